"""The SLO watchdog: hands control from a policy to a fallback while the cluster misses its objectives.

A learned policy is trained on a family of scenarios; on traffic unlike anything it saw it can be badly wrong
(``experiments/results/learned/README.md``, "Outside the training distribution": on an unseen tenant mix the
shipped generalist lost to every rule baseline). :class:`SloWatchdog` wraps such a *primary* policy with a
*fallback* (a rule policy: a policy file or a baseline) and watches one number per interval, the
**priority- and rate-weighted SLO attainment** of the window::

    attainment = Σ priority × request_rate_rps × slo_attainment_frac / Σ priority × request_rate_rps

over the tenants whose rate and attainment are known (no known tenant: no verdict, the streak is kept).

* The primary decides while the attainment stays at or above ``min_attainment_frac``.
* After ``trigger_intervals`` intervals in a row below it, the watchdog *trips*: the fallback decides for
  ``hold_intervals`` intervals, then the primary gets control back (and a fresh streak).
* Each further trip multiplies the hold by ``backoff`` (capped at ``max_hold_intervals``): a primary that keeps
  failing is handed back ever more rarely.
* While the fallback decides, a group it asks no pool change for (no target, or the sizes running) is sent back
  to the pool sizes running at the watchdog's first decision (as deployed), so a split the primary moved does not
  outlive it; a pool move the fallback asks for wins.

The watchdog judges only windows the primary is answerable for: a window is judged when the decision before
it was the primary's (not the first window, which shows what ran before the watchdog, nor the first window after
a hold, which shows the fallback's last interval). It is a pure policy like the ones it wraps (no I/O, no
clock); its state is the streak, the hold and the trip count, exposed for telemetry
(:attr:`SloWatchdog.state`).
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import Policy, PolicyContext
from policies.features import Observation
from policies.schema import ControlAction, PoolTargets
from policies.scoring import pooled_attainment_frac

__all__ = ["FALLBACK_KINDS", "SloWatchdog", "WatchdogParams", "WatchdogState", "weighted_attainment"]

FALLBACK_KINDS: tuple[str, ...] = ("baseline", "file")
"""Policy-spec kinds a fallback may be: rule policies, which need no training stack and cannot be out of their
depth the way a learned policy can."""


@dataclass(frozen=True, slots=True)
class WatchdogParams:
    """When the watchdog trips and for how long.

    Attributes:
        min_attainment_frac: weighted SLO attainment below which an interval counts as failing.
        trigger_intervals: failing intervals in a row (under the primary) that trip the watchdog.
        hold_intervals: intervals the fallback keeps control after the first trip.
        backoff: factor on the hold for every further trip.
        max_hold_intervals: cap on the hold.
    """

    min_attainment_frac: float = 0.5
    trigger_intervals: int = 4
    hold_intervals: int = 20
    backoff: float = 2.0
    max_hold_intervals: int = 10_000

    def __post_init__(self) -> None:
        if not 0.0 < self.min_attainment_frac <= 1.0:
            raise ValueError(f"watchdog min_attainment_frac must be within (0, 1], got {self.min_attainment_frac}")
        for name in ("trigger_intervals", "hold_intervals", "max_hold_intervals"):
            if getattr(self, name) < 1:
                raise ValueError(f"watchdog {name} must be >= 1, got {getattr(self, name)}")
        if self.backoff < 1.0:
            raise ValueError(f"watchdog backoff must be >= 1, got {self.backoff}")
        if self.max_hold_intervals < self.hold_intervals:
            raise ValueError(
                f"watchdog max_hold_intervals ({self.max_hold_intervals}) must be >= hold_intervals "
                f"({self.hold_intervals})"
            )

    def hold_for(self, trip: int) -> int:
        """Hold of the ``trip``-th trip (1-based)."""
        return int(min(self.max_hold_intervals, round(self.hold_intervals * self.backoff ** (trip - 1))))


@dataclass(frozen=True, slots=True)
class WatchdogState:
    """What the watchdog knows after a decision.

    Attributes:
        in_fallback: whether the fallback made this decision.
        failing_streak: failing intervals in a row under the primary.
        hold_left_intervals: decisions the fallback still makes after this one.
        trips: trips so far.
        attainment_frac: this interval's weighted attainment (``None``: unknown).
        tripped: whether this decision tripped the watchdog.
    """

    in_fallback: bool = False
    failing_streak: int = 0
    hold_left_intervals: int = 0
    trips: int = 0
    attainment_frac: float | None = None
    tripped: bool = False


def weighted_attainment(observation: Observation, context: PolicyContext) -> float | None:
    """Priority- and rate-weighted SLO attainment of the window (``None`` when no tenant's is known).

    The tenants' attainments pooled by :func:`policies.scoring.pooled_attainment_frac` with weight
    ``priority × request_rate_rps``; a tenant whose rate or attainment is unknown is left out.
    """
    parts: list[tuple[float | None, float | None]] = []
    for tenant in context.tenants:
        if tenant.name not in observation.tenant_names:
            continue
        rate_rps = observation.value("tenant", tenant.name, "request_rate_rps")
        attainment = observation.value("tenant", tenant.name, "slo_attainment_frac")
        parts.append((None if rate_rps is None else tenant.priority * rate_rps, attainment))
    return pooled_attainment_frac(parts)


class SloWatchdog:
    """A primary policy under an SLO watchdog with a fallback policy (module docstring)."""

    def __init__(self, primary: Policy, fallback: Policy, params: WatchdogParams | None = None) -> None:
        self.primary = primary
        self.fallback = fallback
        self.params = params or WatchdogParams()
        self.state = WatchdogState()
        self._restore_pools: dict[str, PoolTargets] | None = None
        self._primary_decided_last = False

    @property
    def policy_id(self) -> str:
        """``watchdog[FALLBACK]:PRIMARY``."""
        return f"watchdog[{self.fallback.policy_id}]:{self.primary.policy_id}"

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """The primary's action, or the fallback's while the watchdog holds (see the module docstring)."""
        if self._restore_pools is None:
            self._restore_pools = dict(context.current_pools)
        p = self.params
        s = self.state
        attainment = weighted_attainment(observation, context)
        streak, hold, trips = s.failing_streak, s.hold_left_intervals, s.trips
        reason = ""
        tripped = False
        if hold > 0:
            hold -= 1
            reason = f"watchdog: fallback {self.fallback.policy_id} (trip {trips}, {hold} intervals left)"
        else:
            if attainment is not None and self._primary_decided_last:
                streak = streak + 1 if attainment < p.min_attainment_frac else 0
            if streak >= p.trigger_intervals:
                trips += 1
                tripped = True
                hold = p.hold_for(trips) - 1
                streak = 0
                reason = (
                    f"watchdog: tripped ({p.trigger_intervals} intervals below {p.min_attainment_frac:g} SLO "
                    f"attainment, now {attainment:.2f}); fallback {self.fallback.policy_id} for "
                    f"{p.hold_for(trips)} intervals (trip {trips})"
                )
        in_fallback = tripped or s.hold_left_intervals > 0
        self.state = WatchdogState(in_fallback, streak, hold, trips, attainment, tripped)
        self._primary_decided_last = not in_fallback
        if not in_fallback:
            return self.primary.decide(observation, context)
        action = self.fallback.decide(observation, context)
        pools = {group: target for group, target in self._restore_pools.items() if group in context.current_pools}
        pools.update({g: t for g, t in action.pools.items() if t != context.current_pools.get(g)})
        return ControlAction(
            thresholds=action.thresholds,
            pools=pools,
            reason=f"{reason}: {action.reason}" if action.reason else reason,
            policy_id=self.policy_id,
        )
