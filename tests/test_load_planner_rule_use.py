"""``experiments/results/families/load-planner/rule_use.py``: the paired split by whether the planner acted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[1]
rule_use = load_script(REPO / "experiments/results/families/load-planner/rule_use.py", "rule_use")
RULES = ("dynamo-legacy", "aggregated", "dynamo-isl-bounding", "dynamo-isl-or-load", "dynamo-load")


def _trace(folder: Path, scenario: str, load_intervals: int) -> None:
    counts = ", ".join(f"{r}={load_intervals if r == 'dynamo-load' else 10}" for r in RULES)
    (folder / f"{scenario}.txt").write_text(
        f"# rules: {', '.join(RULES)}\nweighted goodput 1 rps\ngroup-intervals per rule: {counts}\n", encoding="utf-8"
    )


def test_the_split_follows_the_traces_and_the_committed_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # default-10536: the candidate 0.351x learned:default with dynamo-load acting; default-10505 1.041x without
    _trace(tmp_path, "default-10536", 20)
    _trace(tmp_path, "default-10505", 0)
    monkeypatch.setattr(sys, "argv", ["rule_use.py", str(tmp_path)])
    rule_use.main()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "dynamo-load acted: True: 1 scenarios, paired 0.351, 0 up, 1 down"
    assert out[1] == "dynamo-load acted: False: 1 scenarios, paired 1.041, 1 up, 0 down"
    assert out[2] == "group-intervals under dynamo-load: 20/100 = 0.200"


def test_a_trace_without_the_count_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "default-10504.txt"
    path.write_text("weighted goodput 1 rps\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"default-10504.txt: last line is not the per-rule count"):
        rule_use.acted_counts(path)
