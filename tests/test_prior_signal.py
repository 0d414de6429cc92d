"""``experiments/prior_signal.py``: rows read as measured, picks averaged over the first windows, and the table its
results README quotes is what the committed JSON gives."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from policies.rule_selector import RuleSelector
from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[1]
signal = load_script(REPO / "experiments" / "prior_signal.py", "prior_signal")
TRACES = Path(os.environ.get("PDCTL_TRACES", "data/traces"))
RESULTS = REPO / "experiments/results/families/episode-prior"


def test_rows_are_the_all_rows_at_the_scenarios_load_and_of_the_scenario_file(tmp_path: Path) -> None:
    from agents.evaluate import simulator_digest

    here = simulator_digest()
    (tmp_path / "s1.yaml").write_text("name: s1\n")
    digest = hashlib.sha256(b"name: s1\n").hexdigest()
    path = tmp_path / "rows.csv"
    header = (
        "policy,scenario,rate_scale,tenant,weighted_goodput_rps_mean,offered_weighted_rps_mean,scenario_sha256,"
        "simulator_sha256\n"
    )
    path.write_text(
        header
        + f"baseline:aggregated,s1,1.0,ALL,3.0,4.0,{digest},{here}\n"
        + f"baseline:aggregated,s1,2.0,ALL,9.0,8.0,{digest},{here}\n"
        + f"baseline:aggregated,s1,1.0,chat,1.0,1.0,{digest},{here}\n"
    )
    signal.check_scenario_files([path], tmp_path)
    assert signal.read_rows([path]) == {"s1": {"baseline:aggregated": (3.0, 4.0)}}
    (tmp_path / "s1.yaml").write_text("name: s1 changed\n")
    with pytest.raises(SystemExit, match="is not the file it was run on"):
        signal.check_scenario_files([path], tmp_path)
    with pytest.raises(SystemExit, match="no file"):
        signal.check_scenario_files([path], tmp_path / "elsewhere")


def test_a_pick_averages_ratios_over_each_groups_first_windows_then_over_groups() -> None:
    def logits(windows: np.ndarray) -> np.ndarray:
        return np.log(windows / (1.0 - windows))  # the inputs are the ratios themselves

    one = np.array([[0.9, 0.1], [0.1, 0.9], [0.1, 0.9]])
    other = np.array([[0.5, 0.6], [0.5, 0.6], [0.5, 0.6]])
    assert signal.pick(logits, [one], 1) == 0
    assert signal.pick(logits, [one], 3) == 1
    assert signal.pick(logits, [one, other], 1) == 0  # (0.9 + 0.5) / 2 against (0.1 + 0.6) / 2
    assert signal.pick(logits, [one, other], 2) == 1


def test_the_windows_kept_are_those_with_traffic_and_the_same_network_picks_the_same() -> None:
    scenario = REPO / "experiments" / "scenarios" / "network-incident-8.yaml"
    selector, groups = signal.group_windows(scenario, "learned:default", 0, TRACES)
    assert len(groups) == 1
    assert len(groups[0]) > 10
    assert all(row[signal._RATE_KNOWN] == 1.0 for row in groups[0])
    again = RuleSelector.load(REPO / "experiments/results/learned/selector-dwell-w8-margin-bar-check-policy")
    assert [signal.pick(selector.network.scores, groups, k) for k in (1, 3, 12)] == [
        signal.pick(again.network.scores, groups, k) for k in (1, 3, 12)
    ]


def test_the_readme_table_is_what_the_committed_json_gives() -> None:
    document = json.loads((RESULTS / "development-A80-seed0.json").read_text())
    lines = signal.table(document["summary"], [1, 3, 6, 12], document["rules"][0])
    readme = (RESULTS / "README.md").read_text().splitlines()
    start = readme.index(lines[0])
    assert readme[start : start + len(lines)] == lines
    servable = [r for r in document["scenarios"] if not r["starved"]]
    assert len(servable) == 49
    other_best = [r["scenario"] for r in servable if r["best_rule"] != "dynamo-legacy"]
    named = [
        r["scenario"] for r in servable if r["scenario"] in other_best and r["picks"]["6"]["prior"] == r["best_rule"]
    ]
    assert (len(other_best), named) == (14, ["default-11000", "default-11015", "default-11027", "default-11056",
                                             "default-11073"])  # fmt: skip
    worse = [r for r in servable if r["best_rule"] == "dynamo-legacy" and r["picks"]["6"]["prior"] != "dynamo-legacy"]
    assert len(worse) == 8
    assert all(r["goodput_ratios"][r["picks"]["6"]["prior"]] < 0.99 for r in worse)
    for starved, geomean in ((True, 1.173), (False, 1.001)):
        ratios = [r["selector_ratio_to_best_of_all"] for r in document["scenarios"] if r["starved"] == starved]
        assert round(float(np.exp(np.mean(np.log(ratios)))), 3) == geomean
