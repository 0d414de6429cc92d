"""The policy registry on MLflow: register, list and promote policies behind aliases.

A registered policy is an MLflow model version whose source is a directory of artifacts:

* a **learned** policy: ``manifest.json`` + ``weights.safetensors`` (:mod:`policies.learned`);
* a **rule** policy: ``policy.yaml`` (a policy file) + ``manifest.json`` with ``{"kind": "file"}``.

Resolving ``models:/NAME@ALIAS`` back to files is the serving side's job (:mod:`controller.policy_registry`).
A new version gets the alias ``challenger``. :func:`promote` moves ``champion`` (or any alias) to a version only
when its evaluation beats the current champion and the best baseline by ``margin_frac``. The gate reads only
**evidence** pdctl produced (:mod:`agents.gate`): the evaluation document in the candidate's run, written by
:func:`evaluate_version` (or by ``pdctl train``), bound to the version's policy files and to the scenario set's
hash; the gate re-hashes the version's artifacts and refuses evidence about other files or, for the champion, on
another scenario set. Numbers a caller types are not accepted anywhere. The ``gate.*`` version tags are a copy for
:func:`list_policies` to display; the gate never reads them. A refusal raises :class:`PromotionRefused` with the
numbers.

The tracking URI defaults to the embedded SQLite registry, ``$PDCTL_DATA_DIR/mlflow/mlflow.db`` (``./data/mlflow``;
:mod:`policies.data_dir`, the one definition every part uses); ``MLFLOW_TRACKING_URI`` or an explicit URI selects a
server.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mlflow.exceptions import MlflowException

from agents.gate import (
    EVIDENCE_PATH,
    EvidenceError,
    GateEvidence,
    PolicyScore,
    ScenarioSet,
    bar_refusal,
    directory_sha256,
    evaluate_specs,
    policy_spec_for,
    utc_now,
)
from policies.data_dir import TRACKING_URI_ENV, embedded_tracking_db
from policies.data_dir import tracking_uri as resolve_tracking_uri
from policies.policy_file import PolicyFileError, load_policy_file, resolve_policy

__all__ = [
    "PromotionRefused",
    "RegisteredPolicy",
    "RegistryError",
    "default_tracking_uri",
    "ensure_experiment",
    "evaluate_version",
    "fluent_tracking_uri",
    "list_policies",
    "log_evidence",
    "promote",
    "register_policy",
    "training_evidence",
    "training_run",
]

GOODPUT_TAG = "gate.goodput"
BASELINE_TAG = "gate.best_baseline_goodput"
SCENARIO_SET_TAG = "gate.scenario_set_sha256"
KIND_TAG = "pdctl.kind"


class RegistryError(ValueError):
    """A registry operation failed (one line naming what)."""


class PromotionRefused(RegistryError):
    """The promotion gate refused a version; the message carries the numbers."""


@dataclass(frozen=True, slots=True)
class RegisteredPolicy:
    """One version of a registered policy."""

    name: str
    version: int
    aliases: tuple[str, ...]
    kind: str
    run_id: str | None
    goodput: float | None
    best_baseline_goodput: float | None
    source: str


def default_tracking_uri(tracking_uri: str | None = None) -> str:
    """``tracking_uri``, else ``MLFLOW_TRACKING_URI``, else the embedded registry (:mod:`policies.data_dir`).

    The embedded registry's folder is created, so that MLflow can create the file.
    """
    uri = resolve_tracking_uri(tracking_uri)
    embedded = embedded_tracking_db()
    if uri == f"sqlite:///{embedded}":
        embedded.parent.mkdir(parents=True, exist_ok=True)
    return uri


@contextmanager
def fluent_tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's fluent API (``mlflow.start_run``, ``mlflow.log_*``) writes to ``uri`` inside this block only.

    ``mlflow.set_tracking_uri`` also writes ``MLFLOW_TRACKING_URI`` into ``os.environ`` (so that subprocesses
    inherit it) and never takes it back; a long-lived process (the test run, a notebook) then hands a stale URI to
    every subprocess it starts later. On exit both MLflow's global and that variable are put back as they were.
    """
    import mlflow
    from mlflow.tracking._tracking_service import utils as tracking_utils

    env_before = os.environ.get(TRACKING_URI_ENV)
    global_before = getattr(tracking_utils, "_tracking_uri", None)  # None: never set, MLflow resolves per call
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(global_before)  # type: ignore[arg-type]  # None (never set) is handled, not annotated
        if env_before is None:
            os.environ.pop(TRACKING_URI_ENV, None)
        else:
            os.environ[TRACKING_URI_ENV] = env_before


def _client(tracking_uri: str | None):  # type: ignore[no-untyped-def]
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=default_tracking_uri(tracking_uri))


