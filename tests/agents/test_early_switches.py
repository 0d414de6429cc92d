"""experiments/early_switches.py: a selector's early rule changes against the rest, from its traces and rule rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.evaluate import simulator_digest
from tests.script_modules import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "early_switches.py"


def _trace(folder: Path, scenario: str, goodput: float, changes: str) -> None:
    body = "# rules: dynamo-legacy, aggregated\n     10s {'g1': 'dynamo-legacy'} [0.50,0.40] reward=1.00\n"
    tail = f"weighted goodput {goodput:.4f} rps\nrequests meeting both SLOs 1/2 = 0.500\nrule changes: {changes}\n"
    (folder / f"{scenario}.txt").write_text(body + tail)


def _rules(path: Path, rows: list[tuple[str, str, float]]) -> Path:
    digest = simulator_digest()
    lines = [f"baseline:{rule},{scenario},ALL,{goodput},{digest}\n" for rule, scenario, goodput in rows]
    path.write_text("policy,scenario,tenant,weighted_goodput_rps_mean,simulator_sha256\n" + "".join(lines))
    return path


@pytest.fixture
def module():  # type: ignore[no-untyped-def]
    return load_script(SCRIPT, "early_switches")


def test_early_changers_and_the_rest_are_counted_apart(tmp_path: Path, module, capsys) -> None:  # type: ignore[no-untyped-def]
    traces = tmp_path / "traces"
    traces.mkdir()
    _trace(traces, "s1", 4.0, "30 s g1: dynamo-legacy -> aggregated")  # early, gains over legacy (8 / 10 vs 2 / 10)
    _trace(traces, "s2", 5.0, "40 s g2: dynamo-legacy -> aggregated; 400 s g2: aggregated -> dynamo-legacy")  # loses
    _trace(traces, "s3", 9.0, "300 s g1: dynamo-legacy -> aggregated")  # late
    _trace(traces, "s4", 10.0, "none")
    rules = _rules(
        tmp_path / "rules.csv",
        [
            ("dynamo-legacy", "s1", 1.0), ("aggregated", "s1", 5.0),
            ("dynamo-legacy", "s2", 10.0), ("aggregated", "s2", 2.0),
            ("dynamo-legacy", "s3", 10.0), ("aggregated", "s3", 1.0),
            ("dynamo-legacy", "s4", 10.0), ("aggregated", "s4", 1.0),
        ],
    )  # fmt: skip
    rows = module.outcomes(traces, rules, "dynamo-legacy")
    assert [(r.scenario, r.first_change_s) for r in rows] == [("s1", 30.0), ("s2", 40.0), ("s3", 300.0), ("s4", None)]
    assert rows[0].selector_ratio == pytest.approx(0.8)
    assert rows[0].first_rule_ratio == pytest.approx(0.2)
    assert module.main([str(traces), str(rules), "--within-s", "60"]) == 0
    early, rest = capsys.readouterr().out.splitlines()[2:]
    # early: s1 (0.8, legacy 0.2) and s2 (0.5, legacy 1.0): both below 0.9x, geometric means sqrt(0.4), sqrt(0.2)
    assert early == "| a change within 60 s | 2 | 2 | 0.632 | 0.447 | 1 |"
    assert rest == "| no change that early | 2 | 0 | 0.949 | 1.000 | 1 |"


def test_a_trace_without_its_rule_rows_or_unfinished_is_one_line(tmp_path: Path, module) -> None:  # type: ignore[no-untyped-def]
    traces = tmp_path / "traces"
    traces.mkdir()
    _trace(traces, "s9", 1.0, "none")
    rules = _rules(tmp_path / "rules.csv", [("dynamo-legacy", "s1", 1.0)])
    with pytest.raises(SystemExit, match=r"s9\.txt: no rule rows for s9"):
        module.main([str(traces), str(rules)])
    (traces / "s9.txt").write_text("# rules: a\n")
    rules = _rules(tmp_path / "rules.csv", [("dynamo-legacy", "s9", 1.0)])
    with pytest.raises(SystemExit, match="no 'weighted goodput' line"):
        module.main([str(traces), str(rules)])
