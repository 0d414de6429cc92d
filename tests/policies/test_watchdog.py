"""The SLO watchdog: when it trips, how long the fallback holds, what it restores, what it refuses."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest

from policies.base import Policy, PolicyContext
from policies.baselines import make_baseline
from policies.fallback_evidence import FallbackEstimate
from policies.features import Observation, build_observation
from policies.policy_file import load_policy_text, resolve_policy
from policies.rules import FilePolicy
from policies.schema import ControlAction, GroupWindow, MetricWindow, PoolTargets, TenantGroup, TenantWindow
from policies.watchdog import BudgetSplit, SloWatchdog, WatchdogParams, judge, weighted_attainment

POLICY = """
pd_disaggregation_policy:
  remote_prefill: {min_input_tokens: 4096}
  local_prefill: {max_input_tokens: 2048}
tenant_groups:
  - {name: g, gpu_budget: 4, pools: {prefill: {min: 0, max: 3}, decode: {min: 1, max: 4}}}
tenants:
  - {name: chat, group: g, priority: 2.0, slo: {ttft_p95_ms: 500, tpot_p95_ms: 50}}
  - {name: batch, group: g, priority: 0.5, slo: {ttft_p95_ms: 30000, tpot_p95_ms: 200}}
"""
RESOLVED = resolve_policy(load_policy_text(POLICY))
TENANTS = tuple(tp.tenant for name, tp in RESOLVED.tenants.items() if name != "default")
GROUPS = tuple(RESOLVED.groups.values())
BASE = {name: tp.thresholds for name, tp in RESOLVED.tenants.items()}
DEPLOYED = PoolTargets(2, 2)


class AllPrefill:
    """A primary that always asks for 3P1D (what a policy out of its depth might do)."""

    policy_id = "test:all-prefill"

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        del observation, context
        return ControlAction(pools={"g": PoolTargets(3, 1)}, reason="primary", policy_id=self.policy_id)


def step(
    policy: Policy,
    attainment: float | None,
    current: PoolTargets = DEPLOYED,
    *,
    rate_rps: float = 1.0,
    groups: tuple[TenantGroup, ...] = GROUPS,
    now_s: float = 0.0,
    pending: int = 0,
) -> ControlAction:
    """One decision on a window where every tenant runs at ``rate_rps`` with the given SLO attainment."""
    known = attainment is not None
    tenants = {
        name: TenantWindow(request_rate_rps=rate_rps if known else None, slo_attainment_frac=attainment)
        for name in ("chat", "batch")
    }
    group_window = GroupWindow(current.num_prefill, current.num_decode, pending_decode=pending)
    window = MetricWindow(100.0, 15.0, tenants, {"g": group_window})
    context = PolicyContext(TENANTS, groups, {"g": current}, BASE, BASE, now_s=now_s, interval_s=15.0)
    return policy.decide(build_observation(window, context.observation_context()), context)


def run(wd: SloWatchdog, primary: float, fallback: float, ticks: int, **kwargs: Any) -> str:
    """``ticks`` decisions where a window shows ``primary`` or ``fallback`` attainment by who decided before it.

    Returns the pattern of who decided: ``P`` (primary) or ``F`` (fallback).
    """
    out = []
    for _ in range(ticks):
        attainment = fallback if wd.state.in_fallback else primary
        step(wd, attainment, **kwargs)
        out.append("F" if wd.state.in_fallback else "P")
    return "".join(out)


def watchdog(**params: float) -> SloWatchdog:
    """A watchdog over :class:`AllPrefill`; these tests keep its pools from running, so unless a test sets
    ``settle_grace_s`` every window is judged (the grace has tests of its own), and no window after a settled move
    is skipped unless a test sets ``move_dwell_s``."""
    params = {"settle_grace_s": 0.0, "move_dwell_s": 0.0, **params}
    return SloWatchdog(AllPrefill(), FilePolicy(RESOLVED, "file:base"), WatchdogParams(**params))  # type: ignore[arg-type]


def test_a_bar_below_the_margin_fails_no_window() -> None:
    """Against a fallback that met 6 % at this load, a primary at 0 % is not clearly worse: near zero, noise."""
    params = WatchdogParams(fallback_margin_frac=0.05)
    poor = FallbackEstimate(attainment_frac=0.06, num_windows=6, load_rps_per_instance=3.2)
    verdict = judge(0.0, poor, params)
    assert verdict.bar_frac == pytest.approx(0.01)
    assert not verdict.failing
    fair = FallbackEstimate(attainment_frac=0.5, num_windows=6, load_rps_per_instance=3.2)
    assert judge(0.3, fair, params).failing  # clearly worse than a fallback that does meet objectives
    assert not judge(0.46, fair, params).failing  # within the margin
    assert judge(0.09, FallbackEstimate(0.15, 3, 3.2), params).failing  # a bar of 0.10, twice the margin: judged
    assert judge(0.3, None, params).failing  # no evidence: the absolute floor, 0.5


def test_the_primary_decides_while_objectives_are_met() -> None:
    wd = watchdog()
    for _ in range(30):
        action = step(wd, 0.9)
        assert action.reason == "primary"
        assert not wd.state.in_fallback
    assert wd.state.trips == 0


def test_trips_after_the_trigger_streak_restores_the_deployed_split_then_hands_back() -> None:
    wd = watchdog(trigger_intervals=3, hold_intervals=5)
    # The first window shows what ran before the primary: not judged. DEPLOYED is what the fallback restores.
    assert step(wd, 0.2).reason == "primary"
    assert wd.state.failing_streak == 0
    assert step(wd, 0.2, PoolTargets(3, 1)).reason == "primary"
    assert step(wd, 0.2, PoolTargets(3, 1)).reason == "primary"
    tripped = step(wd, 0.2, PoolTargets(3, 1))
    assert wd.state.tripped
    assert wd.state.in_fallback
    assert wd.state.trips == 1
    assert tripped.reason.startswith("watchdog: tripped (3 intervals below 0.5 SLO attainment, now 0.20)")
    assert tripped.reason.endswith("file_thresholds")
    assert tripped.policy_id == "watchdog[file:base]:test:all-prefill"
    assert tripped.pools == {"g": DEPLOYED}  # the file has no pool opinion: back to the split as deployed
    assert tripped.thresholds == FilePolicy(RESOLVED, "file:base").decide(*_any()).thresholds
    # Five fallback decisions in all (even while objectives are met again), then the primary is back.
    reasons = [step(wd, 0.95, PoolTargets(2, 2)).reason for _ in range(5)]
    assert [r.startswith("watchdog: fallback") for r in reasons] == [True] * 4 + [False]
    assert reasons[-1] == "primary"
    assert wd.state.failing_streak == 0


def test_each_further_trip_doubles_the_hold_up_to_the_cap() -> None:
    wd = watchdog(trigger_intervals=1, hold_intervals=3, backoff=2.0, max_hold_intervals=10)
    pattern = run(wd, primary=0.1, fallback=0.9, ticks=40)
    # Trigger 1, the primary at 0.1 where the fallback achieved 0.9: the primary gets one interval back after
    # each hold (the window after a hold shows the fallback's work and is not judged), its own window then trips
    # the watchdog again.
    assert pattern.startswith("PFFFPFFFFFFPFFFFFFFFFFP")
    assert [len(r) for r in pattern.split("P") if r][:3] == [3, 6, 10]
    assert [wd.params.hold_for(trip) for trip in (1, 2, 3, 5)] == [3, 6, 10, 10]


def test_unknown_attainment_is_no_verdict_and_keeps_the_streak() -> None:
    wd = watchdog(trigger_intervals=3)
    step(wd, 0.1)  # not judged (first window)
    step(wd, 0.1)
    step(wd, 0.1)
    for _ in range(10):
        assert step(wd, None).reason == "primary"
        assert wd.state.failing_streak == 2
        assert wd.state.attainment_frac is None
    step(wd, 0.1)
    assert wd.state.tripped


def test_a_recovered_interval_resets_the_streak() -> None:
    wd = watchdog(trigger_intervals=3)
    for value in (0.1, 0.1, 0.1, 0.6, 0.1, 0.1):
        step(wd, value)
    assert wd.state.trips == 0
    assert wd.state.failing_streak == 2


def test_attainment_is_weighted_by_priority_and_rate() -> None:
    tenants = {
        "chat": TenantWindow(request_rate_rps=4.0, slo_attainment_frac=0.5),
        "batch": TenantWindow(request_rate_rps=2.0, slo_attainment_frac=1.0),
    }
    context = PolicyContext(TENANTS, GROUPS, {"g": DEPLOYED}, BASE, BASE)
    observation = build_observation(MetricWindow(0.0, 15.0, tenants, {}), context.observation_context())
    # chat 2.0 x 4 x 0.5 + batch 0.5 x 2 x 1.0 over 2.0 x 4 + 0.5 x 2
    assert weighted_attainment(observation, context) == pytest.approx((4.0 + 1.0) / (8.0 + 1.0))
    silent = build_observation(MetricWindow(0.0, 15.0, {}, {}), context.observation_context())
    assert weighted_attainment(silent, context) is None


def test_a_fallback_with_its_own_pool_opinion_keeps_it() -> None:
    wd = SloWatchdog(AllPrefill(), make_baseline("aggregated"), WatchdogParams(trigger_intervals=1))
    step(wd, 0.0)
    action = step(wd, 0.0, PoolTargets(3, 1))
    assert wd.state.in_fallback
    assert action.pools["g"].num_prefill == 0  # aggregated: prefill pool at its min, not the deployed 2P2D


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("min_attainment_frac", 0.0, "watchdog min_attainment_frac must be within (0, 1], got 0.0"),
        ("min_attainment_frac", 1.5, "watchdog min_attainment_frac must be within (0, 1], got 1.5"),
        ("trigger_intervals", 0, "watchdog trigger_intervals must be >= 1, got 0"),
        ("hold_intervals", 0, "watchdog hold_intervals must be >= 1, got 0"),
        ("backoff", 0.5, "watchdog backoff must be >= 1, got 0.5"),
        ("max_hold_intervals", 5, "watchdog max_hold_intervals (5) must be >= hold_intervals (20)"),
        ("fallback_margin_frac", -0.1, "watchdog fallback_margin_frac must be within [0, 1), got -0.1"),
        ("load_tolerance_frac", 0.0, "watchdog load_tolerance_frac must be > 0, got 0.0"),
        ("min_evidence_windows", 0, "watchdog min_evidence_windows must be >= 1, got 0"),
        ("max_evidence_windows", 2, "watchdog max_evidence_windows (2) must be >= min_evidence_windows (3)"),
        ("handback_windows", -1, "watchdog handback_windows must be >= 0, got -1"),
        ("settle_grace_s", -1.0, "watchdog settle_grace_s must be >= 0, got -1.0"),
    ],
)
def test_bad_parameters_are_refused_naming_the_field(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        WatchdogParams(**{field: value})  # type: ignore[arg-type]


def test_a_primary_as_poor_as_the_fallback_was_is_not_failing() -> None:
    wd = watchdog(trigger_intervals=1, hold_intervals=4)
    # Both at 0.1: the first trip is the floor's (no evidence yet); the fallback's hold records that it did no
    # better at this load, so the primary is not handed over again.
    pattern = run(wd, primary=0.1, fallback=0.1, ticks=30)
    assert pattern == "PFFFF" + "P" * 25
    assert wd.state.trips == 1
    assert wd.state.fallback_estimate_frac == pytest.approx(0.1)
    assert wd.state.bar_frac == pytest.approx(0.05)
    assert wd.state.evidence_windows == 4


def test_a_primary_above_the_floor_but_clearly_below_the_fallback_trips() -> None:
    wd = watchdog(trigger_intervals=2, hold_intervals=3)
    assert run(wd, primary=0.2, fallback=0.95, ticks=6) == "PPFFFP"  # the floor's trip
    # Now 0.7: above the 0.5 floor, but far below what the fallback achieved at this load.
    assert run(wd, primary=0.7, fallback=0.95, ticks=10) == "PFFFFFFPPF"  # trips 2 and 3
    assert wd.state.trips == 3
    assert wd.state.fallback_estimate_frac == pytest.approx(0.95)
    assert wd.state.bar_frac == pytest.approx(0.90)
    # Within the margin of the fallback's record is not failing.
    close = watchdog(trigger_intervals=2, hold_intervals=3)
    run(close, primary=0.2, fallback=0.95, ticks=6)
    assert run(close, primary=0.92, fallback=0.95, ticks=20) == "P" * 20


def test_without_comparable_load_the_floor_judges() -> None:
    wd = watchdog(trigger_intervals=2, hold_intervals=3)
    run(wd, primary=0.2, fallback=0.95, ticks=6)  # evidence at 0.5 req/s per instance
    # Five times the load: no comparable fallback window, so 0.7 (above the floor) is not failing...
    assert run(wd, primary=0.7, fallback=0.95, ticks=10, rate_rps=5.0) == "P" * 10
    assert wd.state.fallback_estimate_frac is None
    assert wd.state.bar_frac == 0.5
    # ...and 0.3 (below it) is.
    assert "F" in run(wd, primary=0.3, fallback=0.95, ticks=10, rate_rps=5.0)


def test_a_fallback_that_failed_under_lighter_load_lowers_the_floor_at_a_heavier_one() -> None:
    wd = watchdog(trigger_intervals=2, hold_intervals=3, handback_windows=0)
    run(wd, primary=0.1, fallback=0.1, ticks=6)  # the fallback got 0.1 at 0.5 req/s per instance
    # Five times the load: no comparable window, but the fallback did no better than 0.1 under less load, so a
    # primary at 0.3 (below the floor) is not failing: the bar is 0.1 less the margin.
    assert run(wd, primary=0.3, fallback=0.1, ticks=10, rate_rps=5.0) == "P" * 10
    assert wd.state.bar_frac == pytest.approx(0.05)
    assert wd.state.fallback_estimate_frac == pytest.approx(0.1)
    # At a lighter load than any record the floor judges.
    lighter = watchdog(trigger_intervals=2, hold_intervals=3, handback_windows=0)
    run(lighter, primary=0.1, fallback=0.1, ticks=6, rate_rps=5.0)
    assert "F" in run(lighter, primary=0.3, fallback=0.1, ticks=10, rate_rps=0.5)


def test_pools_are_restored_relative_to_the_budget() -> None:
    wd = watchdog(trigger_intervals=1)
    step(wd, 0.2)  # started at 2P2D of a 4-instance budget: half prefill, the whole budget
    doubled = (replace(GROUPS[0], gpu_budget=8, max_prefill=None, max_decode=None),)
    action = step(wd, 0.2, PoolTargets(3, 1), groups=doubled)
    assert wd.state.tripped
    assert action.pools == {"g": PoolTargets(4, 4)}  # the same shares of the new budget, not 2P2D
    bounded = replace(GROUPS[0], gpu_budget=8)  # prefill at most 3, decode at most 4
    assert BudgetSplit(0.5, 1.0).applied_to(bounded) == PoolTargets(3, 4)
    half = BudgetSplit.of(GROUPS[0], PoolTargets(1, 1))
    assert half == BudgetSplit(0.5, 0.5)
    assert half.applied_to(doubled[0]) == PoolTargets(2, 2)
    assert BudgetSplit.of(GROUPS[0], PoolTargets(0, 0)) is None


def _any() -> tuple[Observation, PolicyContext]:
    context = PolicyContext(TENANTS, GROUPS, {"g": DEPLOYED}, BASE, BASE)
    return build_observation(MetricWindow(0.0, 15.0, {}, {}), context.observation_context()), context


def test_a_fallback_doing_no_better_hands_control_back_early() -> None:
    """The primary trips the floor at 0.3 where its fallback does 0.2: after the fallback's first window (its
    predecessor's backlog) and three more, the watchdog hands back instead of holding 20 intervals."""
    wd = watchdog(trigger_intervals=2, hold_intervals=20)
    pattern = run(wd, primary=0.3, fallback=0.2, ticks=40)
    runs = [len(r) for r in pattern.split("P") if r]
    assert runs[0] == 4  # first fallback window skipped, three judged, handed back on the next decision
    assert wd.state.trips == 1  # the fallback's record (0.2) is now the bar: the primary at 0.3 is not failing
    # The hand-back decision says why.
    again = watchdog(trigger_intervals=2, hold_intervals=20)
    reasons = []
    for _ in range(10):
        reasons.append(step(again, 0.2 if again.state.in_fallback else 0.3).reason)
    back = [r for r in reasons if "primary back" in r]
    assert back == [
        "primary [primary back: fallback file:base no better (0.20 over 3 windows, 0.30 when the watchdog tripped)]"
    ]
    # Off, or a fallback clearly better: the whole hold is served.
    off = watchdog(trigger_intervals=2, hold_intervals=20, handback_windows=0)
    assert next(len(r) for r in run(off, primary=0.3, fallback=0.2, ticks=40).split("P") if r) == 20
    better = watchdog(trigger_intervals=2, hold_intervals=20)
    assert next(len(r) for r in run(better, primary=0.3, fallback=0.9, ticks=40).split("P") if r) == 20


