"""The SLO watchdog: hands control from a policy to a fallback while the fallback would do better.

A learned policy is trained on a family of scenarios; on traffic unlike anything it saw it can be badly wrong
(``experiments/results/learned/README.md``, "Outside the training distribution": on an unseen tenant mix the
shipped generalist lost to every rule baseline). :class:`SloWatchdog` wraps such a *primary* policy with a
*fallback* (a rule policy: a policy file or a baseline) and watches one number per interval, the
**priority- and rate-weighted SLO attainment** of the window (:func:`weighted_attainment`)::

    attainment = Σ priority × request_rate_rps × slo_attainment_frac / Σ priority × request_rate_rps

over the tenants whose rate and attainment are known (no known tenant: no verdict, the streak is kept).

**The bar.** A judged window *fails* when its attainment is below the bar:

* the fallback's estimated attainment at this window's load, less ``fallback_margin_frac``, once there is
  evidence: at least ``min_evidence_windows`` windows the fallback decided at an offered load per instance within
  ``load_tolerance_frac`` of this one (:mod:`policies.fallback_evidence` explains the estimate and its limits).
  A primary that is poor where the fallback was as poor is not failing: handing over would not help. Nor is any
  window while that bar is below the margin itself (the fallback met under twice the margin there): near zero, a
  few hundredths apart is noise, not a better fallback (traced on validation default-10032, 1 + 1 instances far
  past capacity: it tripped at 0.00 against the fallback's 0.06; without that trip, 0.51 → 0.54 the best rule);
* otherwise the fallback's windows at this load **or lighter**, less the margin, when that is below the floor
  (attainment does not rise with load: a primary doing as well as the fallback did under less load is not
  failing);
* otherwise (no fallback window yet, or none at a comparable or lighter load, or the load unknown) the absolute
  floor ``min_attainment_frac``, a backstop until such evidence exists. The first trip is always the floor's.

**Trips.** After ``trigger_intervals`` failing intervals in a row, the watchdog *trips*: the fallback decides for
``hold_intervals`` intervals, then the primary gets control back (and a fresh streak). Each further trip
multiplies the hold by ``backoff`` (capped at ``max_hold_intervals``): a primary that keeps failing is handed
back ever more rarely. The windows the fallback is answerable for are recorded as evidence for later bars. A
primary that **raises** trips the watchdog at once (no streak needed): the fallback decides that interval and
the hold, and :attr:`WatchdogState.primary_error` names the exception.

**Not judged, not handed over.** A hand-over can only help the tenant groups the primary runs otherwise than the
fallback would, and only once the primary's own pool moves there have had their time, so a window is judged on the
tenants of the other groups only:

* a group **in the primary's own pool move** (an instance starting or switching, or other sizes than the primary
  asked for still running) is left out, for at most ``settle_grace_s`` in a row, and once the move has settled, for
  as long as it took, at most ``move_dwell_s`` more: a primary moves pools because a group is failing, and judged
  on the minutes the move takes (and on the backlog it leaves) it would be handed over mid-move, the fallback's
  restore undoing the move. One group's move does not blind the watchdog to the others (traced on validation
  default-10008: a 2 + 2 group moving to aggregated left a 16-instance group failing at 0.23 unjudged for 170 s,
  where the fallback kept it at 0.93);
* a group the primary's last decision ran **as the fallback would** (the same pools, the same thresholds for every
  tenant of the group) is left out: what fails there is the fallback's own doing, and a hand-over would change
  nothing there but undo what the primary does elsewhere (traced on validation default-10029: a 16-instance group
  failing under legacy, the fallback's own rule, tripped the watchdog while a 4-instance group moved to aggregated,
  and the hand-over undid that move). Such windows are not taken as the fallback's record either: a primary runs
  the fallback's rule where it chooses to (a selector in calm periods), and judged against that record later, a
  primary that leaves the rule under heavier load would be tripped for the load (traced on validation
  default-10023).

The judged tenants are held to the same bar. When no group with a known tenant is left, the window is not judged.

**Like with like.** The groups a judged window covers are its *population*, and every comparison stays within
one: the window's load is the offered load per instance of those groups, the fallback's record is kept per
population (the windows of a hold count for the population whose streak tripped it), and the hand-back compares
the fallback's windows on that population with the primary's that tripped. A fallback judged on the whole cluster
would be flattered by the groups the primary ran well, its hold never cut short and its record setting bars the
failing group could never reach (traced on validation default-10011). With one tenant group, or none left out,
the population is the cluster.
The failing streak ends whenever the set of groups left out changes: the population judged next is another. And
when a streak would trip the watchdog while the primary now decides, in the groups judged, exactly as the fallback
would, it does not trip: a hand-over would change nothing but stop the primary from moving on.

**Hand-back.** A hold is cut short when the fallback is doing no better: once it has decided
``handback_windows`` windows after its first (which still carries the primary's backlog), and their mean attainment
on the groups that tripped it is not above the mean of the windows that tripped the watchdog plus
``fallback_margin_frac``, the primary decides
again (its reason then ends ``[primary back: …]``). What the fallback achieved stays on record as evidence, so the
same primary is not handed over again at that load. A primary that raised serves its whole hold.

**Pools.** While the fallback decides, a group it asks no pool change for (no target, or the sizes running) is
sent back to the split **relative to its budget** that ran at the watchdog's first decision: the share of the
group's instances that prefilled then, applied to the group's current budget (the instances it ran then as a share
of its budget then, times its budget now), within its current bounds. With the budget unchanged this is the split
as deployed; after a budget change it is the same proportions of the new budget, not a stale absolute count. A
pool move the fallback asks for wins.

The watchdog judges only windows the primary is answerable for: a window is judged when the decision before
it was the primary's (not the first window, which shows what ran before the watchdog, nor the first window after
a hold, which shows the fallback's last interval); symmetrically, a window is fallback evidence only when the
decision before it was the fallback's. It is a pure policy like the ones it wraps (no I/O, no clock); its state
is the streak, the hold, the trip count and the fallback's record, exposed for telemetry
(:attr:`SloWatchdog.state`). How attainment is computed is :func:`weighted_attainment`'s business; judging
(:func:`judge`) only compares numbers.

**Restarts.** The watchdog hands its whole record over (:meth:`SloWatchdog.memory_document`, with its primary's
memory inside), and a restarted controller gives it back (:mod:`controller.control_memory`): a hold under way goes
on, trips keep doubling the hold, and the fallback's evidence stands.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from policies.base import Policy, PolicyContext, remembering_layer
from policies.fallback_evidence import FallbackEstimate, FallbackRecord, offered_load_rps_per_instance
from policies.features import Observation
from policies.memory_codec import (
    decode_mapping,
    decode_pools,
    read_bool,
    read_count,
    read_names,
    read_numbers,
    read_optional_number,
    read_pair,
    read_time,
)
from policies.pool_clamp import MoveClock, pools_running
from policies.schema import ControlAction, PoolTargets, TenantGroup
from policies.scoring import pooled_attainment_frac

__all__ = [
    "FALLBACK_KINDS",
    "WATCHDOG_MEMORY_KIND",
    "BudgetSplit",
    "SloWatchdog",
    "Verdict",
    "WatchdogParams",
    "WatchdogState",
    "judge",
    "population_numbers",
    "weighted_attainment",
]

WATCHDOG_MEMORY_KIND = "slo-watchdog"
"""The ``kind`` of the watchdog's memory document (:meth:`SloWatchdog.memory_document`). A document without it was
written before the watchdog remembered: it is its primary's memory alone."""

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
        fallback_margin_frac: with evidence, a window fails when its attainment is below the fallback's estimate
            less this margin (default 0.05: the primary must be clearly worse, not within noise).
        load_tolerance_frac: fallback windows whose load per instance is within this ratio of the judged
            window's count as comparable (default 0.25: from 1/1.25 to 1.25 times the load).
        min_evidence_windows: comparable fallback windows needed before the estimate replaces the floor
            (default 3).
        max_evidence_windows: fallback windows remembered per population judged, the oldest dropped first (default
            512; bounds memory).
        handback_windows: during a hold, once the fallback has decided this many windows (after its first, which
            still carries the primary's backlog), hand control back early when their mean attainment is not above
            the attainment of the windows that tripped the watchdog plus ``fallback_margin_frac``: the fallback is
            doing no better, so holding only costs (default 3; 0 = always serve the whole hold).
        settle_grace_s: a window is not judged while the pools the primary last asked for are not yet running in
            every group it asked them for (an instance still starting or switching, or other sizes running), for at
            most this many seconds in a row (default 600: a move of several instances at the guard's pace of one
            per cooldown); 0 = judge every window. A primary that moves a group to other pools does so because
            the group is failing; judged on the minutes the move takes, it would be handed over mid-move, and the
            fallback's restore would undo the move and start another. Such a window also ends the failing streak:
            the pools judged after it are not the ones that failed before it.
        move_dwell_s: after such a move has settled, its windows are not judged for as long as the move took,
            at most this long (default 300): they still carry the backlog the move built up, and a rule that took
            minutes to bring up would be handed over on it. Moving and dwelling together stay unjudged for at most
            ``settle_grace_s + move_dwell_s`` in a row, so a primary that keeps moving is still judged.
    """

    min_attainment_frac: float = 0.5
    trigger_intervals: int = 4
    hold_intervals: int = 20
    backoff: float = 2.0
    max_hold_intervals: int = 10_000
    fallback_margin_frac: float = 0.05
    load_tolerance_frac: float = 0.25
    min_evidence_windows: int = 3
    max_evidence_windows: int = 512
    handback_windows: int = 3
    settle_grace_s: float = 600.0
    move_dwell_s: float = 300.0

    def __post_init__(self) -> None:
        if not 0.0 < self.min_attainment_frac <= 1.0:
            raise ValueError(f"watchdog min_attainment_frac must be within (0, 1], got {self.min_attainment_frac}")
        for name in ("trigger_intervals", "hold_intervals", "max_hold_intervals", "min_evidence_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"watchdog {name} must be >= 1, got {getattr(self, name)}")
        if self.handback_windows < 0:
            raise ValueError(f"watchdog handback_windows must be >= 0, got {self.handback_windows}")
        if self.backoff < 1.0:
            raise ValueError(f"watchdog backoff must be >= 1, got {self.backoff}")
        if not 0.0 <= self.fallback_margin_frac < 1.0:
            raise ValueError(f"watchdog fallback_margin_frac must be within [0, 1), got {self.fallback_margin_frac}")
        if self.load_tolerance_frac <= 0.0:
            raise ValueError(f"watchdog load_tolerance_frac must be > 0, got {self.load_tolerance_frac}")
        if self.settle_grace_s < 0:
            raise ValueError(f"watchdog settle_grace_s must be >= 0, got {self.settle_grace_s}")
        if self.move_dwell_s < 0:
            raise ValueError(f"watchdog move_dwell_s must be >= 0, got {self.move_dwell_s}")
        if self.max_evidence_windows < self.min_evidence_windows:
            raise ValueError(
                f"watchdog max_evidence_windows ({self.max_evidence_windows}) must be >= min_evidence_windows "
                f"({self.min_evidence_windows})"
            )
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
        bar_frac: the attainment below which this window counted as failing (``None``: not judged).
        fallback_estimate_frac: the fallback's estimated attainment behind the bar (``None``: the floor judged).
        evidence_windows: fallback windows on record.
        primary_error: ``"Type: message"`` when the primary raised on this decision (the watchdog then trips at
            once and the fallback decides).
        settling: this window was not judged: the pools the primary asked for were still being brought up in
            every group with a known tenant (``WatchdogParams.settle_grace_s``).
        settling_groups: the groups left out of this window's judgement for that reason (sorted).
    """

    in_fallback: bool = False
    failing_streak: int = 0
    hold_left_intervals: int = 0
    trips: int = 0
    attainment_frac: float | None = None
    tripped: bool = False
    bar_frac: float | None = None
    fallback_estimate_frac: float | None = None
    evidence_windows: int = 0
    primary_error: str | None = None
    settling: bool = False
    settling_groups: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    """How one judged window fared.

    Attributes:
        failing: whether the attainment was below the bar.
        bar_frac: the bar.
        estimate: the fallback's estimate the bar came from (``None``: the absolute floor).
    """

    failing: bool
    bar_frac: float
    estimate: FallbackEstimate | None

    def describe(self, params: WatchdogParams) -> str:
        """The bar in words, for decision reasons."""
        if self.estimate is None:
            return f"{self.bar_frac:g} SLO attainment"
        e = self.estimate
        at = "≤ " if e.lighter else ""
        return (
            f"{self.bar_frac:.2f} SLO attainment (the fallback's {e.attainment_frac:.2f} over {e.num_windows} "
            f"windows at {at}{e.load_rps_per_instance:.3g} req/s per instance, less {params.fallback_margin_frac:g})"
        )


def judge(attainment_frac: float, estimate: FallbackEstimate | None, params: WatchdogParams) -> Verdict:
    """Judge one window: against the fallback's estimate when there is one, else against the absolute floor."""
    floor = params.min_attainment_frac
    if estimate is None:
        return Verdict(attainment_frac < floor, floor, None)
    bar = estimate.attainment_frac - params.fallback_margin_frac
    # a fallback that met under twice the margin at this load fails as the primary does: no better to hand over to
    # (see the module docstring, "The bar")
    return Verdict(attainment_frac < bar and bar >= params.fallback_margin_frac, bar, estimate)


@dataclass(frozen=True, slots=True)
class BudgetSplit:
    """A group's split relative to its budget: what the watchdog restores.

    Attributes:
        prefill_share_frac: prefill instances over all the group's instances.
        instances_share_frac: the group's instances over its budget (``max_instances``).
    """

    prefill_share_frac: float
    instances_share_frac: float

    @classmethod
    def of(cls, group: TenantGroup, pools: PoolTargets) -> BudgetSplit | None:
        """The split ``pools`` is of ``group``'s budget (``None`` when no instance runs)."""
        if pools.num_instances <= 0:
            return None
        return cls(pools.num_prefill / pools.num_instances, pools.num_instances / group.max_instances)

    def applied_to(self, group: TenantGroup) -> PoolTargets:
        """These shares of ``group``'s current budget, rounded, within its bounds."""
        budget = group.max_instances
        max_prefill = budget if group.max_prefill is None else min(group.max_prefill, budget)
        max_decode = budget if group.max_decode is None else min(group.max_decode, budget)
        total = min(max(round(self.instances_share_frac * budget), group.min_prefill + group.min_decode), budget)
        prefill = min(max(round(self.prefill_share_frac * total), group.min_prefill), max_prefill)
        decode = min(max(total - prefill, group.min_decode), max_decode)
        prefill = min(prefill, max(budget - decode, group.min_prefill))
        return PoolTargets(prefill, decode)


def _all_groups(context: PolicyContext) -> frozenset[str]:
    return frozenset(g.name for g in context.groups)


def population_numbers(
    observation: Observation, context: PolicyContext, groups: frozenset[str]
) -> tuple[float | None, float | None]:
    """Weighted attainment and offered load per instance over the tenants and pools of ``groups`` only."""
    if groups == _all_groups(context):
        return weighted_attainment(observation, context), offered_load_rps_per_instance(observation, context)
    grouped = context.grouped()
    part = replace(
        grouped,
        tenants=tuple(t for t in grouped.tenants if t.group in groups),
        current_pools={g: pools for g, pools in context.current_pools.items() if g in groups},
    )
    return weighted_attainment(observation, part), offered_load_rps_per_instance(observation, part)


def _left_out(groups: frozenset[str]) -> str:
    """`` without moving groups a, b`` for decision reasons, or nothing."""
    return f" without moving groups {', '.join(sorted(groups))}" if groups else ""


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
        self._restore_splits: dict[str, BudgetSplit] | None = None
        self._primary_decided_last = False
        self._fallback_decided_last = False
        # the fallback's record per population judged (the groups whose tenants a judged window covers): a primary
        # judged on some groups is held to what the fallback achieved on those same groups
        self._evidence: dict[frozenset[str], FallbackRecord] = {}
        self._hold_groups: frozenset[str] | None = None  # the population that tripped the watchdog (None: all)
        self._streak_attainment: list[float] = []  # the failing windows of the current streak
        self._tripped_at_frac: float | None = None  # their mean when the watchdog last tripped
        self._hold_attainment: list[float] = []  # the fallback's windows in the current hold
        self._primary_pools: dict[str, PoolTargets] = {}  # what the primary last asked for
        self._moves: dict[str, MoveClock] = {}  # per group: the primary's pool move under way or just settled
        self._left_out_before: frozenset[str] = frozenset()  # the groups left out of the last judged window
        self._as_fallback: frozenset[str] = frozenset()  # groups the primary last ran as the fallback would

    def memory_document(self) -> dict[str, Any]:
        """What the watchdog remembers between ticks (:class:`~policies.base.RemembersState`), its primary's inside.

        Its record: the state of the last decision (trips, the hold left, the failing streak), the fallback's evidence
        per population judged, the windows of the streak and of the hold under way, the splits it restores, the pools
        the primary last asked for and their move clocks, the groups left out of the last judged window. Without it a
        restarted controller's watchdog handed a tripped group back to its primary at once and started its trips
        (and so its doubling holds) and its evidence again.
        """
        inner = remembering_layer(self.primary)
        splits = self._restore_splits
        return {
            "kind": WATCHDOG_MEMORY_KIND,
            "state": {**asdict(self.state), "settling_groups": list(self.state.settling_groups)},
            "restore_splits": None
            if splits is None
            else {g: [v.prefill_share_frac, v.instances_share_frac] for g, v in sorted(splits.items())},
            "primary_decided_last": self._primary_decided_last,
            "fallback_decided_last": self._fallback_decided_last,
            "evidence": [
                {"groups": sorted(population), "windows": [list(w) for w in record.windows()]}
                for population, record in sorted(self._evidence.items(), key=lambda item: sorted(item[0]))
            ],
            "hold_groups": None if self._hold_groups is None else sorted(self._hold_groups),
            "streak_attainment": list(self._streak_attainment),
            "tripped_at_frac": self._tripped_at_frac,
            "hold_attainment": list(self._hold_attainment),
            "primary_pools": {g: [p.num_prefill, p.num_decode] for g, p in sorted(self._primary_pools.items())},
            "moves": {g: [m.moving_since_s, m.settled_since_s] for g, m in sorted(self._moves.items())},
            "left_out_before": sorted(self._left_out_before),
            "as_fallback": sorted(self._as_fallback),
            "primary": None if inner is None else inner.memory_document(),
        }

    def restore_memory(self, document: Mapping[str, Any], shift_s: float) -> None:
        """Take over a :meth:`memory_document`, its times moved by ``shift_s``; all of it or, on error, nothing.

        A document without the watchdog's ``kind`` (written before the watchdog remembered) is its primary's memory
        alone: the primary takes it and the watchdog's record starts again.

        Raises:
            ValueError: the document is malformed, or holds memory for a primary that keeps none (one line naming
                the field).
        """
        doc = decode_mapping(document, "(watchdog memory)")
        inner = remembering_layer(self.primary)
        if doc.get("kind") != WATCHDOG_MEMORY_KIND:
            if inner is None:
                raise ValueError(f"kind: expected {WATCHDOG_MEMORY_KIND!r}, got {doc.get('kind')!r}")
            inner.restore_memory(doc, shift_s)
            return
        state = _state_from(doc.get("state"), "state")
        splits_doc = doc.get("restore_splits")
        splits = (
            None
            if splits_doc is None
            else {
                g: BudgetSplit(*read_pair(v, f"restore_splits.{g}"))
                for g, v in decode_mapping(splits_doc, "restore_splits").items()
            }
        )
        evidence: dict[frozenset[str], FallbackRecord] = {}
        entries = doc.get("evidence")
        if not isinstance(entries, list):
            raise ValueError("evidence: expected a list")
        for i, entry in enumerate(entries):
            entry = decode_mapping(entry, f"evidence[{i}]")
            record = FallbackRecord(self.params.max_evidence_windows)
            windows = entry.get("windows")
            if not isinstance(windows, list):
                raise ValueError(f"evidence[{i}].windows: expected a list")
            for window in windows:
                record.add(*read_pair(window, f"evidence[{i}].windows"))
            evidence[read_names(entry.get("groups"), f"evidence[{i}].groups")] = record
        hold_groups = doc.get("hold_groups")
        pools = {
            g: decode_pools(v, f"primary_pools.{g}")
            for g, v in decode_mapping(doc.get("primary_pools"), "primary_pools").items()
        }
        moves = {}
        for g, v in decode_mapping(doc.get("moves"), "moves").items():
            if not isinstance(v, list) or len(v) != 2:
                raise ValueError(f"moves.{g}: expected [moving since, settled since]")
            moves[g] = MoveClock(read_time(v[0], f"moves.{g}[0]", shift_s), read_time(v[1], f"moves.{g}[1]", shift_s))
        taken = (
            read_bool(doc.get("primary_decided_last"), "primary_decided_last"),
            read_bool(doc.get("fallback_decided_last"), "fallback_decided_last"),
            None if hold_groups is None else read_names(hold_groups, "hold_groups"),
            read_numbers(doc.get("streak_attainment"), "streak_attainment"),
            read_optional_number(doc.get("tripped_at_frac"), "tripped_at_frac"),
            read_numbers(doc.get("hold_attainment"), "hold_attainment"),
            read_names(doc.get("left_out_before"), "left_out_before"),
            read_names(doc.get("as_fallback"), "as_fallback"),
        )
        primary = doc.get("primary")
        if primary is not None:
            if inner is None:
                raise ValueError(f"primary: memory for {self.primary.policy_id}, which keeps none")
            inner.restore_memory(decode_mapping(primary, "primary"), shift_s)
        self.state, self._restore_splits, self._evidence = state, splits, evidence
        self._primary_pools, self._moves = pools, moves
        (
            self._primary_decided_last,
            self._fallback_decided_last,
            self._hold_groups,
            self._streak_attainment,
            self._tripped_at_frac,
            self._hold_attainment,
            self._left_out_before,
            self._as_fallback,
        ) = taken

    @property
    def policy_id(self) -> str:
        """``watchdog[FALLBACK]:PRIMARY``."""
        return f"watchdog[{self.fallback.policy_id}]:{self.primary.policy_id}"

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """The primary's action, or the fallback's while the watchdog holds (see the module docstring)."""
        if self._restore_splits is None:
            self._restore_splits = self._splits(context)
        p = self.params
        s = self.state
        attainment = weighted_attainment(observation, context)
        if self._fallback_decided_last:
            self._record_fallback_window(observation, context)
        streak, hold, trips = s.failing_streak, s.hold_left_intervals, s.trips
        reason = ""
        tripped = False
        verdict: Verdict | None = None
        settling: frozenset[str] = frozenset()
        judged = attainment
        primary_decision: ControlAction | None = None
        no_better = self._fallback_no_better() if hold > 0 else None
        handed_back = no_better is not None
        if no_better is not None:
            hold = 0
            reason = f"primary back: fallback {self.fallback.policy_id} no better ({no_better})"
        elif hold > 0:
            hold -= 1
            reason = f"watchdog: fallback {self.fallback.policy_id} (trip {trips}, {hold} intervals left)"
        else:
            streak, verdict, settling, judged = self._judge(observation, context, attainment, streak)
            if streak >= p.trigger_intervals and verdict is not None and judged is not None:
                primary_decision = self._primary_as_fallback(observation, context, settling | self._as_fallback)
            if primary_decision is not None:  # handing over would change nothing
                streak, self._streak_attainment = 0, []
                reason = f"no hand-over: the primary decides as fallback {self.fallback.policy_id} would"
            elif streak >= p.trigger_intervals and verdict is not None and judged is not None:
                trips += 1
                tripped = True
                hold = p.hold_for(trips) - 1
                streak = 0
                self._begin_hold()
                reason = (
                    f"watchdog: tripped ({p.trigger_intervals} intervals below {verdict.describe(p)}, now "
                    f"{judged:.2f}{_left_out(settling)}); fallback {self.fallback.policy_id} for "
                    f"{p.hold_for(trips)} intervals (trip {trips})"
                )
        in_fallback = tripped or (s.hold_left_intervals > 0 and not handed_back)
        self.state = WatchdogState(
            in_fallback,
            streak,
            hold,
            trips,
            attainment,
            tripped,
            bar_frac=None if verdict is None else verdict.bar_frac,
            fallback_estimate_frac=None
            if verdict is None or verdict.estimate is None
            else verdict.estimate.attainment_frac,
            evidence_windows=sum(len(record) for record in self._evidence.values()),
            settling=bool(settling) and verdict is None,
            settling_groups=tuple(sorted(settling)),
        )
        self._primary_decided_last = not in_fallback
        self._fallback_decided_last = in_fallback
        if not in_fallback:
            try:
                decision = primary_decision or self.primary.decide(observation, context)
            except Exception as exc:  # a primary that raises is the clearest failure: the fallback decides now
                reason = self._primary_raised(exc)
            else:
                self._primary_pools = dict(decision.pools)
                self._as_fallback = self._groups_as_fallback(decision, observation, context)[0]
                if reason:  # say why the primary decides (not "watchdog: …" first, which marks fallback decisions)
                    return replace(decision, reason=f"{decision.reason} [{reason}]" if decision.reason else reason)
                return decision
        self._primary_pools = {}
        self._moves.clear()
        self._left_out_before = self._as_fallback = frozenset()
        return self._fallback_action(observation, context, reason)

    def _judge(
        self,
        observation: Observation,
        context: PolicyContext,
        attainment: float | None,
        streak: int,
    ) -> tuple[int, Verdict | None, frozenset[str], float | None]:
        """Judge one window under the primary.

        Returns the failing streak after it, its verdict (``None``: not judged), the groups left out of it because
        the primary's pools are still coming up there, and the attainment judged (their tenants left out).
        """
        if attainment is None or not self._primary_decided_last:
            return streak, None, frozenset(), attainment
        settling = self._settling_groups(observation, context)
        left_out = settling | self._as_fallback
        if left_out != self._left_out_before:  # another population is judged from here on
            streak, self._streak_attainment = 0, []
        self._left_out_before = left_out
        population = _all_groups(context) - left_out
        judged, load = population_numbers(observation, context, population)
        if judged is None:  # every group with a known tenant is moving or ran as the fallback would: nothing judged
            return 0, None, settling, None
        p = self.params
        estimate = None
        record = self._evidence.get(population)
        if load is not None and record is not None:
            estimate = record.estimate(load, tolerance_frac=p.load_tolerance_frac, min_windows=p.min_evidence_windows)
            if estimate is None:  # the fallback under lighter load bounds it above: it may lower the floor
                ceiling = record.ceiling(load, min_windows=p.min_evidence_windows)
                if ceiling is not None and ceiling.attainment_frac - p.fallback_margin_frac < p.min_attainment_frac:
                    estimate = ceiling
        verdict = judge(judged, estimate, p)
        self._streak_attainment = [*self._streak_attainment, judged] if verdict.failing else []
        if verdict.failing:
            self._hold_groups = population  # a trip on this streak hands over what failed here
        return (streak + 1 if verdict.failing else 0), verdict, settling, judged

    def _record_fallback_window(self, observation: Observation, context: PolicyContext) -> None:
        """Record a window the fallback decided, on the population whose failure handed it control.

        Its attainment joins the hold's (for the hand-back) and, with its load, the fallback's record for that
        population: both are compared later with the primary's windows on the same groups, never with the
        cluster's, where groups the primary ran well would flatter the fallback (traced on validation
        default-10011: a 2 + 2 group failing at 0.00 under the primary, the fallback at 0.27-0.74 over the whole
        cluster, so never found no better, and a bar of 0.59 from the cluster's record held against that group).
        """
        population = _all_groups(context) if self._hold_groups is None else self._hold_groups
        attainment, load = population_numbers(observation, context, population)
        if attainment is None:
            return
        self._hold_attainment.append(attainment)
        if load is not None:
            record = self._evidence.get(population)
            if record is None:
                record = self._evidence[population] = FallbackRecord(self.params.max_evidence_windows)
            record.add(load, attainment)

    def _fallback_action(self, observation: Observation, context: PolicyContext, reason: str) -> ControlAction:
        """The fallback's decision, with every group it asks no pool change for sent back to its budget split."""
        action = self.fallback.decide(observation, context)
        pools = self._restored(context)
        pools.update({g: t for g, t in action.pools.items() if t != context.current_pools.get(g)})
        return ControlAction(
            thresholds=action.thresholds,
            pools=pools,
            reason=f"{reason}: {action.reason}" if action.reason else reason,
            policy_id=self.policy_id,
        )

    def _primary_as_fallback(
        self, observation: Observation, context: PolicyContext, left_out: frozenset[str] = frozenset()
    ) -> ControlAction | None:
        """The primary's decision when it is what the fallback would decide now in the groups judged.

        Asked when a streak would trip the watchdog: a primary that fails while deciding exactly as the fallback
        would (the rule selector running the fallback's own rule) gains nothing from a hand-over, which would only
        stop it from moving away. Only the groups judged count (same pools, same thresholds for their tenants);
        the groups ``left_out`` were not judged, and a hand-over would only undo what the primary does there.
        ``None`` otherwise, or when the primary raises (it then trips as usual).
        """
        try:
            decision = self.primary.decide(observation, context)
        except Exception:
            return None
        same, identical = self._groups_as_fallback(decision, observation, context)
        judged = {g.name for g in context.groups} - left_out
        return decision if identical or (left_out and judged <= same) else None

    def _groups_as_fallback(
        self, decision: ControlAction, observation: Observation, context: PolicyContext
    ) -> tuple[frozenset[str], bool]:
        """Where ``decision`` is the fallback's decision now.

        Returns the groups it runs as the fallback would (same pools, same thresholds for every tenant of the
        group), and whether it is the fallback's decision everywhere (every group and every tenant).
        """
        fallback = self._fallback_action(observation, context, "")
        running = context.current_pools
        grouped = context.grouped()
        same: set[str] = set()
        for group in grouped.groups:
            g = group.name
            if decision.pools.get(g, running.get(g)) != fallback.pools.get(g, running.get(g)):
                continue
            tenants = [t.name for t in grouped.tenants if t.group == g]
            if all(decision.thresholds.get(t) == fallback.thresholds.get(t) for t in tenants):
                same.add(g)
        pooled = set(decision.pools) | set(fallback.pools)
        identical = decision.thresholds == fallback.thresholds and all(
            decision.pools.get(g, running.get(g)) == fallback.pools.get(g, running.get(g)) for g in pooled
        )
        return frozenset(same), identical

    def _settling_groups(self, observation: Observation, context: PolicyContext) -> frozenset[str]:
        """The groups whose windows are the primary's pool move, so not judged.

        A group is while the pools the primary asked for there are still being brought up, within
        ``settle_grace_s``, and after they settled for as long as the move took, at most ``move_dwell_s`` and
        within ``settle_grace_s + move_dwell_s`` of the move's start.
        Brought up: no instance of the group starting or switching and the sizes asked for running. The grace runs
        from the first window found not yet settled; once it is spent, the group is judged again until its pools
        settle (which restarts it).
        """
        p = self.params
        now_s = context.now_s
        for group in set(self._moves) - set(self._primary_pools):
            del self._moves[group]
        out: set[str] = set()
        for group, target in self._primary_pools.items():
            moving = p.settle_grace_s > 0 and not pools_running(observation.window, context, group, target)
            move = self._moves.setdefault(group, MoveClock())
            move.observe(moving, now_s)
            if move.moving_since_s is None:
                continue
            since_s = now_s - move.moving_since_s
            if moving:
                if since_s < p.settle_grace_s:
                    out.add(group)
                continue
            if move.dwelling(now_s, p.move_dwell_s) and since_s < p.settle_grace_s + p.move_dwell_s:
                out.add(group)
                continue
            move.reset()
        return frozenset(out)

    def _primary_raised(self, exc: Exception) -> str:
        """Trip at once on a primary's exception (no streak needed); the fallback's reason for this decision."""
        trips = self.state.trips + 1
        hold_intervals = self.params.hold_for(trips)
        self._hold_groups = None  # a primary that raised is answerable for every group
        self._begin_hold(primary_raised=True)
        error = f"{type(exc).__name__}: {exc}"
        self.state = replace(
            self.state,
            in_fallback=True,
            failing_streak=0,
            hold_left_intervals=hold_intervals - 1,
            trips=trips,
            tripped=True,
            primary_error=error,
        )
        self._primary_decided_last = False
        self._fallback_decided_last = True
        return (
            f"watchdog: primary raised {error}; fallback {self.fallback.policy_id} for {hold_intervals} intervals "
            f"(trip {trips})"
        )

    def _begin_hold(self, *, primary_raised: bool = False) -> None:
        """Start a hold: remember the mean attainment of the windows that tripped the watchdog.

        A primary that raised has no such windows: its hold is served whole.
        """
        streak = self._streak_attainment
        if primary_raised or not streak:
            self._tripped_at_frac = None
        else:
            self._tripped_at_frac = sum(streak) / len(streak)
        self._streak_attainment = []
        self._hold_attainment = []

    def _fallback_no_better(self) -> str | None:
        """The evidence, in words, when this hold's fallback does no better than the primary did; else ``None``.

        No better: see :class:`WatchdogParams` ``handback_windows``. The hold's first window is left out: it still
        carries the primary's backlog.
        """
        n = self.params.handback_windows
        windows = self._hold_attainment[1:]
        tripped_at = self._tripped_at_frac
        if n == 0 or tripped_at is None or len(windows) < n:
            return None
        mean = sum(windows) / len(windows)
        if mean > tripped_at + self.params.fallback_margin_frac:
            return None
        return f"{mean:.2f} over {len(windows)} windows, {tripped_at:.2f} when the watchdog tripped"

    @staticmethod
    def _splits(context: PolicyContext) -> dict[str, BudgetSplit]:
        out: dict[str, BudgetSplit] = {}
        for group in context.groups:
            pools = context.current_pools.get(group.name)
            split = None if pools is None else BudgetSplit.of(group, pools)
            if split is not None:
                out[group.name] = split
        return out

    def _restored(self, context: PolicyContext) -> dict[str, PoolTargets]:
        splits = self._restore_splits or {}
        return {
            g.name: splits[g.name].applied_to(g)
            for g in context.groups
            if g.name in splits and g.name in context.current_pools
        }


def _state_from(value: object, field: str) -> WatchdogState:
    """The :class:`WatchdogState` a memory document wrote (every field, each checked)."""
    doc = decode_mapping(value, field)
    expected = {f.name for f in fields(WatchdogState)}
    if set(doc) != expected:
        missing, unknown = sorted(expected - set(doc)), sorted(set(doc) - expected)
        raise ValueError(f"{field}: missing {missing}, unknown {unknown}")
    error = doc["primary_error"]
    if error is not None and not isinstance(error, str):
        raise ValueError(f"{field}.primary_error: expected text, got {error!r}")
    return WatchdogState(
        in_fallback=read_bool(doc["in_fallback"], f"{field}.in_fallback"),
        failing_streak=read_count(doc["failing_streak"], f"{field}.failing_streak"),
        hold_left_intervals=read_count(doc["hold_left_intervals"], f"{field}.hold_left_intervals"),
        trips=read_count(doc["trips"], f"{field}.trips"),
        attainment_frac=read_optional_number(doc["attainment_frac"], f"{field}.attainment_frac"),
        tripped=read_bool(doc["tripped"], f"{field}.tripped"),
        bar_frac=read_optional_number(doc["bar_frac"], f"{field}.bar_frac"),
        fallback_estimate_frac=read_optional_number(doc["fallback_estimate_frac"], f"{field}.fallback_estimate_frac"),
        evidence_windows=read_count(doc["evidence_windows"], f"{field}.evidence_windows"),
        primary_error=error,
        settling=read_bool(doc["settling"], f"{field}.settling"),
        settling_groups=tuple(sorted(read_names(doc["settling_groups"], f"{field}.settling_groups"))),
    )
