"""experiments/admission_gain.py: goodput with / without admission per policy, split by starvation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.script_modules import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "admission_gain.py"
HEADER = (
    "policy,scenario,rate_scale,tenant,weighted_goodput_rps_mean,offered_weighted_rps_mean,arrived_mean,failed_mean,"
    "simulator_sha256\n"
)


def _csv(path: Path, rows: list[tuple[str, str, float, float, float]], digest: str = "aaaa") -> Path:
    lines = [f"{p},{s},1.0,ALL,{g},{o},100,{f},{digest}\n" for p, s, g, o, f in rows]
    path.write_text(HEADER + "".join(lines))
    return path


@pytest.fixture
def module():  # type: ignore[no-untyped-def]
    return load_script(SCRIPT, "admission_gain")


def test_ratios_split_by_whether_the_best_rule_was_starved(tmp_path: Path, module, capsys) -> None:  # type: ignore[no-untyped-def]
    off = _csv(
        tmp_path / "off.csv",
        [
            ("baseline:a", "s1", 2.0, 10.0, 0),  # starved: the best rule serves 3 of 10
            ("baseline:b", "s1", 3.0, 10.0, 0),
            ("learned:x", "s1", 1.0, 10.0, 0),
            ("baseline:a", "s2", 9.0, 10.0, 0),
            ("baseline:b", "s2", 8.0, 10.0, 0),
            ("learned:x", "s2", 9.0, 10.0, 0),
        ],
    )
    on = _csv(
        tmp_path / "on.csv",
        [
            ("baseline:a+admission", "s1", 6.0, 10.0, 40),
            ("baseline:b+admission", "s1", 4.5, 10.0, 30),
            ("learned:x+admission", "s1", 5.0, 10.0, 50),
            ("baseline:a+admission", "s2", 9.0, 10.0, 0),
            ("baseline:b+admission", "s2", 8.8, 10.0, 2),
            ("learned:x+admission", "s2", 8.0, 10.0, 10),
        ],
    )
    table_off, _ = module.read(off)
    table_on, _ = module.read(on)
    ratios = module.gains(table_off, table_on, [module.BEST_RULE, "learned:x"])
    assert ratios[module.BEST_RULE, True] == [pytest.approx(2.0)]  # best 3.0 -> best 6.0
    assert ratios[module.BEST_RULE, False] == [pytest.approx(1.0)]
    assert ratios["learned:x", True] == [pytest.approx(5.0)]
    assert ratios["learned:x", False] == [pytest.approx(8.0 / 9.0)]
    assert module.refused_frac(table_on, "learned:x") == pytest.approx(0.3)
    assert module.main([str(off), str(on), "--policy", "learned:x"]) == 0
    out = capsys.readouterr().out
    assert "| learned:x | not starved | 1 | 0.889× (0.889–0.889) | 0 | 1 | 0.889 |" in out


def test_files_of_two_simulators_or_unknown_policies_are_refused_in_one_line(tmp_path: Path, module) -> None:  # type: ignore[no-untyped-def]
    off = _csv(tmp_path / "off.csv", [("baseline:a", "s1", 2.0, 10.0, 0)])
    on = _csv(tmp_path / "on.csv", [("baseline:a+admission", "s1", 2.0, 10.0, 0)], digest="bbbb")
    with pytest.raises(SystemExit, match="simulator"):
        module.main([str(off), str(on)])
    same = _csv(tmp_path / "same.csv", [("baseline:a+admission", "s1", 2.0, 10.0, 0)])
    with pytest.raises(SystemExit, match="--policy learned:x"):
        module.main([str(off), str(same), "--policy", "learned:x"])