def test_windows_are_not_judged_while_the_primarys_pools_are_still_coming_up_within_the_grace() -> None:
    """AllPrefill asks for (3, 1); the deployed (2, 2) keeps running, then an instance is pending, then (3, 1) runs."""
    wd = watchdog(trigger_intervals=2, settle_grace_s=60.0)
    step(wd, 0.1, PoolTargets(3, 1), now_s=-30.0)  # the first window: never judged
    step(wd, 0.1, PoolTargets(3, 1), now_s=-15.0)  # judged (the pools run): failing
    assert wd.state.failing_streak == 1
    step(wd, 0.1, now_s=0.0)  # the deployed split is back (an operator, say): the primary's move starts again
    assert wd.state.settling
    assert wd.state.failing_streak == 0  # a move ends the streak: the pools judged next are not those that failed
    for now_s in (15.0, 30.0, 45.0):  # the move is under way (sizes not yet running): not judged, whatever it shows
        step(wd, 0.1, now_s=now_s)
        assert wd.state.settling
        assert wd.state.bar_frac is None
        assert wd.state.failing_streak == 0
    step(wd, 0.1, PoolTargets(3, 1), now_s=50.0, pending=1)  # sizes running but an instance still starting
    assert wd.state.settling
    step(wd, 0.1, PoolTargets(3, 1), now_s=60.0)  # settled: judged from here on
    assert not wd.state.settling
    assert wd.state.failing_streak == 1
    step(wd, 0.1, PoolTargets(3, 1), now_s=75.0)
    assert wd.state.tripped


