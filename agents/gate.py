"""Evidence for the promotion gate: an evaluation pdctl ran itself, bound to policy files and a scenario set.

The gate (:func:`agents.registry.promote`) compares numbers; this module decides which numbers it may compare.
A caller cannot type them: the only numbers the gate reads are those of an **evidence** document
(:class:`GateEvidence`, JSON at :data:`EVIDENCE_PATH` in the candidate's MLflow run) that pdctl's own evaluation
wrote — :func:`agents.registry.evaluate_version` (``pdctl policy evaluate``, or ``pdctl policy register --scenarios``)
or ``pdctl train`` after its held-out evaluation — and that binds the numbers to

* **the policy files**: ``policy_sha256`` is the SHA-256 of the evaluated artifact directory
  (:func:`directory_sha256`: every file's relative path and SHA-256, sorted). At promotion the gate downloads the
  model version's artifacts, hashes them and refuses evidence about other files (another version's evidence copied
  into this run, or artifacts overwritten after the evaluation);
* **the scenario set**: the SHA-256 of every scenario file and the seeds (:class:`ScenarioSet`), hashed again into
  one ``sha256``. The gate recomputes that hash from its parts, and compares a candidate with the champion only
  on one scenario set (the champion's numbers come from the candidate's own evidence when it evaluated the
  champion alongside, else from the champion's evidence on the same set).

Every number in the evidence comes from one evaluation run over the same scenarios and seeds
(:func:`evaluate_specs`: priority-weighted goodput, req/s, through :func:`agents.evaluate.run_one`), candidate,
references (baselines) and champion alike. What this does not defend against, stated plainly: a writer with
access to the tracking server can upload a forged document with correct hashes. For that, ``pdctl policy
evaluate`` re-runs the evaluation itself (the gate then judges the fresh document). A scenario file that points at
a trace is hashed as YAML; the trace file itself is not.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.harness import ALL_TENANTS, RunSpec, run_one
from agents.paired import paired_ratio

__all__ = [
    "EVIDENCE_FORMAT",
    "EVIDENCE_PATH",
    "EvidenceError",
    "GateEvidence",
    "PolicyScore",
    "ScenarioSet",
    "bar_refusal",
    "directory_sha256",
    "evaluate_specs",
    "file_sha256",
    "policy_spec_for",
]

EVIDENCE_PATH = "gate/evidence.json"
"""Where the evidence lives in the candidate's MLflow run."""
EVIDENCE_FORMAT = "pdctl-gate-evidence/1"
METRIC = "weighted_goodput_rps"


class EvidenceError(ValueError):
    """Evidence is missing, malformed or bound to something else (one line naming what)."""


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def directory_sha256(root: Path) -> str:
    """SHA-256 over every file under ``root``: its sorted lines of relative path, NUL and the file's SHA-256."""
    if not root.is_dir():
        raise EvidenceError(f"{root}: not a directory of policy artifacts")
    lines = sorted(f"{p.relative_to(root).as_posix()}\0{file_sha256(p)}\n" for p in root.rglob("*") if p.is_file())
    if not lines:
        raise EvidenceError(f"{root}: no policy files to hash")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def policy_spec_for(directory: Path) -> str:
    """The policy spec of an artifact directory: ``file:DIR/policy.yaml`` for a rule policy, else ``learned:DIR``."""
    manifest = directory / "manifest.json"
    try:
        kind = json.loads(manifest.read_text(encoding="utf-8")).get("kind")
    except (OSError, json.JSONDecodeError) as exc:
        raise EvidenceError(f"{manifest}: not readable JSON ({exc.__class__.__name__})") from None
    return f"file:{directory / 'policy.yaml'}" if kind == "file" else f"learned:{directory}"