def ensure_experiment(client, name: str) -> str:  # type: ignore[no-untyped-def]
    """The id of experiment ``name``, created if needed; with a local SQLite store its artifacts live beside it."""
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        return str(existing.experiment_id)
    location = None
    if client.tracking_uri.startswith("sqlite:///"):
        db = Path(client.tracking_uri.removeprefix("sqlite:///"))
        location = (db.parent / "artifacts").resolve().as_uri()
    return str(client.create_experiment(name, artifact_location=location))


@contextmanager
def training_run(name: str, run_label: str, tracking_uri: str | None) -> Iterator[tuple[str, str]]:
    """An MLflow run for a training experiment: yields ``(run_id, tracking URI)`` (experiment ``pdctl-train-NAME``)."""
    import mlflow
    from mlflow import MlflowClient

    uri = default_tracking_uri(tracking_uri)
    experiment_id = ensure_experiment(MlflowClient(tracking_uri=uri), f"pdctl-train-{name}")
    with fluent_tracking_uri(uri), mlflow.start_run(experiment_id=experiment_id, run_name=run_label) as run:
        yield run.info.run_id, uri


def _kind_of(path: Path) -> str:
    manifest = path / "manifest.json"
    if not manifest.is_file():
        raise RegistryError(f"{path}: no manifest.json (export a learned policy or use a policy file)")
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RegistryError(f"{manifest}: not readable JSON: {exc}") from None
    return "file" if data.get("kind") == "file" else "learned"


def _stage_policy_file(policy_file: Path) -> Path:
    try:
        resolve_policy(load_policy_file(policy_file), str(policy_file))
    except PolicyFileError as exc:
        raise RegistryError(str(exc).splitlines()[0]) from None
    staged = Path(tempfile.mkdtemp(prefix="pdctl-policy-"))
    shutil.copyfile(policy_file, staged / "policy.yaml")
    (staged / "manifest.json").write_text(json.dumps({"kind": "file", "source": str(policy_file)}))
    return staged


def register_policy(
    path: str | Path,
    name: str,
    *,
    tracking_uri: str | None = None,
    run_id: str | None = None,
    experiment: str = "pdctl-policies",
) -> RegisteredPolicy:
    """Register an artifact directory or a policy file as a new version of ``name`` with alias ``challenger``.

    Without ``run_id`` a run is created in ``experiment`` to hold the artifacts. The version has no evidence
    for the gate until :func:`evaluate_version` (or ``pdctl train``) logs some to its run.
    """
    import mlflow

    source = Path(path)
    staged: Path | None = None
    if source.is_file():
        staged = _stage_policy_file(source)
        source = staged
    elif not source.is_dir():
        raise RegistryError(f"{path}: no such artifact directory or policy file")
    kind = _kind_of(source)
    client = _client(tracking_uri)
    try:
        if run_id is None:
            with (
                fluent_tracking_uri(client.tracking_uri),
                mlflow.start_run(
                    experiment_id=ensure_experiment(client, experiment), run_name=f"register-{name}"
                ) as run,
            ):
                mlflow.log_artifacts(str(source), artifact_path="policy")
                run_id = run.info.run_id
        else:
            client.log_artifacts(run_id, str(source), artifact_path="policy")
    finally:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
    artifact_uri = f"{client.get_run(run_id).info.artifact_uri}/policy"
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name)
    version = client.create_model_version(name=name, source=artifact_uri, run_id=run_id)
    client.set_model_version_tag(name, version.version, KIND_TAG, kind)
    client.set_registered_model_alias(name, "challenger", version.version)
    return _describe(client, name, int(version.version))


def _float_tag(tags: Mapping[str, str], key: str) -> float | None:
    value = tags.get(key)
    return None if value is None else float(value)


def _describe(client, name: str, version: int) -> RegisteredPolicy:  # type: ignore[no-untyped-def]
    mv = client.get_model_version(name, str(version))
    return RegisteredPolicy(
        name=name,
        version=version,
        aliases=tuple(sorted(getattr(mv, "aliases", []) or [])),
        kind=mv.tags.get(KIND_TAG, "learned"),
        run_id=mv.run_id,
        goodput=_float_tag(mv.tags, GOODPUT_TAG),
        best_baseline_goodput=_float_tag(mv.tags, BASELINE_TAG),
        source=mv.source,
    )


def list_policies(name: str | None = None, *, tracking_uri: str | None = None) -> list[RegisteredPolicy]:
    """Every version of ``name`` (or of every registered policy), newest first."""
    client = _client(tracking_uri)
    query = f"name='{name}'" if name else ""
    versions = client.search_model_versions(query)
    out = [_describe(client, v.name, int(v.version)) for v in versions]
    return sorted(out, key=lambda p: (p.name, -p.version))