def test_after_a_settled_move_its_windows_are_not_judged_as_long_as_it_took_within_the_dwell_and_grace() -> None:
    wd = watchdog(trigger_intervals=2, settle_grace_s=60.0, move_dwell_s=30.0)
    step(wd, 0.1, now_s=0.0)  # the first window
    pattern = []
    for now_s, pools in ((15.0, DEPLOYED), (30.0, DEPLOYED), (45.0, PoolTargets(3, 1)), (60.0, PoolTargets(3, 1))):
        step(wd, 0.1, pools, now_s=now_s)
        pattern.append("s" if wd.state.settling else "P")
    # 15-30 s: the move (the deployed split still runs); 45 s: settled, the dwell starts; 60 s: within it
    assert "".join(pattern) == "ssss"
    assert wd.state.failing_streak == 0
    step(wd, 0.1, PoolTargets(3, 1), now_s=75.0)  # the dwell is over: judged, failing
    assert not wd.state.settling
    assert wd.state.failing_streak == 1
    step(wd, 0.1, PoolTargets(3, 1), now_s=90.0)
    assert wd.state.tripped
    # A short move gets a short dwell: as long as it took (15 s), not the whole 30 s.
    short = watchdog(trigger_intervals=2, settle_grace_s=60.0, move_dwell_s=30.0)
    step(short, 0.1, now_s=0.0)
    step(short, 0.1, DEPLOYED, now_s=15.0)  # the move
    step(short, 0.1, PoolTargets(3, 1), now_s=30.0)  # settled after 15 s: dwelling
    assert short.state.settling
    step(short, 0.1, PoolTargets(3, 1), now_s=45.0)  # judged
    assert not short.state.settling
    assert short.state.failing_streak == 1
    # A move that overran its grace gets no dwell: unjudged for at most grace + dwell from its first window.
    slow = watchdog(trigger_intervals=5, settle_grace_s=60.0, move_dwell_s=30.0)
    step(slow, 0.1, now_s=0.0)
    marks = []
    for tick in range(1, 8):  # the move runs from 15 s to 90 s, the pools run from 105 s
        step(slow, 0.1, PoolTargets(3, 1) if tick >= 7 else DEPLOYED, now_s=15.0 * tick)
        marks.append("s" if slow.state.settling else "P")
    # 15-60 s: the grace; 75-90 s: judged (the grace is spent); 105 s: settled, 90 s after the move's first window
    assert "".join(marks) == "ssssPPP"


