"""The lookahead expert: a receding-horizon choice between candidate policies in copies of the simulator.

At every control interval the expert snapshots the simulator (a pickle round trip of the env, its RNG streams
and the candidates' state), follows each candidate closed-loop for ``horizon_intervals`` intervals in its own
copy, and acts as the candidate with the highest summed reward. It is *clairvoyant*: its copies see the
episode's future arrivals, so it runs only in the simulator, never against a live cluster.

It serves two purposes:

* the imitation teacher of :mod:`agents.pretrain`, whose decisions are encoded into the learned policy's action
  space (:func:`encoded_step`);
* ``expert:H`` in :mod:`agents.policy_specs` (:class:`LookaheadPolicy`, decisions applied as they are,
  :func:`direct_step`): what switching between the baselines and the static configurations of the grid can win
  on a scenario over the best of them alone, before anyone trains a policy to try.

Choice rule (:class:`LookaheadChooser`): the expert keeps the ``default`` candidate, else the one it chose last
interval, unless another candidate's horizon return beats it by more than a margin (a fraction of the best
return); then it takes the best of those that do. The margin is ``switch_margin_frac``, or
``route_switch_margin_frac`` for a candidate whose copy ends the horizon with the same pool sizes as the kept
candidate's (a switch of routing thresholds only: instant and free to undo, where a pool move costs a role switch
now and pays off over minutes, beyond what a short horizon sees).

When the horizon covers the rest of the episode and the margins are 0, the expert's return is at least every
candidate's return alone (policy improvement by rollout: the candidate chosen now, continued, is one of the
options at the next interval).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from agents.runs import control_interval, running
from env.gym_env import PDClusterEnv
from policies.base import Policy, PolicyContext
from policies.features import Observation
from policies.schema import ControlAction

__all__ = [
    "LookaheadChooser",
    "LookaheadPolicy",
    "StepFn",
    "direct_step",
    "encoded_action",
    "encoded_step",
    "keep_current",
    "respect_masks",
]

StepFn = Callable[[PDClusterEnv, Policy], float]
"""Advance ``env`` one control interval acting as the policy; return the interval's reward."""


def respect_masks(action: np.ndarray, mask: np.ndarray, nvec: np.ndarray, noop: np.ndarray) -> np.ndarray:
    """Replace a masked value by the no-change action's value when allowed, else by the first allowed value."""
    out = action.copy()
    start = 0
    for i, size in enumerate(int(n) for n in nvec):
        allowed = mask[start : start + size]
        if not allowed[out[i]]:
            out[i] = int(noop[i]) if allowed[noop[i]] else int(np.flatnonzero(allowed)[0])
        start += size
    return out


def encoded_action(env: PDClusterEnv, policy: Policy) -> np.ndarray:
    """The action the learned policy would take to do what ``policy`` decides now (masks respected)."""
    context = env.policy_context()
    decision = policy.decide(env.observation(), context)
    encoded = env.codec.encode(decision, env.tenants, env.groups, context.current_pools, context.current_thresholds)
    noop = env.codec.noop(env.tenants, context.current_thresholds, env.groups, context.current_pools)
    return respect_masks(encoded, env.action_masks(), env.codec.nvec, noop)


def encoded_step(env: PDClusterEnv, policy: Policy) -> float:
    """One interval acting as ``policy`` through the action codec (what a learned policy could express)."""
    return float(env.step(encoded_action(env, policy))[1])


def direct_step(env: PDClusterEnv, policy: Policy) -> float:
    """One interval acting as ``policy`` with its decision applied as it is (through the guard)."""
    return control_interval(env, policy).reward


