"""experiments/results/families/hindsight_rule.py: the rule best at one seed, scored at another."""

from __future__ import annotations

import csv
from pathlib import Path
from types import ModuleType

import pytest

from agents.evaluate import simulator_digest
from tests.script_modules import load_script

FAMILIES = Path(__file__).resolve().parents[2] / "experiments" / "results" / "families"
HEADER = (
    "policy,scenario,tenant,rate_scale,weighted_goodput_rps_mean,gpu_seconds_mean,offered_weighted_rps_mean,"
    "simulator_sha256"
)


@pytest.fixture
def module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(FAMILIES))  # the script imports summarize.py beside it, as when run from there
    return load_script(FAMILIES / "hindsight_rule.py", "families_hindsight_rule")


def _csv(path: Path, rows: list[tuple[str, str, float]], extra: list[str] | None = None) -> str:
    digest = simulator_digest()
    lines = [f"{policy},{scenario},ALL,1.0,{goodput},3600,10,{digest}" for policy, scenario, goodput in rows]
    lines += extra or []
    path.write_text("\n".join([HEADER, *lines]) + "\n")
    return str(path)


def test_the_rule_best_at_one_seed_is_scored_by_its_row_at_the_other(tmp_path: Path, module: ModuleType) -> None:
    chosen = _csv(
        tmp_path / "seed0.csv",
        [
            ("baseline:a", "s1", 5.0),  # a best at seed 0 on s1
            ("baseline:b", "s1", 4.0),
            ("baseline:a", "s2", 1.0),
            ("baseline:b", "s2", 2.0),  # b best on s2
            ("baseline:c", "s2", 9.0),  # c never ran at seed 1: not a candidate
            ("learned:x", "s1", 99.0),  # not a rule
            ("baseline:a", "s3", 1.0),  # s3 not at seed 1
        ],
        # another tenant's row and a rate-swept row are not read
        extra=[
            f"baseline:b,s1,t1,1.0,50,3600,10,{simulator_digest()}",
            f"baseline:b,s1,ALL,1.5,50,3600,10,{simulator_digest()}",
        ],
    )
    scored = _csv(
        tmp_path / "seed1.csv",
        [
            ("baseline:a", "s1", 3.0),
            ("baseline:b", "s1", 6.0),  # at seed 1 b is best on s1: the hindsight choice gets a's 3.0
            ("baseline:a", "s2", 7.0),
            ("baseline:b", "s2", 8.0),
        ],
    )
    rows = module.hindsight_rows([chosen], [scored], "hindsight:x")
    assert [(r["scenario"], r["policy"], float(r["weighted_goodput_rps_mean"])) for r in rows] == [
        ("s1", "hindsight:x", 3.0),
        ("s2", "hindsight:x", 8.0),
    ]
    assert rows[0]["simulator_sha256"] == simulator_digest()  # every column of the scored row is kept

    out = tmp_path / "out.csv"
    assert module.main(["--chosen-at", chosen, "--scored-at", scored, "--label", "hindsight:x", "--out", str(out)]) == 0
    with out.open(newline="") as handle:
        written = list(csv.DictReader(handle))
    assert [(r["scenario"], float(r["weighted_goodput_rps_mean"])) for r in written] == [("s1", 3.0), ("s2", 8.0)]
    # summarize.py scores it as a policy beside the scored seed's rules: 0.5x b on s1, 1.0x on s2
    summarize = load_script(FAMILIES / "summarize.py", "families_summarize_for_hindsight")
    figures = summarize.summarize([scored, str(out)], ["hindsight:x"]).figures["hindsight:x"]
    assert (figures.floor, figures.at_least_best, figures.below_floor_line) == (0.5, 1, 1)


def test_a_label_that_looks_like_a_rule_and_disjoint_sets_are_refused(tmp_path: Path, module: ModuleType) -> None:
    one = _csv(tmp_path / "one.csv", [("baseline:a", "s1", 1.0)])
    other = _csv(tmp_path / "other.csv", [("baseline:a", "s2", 1.0)])
    out = str(tmp_path / "out.csv")
    with pytest.raises(SystemExit, match="--label baseline:best: a rule's prefix"):
        module.main(["--chosen-at", one, "--scored-at", one, "--label", "baseline:best", "--out", out])
    with pytest.raises(SystemExit, match="share no scenario"):
        module.hindsight_rows([one], [other], "hindsight:x")
    learned_only = _csv(tmp_path / "learned.csv", [("learned:x", "s1", 1.0)])
    with pytest.raises(SystemExit, match="no rule"):
        module.hindsight_rows([one], [learned_only], "hindsight:x")