def test_a_primary_whose_pools_never_come_up_is_judged_once_the_grace_is_spent() -> None:
    wd = watchdog(trigger_intervals=2, settle_grace_s=60.0)
    pattern = []
    for tick in range(8):
        step(wd, 0.1, now_s=15.0 * tick)
        pattern.append("s" if wd.state.settling else ("F" if wd.state.in_fallback else "P"))
    # 0 s: the first window; 15-60 s: within the 60 s grace that starts at 15 s; 75 s: judged (failing);
    # 90 s: the second failing window trips.
    assert "".join(pattern) == "PssssPFF"
    # Without a grace (0) the same primary trips after its first two judged windows.
    wd = watchdog(trigger_intervals=2)
    assert run(wd, primary=0.1, fallback=0.9, ticks=4) == "PPFF"


class Mimic:
    """A primary that decides exactly as the file fallback does (and asks for no pool change)."""

    policy_id = "test:mimic"

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        action = FilePolicy(RESOLVED, "file:base").decide(observation, context)
        return ControlAction(thresholds=action.thresholds, reason="mimic", policy_id=self.policy_id)


def test_a_primary_deciding_as_the_fallback_would_is_not_judged() -> None:
    wd = SloWatchdog(Mimic(), FilePolicy(RESOLVED, "file:base"), WatchdogParams(trigger_intervals=2))
    for _ in range(8):  # failing all along, on the deployed split the fallback would restore
        step(wd, 0.1)
        assert not wd.state.in_fallback
    # No window is judged: the first shows what ran before the watchdog, every later one what the fallback does.
    assert wd.state.bar_frac is None
    assert wd.state.trips == 0
    assert wd.state.failing_streak == 0
    # Such windows are not taken as the fallback's record either: they come from wherever the primary chose to
    # run the fallback's rule (calm periods, for a selector), and judged against them later, a primary that
    # leaves the rule under heavier load is tripped for the load (traced on validation default-10023).
    assert wd.state.evidence_windows == 0
    # One that decides otherwise (AllPrefill asks for other pools) is handed over as before.
    assert run(watchdog(trigger_intervals=2), primary=0.1, fallback=0.9, ticks=4) == "PPFF"


