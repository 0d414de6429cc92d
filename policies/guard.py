"""The safety guard: every action passes through it before anything is actuated.

:meth:`SafetyGuard.apply` is pure and deterministic. It takes the policy's action, the context (bounds,
budget, running counts), the metric window the action was computed from and the guard's own state (cooldown
clocks and hysteresis streaks), and returns the clamped action, one :class:`Clamp` per adjustment and the
next state. Nothing is mutated.

Checks per tenant group, in order (each can only move the target towards what is running or what is
feasible; a group running outside its bounds or budget is moved towards them, at most ``max_step_per_tick``
per pool and never down on stale or missing data; :mod:`policies.pool_clamp` has the details):

1. no running counts for the group, or no opinion → nothing to do;
2. pool bounds (``min_*``/``max_*``; a missing max means "what the budget allows"; decode keeps at least one
   instance, which every request needs; an empty prefill pool fails no request: the router serves locally);
3. what may run: increases are cut until ``prefill + decode`` fits the GPU budget and the group's **live
   capacity** (``context.capacity``: its healthy instances when the instance set is fixed, as under the router
   actuator; ``live_capacity``); no pool leaves its bounds to bring the other into them;
4. max step: each pool moves at most ``max_step_per_tick`` instances per tick;
5. never scale down on stale data (``staleness_s > max_staleness_s``) or on missing data for the group
   (no group window, no decode KV usage, or a tenant of the group without a request rate);
6. a change still pending (instances starting or draining) → hold;
7. cooldown: no change within ``cooldown_s`` of the last applied change;
8. **pool reversal hold**: a change that shrinks a pool the group's last applied change grew, within
   ``pool_reversal_hold_s`` of it, by the same deciding policy, is held (below);
9. hysteresis: the same direction must be asked for ``hysteresis_ticks`` ticks in a row.

The pool reversal hold is the pools' counterpart of the threshold reversal hold below: a sizer that adds a
prefill instance and gives it back three minutes later (measured: ``queue_kv`` in the simulated week,
``benchmarks/results/soak.md``) pays two instance restarts for nothing. Only the give-back is held, never a pool
that grows: like an autoscaler's scale-down stabilization window, capacity asked for by rising load is never
delayed. Holding both directions was measured first and cost the reactive sizers most of their goodput where load
rises again within the hold (a flood after a quiet start: ``keda-queue`` 0.85 → 0.14 req/s on ``short-flood-8``);
holding only the give-back raised it (geometric mean over the four pool-sizing rules on the six dynamic scenarios
1.28× no hold, both directions 0.63×; ``experiments/results/families/pool-hold/``). Not held: a move by another
policy (a handover exists to undo what the previous policy did), a move asked for with a change of the route rule of a
tenant of the group (the rule selector moving the group to another rule, whose pools must act as that rule
sets them; the group's move memory is forgotten then, so the new rule's next ticks are not held either), a
group running outside its bounds or above what may run (a correction, never held), and the rollback on a broken
transfer path (below; it leaves no move to reverse, so the way back to a split is not held either).

**Rollback on a broken transfer path.** When the window shows the group's KV-transfer path unusable
(:func:`policies.transfer_fallback.remote_path_unusable`: half its remote legs failed, or their p95 transfer time
reached the loosest TTFT objective of its tenants) and the target moves toward aggregated serving (fewer prefill
instances, no fewer decode instances), checks 4 and 6 to 9 are waived: the move is applied in one tick, noted
as a ``transfer_rollback`` clamp. Bounds, budget and the data checks still apply (on stale data nothing is judged
unusable). With the remote path gone the prefill pool serves nobody, and each paced tick leaves the decode pool
alone under the whole load, building a backlog that can outlast the incident. The way back to a split is paced
as usual.

Per tenant, in order: thresholds for unknown tenants are dropped; on stale data thresholds are held; a tenant's
thresholds change at most once per ``cooldown_s`` (a change of the route rule excepted, below); then **threshold
hysteresis**:

* *dead band*: a change that moves every ordered threshold (the numeric fields of
  :class:`~policies.schema.RoutingThresholds`, :data:`ORDERED_THRESHOLD_FIELDS`) by less than
  ``threshold_dead_band_frac`` of its value, and changes nothing else, is held;
* *reversal hold*: a change that moves an ordered threshold in the direction opposite to that field's last
  applied move, within ``threshold_reversal_hold_s`` of that move, **by the same deciding policy**
  (``ControlAction.policy_id``), is refused (the whole change: the tenant's thresholds stay as they are). A
  policy that lowers a tenant's remote-prefill threshold and relaxes it back the next interval (the 544
  reversals per simulated week of ``benchmarks/results/soak.md``) so settles on one side for at least the hold.
  A move by another policy is not held: a handover (the SLO watchdog's fallback taking over from the primary,
  or a reloaded policy) exists to undo what the previous policy did, at once; the watchdog's own hold bounds
  how often handovers happen. Nor is a change of the **route rule** (``rule``): that is a handover between
  rules within one policy (the rule selector, :mod:`policies.rule_selector`, moving a group from one rule to
  another), and the new rule's thresholds must act as that rule set them, or the group runs a rule nobody chose
  (measured: on a generated scenario the selector's switch to ``dynamo-legacy`` was refused for ten minutes and
  the old rule kept running under the new rule's name). How often a policy switches rules is its own hysteresis'
  business (the selector's patience). For the same reason a change of the route rule passes the **cooldown**
  too (measured: on a validation scenario the selector named legacy again 20 s after its previous switch, and the
  cooldown kept the other rule's routing for 40 s, until the selector, judging legacy on that rule's windows,
  named the other rule again); it still counts as an applied change, so the cooldown restarts from it.

Changes of the non-ordered fields (booleans such as ``disaggregation_enabled``, the route rule, fallback
actions, models, buckets) pass the dead band and have no direction: only the cooldown applies to them (and not
to the route rule). An
operator's rollback is an override, applied after the guard, and is never held by it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from policies.base import PolicyContext
from policies.pool_clamp import Clamp, ClampReason, PoolClamp, group_data_complete
from policies.schema import ControlAction, MetricWindow, PoolTargets, RoutingThresholds, TenantGroup
from policies.transfer_fallback import remote_path_unusable

__all__ = [
    "ORDERED_THRESHOLD_FIELDS",
    "Clamp",
    "ClampReason",
    "GroupGuardState",
    "GuardLimits",
    "GuardResult",
    "GuardState",
    "SafetyGuard",
    "ThresholdMove",
]

ORDERED_THRESHOLD_FIELDS: tuple[str, ...] = (
    "min_remote_input_tokens",
    "max_local_input_tokens",
    "max_prefill_queue_wait_s",
    "min_expected_output_tokens",
    "decode_pressure_threshold_frac",
    "traffic_percent",
    "uncached_ratio_threshold_frac",
    "max_prefill_queue_requests",
    "prefill_busy_factor",
)
"""Numeric fields of :class:`~policies.schema.RoutingThresholds` that have a direction (up / down): the ones the
dead band and the reversal hold look at. Every other field is a switch or a set (no direction)."""


@dataclass(frozen=True, slots=True)
class GuardLimits:
    """Limits of the guard.

    Attributes:
        max_step_per_tick: most instances one pool may gain or lose in one tick.
        cooldown_s: seconds after an applied change during which the group is held.
        hysteresis_ticks: consecutive ticks a change must be asked for (same direction) before it is applied.
        max_staleness_s: a window older than this is stale: no scale-down, thresholds held.
        threshold_dead_band_frac: a routing-threshold change smaller than this fraction of every ordered field's
            value is held (0 = off). Default 0.05: a 5 % nudge is noise; the rule policy's steps are 25 %.
        threshold_reversal_hold_s: seconds after a threshold field moved during which a move of that field in
            the opposite direction is refused (0 = off). Default 600 s: ten one-minute intervals, the window in
            which the soak counts a reversal as flapping.
        pool_reversal_hold_s: seconds after a group's pools changed during which a move that shrinks a pool that
            change grew, by the same policy, is held (0 = off; a growing pool is never held). Default 600 s: the
            window in which the soak counts a pool flap.
    """

    max_step_per_tick: int = 1
    cooldown_s: float = 60.0
    hysteresis_ticks: int = 2
    max_staleness_s: float = 30.0
    threshold_dead_band_frac: float = 0.05
    threshold_reversal_hold_s: float = 600.0
    pool_reversal_hold_s: float = 600.0

    def __post_init__(self) -> None:
        if self.max_step_per_tick < 1:
            raise ValueError("max_step_per_tick must be >= 1")
        if self.cooldown_s < 0 or self.max_staleness_s < 0:
            raise ValueError("cooldown_s and max_staleness_s must be >= 0")
        if self.hysteresis_ticks < 1:
            raise ValueError("hysteresis_ticks must be >= 1")
        if not 0.0 <= self.threshold_dead_band_frac < 1.0:
            raise ValueError(f"threshold_dead_band_frac must be within [0, 1), got {self.threshold_dead_band_frac}")
        if self.threshold_reversal_hold_s < 0:
            raise ValueError(f"threshold_reversal_hold_s must be >= 0, got {self.threshold_reversal_hold_s}")
        if self.pool_reversal_hold_s < 0:
            raise ValueError(f"pool_reversal_hold_s must be >= 0, got {self.pool_reversal_hold_s}")


@dataclass(frozen=True, slots=True)
class GroupGuardState:
    """Guard memory of one tenant group."""

    last_change_s: float | None = None
    streak_direction: tuple[int, int] = (0, 0)
    streak_ticks: int = 0
    last_move: tuple[int, int] = (0, 0)
    """Direction of each pool (prefill, decode) in the last applied change; (0, 0) when there is none to hold
    against (none yet, a transfer rollback, or forgotten at a change of the route rule). A pool with +1 here may not
    shrink within ``pool_reversal_hold_s``."""
    last_move_policy_id: str = ""
    """The deciding policy of that change (``ControlAction.policy_id``)."""


@dataclass(frozen=True, slots=True)
class ThresholdMove:
    """The last applied move of one ordered threshold field: its direction (+1 up, -1 down), when, and by whom."""

    direction: int
    at_s: float
    policy_id: str = ""


@dataclass(frozen=True, slots=True)
class GuardState:
    """Guard memory of all tenant groups (immutable; :meth:`SafetyGuard.apply` returns the next one)."""

    groups: Mapping[str, GroupGuardState] = field(default_factory=dict)
    tenants: Mapping[str, float] = field(default_factory=dict)
    """When each tenant's thresholds last changed (``context.now_s``)."""
    threshold_moves: Mapping[str, Mapping[str, ThresholdMove]] = field(default_factory=dict)
    """Per tenant, per ordered field (:data:`ORDERED_THRESHOLD_FIELDS`), its last applied move (at most one entry
    per tenant and field: the memory does not grow with time)."""

    def after_restart(self, *, keep_streaks: bool) -> GuardState:
        """What a restarted controller reads back of this memory: all of it, the streaks only if ``keep_streaks``.

        The hysteresis streaks count consecutive ticks: a quick restart continues the sequence (the new process
        asks what the old one would have), a long outage breaks it (:meth:`policies.control.ControlState.
        after_restart`, which the controller's memory file and the gym env's restart both follow).
        """
        if keep_streaks:
            return self
        groups = {name: replace(g, streak_direction=(0, 0), streak_ticks=0) for name, g in self.groups.items()}
        return GuardState(groups, dict(self.tenants), {t: dict(per) for t, per in self.threshold_moves.items()})


