"""Pool targets of one tenant group clamped to the invariants the guard keeps whatever the policy says.

:class:`PoolClamp` is the working half of :class:`policies.guard.SafetyGuard` for one group's pool target:

* **bounds**: each pool within its ``min_*``/``max_*`` (a missing max means what the budget allows). Decode,
  which every request needs, keeps at least one instance (``min_decode >= 1``); an empty prefill pool fails no
  request (the router then serves locally, reason ``no_prefill_instance``), so it keeps ``min_prefill``;
* **what may run**: ``prefill + decode`` at most the GPU budget, capped by the group's **live capacity** (its
  healthy instances, when its instance set is fixed: the router actuator moves instances between roles and
  cannot add any). Increases are cut first, never below a pool's floor; then pools above their floor shrink
  (prefill first); a floor that still does not fit (fewer healthy instances than the minimums) is not
  restored: no pool leaves its bounds to bring the other into them;
* **max step**: each pool moves at most ``max_step_per_tick`` instances from what runs.

Each check only moves the target towards what is feasible; a group running outside its bounds is moved
towards them, never further out. Pure: no I/O, no state beyond the working values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from policies.base import PolicyContext
from policies.schema import MetricWindow, PoolTargets, TenantGroup

__all__ = [
    "Clamp",
    "ClampReason",
    "MoveClock",
    "PoolClamp",
    "group_data_complete",
    "pools_running",
    "within_bounds",
]


class ClampReason(enum.StrEnum):
    """Why the guard changed an action. Append-only: values are exported as metric labels."""

    UNKNOWN_GROUP = "unknown_group"
    UNKNOWN_TENANT = "unknown_tenant"
    BELOW_MIN = "below_min"
    ABOVE_MAX = "above_max"
    GPU_BUDGET = "gpu_budget"
    MAX_STEP = "max_step"
    STALE_NO_SCALE_DOWN = "stale_no_scale_down"
    MISSING_NO_SCALE_DOWN = "missing_no_scale_down"
    PENDING_CHANGE = "pending_change"
    COOLDOWN = "cooldown"
    HYSTERESIS = "hysteresis"
    STALE_HOLD_THRESHOLDS = "stale_hold_thresholds"
    THRESHOLD_COOLDOWN = "threshold_cooldown"
    THRESHOLD_DEAD_BAND = "threshold_dead_band"
    THRESHOLD_REVERSAL = "threshold_reversal"
    LIVE_CAPACITY = "live_capacity"
    TRANSFER_ROLLBACK = "transfer_rollback"
    """Not a cut: a move toward aggregated serving let through at once (:mod:`policies.transfer_fallback`)."""
    POOL_REVERSAL = "pool_reversal"


@dataclass(frozen=True, slots=True)
class Clamp:
    """One adjustment the guard made."""

    scope: str
    name: str
    reason: ClampReason
    detail: str = ""

    def as_dict(self) -> dict[str, str]:
        """JSON-friendly form for logs and the audit trail."""
        return {"scope": self.scope, "name": self.name, "reason": self.reason.value, "detail": self.detail}


def _sign(value: int) -> int:
    return (value > 0) - (value < 0)


def pools_running(window: MetricWindow, context: PolicyContext, group: str, target: PoolTargets | None) -> bool:
    """Whether ``group`` runs ``target`` (``None``: any sizes) with no instance starting or switching."""
    group_window = window.groups.get(group)
    if group_window is not None and group_window.pending_prefill + group_window.pending_decode > 0:
        return False
    return target is None or target == context.current_pools.get(group)


@dataclass(slots=True)
class MoveClock:
    """When a pool move was first seen under way, and when it was first seen settled after that.

    Shared by the rule selector and the SLO watchdog, which both leave a move's windows unjudged, and its first
    settled windows too for as long as the move took (they still carry the backlog it built up).
    """

    moving_since_s: float | None = None
    settled_since_s: float | None = None

    def observe(self, moving: bool, now_s: float) -> None:
        """Record this window: a move under way (``moving``), or pools running as asked."""
        if moving:
            self.settled_since_s = None
            if self.moving_since_s is None:
                self.moving_since_s = now_s
        elif self.moving_since_s is not None and self.settled_since_s is None:
            self.settled_since_s = now_s

    def dwelling(self, now_s: float, max_dwell_s: float) -> bool:
        """Whether the move settled less than its own duration, at most ``max_dwell_s``, before ``now_s``."""
        if self.moving_since_s is None or self.settled_since_s is None:
            return False
        return now_s - self.settled_since_s < min(max_dwell_s, self.settled_since_s - self.moving_since_s)

    def reset(self) -> None:
        """Forget the move (judged again from now on)."""
        self.moving_since_s = self.settled_since_s = None


def group_data_complete(window: MetricWindow, context: PolicyContext, group: str) -> bool:
    """Whether the window has what a scale-down needs: the group's decode KV usage and every tenant's rate."""
    group_window = window.groups.get(group)
    if group_window is None or group_window.decode_kv_usage_frac is None:
        return False
    for tenant in context.tenants_of(group):
        tenant_window = window.tenants.get(tenant.name)
        if tenant_window is None or tenant_window.request_rate_rps is None:
            return False
    return True


@dataclass(slots=True)
class PoolClamp:
    """Working state while one group's target is clamped (methods in the order the guard calls them).

    ``max_total`` is what the group may run now (its budget, capped by its live capacity).
    """

    group: TenantGroup
    current: PoolTargets
    prefill: int
    decode: int
    clamps: list[Clamp]
    max_total: int = 0

    def note(self, reason: ClampReason, detail: str) -> None:
        """Record one adjustment."""
        self.clamps.append(Clamp("group", self.group.name, reason, detail))

    def hold(self, reason: ClampReason, detail: str) -> None:
        """Go back to what runs (noting ``reason`` if that changes the target)."""
        if (self.prefill, self.decode) != (self.current.num_prefill, self.current.num_decode):
            self.note(reason, detail)
        self.prefill, self.decode = self.current.num_prefill, self.current.num_decode

    def floor(self, pool: str) -> int:
        """The fewest instances ``pool`` may keep: its minimum (decode's is at least one, by the schema)."""
        return self.group.min_prefill if pool == "prefill" else max(self.group.min_decode, 1)

    def _maxima(self) -> tuple[int, int]:
        g = self.group
        max_prefill = g.max_prefill if g.max_prefill is not None else g.max_instances
        max_decode = g.max_decode if g.max_decode is not None else g.max_instances
        return max_prefill, max_decode

    @property
    def outside_what_may_run(self) -> bool:
        """Whether what runs is outside a pool's bounds or above ``max_total`` (a move from it is a correction)."""
        cur = self.current
        max_prefill, max_decode = self._maxima()
        return (
            not self.floor("prefill") <= cur.num_prefill <= max_prefill
            or not self.floor("decode") <= cur.num_decode <= max_decode
            or cur.num_prefill + cur.num_decode > self.max_total
        )

    def bounds(self) -> None:
        """Each pool within its floor (:meth:`floor`) and its maximum."""
        max_prefill, max_decode = self._maxima()
        for pool, high in (("prefill", max_prefill), ("decode", max_decode)):
            low = self.floor(pool)
            value = self._value(pool)
            clamped = min(max(value, low), high)
            if clamped != value:
                reason = ClampReason.BELOW_MIN if value < low else ClampReason.ABOVE_MAX
                self.note(reason, f"{pool} {value} -> {clamped}")
                self._add(pool, clamped - value)

    def budget(self, *, shrink: bool, keep_floors: bool = True) -> None:
        """``prefill + decode`` within ``max_total`` (module docstring).

        ``shrink=False`` only cuts increases; ``keep_floors=False`` cuts them even below a pool's floor (what a
        hold needs: on stale data, a floor is not restored by shrinking the other pool).
        """
        over = self.prefill + self.decode - self.max_total
        if over <= 0:
            return
        before = (self.prefill, self.decode)
        # Cut increases first (the larger increase first), never below a pool's floor; then, if allowed, shrink
        # pools above their floor (prefill first). A floor that still does not fit is not restored: no pool
        # leaves its bounds to bring the other into them.
        floors = {pool: self.floor(pool) if keep_floors else 0 for pool in ("prefill", "decode")}
        for pool in sorted(("prefill", "decode"), key=self._increase, reverse=True):
            cut = min(over, max(self._increase(pool), 0), max(self._value(pool) - floors[pool], 0))
            self._add(pool, -cut)
            over -= cut
        if shrink:
            for pool in ("prefill", "decode"):
                cut = min(over, max(self._value(pool) - floors[pool], 0))
                self._add(pool, -cut)
                over -= cut
        for pool in sorted(("prefill", "decode"), key=self._increase, reverse=True):
            cut = min(over, max(self._increase(pool), 0))
            self._add(pool, -cut)
            over -= cut
        after = (self.prefill, self.decode)
        if self.max_total < self.group.max_instances:
            detail = f"{before} -> {after} (live capacity {self.max_total} healthy instances)"
            self.note(ClampReason.LIVE_CAPACITY, detail)
        else:
            self.note(ClampReason.GPU_BUDGET, f"{before} -> {after} (budget {self.group.max_instances} instances)")

    def step(self, max_step: int) -> None:
        """Each pool at most ``max_step`` instances from what runs."""
        before = (self.prefill, self.decode)
        cur = self.current
        self.prefill = min(max(self.prefill, cur.num_prefill - max_step), cur.num_prefill + max_step)
        self.decode = min(max(self.decode, cur.num_decode - max_step), cur.num_decode + max_step)
        if (self.prefill, self.decode) != before:
            self.note(ClampReason.MAX_STEP, f"{before} -> {(self.prefill, self.decode)}")

    def no_scale_down(self, reason: ClampReason) -> None:
        """No pool below what runs (stale or missing data), then increases cut back within ``max_total``."""
        before = (self.prefill, self.decode)
        self.prefill = max(self.prefill, self.current.num_prefill)
        self.decode = max(self.decode, self.current.num_decode)
        if (self.prefill, self.decode) != before:
            self.note(reason, f"{before} -> {(self.prefill, self.decode)}")
            self.budget(shrink=False, keep_floors=False)

    def _increase(self, pool: str) -> int:
        if pool == "prefill":
            return self.prefill - self.current.num_prefill
        return self.decode - self.current.num_decode

    def _value(self, pool: str) -> int:
        return self.prefill if pool == "prefill" else self.decode

    def _add(self, pool: str, delta: int) -> None:
        if pool == "prefill":
            self.prefill += delta
        else:
            self.decode += delta

    @property
    def toward_aggregated(self) -> bool:
        """Whether the target has fewer prefill instances than run and no fewer decode instances."""
        return self.prefill < self.current.num_prefill and self.decode >= self.current.num_decode

    @property
    def direction(self) -> tuple[int, int]:
        """Sign of the change of each pool (prefill, decode)."""
        return (_sign(self.prefill - self.current.num_prefill), _sign(self.decode - self.current.num_decode))


def within_bounds(target: PoolTargets, group: TenantGroup) -> PoolTargets:
    """``target`` clamped into the group's pool bounds and GPU budget (decode keeps its minimum first).

    The last line of defence of an actuator that sets counts directly (Kubernetes replicas): whatever the plan
    says, it never asks for a pool outside its bounds nor for more instances than the budget allows.
    """
    max_prefill = group.max_prefill if group.max_prefill is not None else group.max_instances
    max_decode = group.max_decode if group.max_decode is not None else group.max_instances
    prefill = min(max(target.num_prefill, group.min_prefill), max_prefill)
    decode = min(max(target.num_decode, group.min_decode), max_decode)
    over = prefill + decode - group.max_instances
    if over > 0:
        cut = min(over, prefill - group.min_prefill)
        prefill, over = prefill - cut, over - cut
        decode -= min(over, decode - group.min_decode)
    return PoolTargets(prefill, decode)