TWO_GROUPS = resolve_policy(
    load_policy_text(
        """
pd_disaggregation_policy:
  remote_prefill: {min_input_tokens: 4096}
  local_prefill: {max_input_tokens: 2048}
tenant_groups:
  - {name: g, gpu_budget: 4, pools: {prefill: {min: 0, max: 3}, decode: {min: 1, max: 4}}}
  - {name: h, gpu_budget: 4, pools: {prefill: {min: 0, max: 3}, decode: {min: 1, max: 4}}}
tenants:
  - {name: chat, group: g, priority: 1.0, slo: {ttft_p95_ms: 500, tpot_p95_ms: 50}}
  - {name: code, group: h, priority: 1.0, slo: {ttft_p95_ms: 500, tpot_p95_ms: 50}}
"""
    )
)


class MovesG:
    """A primary that asks for 3P1D in group g and keeps h as deployed."""

    policy_id = "test:moves-g"

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        del observation, context
        return ControlAction(pools={"g": PoolTargets(3, 1), "h": DEPLOYED}, reason="primary", policy_id=self.policy_id)


def two_group_step(wd: SloWatchdog, chat: float, code: float, g_pools: PoolTargets, now_s: float) -> None:
    """One decision: tenant chat (group g) and code (group h) at these attainments, h running as deployed."""
    tenants = {
        "chat": TenantWindow(request_rate_rps=1.0, slo_attainment_frac=chat),
        "code": TenantWindow(request_rate_rps=1.0, slo_attainment_frac=code),
    }
    groups = {"g": GroupWindow(g_pools.num_prefill, g_pools.num_decode), "h": GroupWindow(2, 2)}
    window = MetricWindow(100.0, 15.0, tenants, groups)
    named = tuple(tp.tenant for name, tp in TWO_GROUPS.tenants.items() if name != "default")
    base = {name: tp.thresholds for name, tp in TWO_GROUPS.tenants.items()}
    context = PolicyContext(
        named,
        tuple(TWO_GROUPS.groups.values()),
        {"g": g_pools, "h": DEPLOYED},
        base,
        base,
        now_s=now_s,
        interval_s=15.0,
    )
    wd.decide(build_observation(window, context.observation_context()), context)


