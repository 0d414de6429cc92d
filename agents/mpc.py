"""``mpc:H``: a model-predictive controller that does not look ahead, over the calibrated simulator.

At every control interval the controller copies the simulator it acts in, replaces the copy's future by a
persistence forecast built only from what the router has seen (:func:`env.sim.forecast.apply_persistence_forecast`:
the last ``window_s`` of arrivals repeated, the network as it is now, a fresh random stream), and follows each
candidate closed-loop in its own copy of that forecast for ``H`` intervals (:class:`agents.lookahead.LookaheadChooser`,
the same receding-horizon choice the clairvoyant expert makes). It then acts as the candidate with the best summed
reward (the one scoring function, :mod:`policies.scoring`, through the env's reward).

Candidates, every interval:

* each rule of :data:`MPC_RULES`, as it would act (routing thresholds; pool targets when the rule sets them);
* the rule kept now, plus **one instance moved toward prefill or toward decode** in one tenant group (for every
  group and both directions the pool bounds allow): a move relative to the running pools, never an absolute count.

The return of a copy is its rewards over the horizon plus a terminal term, :func:`missed_in_flight`: requests
still in flight at the horizon's end that have already missed their TTFT objective count as lost (a short horizon
would otherwise prefer a policy that leaves a growing queue behind it).

A threshold switch is taken when it beats the kept rule by ``route_switch_margin_frac`` of the best return, a pool
move only by ``switch_margin_frac`` (a role switch costs a drain and a restart and pays off beyond a short
horizon). After a move the kept candidate is the rule again.

It needs the simulator (:meth:`MpcPolicy.bind`, done by :func:`agents.runs.run_episode`), so it runs in evaluation
and as a teacher, not against a live cluster. :attr:`MpcPolicy.decide_times_s` records the wall time of each
decision.
"""

from __future__ import annotations

import math
import pickle
import time
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from agents.lookahead import LookaheadChooser, direct_step, keep_current
from env.gym_env import PDClusterEnv
from env.sim.forecast import apply_persistence_forecast
from env.sim.records import SimRequest
from policies.base import Policy, PolicyContext
from policies.features import Observation
from policies.schema import ControlAction, PoolTargets, TenantGroup

__all__ = ["MPC_RULES", "MpcPolicy", "PoolStep", "missed_in_flight", "pool_steps"]

MPC_RULES: tuple[str, ...] = (
    "baseline:dynamo-legacy",
    "baseline:aggregated",
    "baseline:dynamo-isl-or-load",
    "baseline:dynamo-isl-bounding",
    "baseline:queue_kv",
)
"""The rule candidates of ``mpc:H`` (the first is kept at the start)."""


class PoolStep:
    """A candidate: ``base`` as it decides, with one instance of ``group`` moved at its first decision only."""

    def __init__(self, base: Policy, group: str, toward_prefill: bool) -> None:
        self._base = base
        self._group = group
        self._toward_prefill = toward_prefill
        self._moved = False

    @property
    def policy_id(self) -> str:
        """The base rule's id and the move (``…+prefill@g0``)."""
        return f"{self._base.policy_id}+{'prefill' if self._toward_prefill else 'decode'}@{self._group}"

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """The base decision; the first time, also the group's running pools with one instance moved."""
        decision = self._base.decide(observation, context)
        if self._moved:
            return decision
        self._moved = True
        current = context.current_pools[self._group]
        step = 1 if self._toward_prefill else -1
        pools = dict(decision.pools)
        pools[self._group] = PoolTargets(current.num_prefill + step, current.num_decode - step)
        return replace(decision, pools=pools)


def missed_in_flight(env: PDClusterEnv) -> float:
    """Minus the priority-weighted requests in flight that have already missed their TTFT objective.

    Counted over the requests the simulator lists as arrived (in a forecast copy: those of the window in progress
    and after), in the reward's unit (``goodput_weight`` per request of priority 1).
    """
    sim = env.sim
    now_s = sim.now_s
    lost = 0.0
    for ti, tenant in enumerate(env.tenants):
        target_s = sim.slo_ttft_s[ti]
        for request in sim.arrived[ti]:
            if request.status != SimRequest.IN_FLIGHT:
                continue
            first_s = request.first_token_s
            if (now_s if math.isnan(first_s) else first_s) - request.arrival_s > target_s:
                lost += tenant.priority
    return -env.reward_weights.goodput_weight * lost


