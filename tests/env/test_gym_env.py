from __future__ import annotations

import inspect
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from gymnasium.utils.env_checker import data_equivalence
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import env as env_pkg
from env.gym_env import ENV_ID, PDClusterEnv
from env.reward import REWARD_TERMS, total
from policies.action_codec import ActionCodec
from policies.features import ObservationLayout, feature_table_markdown
from policies.schema import ControlAction, PoolTargets, RouteRule, RoutingThresholds

from .helpers import tiny_scenario


def _masked_sample(env: PDClusterEnv, rng: np.random.Generator) -> np.ndarray:
    mask = env.action_masks()
    out, offset = [], 0
    for size in env.codec.nvec:
        out.append(int(rng.choice(np.flatnonzero(mask[offset : offset + size]))))
        offset += int(size)
    return np.asarray(out, dtype=np.int64)


def _rollout(seed: int, steps: int = 11) -> list[tuple[object, ...]]:
    env = PDClusterEnv(tiny_scenario())
    rng = np.random.default_rng(123)
    obs, info = env.reset(seed=seed)
    out: list[tuple[object, ...]] = [(obs, info)]
    for _ in range(steps):
        out.append(env.step(_masked_sample(env, rng)))
    return out


def test_registered_lazily() -> None:
    assert env_pkg.ENV_ID == ENV_ID
    spec = gym.spec(ENV_ID)
    assert spec.entry_point == "env.gym_env:PDClusterEnv"
    code = "import sys, env; print('env.gym_env' in sys.modules, 'env.sim.simulator' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]


def test_gymnasium_checker_passes() -> None:
    env = gym.make(ENV_ID, scenario=tiny_scenario(), disable_env_checker=True)
    gym_check_env(env.unwrapped)


def test_sb3_checker_passes_without_warnings() -> None:
    # filterwarnings=error: any warning of SB3's checker fails the test
    sb3_check_env(PDClusterEnv(tiny_scenario()), warn=True)


def test_same_seed_same_trajectory() -> None:
    first, second = _rollout(7), _rollout(7)
    assert data_equivalence(first, second)


def test_other_seed_other_trajectory() -> None:
    assert not data_equivalence(_rollout(7), _rollout(8))


def test_episode_truncates_after_num_steps() -> None:
    env = PDClusterEnv(tiny_scenario(duration_s=100.0))
    obs, _ = env.reset(seed=0)
    assert obs in env.observation_space
    noop = env.codec.noop(env.tenants, env.thresholds)
    flags = [env.step(noop)[3] for _ in range(env.num_steps)]
    assert env.num_steps == 9
    assert flags == [False] * 8 + [True]
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(noop)


def test_info_carries_every_reward_term() -> None:
    env = PDClusterEnv(tiny_scenario())
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(env.codec.noop(env.tenants, env.thresholds))
    assert not terminated
    assert set(info["reward_terms"]) == set(REWARD_TERMS)
    assert reward == pytest.approx(total(info["reward_terms"]))
    assert info["reward_terms"]["goodput"] > 0
    # 8 GPUs held for one 10 s interval
    assert info["reward_terms"]["gpu_cost"] == pytest.approx(-0.01 * 80.0)


def test_actions_pass_through_the_guard() -> None:
    env = PDClusterEnv(tiny_scenario())
    env.reset(seed=0)
    ask = ControlAction(pools={"g0": PoolTargets(0, 4)})
    first = env.control(ask)  # hysteresis: asked once, held
    assert first.changes == 0
    assert env.current_pools()["g0"] == PoolTargets(2, 2)
    assert {c.reason.value for c in first.clamps} >= {"max_step", "hysteresis"}
    second = env.control(ask)  # asked twice: one step (max step 1 per pool)
    assert second.changes == 2
    assert env.current_pools()["g0"] == PoolTargets(1, 3)
    assert second.reward_terms["churn"] == pytest.approx(-2 * env.reward_weights.churn_cost_per_change)


def test_thresholds_reach_the_router() -> None:
    env = PDClusterEnv(tiny_scenario())
    env.reset(seed=0)
    local = RoutingThresholds(rule=RouteRule.AGGREGATED_ONLY)
    for _ in range(3):
        env.control(ControlAction(thresholds={"chat0": local, "rag0": local}))
    assert env.thresholds["chat0"] == local
    window = env.observation().window
    assert window.tenants["chat0"].remote_prefill_frac == 0.0
    assert window.tenants["rag0"].remote_prefill_frac == 0.0