def test_one_groups_move_leaves_the_other_groups_judged() -> None:
    """Group g is moving (3P1D asked, 2P2D running): its tenant is left out, and group h failing alone trips the
    watchdog; h fine while g fails does not. With every group moving, the window is not judged at all."""
    fallback = FilePolicy(TWO_GROUPS, "file:base")
    params = WatchdogParams(trigger_intervals=2, settle_grace_s=600.0, move_dwell_s=0.0)
    wd = SloWatchdog(MovesG(), fallback, params)
    two_group_step(wd, 0.9, 0.9, DEPLOYED, now_s=0.0)  # the first window: never judged
    two_group_step(wd, 0.9, 0.1, DEPLOYED, now_s=15.0)
    assert wd.state.settling_groups == ("g",)
    assert not wd.state.settling
    assert wd.state.attainment_frac == pytest.approx(0.5)  # what the window showed, both tenants
    assert wd.state.failing_streak == 1  # judged on h alone: 0.1
    two_group_step(wd, 0.9, 0.1, DEPLOYED, now_s=30.0)
    assert wd.state.tripped
    # The other way round: g (moving) fails, h is fine: judged on h, not failing.
    calm = SloWatchdog(MovesG(), fallback, params)
    for tick in range(6):
        two_group_step(calm, 0.0, 0.9, DEPLOYED, now_s=15.0 * tick)
    assert calm.state.trips == 0
    assert calm.state.failing_streak == 0
    assert calm.state.bar_frac == 0.5