def _move_allowed(group: TenantGroup, current: PoolTargets, toward_prefill: bool) -> bool:
    prefill = current.num_prefill + (1 if toward_prefill else -1)
    decode = current.num_decode - (1 if toward_prefill else -1)
    max_prefill = group.max_prefill if group.max_prefill is not None else group.max_instances
    max_decode = group.max_decode if group.max_decode is not None else group.max_instances
    return group.min_prefill <= prefill <= max_prefill and group.min_decode <= decode <= max_decode


def pool_steps(base: Policy, context: PolicyContext) -> list[PoolStep]:
    """Every one-instance move of ``base`` the groups' bounds allow, in group order (prefill first)."""
    steps = []
    for group in context.groups:
        current = context.current_pools.get(group.name)
        if current is None:
            continue
        for toward_prefill in (True, False):
            if _move_allowed(group, current, toward_prefill):
                steps.append(PoolStep(base, group.name, toward_prefill))
    return steps


class MpcPolicy:
    """``mpc:H`` (module docstring).

    Args:
        rules: the rule candidates by name (the first is kept at the start).
        horizon_intervals: intervals each candidate is followed in its forecast copy.
        policy_id: the spec.
        window_s: how much recent traffic the forecast repeats (default: four control intervals).
        seed: seed of the forecast copies' random streams.
        switch_margin_frac: the margin a pool move needs over the kept rule.
        route_switch_margin_frac: the margin a threshold switch needs.
    """

    def __init__(
        self,
        rules: Mapping[str, Policy],
        horizon_intervals: int,
        policy_id: str,
        window_s: float | None = None,
        seed: int = 0,
        switch_margin_frac: float = 0.05,
        route_switch_margin_frac: float = 0.02,
    ) -> None:
        if not rules:
            raise ValueError(f"{policy_id}: needs at least one rule candidate")
        self._names = list(rules)
        self._rules = list(rules.values())
        self._chooser = LookaheadChooser(
            horizon_intervals,
            switch_margin_frac,
            route_switch_margin_frac=route_switch_margin_frac,
            terminal=missed_in_flight,
        )
        self._policy_id = policy_id
        self._window_s = window_s
        self._rng = np.random.default_rng(seed)
        self._env: PDClusterEnv | None = None
        self.chosen_intervals: dict[str, int] = {}
        """How many intervals the controller acted as each candidate (moves as ``rule+prefill@group``)."""
        self.decide_times_s: list[float] = []
        """Wall time of every decision, seconds."""
        self.forecast_returns: list[list[float]] = []
        """Every decision's forecast horizon returns, one per candidate (rules first, then pool moves)."""

    @property
    def policy_id(self) -> str:
        """The spec (``mpc:H``)."""
        return self._policy_id

    def bind(self, env: PDClusterEnv) -> None:
        """Attach the simulator the controller acts in (its forecast copies are taken from it)."""
        self._env = env

    def _forecast_env(self, env: PDClusterEnv, interval_s: float) -> PDClusterEnv:
        copy: PDClusterEnv = pickle.loads(pickle.dumps(env, protocol=pickle.HIGHEST_PROTOCOL))  # our own bytes
        window_s = self._window_s if self._window_s is not None else 4 * interval_s
        horizon_s = self._chooser.horizon_intervals * interval_s
        apply_persistence_forecast(copy.sim, window_s, horizon_s, int(self._rng.integers(2**63)))
        return copy

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """The decision of the candidate with the best forecast return over the horizon."""
        if self._env is None:
            raise RuntimeError(f"{self._policy_id}: the model-predictive controller runs only in the simulator")
        start_s = time.perf_counter()
        kept = self._chooser.chosen
        forecast = self._forecast_env(self._env, context.interval_s)
        candidates: list[Policy] = [*self._rules, *pool_steps(self._rules[kept], context)]
        chosen = self._chooser.choose(forecast, candidates, direct_step)
        returns = self._chooser.last_returns
        self.forecast_returns.append([] if returns is None else [float(r) for r in returns])
        if chosen < len(self._rules):
            name = self._names[chosen]
            decision = self._rules[chosen].decide(observation, context)
            acting = chosen
        else:
            step = pool_steps(self._rules[kept], context)[chosen - len(self._rules)]
            name = step.policy_id
            decision = step.decide(observation, context)  # decides as the kept rule (it holds the real rule)
            acting = kept
            self._chooser.chosen = kept
        keep_current(self._rules, acting, observation, context)
        self.chosen_intervals[name] = self.chosen_intervals.get(name, 0) + 1
        self.decide_times_s.append(time.perf_counter() - start_s)
        return replace(decision, reason=f"{name}: {decision.reason}", policy_id=self._policy_id)
