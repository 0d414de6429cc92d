"""experiments/selector_cv.py: grouped cross-validation of the selector's fit, and its learning curve."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agents.selector_data import GroupRollout
from policies.rule_selector import GROUP_INPUT_WIDTH
from tests.agents.selector_recipes import DEFAULT_FAMILY, experiment

REPO = Path(__file__).resolve().parents[2]
RULES = ["dynamo-legacy", "aggregated"]


def _cache(tmp_path: Path, scenarios: int) -> Path:
    """A rollout cache of ``scenarios`` one-group scenarios: legacy best where input 0 is 0, aggregated where it is 1;
    each scenario also has a rollout of a third rule, as the cache of a run with more candidates would."""
    entries = {}
    for i in range(scenarios):
        kind = i % 2
        inputs = np.zeros((4, GROUP_INPUT_WIDTH), dtype=np.float32)
        inputs[:, 0] = kind
        goodput = {"dynamo-legacy": 4.0 - 2.0 * kind, "aggregated": 2.0 + 2.0 * kind, "dynamo-load": 1.0}
        for rule, value in goodput.items():
            task = (f"default-{i:05d}", rule)
            entries[task] = ([GroupRollout(f"default-{i:05d}", 0, "g1", rule, inputs, value, 10.0, 0.0)], 1.0)
    path = tmp_path / "rollouts.pkl"
    path.write_bytes(pickle.dumps({"format": 3, "entries": entries}))
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    script = REPO / "experiments" / "selector_cv.py"
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300, cwd=REPO)


def test_the_learning_curve_fits_on_fewer_scenarios_and_scores_the_same_held_out_fold(tmp_path: Path) -> None:
    recipe = experiment(tmp_path, DEFAULT_FAMILY, rules=RULES, epochs=200, learning_rate=0.02, hidden_width=8)
    out = _run(
        "--experiment", str(recipe), "--rollouts", str(_cache(tmp_path, 10)), "--folds", "5",
        "--train-scenarios", "1", "--train-scenarios", "4",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"left out 10 rollouts of rules not in the experiment's {RULES}"
    assert lines[1].startswith("10 training scenarios, 5 folds")
    labels = [line.split(": regret")[0] for line in lines[2:]]
    assert labels == [
        "constant:dynamo-legacy",
        "{}",
        "{} on 1 training scenarios per fold",
        "{} on 4 training scenarios per fold",
    ]
    value = {}
    for label, line in zip(labels, lines[2:], strict=True):
        found = re.search(r"regret ([0-9.]+)", line)
        assert found is not None, line
        value[label] = float(found.group(1))
    assert value["constant:dynamo-legacy"] == 0.25  # wrong on half the windows, by half
    assert value["{}"] < 0.05  # the pattern is learnt from all eight training scenarios of a fold
    assert value["{} on 1 training scenarios per fold"] > value["{}"]  # one scenario shows one kind only


def test_a_count_that_is_not_positive_is_refused_in_one_line(tmp_path: Path) -> None:
    recipe = experiment(tmp_path, DEFAULT_FAMILY, rules=RULES)
    out = _run("--experiment", str(recipe), "--rollouts", str(_cache(tmp_path, 4)), "--train-scenarios", "0")
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == ["--train-scenarios: 0 is not a positive count"]


def test_switches_report_what_leaving_the_first_rule_gains_and_what_the_members_agree_on(tmp_path: Path) -> None:
    recipe = experiment(tmp_path, DEFAULT_FAMILY, rules=RULES, epochs=200, learning_rate=0.02, hidden_width=8)
    out = _run(
        "--experiment", str(recipe), "--rollouts", str(_cache(tmp_path, 10)), "--folds", "5", "--switches",
        "--variant", '{"ensemble_members": 2}',
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    switched = [line for line in lines if line.startswith("  switches off dynamo-legacy")]
    assert len(switched) == 2  # the recipe as it is and the ensemble variant; none for the constant rule
    # aggregated is best on the half of the windows where input 0 is 1, by 1.0 against legacy's 0.5: a fit that
    # learnt the pattern switches on that half and gains 0.25 per window of all the weight, losing on none
    for line in switched:
        assert "switched 0.500 of the weight, gain 0.2500 per window (0.500 per switched window)" in line, line
        assert "losing 0.000 of the switched" in line, line
    agreed = [line for line in lines if line.startswith("  those every member agrees on")]
    assert len(agreed) == 1
    assert "switched 0.500 of the weight" in agreed[0]


def test_switch_sums_count_a_switch_only_past_the_margin_and_with_every_member_when_asked() -> None:
    from tests.script_modules import load_script

    cv = load_script(REPO / "experiments" / "selector_cv.py", "selector_cv_for_switches")
    # three windows, two rules, two members; realized ratios: rule 1 wins window 0, loses windows 1 and 2
    members = np.array(
        [
            [[0.5, 0.9], [0.5, 0.9], [0.5, 0.52]],  # member 0: rule 1 ahead everywhere (window 2 within the margin)
            [[0.5, 0.9], [0.6, 0.5], [0.5, 0.52]],  # member 1 disagrees on window 1
        ]
    )
    realized = np.array([[0.5, 1.0], [1.0, 0.6], [1.0, 0.9]])
    weights = np.ones(3)
    # the mean: windows 0 and 1 switch (0.9 vs 0.5, 0.7 vs 0.55), window 2 is within the 0.05 margin
    sums = cv.switch_sums(members, realized, weights, 0.05, False)
    assert sums.tolist() == pytest.approx([2.0, 0.5 - 0.4, 1.0, 1.0, 3.0])
    agreed = cv.switch_sums(members, realized, weights, 0.05, True)
    assert agreed.tolist() == pytest.approx([1.0, 0.5, 0.0, 0.0, 3.0])