@dataclass(frozen=True, slots=True)
class GuardResult:
    """The guarded action, what was clamped, and the guard's next state."""

    action: ControlAction
    clamps: tuple[Clamp, ...]
    state: GuardState


def _relative_change(old: float, new: float) -> float:
    """``|new - old|`` over the larger magnitude (0 when both are 0): within [0, 1] for values of one sign."""
    scale = max(abs(old), abs(new))
    return 0.0 if scale == 0 else abs(new - old) / scale


def _ordered_directions(old: RoutingThresholds, new: RoutingThresholds) -> dict[str, int]:
    """Direction of every ordered field that differs between ``old`` and ``new``."""
    out: dict[str, int] = {}
    for name in ORDERED_THRESHOLD_FIELDS:
        before, after = float(getattr(old, name)), float(getattr(new, name))
        if after != before:
            out[name] = 1 if after > before else -1
    return out


_UNORDERED_THRESHOLD_FIELDS: tuple[str, ...] = tuple(
    f.name for f in fields(RoutingThresholds) if f.name not in ORDERED_THRESHOLD_FIELDS
)


def _rule_handover(action: ControlAction, context: PolicyContext, group: TenantGroup) -> bool:
    """Whether ``action`` changes the route rule of a tenant of ``group`` (a handover between rules)."""
    for tenant in group.tenants:
        requested = action.thresholds.get(tenant)
        current = context.current_thresholds.get(tenant)
        if requested is not None and current is not None and requested.rule != current.rule:
            return True
    return False


