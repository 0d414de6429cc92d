"""Gate evidence without a registry: hashes bind files and scenario sets; malformed documents are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.gate import (
    EvidenceError,
    GateEvidence,
    PolicyScore,
    ScenarioSet,
    bar_refusal,
    directory_sha256,
    policy_spec_for,
)


def _policy_dir(root: Path, text: str = "a: 1\n") -> Path:
    root.mkdir(parents=True)
    (root / "policy.yaml").write_text(text)
    (root / "manifest.json").write_text(json.dumps({"kind": "file"}))
    return root


def test_directory_hash_follows_contents_and_names_not_location(tmp_path: Path) -> None:
    one = directory_sha256(_policy_dir(tmp_path / "one"))
    assert directory_sha256(_policy_dir(tmp_path / "two")) == one  # same files elsewhere
    assert directory_sha256(_policy_dir(tmp_path / "three", "a: 2\n")) != one  # one byte differs
    renamed = _policy_dir(tmp_path / "four")
    (renamed / "policy.yaml").rename(renamed / "other.yaml")
    assert directory_sha256(renamed) != one
    with pytest.raises(EvidenceError, match="not a directory"):
        directory_sha256(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EvidenceError, match="no policy files"):
        directory_sha256(tmp_path / "empty")


def test_policy_spec_follows_the_manifest(tmp_path: Path) -> None:
    rule = _policy_dir(tmp_path / "rule")
    assert policy_spec_for(rule) == f"file:{rule / 'policy.yaml'}"
    learned = tmp_path / "learned"
    learned.mkdir()
    (learned / "manifest.json").write_text(json.dumps({"schema_version": 1}))
    assert policy_spec_for(learned) == f"learned:{learned}"
    with pytest.raises(EvidenceError, match=r"manifest\.json: not readable JSON"):
        policy_spec_for(tmp_path)


def test_scenario_set_hash_is_order_free_and_binds_files_and_seeds(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("name: a\n")
    b.write_text("name: b\n")
    base = ScenarioSet.of([a, b], [0, 1])
    assert ScenarioSet.of([b, a], [1, 0]).sha256 == base.sha256
    assert ScenarioSet.of([a, b], [0, 2]).sha256 != base.sha256
    b.write_text("name: b\nduration_s: 60\n")
    assert ScenarioSet.of([a, b], [0, 1]).sha256 != base.sha256
    assert ScenarioSet.from_dict(base.as_dict()) == base
    tampered = {**base.as_dict(), "seeds": [0, 1, 2]}
    with pytest.raises(EvidenceError, match="is not the hash of its files and seeds"):
        ScenarioSet.from_dict(tampered)
    with pytest.raises(EvidenceError, match="no such scenario file"):
        ScenarioSet.of([tmp_path / "nope.yaml"], [0])
    with pytest.raises(EvidenceError, match="empty"):
        ScenarioSet.of([], [0])


def test_a_set_behind_admission_hashes_apart_and_a_set_without_keeps_its_old_hash(tmp_path: Path) -> None:
    import hashlib

    a = tmp_path / "a.yaml"
    a.write_text("name: a\n")
    plain = ScenarioSet.of([a], [0, 1])
    digest = hashlib.sha256(a.read_bytes()).hexdigest()
    old = json.dumps({"files": [digest], "seeds": [0, 1]}, sort_keys=True, separators=(",", ":"))
    assert plain.sha256 == hashlib.sha256(old.encode()).hexdigest()  # evidence logged before the field still verifies
    assert "admission_ttft_slack_frac" not in plain.as_dict()
    behind = ScenarioSet.of([a], [0, 1], admission_ttft_slack_frac=1.0)
    assert behind.sha256 != plain.sha256
    assert ScenarioSet.of([a], [0, 1], admission_ttft_slack_frac=2.0).sha256 != behind.sha256
    assert ScenarioSet.from_dict(behind.as_dict()) == behind
    for doc in (
        {**behind.as_dict(), "admission_ttft_slack_frac": 2.0},
        {**plain.as_dict(), "admission_ttft_slack_frac": 1.0},
    ):
        with pytest.raises(EvidenceError, match="is not the hash of its files and seeds"):
            ScenarioSet.from_dict(doc)  # the slack cannot be edited, added or dropped without the hash
    dropped = {k: v for k, v in behind.as_dict().items() if k != "admission_ttft_slack_frac"}
    with pytest.raises(EvidenceError, match="is not the hash"):
        ScenarioSet.from_dict(dropped)


def test_evidence_round_trips_and_refuses_malformed_documents(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\n")
    evidence = GateEvidence(
        policy_sha256="ab" * 32,
        scenario_set=ScenarioSet.of([scenario], [3]),
        candidate=PolicyScore(2.0, {"s": 2.0}),
        references={"baseline:x": PolicyScore(1.5, {"s": 1.5}), "baseline:y": PolicyScore(1.8, {"s": 1.8})},
        champion={"alias": "champion", "version": 4, "policy_sha256": "cd" * 32, "score": {"mean": 1.9,
                  "per_scenario": {"s": 1.9}}},
    )  # fmt: skip
    parsed = GateEvidence.from_json(evidence.to_json(), "doc")
    assert parsed == evidence
    assert parsed.best_reference() == ("baseline:y", PolicyScore(1.8, {"s": 1.8}))
    champion = parsed.champion_score()
    assert champion is not None
    assert champion[:2] == (4, "cd" * 32)
    doc = json.loads(evidence.to_json())
    for broken, message in (
        ("goodput: 5", "doc: not JSON"),
        (json.dumps({**doc, "format": "typed-by-hand"}), "not a pdctl-gate-evidence/1 document"),
        (json.dumps({**doc, "candidate": {"mean": "NaN", "per_scenario": {}}}), "non-finite score"),
        (json.dumps({k: v for k, v in doc.items() if k != "policy_sha256"}), "malformed"),
        (json.dumps({**doc, "champion": {"version": 1}}), "malformed"),
    ):
        with pytest.raises(EvidenceError, match=message):
            GateEvidence.from_json(broken, "doc")


def _score(per: dict[str, float]) -> PolicyScore:
    return PolicyScore(sum(per.values()) / len(per), per)


def test_a_bar_is_beaten_by_the_mean_or_with_confidence_scenario_by_scenario() -> None:
    bar = _score({f"s{i}": 1.0 for i in range(12)})
    # A gain carried by two scenarios, losses elsewhere: the mean beats the bar, the paired interval does not.
    lucky = _score({f"s{i}": 4.0 if i < 2 else 0.9 for i in range(12)})
    assert lucky.mean > bar.mean * 1.02
    assert bar_refusal(lucky, "champion v1", bar, margin_frac=0.02) is None
    why = bar_refusal(lucky, "champion v1", bar, margin_frac=0.02, confidence=0.95)
    assert why is not None
    assert why.startswith("goodput ratio over champion v1 1.")
    assert "2 up, 10 down of 12" in why
    assert "at 95% confidence (the interval's low end needs ≥ 1.020)" in why
    # A consistent gain clears it; the same gain against a larger margin does not.
    steady = _score({f"s{i}": 1.08 if i % 2 else 1.12 for i in range(12)})
    assert bar_refusal(steady, "best baseline b", bar, margin_frac=0.02, confidence=0.95) is None
    assert bar_refusal(steady, "best baseline b", bar, margin_frac=0.15, confidence=0.95) is not None
    # The mean alone keeps its message.
    assert bar_refusal(bar, "best baseline b", steady, margin_frac=0.0) == (
        f"goodput 1 does not beat best baseline b {steady.mean:.4g} by 0.0% (needs ≥ {steady.mean:.4g})"
    )
    # No scenario both served: no comparison, refused with the reason.
    zero = _score({"s0": 0.0})
    assert bar_refusal(zero, "champion v1", _score({"s0": 1.0}), margin_frac=0.0, confidence=0.95) == (
        "no paired comparison with champion v1 (paired_ratio: no scenario where both policies have a positive goodput)"
    )