def _version(client, name: str, version: int):  # type: ignore[no-untyped-def]
    try:
        return client.get_model_version(name, str(version))
    except MlflowException as exc:
        raise RegistryError(f"{name} version {version}: not found ({exc.__class__.__name__})") from None


def _download_version(client, name: str, version: int, dst: Path) -> Path:  # type: ignore[no-untyped-def]
    import mlflow

    mv = _version(client, name, version)
    try:
        return Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=str(mv.source), dst_path=str(dst), tracking_uri=client.tracking_uri
            )
        )
    except (MlflowException, OSError) as exc:
        raise RegistryError(f"{name} v{version}: artifacts not downloadable ({exc.__class__.__name__})") from None


def _version_sha256(client, name: str, version: int) -> str:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory(prefix="pdctl-gate-") as tmp:
        return directory_sha256(_download_version(client, name, version, Path(tmp)))


def _read_evidence(client, name: str, version: int) -> GateEvidence | None:  # type: ignore[no-untyped-def]
    import mlflow

    mv = _version(client, name, version)
    if not mv.run_id:
        return None
    with tempfile.TemporaryDirectory(prefix="pdctl-gate-") as tmp:
        try:
            local = mlflow.artifacts.download_artifacts(
                run_id=mv.run_id, artifact_path=EVIDENCE_PATH, dst_path=tmp, tracking_uri=client.tracking_uri
            )
        except (MlflowException, OSError):
            return None
        text = Path(local).read_text(encoding="utf-8")
    try:
        return GateEvidence.from_json(text, f"{name} v{version} run {mv.run_id} {EVIDENCE_PATH}")
    except EvidenceError as exc:
        raise PromotionRefused(str(exc)) from None


def log_evidence(client, name: str, version: int, evidence: GateEvidence) -> None:  # type: ignore[no-untyped-def]
    """Log ``evidence`` to the run of ``name`` v``version`` and copy its numbers to display-only tags."""
    mv = _version(client, name, version)
    if not mv.run_id:
        raise RegistryError(f"{name} v{version}: no MLflow run to hold the evidence")
    client.log_text(mv.run_id, evidence.to_json(), EVIDENCE_PATH)
    client.set_model_version_tag(name, str(version), GOODPUT_TAG, repr(evidence.candidate.mean))
    best = evidence.best_reference()
    if best is not None:
        client.set_model_version_tag(name, str(version), BASELINE_TAG, repr(best[1].mean))
    client.set_model_version_tag(name, str(version), SCENARIO_SET_TAG, evidence.scenario_set.sha256)


def evaluate_version(
    name: str,
    version: int,
    scenarios: Sequence[Path],
    seeds: Sequence[int],
    *,
    baselines: Sequence[str] = (),
    alias: str = "champion",
    tracking_uri: str | None = None,
    admission_ttft_slack_frac: float | None = None,
) -> GateEvidence:
    """Evaluate ``name`` v``version``, the ``alias`` holder (if another version) and ``baselines`` on one set.

    With ``admission_ttft_slack_frac`` all of them run behind the admission stage, which the set records.

    The version's artifacts are downloaded from the registry and evaluated as they are stored (so the evidence
    is about the files the gate will hash); the document is logged to the version's run (:func:`log_evidence`).
    """
    client = _client(tracking_uri)
    scenario_set = ScenarioSet.of(list(scenarios), list(seeds), admission_ttft_slack_frac)
    with tempfile.TemporaryDirectory(prefix="pdctl-gate-") as tmp:
        candidate_dir = _download_version(client, name, version, Path(tmp) / "candidate")
        specs = {"candidate": policy_spec_for(candidate_dir)}
        champion: dict[str, object] | None = None
        holder = _alias_holder(client, name, alias)
        if holder is not None and holder != version:
            champion_dir = _download_version(client, name, holder, Path(tmp) / "champion")
            specs["champion"] = policy_spec_for(champion_dir)
            champion = {"alias": alias, "version": holder, "policy_sha256": directory_sha256(champion_dir)}
        scores = evaluate_specs([*specs.values(), *baselines], list(scenarios), list(seeds), admission_ttft_slack_frac)
        evidence = GateEvidence(
            policy_sha256=directory_sha256(candidate_dir),
            scenario_set=scenario_set,
            candidate=scores[specs["candidate"]],
            references={b: scores[b] for b in baselines},
            champion=None if champion is None else {**champion, "score": scores[specs["champion"]].as_dict()},
            produced_by="agents.registry.evaluate_version",
            created_utc=utc_now(),
        )
    log_evidence(client, name, version, evidence)
    return evidence