class SafetyGuard:
    """Clamps actions to bounds, budget, step, cooldown and hysteresis (see the module docstring)."""

    def __init__(self, limits: GuardLimits) -> None:
        self.limits = limits

    def apply(
        self, action: ControlAction, context: PolicyContext, window: MetricWindow, state: GuardState
    ) -> GuardResult:
        """Return the clamped action, the clamps and the next guard state (pure; nothing is mutated)."""
        clamps: list[Clamp] = []
        stale = window.staleness_s > self.limits.max_staleness_s
        groups = {g.name: g for g in context.groups}
        next_states = dict(state.groups)
        pools: dict[str, PoolTargets] = {}
        for name, requested in action.pools.items():
            group = groups.get(name)
            current = context.current_pools.get(name)
            if group is None or current is None:
                clamps.append(Clamp("group", name, ClampReason.UNKNOWN_GROUP, "no bounds or running counts"))
                continue
            work = PoolClamp(
                group,
                current,
                requested.num_prefill,
                requested.num_decode,
                clamps,
                max_total=context.max_instances(group),
            )
            memory = state.groups.get(name, GroupGuardState())
            if _rule_handover(action, context, group):
                memory = replace(memory, last_move=(0, 0), last_move_policy_id="")
            target, next_states[name] = self._group(
                work,
                memory,
                stale=stale,
                complete=group_data_complete(window, context, name),
                pending=self._pending(window, name),
                now_s=context.now_s,
                policy_id=action.policy_id,
                rollback=not stale and remote_path_unusable(window, context, name),
            )
            pools[name] = target
        for name in groups.keys() - action.pools.keys():
            if name in next_states:
                next_states[name] = replace(next_states[name], streak_direction=(0, 0), streak_ticks=0)
        tenant_changes = dict(state.tenants)
        moves = dict(state.threshold_moves)
        thresholds = self._thresholds(action, context, stale, clamps, tenant_changes, moves)
        guarded = ControlAction(thresholds=thresholds, pools=pools, reason=action.reason, policy_id=action.policy_id)
        return GuardResult(guarded, tuple(clamps), GuardState(next_states, tenant_changes, moves))

    @staticmethod
    def _pending(window: MetricWindow, group: str) -> bool:
        group_window = window.groups.get(group)
        return group_window is not None and (group_window.pending_prefill + group_window.pending_decode) > 0

    def _group(
        self,
        work: PoolClamp,
        memory: GroupGuardState,
        *,
        stale: bool,
        complete: bool,
        pending: bool,
        now_s: float,
        policy_id: str = "",
        rollback: bool = False,
    ) -> tuple[PoolTargets, GroupGuardState]:
        current = work.current
        if (work.prefill, work.decode) == (current.num_prefill, current.num_decode):
            return current, replace(memory, streak_direction=(0, 0), streak_ticks=0)
        correcting = work.outside_what_may_run
        work.bounds()
        work.budget(shrink=True)
        if rollback and work.toward_aggregated:
            work.budget(shrink=False)
            if not complete:
                work.no_scale_down(ClampReason.MISSING_NO_SCALE_DOWN)
            if work.toward_aggregated:
                work.note(
                    ClampReason.TRANSFER_ROLLBACK,
                    f"KV-transfer path unusable: {(current.num_prefill, current.num_decode)} -> "
                    f"{(work.prefill, work.decode)} at once",
                )
                return PoolTargets(work.prefill, work.decode), GroupGuardState(now_s)
        work.step(self.limits.max_step_per_tick)
        work.budget(shrink=False)
        if stale:
            work.no_scale_down(ClampReason.STALE_NO_SCALE_DOWN)
        elif not complete:
            work.no_scale_down(ClampReason.MISSING_NO_SCALE_DOWN)
        direction = work.direction
        if direction == (0, 0):
            return current, replace(memory, streak_direction=(0, 0), streak_ticks=0)
        streak = memory.streak_ticks + 1 if direction == memory.streak_direction else 1
        memory = replace(memory, streak_direction=direction, streak_ticks=streak)
        if pending:
            work.hold(ClampReason.PENDING_CHANGE, "instances still starting or draining")
        elif memory.last_change_s is not None and now_s - memory.last_change_s < self.limits.cooldown_s:
            left_s = self.limits.cooldown_s - (now_s - memory.last_change_s)
            work.hold(ClampReason.COOLDOWN, f"{left_s:.1f} s of cooldown left")
        elif not correcting and (held := self._pool_reversal(memory, direction, now_s, policy_id)) is not None:
            work.hold(ClampReason.POOL_REVERSAL, held)
        elif streak < self.limits.hysteresis_ticks:
            work.hold(ClampReason.HYSTERESIS, f"asked {streak} of {self.limits.hysteresis_ticks} ticks")
        else:
            return PoolTargets(work.prefill, work.decode), GroupGuardState(
                now_s, last_move=direction, last_move_policy_id=policy_id
            )
        return current, memory

    def _pool_reversal(
        self, memory: GroupGuardState, direction: tuple[int, int], now_s: float, policy_id: str
    ) -> str | None:
        """Why a move in ``direction`` is held as giving back what the group's last change added; ``None`` if not."""
        hold_s = self.limits.pool_reversal_hold_s
        if memory.last_change_s is None or memory.last_move_policy_id != policy_id:
            return None
        age_s = now_s - memory.last_change_s
        if age_s >= hold_s:
            return None
        for pool, new, last in zip(("prefill", "decode"), direction, memory.last_move, strict=True):
            if last > 0 and new < 0:  # gives back an instance it was given; a pool that grows is never held
                return f"{pool} gives back the instance added {age_s:.0f} s ago ({hold_s - age_s:.0f} s of hold left)"
        return None

    def _thresholds(
        self,
        action: ControlAction,
        context: PolicyContext,
        stale: bool,
        clamps: list[Clamp],
        changes: dict[str, float],
        moves: dict[str, Mapping[str, ThresholdMove]],
    ) -> dict[str, RoutingThresholds]:
        known = {t.name for t in context.tenants}
        out: dict[str, RoutingThresholds] = {}
        for tenant, thresholds in action.thresholds.items():
            if tenant not in known:
                clamps.append(Clamp("tenant", tenant, ClampReason.UNKNOWN_TENANT, "not in the policy"))
                continue
            current = context.current_thresholds.get(tenant)
            if current is not None and thresholds != current:
                if stale:
                    clamps.append(Clamp("tenant", tenant, ClampReason.STALE_HOLD_THRESHOLDS, "window is stale"))
                    continue
                last_s = changes.get(tenant)
                handover = current.rule != thresholds.rule  # between rules: not held by the cooldown (docstring)
                if not handover and last_s is not None and context.now_s - last_s < self.limits.cooldown_s:
                    left_s = self.limits.cooldown_s - (context.now_s - last_s)
                    clamps.append(Clamp("tenant", tenant, ClampReason.THRESHOLD_COOLDOWN, f"{left_s:.1f} s left"))
                    continue
                held = self._hysteresis(tenant, current, thresholds, moves.get(tenant, {}), context.now_s, action)
                if held is not None:
                    clamps.append(held)
                    continue
                changes[tenant] = context.now_s
                applied = _ordered_directions(current, thresholds)
                moves[tenant] = {
                    **moves.get(tenant, {}),
                    **{name: ThresholdMove(sign, context.now_s, action.policy_id) for name, sign in applied.items()},
                }
            out[tenant] = thresholds
        return out

    def _hysteresis(
        self,
        tenant: str,
        current: RoutingThresholds,
        requested: RoutingThresholds,
        last_moves: Mapping[str, ThresholdMove],
        now_s: float,
        action: ControlAction,
    ) -> Clamp | None:
        """The clamp that holds ``current`` -> ``requested`` (dead band or reversal), ``None`` if it may pass."""
        limits = self.limits
        switched = any(getattr(current, n) != getattr(requested, n) for n in _UNORDERED_THRESHOLD_FIELDS)
        if not switched and limits.threshold_dead_band_frac > 0:
            largest = max(
                _relative_change(float(getattr(current, n)), float(getattr(requested, n)))
                for n in ORDERED_THRESHOLD_FIELDS
            )
            if largest < limits.threshold_dead_band_frac:
                detail = f"largest change {largest:.1%} < dead band {limits.threshold_dead_band_frac:.1%}"
                return Clamp("tenant", tenant, ClampReason.THRESHOLD_DEAD_BAND, detail)
        if current.rule != requested.rule:  # a handover between rules, not a reversal (module docstring)
            return None
        for name, sign in _ordered_directions(current, requested).items():
            last = last_moves.get(name)
            if last is None or last.direction != -sign or last.policy_id != action.policy_id:
                continue
            age_s = now_s - last.at_s
            if age_s < limits.threshold_reversal_hold_s:
                detail = (
                    f"{name} {getattr(current, name)} -> {getattr(requested, name)} reverses its move "
                    f"{age_s:.0f} s ago ({limits.threshold_reversal_hold_s - age_s:.0f} s of hold left)"
                )
                return Clamp("tenant", tenant, ClampReason.THRESHOLD_REVERSAL, detail)
        return None
