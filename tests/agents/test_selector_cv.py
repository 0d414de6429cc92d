"""experiments/selector_cv.py: grouped cross-validation of the selector's fit, and its learning curve."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

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