def test_the_streak_ends_when_the_moving_groups_change() -> None:
    fallback = FilePolicy(TWO_GROUPS, "file:base")
    wd = SloWatchdog(MovesG(), fallback, WatchdogParams(trigger_intervals=3, settle_grace_s=600.0, move_dwell_s=0.0))
    two_group_step(wd, 0.1, 0.1, PoolTargets(3, 1), now_s=0.0)  # the first window
    two_group_step(wd, 0.1, 0.1, PoolTargets(3, 1), now_s=15.0)  # nothing moving: judged on both, failing
    two_group_step(wd, 0.1, 0.1, PoolTargets(3, 1), now_s=30.0)
    assert wd.state.failing_streak == 2
    two_group_step(wd, 0.1, 0.1, DEPLOYED, now_s=45.0)  # g moves again: another population is judged
    assert wd.state.settling_groups == ("g",)
    assert wd.state.failing_streak == 1
    assert not wd.state.tripped


class FallbackInH:
    """A primary that runs group h exactly as the file fallback would and asks for 3P1D in group g."""

    policy_id = "test:fallback-in-h"

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        action = FilePolicy(TWO_GROUPS, "file:base").decide(observation, context)
        thresholds = {"code": action.thresholds["code"]}
        return ControlAction(
            thresholds=thresholds, pools={"g": PoolTargets(3, 1), "h": DEPLOYED}, reason="p", policy_id=self.policy_id
        )


