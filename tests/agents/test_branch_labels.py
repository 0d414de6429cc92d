"""experiments/branch_labels.py: a rule branched from its own state achieves what its own run did in the window."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np

from agents.harness import slo_met_arrivals_s
from agents.policy_specs import make_policy
from agents.runs import episode_env, run_episode
from env.gym_env import resolve_scenario
from tests.agents.experiment_scripts import run_experiment_script

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "experiments/scenarios/chatbot-8.yaml"


def _branch(traces_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_experiment_script("branch_labels.py", SCENARIO, traces_dir, *args)


def _own_window_met(traces_dir: Path, rule: str, start_s: float, end_s: float) -> float:
    """The priority-weighted requests of group main arriving in [start_s, end_s) that met both objectives."""
    scenario = resolve_scenario(SCENARIO, str(traces_dir))
    policy = make_policy(f"baseline:{rule}", scenario)
    env = episode_env(scenario, policy, str(traces_dir))
    sim = run_episode(env, policy, 1000).sim
    total = 0.0
    for index, tenant in enumerate(env.tenants):
        arrivals = np.asarray(slo_met_arrivals_s(sim, index))
        total += tenant.priority * float(((arrivals >= start_s) & (arrivals < end_s)).sum())
    return total


def test_a_rule_branched_from_its_own_state_repeats_its_own_run_and_a_switch_costs_what_a_move_costs(
    traces_dir: Path,
) -> None:
    out = _branch(
        traces_dir, "--group", "main", "--at-s", "100", "--policy", "baseline:dynamo-legacy", "--seed", "1000"
    )
    assert out.returncode == 0, out.stderr
    cells = dict(re.findall(r"(\S+)=[0-9.]+ \(([0-9]+),", out.stdout))
    assert set(cells) == {"dynamo-legacy", "aggregated", "dynamo-isl-bounding", "dynamo-isl-or-load"}
    own = _own_window_met(traces_dir, "dynamo-legacy", 100.0, 140.0)
    assert own > 0
    assert float(cells["dynamo-legacy"]) == own
    # aggregated from legacy's split pools must first move them; its own run never had to
    assert float(cells["aggregated"]) < _own_window_met(traces_dir, "aggregated", 100.0, 140.0)


def test_a_group_the_scenario_lacks_is_refused_in_one_line(traces_dir: Path) -> None:
    out = _branch(traces_dir, "--group", "nope", "--at-s", "100")
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1] == f"--group: 'nope' is not a group of {SCENARIO}"
