"""The one episode loop (agents.runs): reset → observe → decide → control → drain, and the env it runs in."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.policy_specs import make_policy
from agents.runs import episode_env, run_episode, running, scale_bandwidth
from env.gym_env import ControlStep, PDClusterEnv
from policies.base import PolicyContext
from policies.features import Observation, ObservationLayout
from policies.policy_file import PolicyFile, resolve_policy
from policies.registry import load_policy
from policies.route_levels import route_thresholds
from policies.rules import FilePolicy
from policies.schema import ControlAction, RoutingThresholds
from tests.env.helpers import tiny_scenario
from tests.policies.test_learned import LAYOUT, write_artifact


def test_the_loop_is_the_env_driven_by_hand() -> None:
    scenario = tiny_scenario(duration_s=60.0)
    policy = make_policy("baseline:queue_kv", scenario)
    seen: list[ControlStep] = []
    horizon: list[float] = []
    env = episode_env(scenario, policy)
    episode = run_episode(env, policy, 5, lambda e, step: seen.append(step), lambda e: horizon.append(e.sim.now_s))
    assert episode.intervals == len(seen) == env.num_steps
    assert not episode.stopped
    assert horizon == [pytest.approx(scenario.duration_s)]
    assert episode.sim.num_in_flight == 0  # drained
    by_hand = PDClusterEnv(scenario)
    by_hand.reset(seed=5)
    same = make_policy("baseline:queue_kv", scenario)
    rewards = [
        by_hand.control(same.decide(by_hand.observation(), by_hand.policy_context())).reward
        for _ in range(by_hand.num_steps)
    ]
    assert not running(by_hand)
    sim = by_hand.drain()
    assert rewards == [step.reward for step in seen]
    assert (sim.num_finished, sim.num_failed) == (episode.sim.num_finished, episode.sim.num_failed)


def test_a_stop_check_ends_the_episode_without_draining() -> None:
    scenario = tiny_scenario(duration_s=60.0)
    policy = make_policy("baseline:vllm-proxy", scenario)
    asked: list[float] = []

    def stop(env: PDClusterEnv) -> bool:
        asked.append(env.sim.now_s)
        return len(asked) == 2

    episode = run_episode(episode_env(scenario, policy), policy, 0, stop=stop)
    assert episode.stopped
    assert episode.intervals == 2
    assert episode.sim.now_s == pytest.approx(asked[-1]) == pytest.approx(3 * scenario.control_interval_s)
    # asked through the drain too, one interval at a time, when it never says stop
    asked.clear()

    def never_stop(env: PDClusterEnv) -> bool:
        asked.append(env.sim.now_s)
        return False

    never = run_episode(episode_env(scenario, policy), policy, 0, stop=never_stop)
    assert not never.stopped
    assert max(asked) > scenario.duration_s
    assert never.sim.num_in_flight == 0


def test_a_file_policy_is_in_force_from_the_first_second(tmp_path: Path) -> None:
    scenario = tiny_scenario(duration_s=30.0)
    level = route_thresholds("remote>=512")
    static = FilePolicy(level, "static")
    env = episode_env(scenario, static)
    env.reset(seed=0)
    assert env.thresholds == {"chat0": level, "rag0": level}
    (tmp_path / "p.yaml").write_text("pd_disaggregation_policy: {remote_prefill: {min_input_tokens: 3000}}\n")
    from_file = make_policy(f"file:{tmp_path / 'p.yaml'}", scenario)
    env = episode_env(scenario, from_file)
    env.reset(seed=0)
    assert {t.min_remote_input_tokens for t in env.thresholds.values()} == {3000}
    # every other policy starts from the seed's thresholds and decides after the first interval
    env = episode_env(scenario, make_policy("baseline:queue_kv", scenario))
    env.reset(seed=0)
    assert set(env.thresholds.values()) == {RoutingThresholds()}


def test_layouts_learned_policies_fix_and_rule_policies_fit(tmp_path: Path) -> None:
    big = tiny_scenario(groups=3)  # 3 groups, 6 tenants: more than the default layout's slots
    env = episode_env(big, make_policy("baseline:vllm-proxy", big))
    assert (env.layout.max_groups, env.layout.max_tenants) == (3, 6)
    small = tiny_scenario()
    assert episode_env(small, make_policy("baseline:vllm-proxy", small)).layout == ObservationLayout()
    write_artifact(tmp_path / "artifact")
    learned = load_policy(f"learned:{tmp_path / 'artifact'}", resolve_policy(PolicyFile()))
    assert episode_env(small, learned).layout == LAYOUT
    with pytest.raises(ValueError, match=r"^scenario tiny: 3 groups / 6 tenants exceed the layout's 1 / 2 slots$"):
        episode_env(big, learned)


class _Bound:
    """A policy that needs its env (as the lookahead expert does)."""

    policy_id = "bound"

    def __init__(self) -> None:
        self.env: PDClusterEnv | None = None

    def bind(self, env: PDClusterEnv) -> None:
        self.env = env

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        assert self.env is not None, "decided before it was bound"
        return ControlAction(policy_id=self.policy_id)


def test_policies_that_need_the_env_are_bound_after_the_reset() -> None:
    scenario = tiny_scenario(duration_s=30.0)
    policy = _Bound()
    env = episode_env(scenario, policy)
    assert run_episode(env, policy, 0).intervals == env.num_steps
    assert policy.env is env


def test_scaling_the_link_rate_scales_the_base_rate_and_every_incident_that_sets_one() -> None:
    from env.scenario import NetworkIncidentConfig

    scenario = tiny_scenario()
    network = scenario.cluster.network.model_copy(
        update={
            "link_bandwidth_bytes_per_s": 40e9,
            "incidents": [
                NetworkIncidentConfig(start_s=10, end_s=20, link_bandwidth_bytes_per_s=2e9),
                NetworkIncidentConfig(start_s=30, end_s=40, failure_prob=0.5),
            ],
        }
    )
    scenario = scenario.model_copy(update={"cluster": scenario.cluster.model_copy(update={"network": network})})
    assert scale_bandwidth(scenario, 1.0) is scenario
    slow = scale_bandwidth(scenario, 0.1)
    assert slow.name == f"{scenario.name}@bw0.1"
    assert slow.cluster.network.link_bandwidth_bytes_per_s == pytest.approx(4e9)
    first, second = slow.cluster.network.incidents
    assert first.link_bandwidth_bytes_per_s == pytest.approx(2e8)
    assert second.link_bandwidth_bytes_per_s is None
    assert second.failure_prob == 0.5
    assert slow.cluster.network.setup_latency_s == network.setup_latency_s
    assert scenario.cluster.network.link_bandwidth_bytes_per_s == 40e9  # the original is untouched