@dataclass(slots=True)
class LookaheadChooser:
    """The expert's choice rule and memory (see the module docstring).

    Attributes:
        horizon_intervals: intervals each candidate is followed in its copy.
        switch_margin_frac: how much better (a fraction of the best horizon return) another candidate must do for
            the expert to leave the kept one.
        default: the candidate kept first (``None``: none).
        chosen: the candidate chosen last (kept after ``default``).
        route_switch_margin_frac: the margin for a candidate that ends the horizon with the kept one's pool sizes
            (``None``: ``switch_margin_frac``).
        terminal: a value of the state a copy ends the horizon in, added to its return (``None``: none).
        last_returns: the candidates' horizon returns at the last choice.
    """

    horizon_intervals: int
    switch_margin_frac: float = 0.0
    default: int | None = None
    chosen: int = 0
    route_switch_margin_frac: float | None = None
    terminal: Callable[[PDClusterEnv], float] | None = None
    last_returns: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.horizon_intervals < 1:
            raise ValueError(f"horizon_intervals must be >= 1, got {self.horizon_intervals}")
        for name in ("switch_margin_frac", "route_switch_margin_frac"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {value}")
        if self.default is not None:
            self.chosen = self.default

    def horizon_rollouts(
        self, env: PDClusterEnv, policies: Sequence[Policy], step: StepFn
    ) -> tuple[np.ndarray, list[tuple[tuple[str, int, int], ...]]]:
        """Each candidate's summed reward over the horizon and the pool sizes its copy ends with.

        Every candidate is followed closed-loop in its own copy of ``env``.
        """
        snapshot = pickle.dumps((env, list(policies)), protocol=pickle.HIGHEST_PROTOCOL)
        returns = np.empty(len(policies))
        ends: list[tuple[tuple[str, int, int], ...]] = []
        for i in range(len(policies)):
            copy_env, copy_policies = pickle.loads(snapshot)  # our own bytes, made just above (never a file)
            total = 0.0
            for _ in range(self.horizon_intervals):
                if not running(copy_env):
                    break
                total += step(copy_env, copy_policies[i])
            if self.terminal is not None:
                total += self.terminal(copy_env)
            returns[i] = total
            pools = copy_env.current_pools()
            ends.append(tuple((g, p.num_prefill, p.num_decode) for g, p in sorted(pools.items())))
        return returns, ends

    def choose(self, env: PDClusterEnv, policies: Sequence[Policy], step: StepFn) -> int:
        """Index of the candidate to act as at this interval."""
        returns, ends = self.horizon_rollouts(env, policies, step)
        self.last_returns = returns
        scale = abs(float(returns.max()))
        route_margin = (
            self.switch_margin_frac if self.route_switch_margin_frac is None else self.route_switch_margin_frac
        )

        def beaten_by(kept: int) -> list[int]:
            margins = [route_margin if end == ends[kept] else self.switch_margin_frac for end in ends]
            return [i for i in range(len(returns)) if returns[i] > returns[kept] + margins[i] * scale + 1e-9]

        if self.default is not None and not beaten_by(self.default):
            self.chosen = self.default
        else:
            better = beaten_by(self.chosen)
            if better:
                self.chosen = max(better, key=lambda i: (returns[i], -i))
        return self.chosen


def keep_current(policies: Sequence[Policy], chosen: int, observation: Observation, context: PolicyContext) -> None:
    """Let every candidate but ``chosen`` see this interval too (stateful rules keep their own history current)."""
    for i, policy in enumerate(policies):
        if i != chosen:
            policy.decide(observation, context)


class LookaheadPolicy:
    """``expert:H``: the clairvoyant lookahead expert as a policy of an evaluation run.

    It needs the simulator it acts in (:meth:`bind`); :func:`agents.runs.run_episode` binds it. Decisions are
    the chosen candidate's, applied as they are.
    """

    def __init__(
        self, candidates: Mapping[str, Policy], horizon_intervals: int, policy_id: str, switch_margin_frac: float = 0.0
    ) -> None:
        if not candidates:
            raise ValueError(f"{policy_id}: needs at least one candidate policy")
        self._names = list(candidates)
        self._policies = list(candidates.values())
        self._chooser = LookaheadChooser(horizon_intervals, switch_margin_frac)
        self._policy_id = policy_id
        self._env: PDClusterEnv | None = None
        self.chosen_intervals: dict[str, int] = {}
        """How many intervals the expert acted as each candidate."""

    @property
    def policy_id(self) -> str:
        """The spec (``expert:H``)."""
        return self._policy_id

    @property
    def candidates(self) -> list[str]:
        """Names of the candidate policies, in order."""
        return list(self._names)

    def bind(self, env: PDClusterEnv) -> None:
        """Attach the simulator the expert acts in (its copies are taken from it every interval)."""
        self._env = env

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """The decision of the candidate with the best return over the horizon from the current state."""
        if self._env is None:
            raise RuntimeError(f"{self._policy_id}: the lookahead expert runs only in the simulator (not bound)")
        chosen = self._chooser.choose(self._env, self._policies, direct_step)
        name = self._names[chosen]
        self.chosen_intervals[name] = self.chosen_intervals.get(name, 0) + 1
        decision = self._policies[chosen].decide(observation, context)
        keep_current(self._policies, chosen, observation, context)
        return replace(decision, reason=f"{name}: {decision.reason}", policy_id=self._policy_id)
