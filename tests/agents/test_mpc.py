"""``mpc:H``: the persistence forecast its copies see, and the controller as an evaluation policy."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest
import yaml

from agents.mpc import MPC_RULES, MpcPolicy, PoolStep, missed_in_flight, pool_steps
from agents.policy_specs import make_policy
from agents.runs import episode_env, run_episode
from env.gym_env import ControlStep, PDClusterEnv, resolve_scenario
from env.sim.base import EVENT_NETWORK
from env.sim.forecast import apply_persistence_forecast
from env.sim.records import SimRequest
from policies.registry import PolicySpecError
from policies.schema import PoolTargets
from tests.env.helpers import tiny_scenario

INCIDENT = {
    "link_bandwidth_bytes_per_s": 4.5e10,
    "incidents": [{"start_s": 60, "end_s": 80, "link_bandwidth_bytes_per_s": 1.0e9, "failure_prob": 0.3}],
}


@pytest.fixture
def scenario_path(tmp_path: Path) -> Path:
    """Twelve control intervals of 10 s, two tenants, a network incident in the middle."""
    path = tmp_path / "tiny.yaml"
    scenario = tiny_scenario(duration_s=120.0, rate_rps=3.0, network=INCIDENT)
    path.write_text(yaml.safe_dump(scenario.model_dump(mode="json")))
    return path


def _env_at(scenario_path: Path, now_s: float) -> PDClusterEnv:
    scenario = resolve_scenario(scenario_path)
    policy = make_policy("baseline:dynamo-legacy", scenario)
    env = episode_env(scenario, policy)
    env.reset(seed=3)
    while env.sim.now_s < now_s:
        env.control(policy)
    return env


def test_the_forecast_repeats_the_last_window_and_forgets_the_scheduled_future(scenario_path: Path) -> None:
    env = _env_at(scenario_path, 50.0)
    real = env.sim
    copy = pickle.loads(pickle.dumps(env)).sim
    arrived = real._next
    window = [i for i in range(arrived) if real._arrival_s[i] >= 50.0 - 20.0]
    count = apply_persistence_forecast(copy, window_s=20.0, horizon_s=30.0, seed=1)
    future = range(arrived, copy.num_requests)
    assert count == len(future) > 0
    # only repeats of what arrived in the window: same tenants and lengths, shifted by whole windows, within the horizon
    assert all(50.0 <= copy._arrival_s[i] <= 80.0 for i in future)
    assert copy._arrival_s[arrived:] == sorted(copy._arrival_s[arrived:])
    observed = {(real._tenant_of[i], real._input[i], real._output[i]) for i in window}
    assert {(copy._tenant_of[i], copy._input[i], copy._output[i]) for i in future} <= observed
    assert len(future) == pytest.approx(len(window) * 1.5, abs=len(window) * 0.5 + 1)
    # the incident's start and end are no longer scheduled in the copy; the real run still has them
    assert not any(e[2] == EVENT_NETWORK for e in copy._heap)
    assert any(e[2] == EVENT_NETWORK for e in real._heap)
    assert real.num_requests > copy.num_requests  # the real future is untouched (and longer than the horizon)
    # the copy runs on: its forecast requests arrive under ids of their own (no clash with in-flight ones)
    copy.run_until(80.0)
    ids = [r.request_id for t in copy.arrived for r in t]
    assert len(ids) == len(set(ids))
    assert copy.forecast_from == arrived


def test_a_forecast_needs_a_positive_window(scenario_path: Path) -> None:
    env = _env_at(scenario_path, 15.0)
    with pytest.raises(ValueError, match="window_s"):
        apply_persistence_forecast(env.sim, window_s=0.0, horizon_s=30.0, seed=1)


def test_pool_steps_move_one_instance_within_the_bounds(scenario_path: Path) -> None:
    env = _env_at(scenario_path, 15.0)
    context = env.policy_context()
    base = make_policy("baseline:dynamo-legacy", env.scenario)
    steps = pool_steps(base, context)
    group = context.groups[0]
    current = context.current_pools[group.name]
    decisions = [s.decide(env.observation(), context) for s in steps]
    for decision in decisions:
        moved = decision.pools[group.name]
        assert moved.num_instances == current.num_instances
        assert abs(moved.num_prefill - current.num_prefill) == 1
        assert group.min_prefill <= moved.num_prefill
        assert group.min_decode <= moved.num_decode
    # a step moves once; afterwards it decides as its base rule
    assert steps[0].decide(env.observation(), context).pools == base.decide(env.observation(), context).pools
    at_min = PoolTargets(group.min_prefill, current.num_instances - group.min_prefill)
    bounded = [
        s
        for s in pool_steps(base, type(context)(context.tenants, context.groups, {group.name: at_min}, {}))
        if isinstance(s, PoolStep) and "decode" in s.policy_id
    ]
    assert bounded == []  # no move below the prefill minimum


def test_missed_in_flight_counts_queued_requests_past_their_ttft_objective(scenario_path: Path) -> None:
    env = _env_at(scenario_path, 30.0)
    assert missed_in_flight(env) <= 0.0
    sim = env.sim
    request = next(r for t in sim.arrived for r in t)
    request.status = SimRequest.IN_FLIGHT
    request.first_token_s = math.nan  # no token yet
    request.arrival_s = sim.now_s - 10 * sim.slo_ttft_s[request.tenant] - 1.0
    priority = env.tenants[request.tenant].priority
    before = missed_in_flight(env)
    request.arrival_s = sim.now_s
    assert missed_in_flight(env) == pytest.approx(before + priority)


def test_mpc_runs_as_an_evaluation_policy_and_is_deterministic(scenario_path: Path) -> None:
    scenario = resolve_scenario(scenario_path)
    runs = []
    for _ in range(2):
        policy = make_policy("mpc:2", scenario)
        assert isinstance(policy, MpcPolicy)
        env = episode_env(scenario, policy)
        steps: list[ControlStep] = []
        run_episode(env, policy, seed=5, on_interval=lambda _env, step: steps.append(step))  # noqa: B023
        reasons = [step.action.reason for step in steps]
        runs.append((reasons, dict(policy.chosen_intervals)))
        assert sum(policy.chosen_intervals.values()) == len(reasons) == len(policy.decide_times_s) > 8
        assert all(name.split("+")[0] in MPC_RULES for name in policy.chosen_intervals)
    assert runs[0] == runs[1]


def test_mpc_does_not_see_the_future(scenario_path: Path) -> None:
    """Two runs whose arrivals agree until 60 s and differ after it decide and forecast alike until 60 s."""
    scenario = resolve_scenario(scenario_path)
    decided: list[list[str]] = []
    for keep_future in (True, False):
        policy = make_policy("mpc:3", scenario)
        env = episode_env(scenario, policy)
        reasons: list[str] = []

        def on_interval(
            env: PDClusterEnv, step: ControlStep, reasons: list[str] = reasons, keep: bool = keep_future
        ) -> None:
            reasons.append(f"{env.sim.now_s:.0f} {step.action.reason}")
            if not keep and len(reasons) == 1:  # a flood of long prompts from 60 s on, in this run only
                sim = env.sim
                late = [i for i in range(sim._next, sim.num_requests) if sim._arrival_s[i] >= 60.0]
                for i in late:
                    sim._input[i] = 8 * sim._input[i]

        run_episode(env, policy, seed=5, on_interval=on_interval)
        assert isinstance(policy, MpcPolicy)
        decided.append([f"{r} {policy.forecast_returns[i]}" for i, r in enumerate(reasons)])
    until = [r for r in decided[0] if float(r.split()[0]) <= 60.0]
    assert len(until) >= 5
    assert decided[1][: len(until)] == until
    assert decided[0] != decided[1]  # the changed future did change later forecasts (the test can tell)


def test_mpc_spec_errors_name_the_spec() -> None:
    scenario = tiny_scenario()
    with pytest.raises(PolicySpecError, match=r"mpc:0.*horizon"):
        make_policy("mpc:0", scenario)


def test_an_unbound_mpc_policy_says_it_needs_the_simulator(scenario_path: Path) -> None:
    env = _env_at(scenario_path, 15.0)
    policy = make_policy("mpc:2", env.scenario)
    with pytest.raises(RuntimeError, match="simulator"):
        policy.decide(env.observation(), env.policy_context())