def test_groups_run_as_the_fallback_would_are_left_out_of_the_judgement() -> None:
    """Group h runs as the fallback would run it and fails there (the fallback's own failure: a hand-over would
    change nothing in h, only undo what the primary does in g); g, where the primary differs, is fine: no trip.
    The same windows with g failing too trip the watchdog, judged on g alone."""
    fallback = FilePolicy(TWO_GROUPS, "file:base")
    params = WatchdogParams(trigger_intervals=2, settle_grace_s=600.0, move_dwell_s=0.0)
    wd = SloWatchdog(FallbackInH(), fallback, params)
    for tick in range(8):
        two_group_step(wd, 0.9, 0.0, PoolTargets(3, 1), now_s=15.0 * tick)
    assert wd.state.trips == 0
    assert wd.state.bar_frac == 0.5
    assert wd.state.settling_groups == ()
    failing = SloWatchdog(FallbackInH(), fallback, params)
    for tick in range(3):
        two_group_step(failing, 0.2, 0.9, PoolTargets(3, 1), now_s=15.0 * tick)
    assert failing.state.tripped


def test_the_fallback_is_judged_on_the_groups_that_tripped_the_watchdog() -> None:
    """Group g fails under the primary (judged alone: h runs as the fallback would, at 0.9). The fallback then does
    no better in g: its hold is cut short on g's windows, not kept on the cluster's 0.5, which h's health would
    flatter. And what it achieved in g is the bar g is held to afterwards: 0.1 against the fallback's 0.1 is not
    failing, where the cluster's record would have set a bar of 0.45 and tripped the watchdog again."""
    fallback = FilePolicy(TWO_GROUPS, "file:base")
    params = WatchdogParams(trigger_intervals=2, hold_intervals=10, handback_windows=3, settle_grace_s=0.0)
    wd = SloWatchdog(FallbackInH(), fallback, params)
    pattern = ""
    for tick in range(20):
        two_group_step(wd, 0.1, 0.9, PoolTargets(3, 1), now_s=15.0 * tick)
        pattern += "F" if wd.state.in_fallback else "P"
    assert pattern == "PPFFFF" + "P" * 14  # the trip, the first hold window and three no better: back
    assert wd.state.trips == 1
    assert wd.state.bar_frac == pytest.approx(0.05)  # the fallback's 0.1 in g, less the margin
    assert wd.state.fallback_estimate_frac == pytest.approx(0.1)
    assert wd.state.failing_streak == 0