def test_masks_match_the_codec_and_allow_noop() -> None:
    env = PDClusterEnv(tiny_scenario())
    env.reset(seed=0)
    mask = env.action_masks()
    assert mask.shape == (int(env.codec.nvec.sum()),)
    assert mask.dtype == bool
    noop = env.codec.noop(env.tenants, env.thresholds)
    offsets = np.concatenate([[0], np.cumsum(env.codec.nvec)[:-1]])
    assert mask[offsets + noop].all()


def test_reset_option_switches_scenario() -> None:
    env = PDClusterEnv(tiny_scenario())
    env.reset(seed=0)
    other = tiny_scenario(groups=2, name="two-groups")
    obs, info = env.reset(seed=0, options={"scenario": other})
    assert info["scenario"] == "two-groups"
    assert [g.name for g in env.groups] == ["g0", "g1"]
    assert obs in env.observation_space


def test_scenario_larger_than_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="exceed the layout"):
        PDClusterEnv(tiny_scenario(groups=2), layout=ObservationLayout(max_groups=1, max_tenants=4))


def test_without_a_layout_the_env_grows_to_fit_any_scenario() -> None:
    """Rule policies need no fixed slot layout: 3 groups / 6 tenants run, and the spaces follow the scenario."""
    env = PDClusterEnv(tiny_scenario())
    assert env.layout == ObservationLayout()  # shipped-size scenarios keep the default spaces
    obs, _ = env.reset(seed=0, options={"scenario": tiny_scenario(groups=3, name="three-groups")})
    assert (env.layout.max_groups, env.layout.max_tenants) == (3, 6)
    assert obs in env.observation_space
    assert env.action_space == env.codec.action_space()
    step = env.control(ControlAction())
    assert np.isfinite(step.reward)
    obs, *_ = env.step_control(ControlAction())
    assert obs in env.observation_space


def test_initial_pools_override() -> None:
    env = PDClusterEnv(tiny_scenario(), initial_pools={"g0": (0, 4)})
    env.reset(seed=0)
    assert env.current_pools()["g0"] == PoolTargets(0, 4)


def test_docstring_observation_table_is_the_feature_table() -> None:
    doc = inspect.cleandoc(PDClusterEnv.__doc__ or "")
    assert feature_table_markdown() in doc
    for section in ("## Action Space", "## Observation Space", "## Rewards", "## Episode End", "## Version History"):
        assert section in doc
    assert f"{len(ActionCodec(ObservationLayout()).nvec)} dimensions" in doc


def test_shipped_scenarios_fit_the_default_layout() -> None:
    from agents.evaluate import scenario_paths

    paths = scenario_paths(["suite:all"])
    assert len(paths) == 11
    for path in paths:
        env = PDClusterEnv(path)
        assert env.scenario.duration_s <= 1800
        assert {g.gpu_budget for g in env.groups} <= {8, 16}


def test_preempted_and_readmitted_request_finishes_once() -> None:
    # Regression (env.sim.engine): a request preempted under KV pressure and re-admitted could rejoin decoding
    # with the same finish step as its stale heap entry and be finished twice (KeyError in commit_decode_run).
    from agents.evaluate import RunSpec, run_one
    from env.gym_env import SCENARIO_DIR

    result = run_one(RunSpec("baseline:dynamo-load", str(SCENARIO_DIR / "batch-summarization-8.yaml"), 1))
    total = next(r for r in result.rows if r["tenant"] == "ALL")
    assert total["finished"] <= total["arrived"]


def test_peer_rules_see_their_live_inputs() -> None:
    # legacy Dynamo routes locally when the prefill queue holds >= 2 requests: the simulator must pass the queue
    from collections import Counter

    from agents.evaluate import make_policy

    env = PDClusterEnv("rag-surge-8")
    env.reset(seed=0)
    policy = make_policy("baseline:dynamo-legacy", env.scenario)
    while env.sim.now_s < env.scenario.duration_s:
        env.control(policy.decide(env.observation(), env.policy_context()))
    reasons = Counter(r.reason.value for per in env.sim.arrived for r in per)
    assert reasons["baseline_prefill_queue_full"] > 0
    assert reasons["baseline_uncached_above"] > reasons["baseline_prefill_queue_full"]
