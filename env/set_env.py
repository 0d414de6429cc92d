"""The gym env of the set policy: the cluster env with relative observations, pool moves and a scenario per episode.

:class:`SetPolicyEnv` wraps :class:`env.gym_env.PDClusterEnv` (which keeps doing the dynamics, the guard and the
reward through the shared control step) and changes only what the agent sees and does:

* observations are :func:`policies.set_features.build_set_observation` of the interval's window, padded to a
  :class:`~policies.set_features.SetLayout` — the vector :meth:`policies.set_policy.SetPolicy.decide` builds from
  the same window and context, so training and deployment read the same numbers;
* actions are :class:`policies.set_codec.SetActionCodec` vectors (pool moves per group, route levels per tenant);
* every reset draws a scenario from a :class:`ScenarioSource`: a fixed list, or a fresh generated scenario from
  a scenario family's seed split (:class:`FamilyDraw`), so a trainer sees a new layout, budget and tenant mix
  per episode.

All randomness comes from the seed given to :meth:`SetPolicyEnv.reset`: it draws the scenario (the family seed)
and the episode seed of the wrapped env, so the same seed gives the same episode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from env.families import ScenarioFamily, generate_scenario
from env.gym_env import PDClusterEnv, resolve_scenario
from env.scenario import Scenario
from policies.set_codec import SetActionCodec
from policies.set_features import SetLayout, build_set_observation

__all__ = ["FamilyDraw", "RewardScale", "ScenarioList", "ScenarioSource", "SetPolicyEnv"]


@dataclass(frozen=True)
class FamilyDraw:
    """Scenarios generated from one seed split of a family: a family seed drawn uniformly per episode."""

    family: ScenarioFamily
    split: str = "train"

    def __post_init__(self) -> None:
        self.family.split_seeds(self.split)  # refuses an unknown split in one line

    def first(self) -> Scenario:
        """The scenario of the split's first seed (what the env starts with before any reset)."""
        return generate_scenario(self.family, self.family.split_seeds(self.split)[0])

    def draw(self, rng: np.random.Generator) -> tuple[Scenario, int]:
        """A generated scenario and its family seed."""
        seeds = self.family.split_seeds(self.split)
        seed = int(seeds[int(rng.integers(len(seeds)))])
        return generate_scenario(self.family, seed), seed

    def describe(self) -> str:
        """``family:NAME#split`` (recorded in manifests)."""
        return f"family:{self.family.name}#{self.split}"


@dataclass(frozen=True)
class ScenarioList:
    """Scenarios (names, paths or instances) drawn uniformly per episode."""

    scenarios: tuple[str | Path | Scenario, ...]

    def __post_init__(self) -> None:
        if not self.scenarios:
            raise ValueError("scenarios: at least one scenario is needed")

    def first(self) -> Scenario:
        """The first scenario."""
        return resolve_scenario(self.scenarios[0])

    def draw(self, rng: np.random.Generator) -> tuple[Scenario, int | None]:
        """One of the scenarios (no family seed)."""
        return resolve_scenario(self.scenarios[int(rng.integers(len(self.scenarios)))]), None


ScenarioSource = FamilyDraw | ScenarioList
RewardScale = Literal["none", "offered"]
"""``none``: the wrapped env's reward (SLO-meeting requests minus costs); ``offered``: divided by the episode's
weighted arrivals per interval (:meth:`~env.gym_env.PDClusterEnv.offered_weighted_rps`), so a 4-GPU and a 96-GPU
scenario weigh alike in training (the goodput term becomes the weighted share of offered requests served)."""


class SetPolicyEnv(gym.Env[np.ndarray, np.ndarray]):
    """:class:`~env.gym_env.PDClusterEnv` seen through the set policy's observation and action codec.

    Args:
        source: where each episode's scenario comes from (a family split or a list).
        layout: the padding (most groups and tenants); a drawn scenario beyond it is refused in one line.
        reward_scale: :data:`RewardScale` (the unscaled reward is in ``info["reward_unscaled"]``).
        **env_kwargs: passed to :class:`~env.gym_env.PDClusterEnv` (reward weights, guard limits, …; not
            ``layout``: the wrapped env's own slot layout grows to fit every scenario).
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - the gymnasium attribute, never mutated

    def __init__(
        self,
        source: ScenarioSource,
        layout: SetLayout | None = None,
        *,
        reward_scale: RewardScale = "none",
        **env_kwargs: Any,
    ) -> None:
        if reward_scale not in ("none", "offered"):
            raise ValueError(f"reward_scale: {reward_scale!r} is not 'none' or 'offered'")
        self.reward_scale = reward_scale
        self._reward_unit = 1.0
        self.source = source
        self.layout = layout or SetLayout()
        self.codec = SetActionCodec(self.layout)
        self.observation_space = self.layout.observation_space()
        self.action_space = self.codec.action_space()
        first = source.first()
        self.layout.check_fits(len(first.tenant_groups), len(first.tenants))
        self.inner = PDClusterEnv(first, **env_kwargs)
        self.family_seed: int | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Draw a scenario (unless ``options["scenario"]`` names one) and start an episode on it.

        Raises:
            ValueError: the scenario has more groups or tenants than the padding (one line naming it).
        """
        super().reset(seed=seed)
        chosen = (options or {}).get("scenario")
        if chosen is not None:
            scenario, self.family_seed = resolve_scenario(chosen), None
        else:
            scenario, self.family_seed = self.source.draw(self.np_random)
        try:
            self.layout.check_fits(len(scenario.tenant_groups), len(scenario.tenants))
        except ValueError as exc:
            raise ValueError(f"scenario {scenario.name}: {exc}") from None
        _, info = self.inner.reset(seed=int(self.np_random.integers(0, 2**31 - 1)), options={"scenario": scenario})
        info["family_seed"] = self.family_seed
        self._reward_unit = 1.0
        if self.reward_scale == "offered":
            offered = self.inner.offered_weighted_rps() * scenario.control_interval_s
            self._reward_unit = offered if offered > 0 else 1.0
        info["reward_unit"] = self._reward_unit
        return self.observation_vector(), info

    def observation_vector(self) -> np.ndarray:
        """The padded set observation of the last interval (what :class:`~policies.set_policy.SetPolicy` sees)."""
        context = self.inner.policy_context().observation_context()
        return build_set_observation(self.inner.observation().window, context).to_vector(self.layout)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Decode ``action`` against the running state and run one control interval."""
        inner = self.inner
        decoded = self.codec.decode(
            np.asarray(action), inner.tenants, inner.groups, inner.current_pools(), inner.base_thresholds
        )
        _, reward, terminated, truncated, info = inner.step_control(decoded)
        info["reward_unscaled"] = reward
        return self.observation_vector(), reward / self._reward_unit, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """Valid values of every action dimension (concatenated), as sb3-contrib's ``MaskablePPO`` reads them."""
        inner = self.inner
        return self.codec.masks(inner.groups, inner.current_pools(), len(inner.tenants))

    @property
    def scenario_names(self) -> Sequence[str]:
        """Name of the running scenario (a one-element list, for ``VecEnv.get_attr``)."""
        return [self.inner.scenario.name]
