"""experiments/branch_labels.py: a rule branched from its own state achieves what its own run did in the window."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np

from agents.selector_data import RolloutTask, rule_rollout, window_goodput
from tests.agents.experiment_scripts import run_experiment_script

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "experiments/scenarios/chatbot-8.yaml"


def _branch(traces_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_experiment_script("branch_labels.py", SCENARIO, traces_dir, *args)


def _own_window_label(traces_dir: Path, rule: str, at_s: float) -> float:
    """The recipe's windowed label (four intervals) of ``rule``'s own rollout at its decision at ``at_s``."""
    (rollout,) = rule_rollout(RolloutTask(str(SCENARIO), rule, 1000, str(traces_dir)))
    assert rollout.decision_s is not None
    decision = int(np.flatnonzero(np.isclose(rollout.decision_s, at_s))[0])
    return float(window_goodput(rollout, 4)[decision])


def test_a_rule_branched_from_its_own_state_repeats_its_own_run_and_a_switch_costs_what_a_move_costs(
    traces_dir: Path,
) -> None:
    out = _branch(
        traces_dir, "--group", "main", "--at-s", "100", "--policy", "baseline:dynamo-legacy", "--seed", "1000"
    )
    assert out.returncode == 0, out.stderr
    cells = dict(re.findall(r"(\S+)=[0-9.]+ \(([0-9]+)\)", out.stdout))
    assert set(cells) == {"dynamo-legacy", "aggregated", "dynamo-isl-bounding", "dynamo-isl-or-load"}
    own = _own_window_label(traces_dir, "dynamo-legacy", 100.0)
    assert own > 0
    assert float(cells["dynamo-legacy"]) == own
    # aggregated from legacy's split pools must first move them; its own run never had to
    assert float(cells["aggregated"]) < _own_window_label(traces_dir, "aggregated", 100.0)


def test_a_group_the_scenario_lacks_is_refused_in_one_line(traces_dir: Path) -> None:
    out = _branch(traces_dir, "--group", "nope", "--at-s", "100")
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1] == f"--group: 'nope' is not a group of {SCENARIO}"