def training_evidence(
    artifact: Path,
    scenarios: Sequence[Path],
    seeds: Sequence[int],
    evaluation: Mapping[str, Mapping[str, float]],
    admission_ttft_slack_frac: float | None = None,
) -> GateEvidence:
    """Evidence from ``pdctl train``'s own held-out evaluation of ``artifact`` (``learned:ARTIFACT`` and baselines).

    ``admission_ttft_slack_frac``: the admission stage that evaluation ran behind, if any.
    """

    def score(row: Mapping[str, float]) -> PolicyScore:
        return PolicyScore(float(row["mean"]), {k: float(v) for k, v in row.items() if k != "mean"})

    candidate = f"learned:{artifact}"
    return GateEvidence(
        policy_sha256=directory_sha256(artifact),
        scenario_set=ScenarioSet.of(list(scenarios), list(seeds), admission_ttft_slack_frac),
        candidate=score(evaluation[candidate]),
        references={k: score(v) for k, v in evaluation.items() if k != candidate},
        produced_by="agents.train",
        created_utc=utc_now(),
    )


def _alias_holder(client, name: str, alias: str) -> int | None:  # type: ignore[no-untyped-def]
    try:
        return int(client.get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def _champion_bar(client, name: str, alias: str, holder: int, evidence: GateEvidence) -> tuple[str, PolicyScore]:  # type: ignore[no-untyped-def]
    """The alias holder's score on the candidate's scenario set, from evidence the gate can verify."""
    holder_sha = _version_sha256(client, name, holder)
    alongside = evidence.champion_score()
    if alongside is not None and alongside[0] == holder and alongside[1] == holder_sha:
        return f"{alias} v{holder}", alongside[2]
    own = _read_evidence(client, name, holder)
    if own is not None and own.policy_sha256 == holder_sha and own.scenario_set.sha256 == evidence.scenario_set.sha256:
        return f"{alias} v{holder}", own.candidate
    raise PromotionRefused(
        f"{name}: no verifiable score of {alias} v{holder} on the candidate's scenario set "
        f"{evidence.scenario_set.sha256[:12]}; run `pdctl policy evaluate {name} --version <candidate>` to evaluate "
        f"both on one set; {alias} unchanged"
    )


def promote(
    name: str,
    version: int,
    *,
    alias: str = "champion",
    margin_frac: float = 0.0,
    tracking_uri: str | None = None,
    force: bool = False,
    confidence: float | None = None,
) -> RegisteredPolicy:
    """Move ``alias`` to ``version`` if its evidence beats the current holder and the best baseline by ``margin_frac``.

    The evidence is the candidate run's :data:`agents.gate.EVIDENCE_PATH`, checked against the version's files
    (module docstring); ``force`` skips the gate. With ``confidence`` (e.g. 0.95) a bar is beaten only when the
    lower end of that bootstrap interval of the per-scenario goodput ratio clears the margin
    (:func:`agents.gate.bar_refusal`), not the mean alone.
    """
    if not 0.0 <= margin_frac < 1.0 or margin_frac != margin_frac:
        raise RegistryError(f"margin must be within [0, 1), got {margin_frac}")
    if confidence is not None and not 0.0 < confidence < 1.0:
        raise RegistryError(f"confidence must be within (0, 1), got {confidence}")
    client = _client(tracking_uri)
    _version(client, name, version)
    if not force:
        evidence = _read_evidence(client, name, version)
        if evidence is None:
            raise PromotionRefused(
                f"{name} v{version}: no evaluation evidence ({EVIDENCE_PATH} in its run); run "
                f"`pdctl policy evaluate {name} --version {version} --scenarios ... --seeds ...`"
            )
        actual = _version_sha256(client, name, version)
        if evidence.policy_sha256 != actual:
            raise PromotionRefused(
                f"{name} v{version}: the evidence is about other policy files (sha256 {evidence.policy_sha256[:12]}, "
                f"the version's files {actual[:12]}); re-evaluate it; {alias} unchanged"
            )
        bars: list[tuple[str, PolicyScore]] = []
        best = evidence.best_reference()
        if best is not None:
            bars.append((f"best baseline {best[0]}", best[1]))
        holder = _alias_holder(client, name, alias)
        if holder is not None and holder != version:
            bars.append(_champion_bar(client, name, alias, holder, evidence))
        for label, score in bars:
            why = bar_refusal(evidence.candidate, label, score, margin_frac=margin_frac, confidence=confidence)
            if why is not None:
                raise PromotionRefused(
                    f"{name} v{version}: {why}, scenario set {evidence.scenario_set.sha256[:12]}; {alias} unchanged"
                )
    client.set_registered_model_alias(name, alias, str(version))
    return _describe(client, name, version)