def _canonical_sha256(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ScenarioSet:
    """Scenario files (name and SHA-256) and seeds; ``sha256`` identifies the set (order does not matter).

    With ``admission_ttft_slack_frac`` every policy of the set ran behind the router's admission stage at that slack
    (:mod:`policies.admission`); it is part of the hash, so evidence behind admission is only ever compared with
    evidence behind the same stage. Without it the hash is the one of the files and seeds alone, as before the field.
    """

    scenarios: tuple[tuple[str, str], ...]
    seeds: tuple[int, ...]
    admission_ttft_slack_frac: float | None = None

    @classmethod
    def of(
        cls, paths: Sequence[Path], seeds: Sequence[int], admission_ttft_slack_frac: float | None = None
    ) -> ScenarioSet:
        """Hash the scenario files as they are on disk now."""
        if not paths:
            raise EvidenceError("the gate's scenario set is empty: name at least one scenario")
        if not seeds:
            raise EvidenceError("the gate's scenario set has no seeds: name at least one")
        for path in paths:
            if not path.is_file():
                raise EvidenceError(f"{path}: no such scenario file")
        return cls(
            tuple((p.stem, file_sha256(p)) for p in paths), tuple(int(s) for s in seeds), admission_ttft_slack_frac
        )

    @property
    def sha256(self) -> str:
        """SHA-256 of the sorted file digests, the sorted seeds and the admission slack (when there is one)."""
        doc: dict[str, Any] = {"files": sorted(d for _, d in self.scenarios), "seeds": sorted(self.seeds)}
        if self.admission_ttft_slack_frac is not None:
            doc["admission_ttft_slack_frac"] = self.admission_ttft_slack_frac
        return _canonical_sha256(doc)

    def as_dict(self) -> dict[str, Any]:
        """JSON form (with the hash, which :meth:`from_dict` checks)."""
        doc: dict[str, Any] = {
            "scenarios": [{"name": n, "sha256": d} for n, d in self.scenarios],
            "seeds": list(self.seeds),
            "sha256": self.sha256,
        }
        if self.admission_ttft_slack_frac is not None:
            doc["admission_ttft_slack_frac"] = self.admission_ttft_slack_frac
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ScenarioSet:
        """Parse and check that the recorded hash is the hash of the recorded parts."""
        try:
            scenarios = tuple((str(s["name"]), str(s["sha256"])) for s in doc["scenarios"])
            seeds = tuple(int(s) for s in doc["seeds"])
            recorded = str(doc["sha256"])
            slack = doc.get("admission_ttft_slack_frac")
            admission = None if slack is None else float(slack)
        except (KeyError, TypeError, ValueError) as exc:
            raise EvidenceError(f"scenario_set: malformed ({exc.__class__.__name__}: {exc})") from None
        parsed = cls(scenarios, seeds, admission)
        if parsed.sha256 != recorded:
            raise EvidenceError(f"scenario_set: recorded hash {recorded[:12]} is not the hash of its files and seeds")
        return parsed


@dataclass(frozen=True, slots=True)
class PolicyScore:
    """One policy's mean weighted goodput (req/s) over the set, and per scenario."""

    mean: float
    per_scenario: Mapping[str, float]

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"mean": self.mean, "per_scenario": dict(self.per_scenario)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], where: str) -> PolicyScore:
        """Parse; non-finite numbers are refused."""
        try:
            mean = float(doc["mean"])
            per = {str(k): float(v) for k, v in doc["per_scenario"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise EvidenceError(f"{where}: malformed score ({exc.__class__.__name__})") from None
        if not all(math.isfinite(v) for v in (mean, *per.values())):
            raise EvidenceError(f"{where}: non-finite score")
        return cls(mean, per)


@dataclass(frozen=True, slots=True)
class GateEvidence:
    """What the gate reads (module docstring).

    Attributes:
        policy_sha256: hash of the evaluated policy files (:func:`directory_sha256`).
        scenario_set: the scenarios and seeds.
        candidate: the candidate's score.
        references: baseline specs and their scores on the same set.
        champion: the alias holder evaluated alongside (``alias``, ``version``, ``policy_sha256``, ``score``), if any.
        produced_by: which pdctl step ran the evaluation.
        created_utc: when.
    """

    policy_sha256: str
    scenario_set: ScenarioSet
    candidate: PolicyScore
    references: Mapping[str, PolicyScore] = field(default_factory=dict)
    champion: Mapping[str, Any] | None = None
    produced_by: str = ""
    created_utc: str = ""

    def best_reference(self) -> tuple[str, PolicyScore] | None:
        """The reference with the highest mean, if any."""
        if not self.references:
            return None
        name = max(self.references, key=lambda k: self.references[k].mean)
        return name, self.references[name]

    def champion_score(self) -> tuple[int, str, PolicyScore] | None:
        """``(version, policy_sha256, score)`` of the champion evaluated alongside, if any."""
        if self.champion is None:
            return None
        c = self.champion
        return int(c["version"]), str(c["policy_sha256"]), PolicyScore.from_dict(c["score"], "champion")

    def to_json(self) -> str:
        """The document logged to the run."""
        doc = {
            "format": EVIDENCE_FORMAT,
            "metric": METRIC,
            "policy_sha256": self.policy_sha256,
            "scenario_set": self.scenario_set.as_dict(),
            "candidate": self.candidate.as_dict(),
            "references": {k: v.as_dict() for k, v in self.references.items()},
            "champion": None if self.champion is None else dict(self.champion),
            "produced_by": self.produced_by,
            "created_utc": self.created_utc,
        }
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> GateEvidence:
        """Parse and check a logged document; :class:`EvidenceError` names what is wrong."""
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EvidenceError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(doc, dict) or doc.get("format") != EVIDENCE_FORMAT or doc.get("metric") != METRIC:
            raise EvidenceError(f"{where}: not a {EVIDENCE_FORMAT} document on {METRIC}")
        try:
            champion = doc.get("champion")
            evidence = cls(
                policy_sha256=str(doc["policy_sha256"]),
                scenario_set=ScenarioSet.from_dict(doc["scenario_set"]),
                candidate=PolicyScore.from_dict(doc["candidate"], f"{where}: candidate"),
                references={
                    str(k): PolicyScore.from_dict(v, f"{where}: {k}") for k, v in dict(doc["references"]).items()
                },
                champion=None if champion is None else dict(champion),
                produced_by=str(doc.get("produced_by", "")),
                created_utc=str(doc.get("created_utc", "")),
            )
            evidence.champion_score()
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, EvidenceError):
                raise EvidenceError(f"{where}: {exc}") from None
            raise EvidenceError(f"{where}: malformed ({exc.__class__.__name__}: {exc})") from None
        return evidence


def bar_refusal(
    candidate: PolicyScore, label: str, bar: PolicyScore, *, margin_frac: float, confidence: float | None = None
) -> str | None:
    """Why ``candidate`` does not beat ``bar`` (the best baseline or the champion) on their set, or ``None``.

    Without ``confidence``: the candidate's mean goodput must reach the bar's times ``1 + margin_frac``. With it
    (e.g. 0.95): scenario by scenario, the lower end of the ``confidence`` bootstrap interval of the geometric-mean
    goodput ratio (:func:`agents.paired.paired_ratio`, seed 0) must reach ``1 + margin_frac``, so a gain the set
    cannot tell from the scatter of its scenarios is refused. On one scenario the interval is that scenario's ratio.
    """
    if confidence is None:
        need = bar.mean * (1.0 + margin_frac)
        if candidate.mean >= need:
            return None
        return (
            f"goodput {candidate.mean:.4g} does not beat {label} {bar.mean:.4g} by {margin_frac:.1%} "
            f"(needs ≥ {need:.4g})"
        )
    try:
        paired = paired_ratio(candidate.per_scenario, bar.per_scenario, level=confidence)
    except ValueError as exc:
        return f"no paired comparison with {label} ({exc})"
    need = 1.0 + margin_frac
    if paired.low >= need:
        return None
    return (
        f"goodput ratio over {label} {paired.describe(confidence)} does not beat it by {margin_frac:.1%} at "
        f"{confidence:.0%} confidence (the interval's low end needs ≥ {need:.3f})"
    )


def evaluate_specs(
    specs: Sequence[str],
    paths: Sequence[Path],
    seeds: Sequence[int],
    admission_ttft_slack_frac: float | None = None,
) -> dict[str, PolicyScore]:
    """Every spec over every scenario and seed: mean weighted goodput per scenario, and their mean.

    With ``admission_ttft_slack_frac`` every spec runs behind the admission stage (``RunSpec``'s field).
    """
    out: dict[str, PolicyScore] = {}
    for spec in specs:
        per: dict[str, float] = {}
        for path in paths:
            values = []
            for seed in seeds:
                result = run_one(
                    RunSpec(spec, str(path), int(seed), admission_ttft_slack_frac=admission_ttft_slack_frac)
                )
                total = next(row for row in result.rows if row["tenant"] == ALL_TENANTS)
                values.append(float(total[METRIC]))
            per[path.stem] = float(np.mean(values))
        out[spec] = PolicyScore(float(np.mean(list(per.values()))), per)
    return out


def utc_now() -> str:
    """``YYYY-MM-DDTHH:MM:SSZ`` (for the record only; nothing compares it)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
