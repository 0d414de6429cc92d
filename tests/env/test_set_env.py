"""The set policy's env: a generated scenario per episode, relative observations, pool moves, decide parity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from env.families import load_family
from env.set_env import FamilyDraw, ScenarioList, SetPolicyEnv
from policies.schema import ControlAction
from policies.set_features import SetLayout
from policies.set_policy import SetPolicy
from tests.env.helpers import tiny_scenario
from tests.policies.test_set_policy import write_set_artifact

FAMILY = Path(__file__).resolve().parents[2] / "experiments" / "families" / "default.yaml"


@pytest.fixture(scope="module")
def family_env() -> SetPolicyEnv:
    return SetPolicyEnv(FamilyDraw(load_family(FAMILY), "train"))


def _valid_action(env: SetPolicyEnv, rng: np.random.Generator) -> np.ndarray:
    mask = env.action_masks()
    action, start = [], 0
    for size in env.codec.nvec:
        action.append(int(rng.choice(np.flatnonzero(mask[start : start + size]))))
        start += int(size)
    return np.asarray(action)


def test_each_reset_draws_a_generated_training_scenario_deterministically(family_env: SetPolicyEnv) -> None:
    train = family_env.source.family.split_seeds("train")  # type: ignore[union-attr]
    seen = []
    for seed in (0, 1, 2):
        obs, info = family_env.reset(seed=seed)
        assert info["family_seed"] in train
        assert info["scenario"] == f"default-{info['family_seed']:05d}"
        assert family_env.observation_space.contains(obs)
        seen.append((info["family_seed"], obs))
    again, info = family_env.reset(seed=1)
    assert info["family_seed"] == seen[1][0]
    np.testing.assert_array_equal(again, seen[1][1])
    assert len({s for s, _ in seen}) == 3


def test_steps_stay_in_the_spaces_and_move_one_instance(family_env: SetPolicyEnv) -> None:
    rng = np.random.default_rng(0)
    family_env.reset(seed=5)
    before = family_env.inner.current_pools()
    for _ in range(3):
        action = _valid_action(family_env, rng)
        obs, reward, terminated, truncated, _ = family_env.step(action)
        assert family_env.observation_space.contains(obs)
        assert np.isfinite(reward)
        assert not terminated
        after = family_env.inner.current_pools()
        for name, pools in after.items():
            assert abs(pools.num_prefill - before[name].num_prefill) <= 1
        before = after
        if truncated:
            break


def test_the_env_sees_what_the_deployed_policy_sees(tmp_path: Path) -> None:
    """Acting on the env's vector and masks gives the action SetPolicy.decide takes on the same interval."""
    write_set_artifact(tmp_path)
    policy = SetPolicy.load(tmp_path)
    env = SetPolicyEnv(ScenarioList((tiny_scenario(groups=2),)))
    obs, _ = env.reset(seed=3)
    for _ in range(4):
        inner = env.inner
        decided = policy.decide(inner.observation(), inner.policy_context())
        encoded = policy.act(obs, env.action_masks())
        via_env = env.codec.decode(encoded, inner.tenants, inner.groups, inner.current_pools(), inner.base_thresholds)
        assert decided.pools == via_env.pools
        assert decided.thresholds == via_env.thresholds
        obs, *_ = env.step(encoded)


def test_a_scenario_beyond_the_padding_is_refused_in_one_line() -> None:
    env = SetPolicyEnv(ScenarioList((tiny_scenario(groups=1),)), SetLayout(max_groups=1, max_tenants=2))
    with pytest.raises(ValueError, match=r"^scenario tiny: 2 groups / 4 tenants exceed the set policy's maximum"):
        env.reset(seed=0, options={"scenario": tiny_scenario(groups=2)})


def test_offered_reward_scale_divides_by_the_episodes_weighted_arrivals_per_interval() -> None:
    units = []
    for rate_rps in (2.0, 4.0):
        scenario = tiny_scenario(rate_rps=rate_rps)
        env = SetPolicyEnv(ScenarioList((scenario,)), reward_scale="offered")
        _, info = env.reset(seed=0)
        unit = info["reward_unit"]
        expected = env.inner.offered_weighted_rps() * scenario.control_interval_s
        assert unit == pytest.approx(expected)
        inner = env.inner
        hold = env.codec.encode(ControlAction(), inner.tenants, inner.groups, inner.current_pools(), inner.thresholds)
        _, reward, _, _, step_info = env.step(hold)
        assert reward == pytest.approx(step_info["reward_unscaled"] / unit)
        units.append(unit)
    assert 1.5 < units[1] / units[0] < 2.5  # twice the arrivals, about twice the unit
    with pytest.raises(ValueError, match="reward_scale: 'goodput' is not 'none' or 'offered'"):
        SetPolicyEnv(ScenarioList((tiny_scenario(),)), reward_scale="goodput")  # type: ignore[arg-type]
