"""SafetyGuard: bounds, budget, step, staleness, missing data, pending, cooldown, hysteresis; properties."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import PolicyContext
from policies.guard import (
    ORDERED_THRESHOLD_FIELDS,
    ClampReason,
    GroupGuardState,
    GuardLimits,
    GuardState,
    SafetyGuard,
    ThresholdMove,
)
from policies.schema import (
    ControlAction,
    GroupWindow,
    MetricWindow,
    PoolTargets,
    RouteRule,
    RoutingThresholds,
    Slo,
    Tenant,
    TenantGroup,
    TenantWindow,
)

GROUP = TenantGroup("g", ("a",), gpu_budget=8, min_prefill=1, max_prefill=5, min_decode=2, max_decode=6)
TENANT = Tenant("a", "g", Slo(ttft_p95_s=1.0))
LIMITS = GuardLimits(max_step_per_tick=1, cooldown_s=60.0, hysteresis_ticks=1, max_staleness_s=30.0)


def context(current: PoolTargets, now_s: float = 1000.0, group: TenantGroup = GROUP) -> PolicyContext:
    return PolicyContext(
        tenants=(TENANT,),
        groups=(group,),
        current_pools={group.name: current},
        current_thresholds={"a": RoutingThresholds()},
        now_s=now_s,
    )


def window(current: PoolTargets, *, staleness_s: float = 0.0, complete: bool = True, pending: int = 0) -> MetricWindow:
    group = GroupWindow(
        num_prefill=current.num_prefill,
        num_decode=current.num_decode,
        pending_prefill=pending,
        decode_kv_usage_frac=0.5 if complete else None,
    )
    return MetricWindow(1000.0, 30.0, {"a": TenantWindow(request_rate_rps=1.0)}, {"g": group}, staleness_s)


def run(
    current: PoolTargets,
    target: PoolTargets,
    limits: GuardLimits = LIMITS,
    state: GuardState | None = None,
    **window_kwargs: Any,
) -> tuple[PoolTargets, set[ClampReason], GuardState]:
    guard = SafetyGuard(limits)
    result = guard.apply(
        ControlAction(pools={"g": target}), context(current), window(current, **window_kwargs), state or GuardState()
    )
    return result.action.pools["g"], {c.reason for c in result.clamps}, result.state


def test_change_within_every_limit_passes() -> None:
    target, reasons, state = run(PoolTargets(2, 4), PoolTargets(3, 4))
    assert target == PoolTargets(3, 4)
    assert reasons == set()
    assert state.groups["g"].last_change_s == 1000.0


def test_bounds_clamp_both_pools() -> None:
    limits = GuardLimits(max_step_per_tick=10, cooldown_s=0.0, hysteresis_ticks=1)
    target, reasons, _ = run(PoolTargets(2, 4), PoolTargets(0, 7), limits)
    assert target == PoolTargets(1, 6)
    assert reasons == {ClampReason.BELOW_MIN, ClampReason.ABOVE_MAX}


def test_budget_cuts_the_increase() -> None:
    limits = GuardLimits(max_step_per_tick=10, cooldown_s=0.0, hysteresis_ticks=1)
    target, reasons, _ = run(PoolTargets(2, 5), PoolTargets(5, 5), limits)
    assert target == PoolTargets(3, 5)
    assert ClampReason.GPU_BUDGET in reasons


def test_max_step_limits_each_pool() -> None:
    limits = GuardLimits(max_step_per_tick=1, cooldown_s=0.0, hysteresis_ticks=1)
    target, reasons, _ = run(PoolTargets(1, 6), PoolTargets(4, 3), limits)
    assert target == PoolTargets(2, 5)
    assert ClampReason.MAX_STEP in reasons


def test_stale_window_never_scales_down() -> None:
    target, reasons, _ = run(PoolTargets(3, 5), PoolTargets(2, 5), staleness_s=31.0)
    assert target == PoolTargets(3, 5)
    assert ClampReason.STALE_NO_SCALE_DOWN in reasons


def test_stale_window_turns_a_rebalance_at_full_budget_into_a_hold() -> None:
    target, reasons, _ = run(PoolTargets(3, 5), PoolTargets(4, 4), staleness_s=100.0)
    assert target == PoolTargets(3, 5)
    assert ClampReason.STALE_NO_SCALE_DOWN in reasons


def test_stale_window_still_allows_scale_up() -> None:
    target, _, _ = run(PoolTargets(2, 4), PoolTargets(3, 4), staleness_s=100.0)
    assert target == PoolTargets(3, 4)


def test_missing_data_never_scales_down() -> None:
    target, reasons, _ = run(PoolTargets(3, 5), PoolTargets(3, 4), complete=False)
    assert target == PoolTargets(3, 5)
    assert ClampReason.MISSING_NO_SCALE_DOWN in reasons


def test_missing_tenant_rate_counts_as_missing() -> None:
    guard = SafetyGuard(LIMITS)
    w = window(PoolTargets(3, 5))
    w = MetricWindow(w.end_s, w.window_s, {"a": TenantWindow()}, w.groups, 0.0)
    result = guard.apply(ControlAction(pools={"g": PoolTargets(3, 4)}), context(PoolTargets(3, 5)), w, GuardState())
    assert result.action.pools["g"] == PoolTargets(3, 5)


def test_pending_change_holds() -> None:
    target, reasons, _ = run(PoolTargets(2, 4), PoolTargets(3, 4), pending=1)
    assert target == PoolTargets(2, 4)
    assert reasons == {ClampReason.PENDING_CHANGE}


def test_cooldown_holds_then_releases() -> None:
    limits = GuardLimits(max_step_per_tick=1, cooldown_s=60.0, hysteresis_ticks=1)
    recent = GuardState({"g": GroupGuardState(last_change_s=990.0)})
    target, reasons, _ = run(PoolTargets(2, 4), PoolTargets(3, 4), limits, recent)
    assert target == PoolTargets(2, 4)
    assert reasons == {ClampReason.COOLDOWN}
    old = GuardState({"g": GroupGuardState(last_change_s=900.0)})
    target, _, _ = run(PoolTargets(2, 4), PoolTargets(3, 4), limits, old)
    assert target == PoolTargets(3, 4)


def test_hysteresis_needs_consecutive_ticks_in_one_direction() -> None:
    limits = GuardLimits(max_step_per_tick=1, cooldown_s=0.0, hysteresis_ticks=3)
    state = GuardState()
    for _ in range(2):
        target, reasons, state = run(PoolTargets(2, 4), PoolTargets(3, 4), limits, state)
        assert target == PoolTargets(2, 4)
        assert reasons == {ClampReason.HYSTERESIS}
    # A change of direction restarts the count.
    target, reasons, state = run(PoolTargets(2, 4), PoolTargets(2, 5), limits, state)
    assert reasons == {ClampReason.HYSTERESIS}
    assert state.groups["g"].streak_ticks == 1
    for _ in range(2):
        target, _, state = run(PoolTargets(2, 4), PoolTargets(2, 5), limits, state)
    assert target == PoolTargets(2, 5)


def test_no_opinion_resets_the_streak() -> None:
    limits = GuardLimits(max_step_per_tick=1, cooldown_s=0.0, hysteresis_ticks=2)
    _, _, state = run(PoolTargets(2, 4), PoolTargets(3, 4), limits)
    assert state.groups["g"].streak_ticks == 1
    result = SafetyGuard(limits).apply(ControlAction(), context(PoolTargets(2, 4)), window(PoolTargets(2, 4)), state)
    assert result.state.groups["g"].streak_ticks == 0


def test_unknown_group_and_tenant_are_dropped() -> None:
    action = ControlAction(thresholds={"nobody": RoutingThresholds()}, pools={"nowhere": PoolTargets(1, 1)})
    result = SafetyGuard(LIMITS).apply(action, context(PoolTargets(2, 4)), window(PoolTargets(2, 4)), GuardState())
    assert result.action.pools == {}
    assert result.action.thresholds == {}
    assert {c.reason for c in result.clamps} == {ClampReason.UNKNOWN_GROUP, ClampReason.UNKNOWN_TENANT}


def test_stale_window_holds_thresholds() -> None:
    action = ControlAction(thresholds={"a": RoutingThresholds(min_remote_input_tokens=1024)})
    stale = window(PoolTargets(2, 4), staleness_s=60.0)
    result = SafetyGuard(LIMITS).apply(action, context(PoolTargets(2, 4)), stale, GuardState())
    assert result.action.thresholds == {}
    assert [c.reason for c in result.clamps] == [ClampReason.STALE_HOLD_THRESHOLDS]
    fresh = SafetyGuard(LIMITS).apply(action, context(PoolTargets(2, 4)), window(PoolTargets(2, 4)), GuardState())
    assert fresh.action.thresholds == action.thresholds


def test_thresholds_change_at_most_once_per_cooldown() -> None:
    guard = SafetyGuard(GuardLimits(cooldown_s=60.0))
    lower = ControlAction(thresholds={"a": RoutingThresholds(min_remote_input_tokens=1536)})
    first = guard.apply(lower, context(PoolTargets(2, 4), now_s=1000.0), window(PoolTargets(2, 4)), GuardState())
    assert first.action.thresholds == lower.thresholds
    assert first.state.tenants == {"a": 1000.0}
    lowered = {"a": RoutingThresholds(min_remote_input_tokens=1536)}
    again = ControlAction(
        thresholds={"a": RoutingThresholds(min_remote_input_tokens=1152, max_local_input_tokens=1024)}
    )
    ctx = replace(context(PoolTargets(2, 4), now_s=1030.0), current_thresholds=lowered)
    held = guard.apply(again, ctx, window(PoolTargets(2, 4)), first.state)
    assert held.action.thresholds == {}
    assert [c.reason for c in held.clamps] == [ClampReason.THRESHOLD_COOLDOWN]
    # Asking for what is already in force is not a change and passes.
    same = guard.apply(ControlAction(thresholds=lowered), ctx, window(PoolTargets(2, 4)), first.state)
    assert same.action.thresholds == lowered
    later = replace(ctx, now_s=1061.0)
    assert guard.apply(again, later, window(PoolTargets(2, 4)), first.state).action.thresholds == again.thresholds


pools = st.builds(PoolTargets, st.integers(0, 12), st.integers(0, 12))
groups = st.builds(
    lambda budget, min_p, min_d, extra_p, extra_d: TenantGroup(
        "g", ("a",), gpu_budget=max(budget, min_p + min_d), min_prefill=min_p, max_prefill=min_p + extra_p,
        min_decode=min_d, max_decode=min_d + extra_d,
    ),
    st.integers(2, 12), st.integers(0, 3), st.integers(1, 3), st.integers(0, 6), st.integers(0, 8),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    group=groups,
    current=pools,
    target=pools,
    step=st.integers(1, 3),
    staleness_s=st.sampled_from([0.0, 100.0]),
    complete=st.booleans(),
)
def test_guard_properties(
    group: TenantGroup, current: PoolTargets, target: PoolTargets, step: int, staleness_s: float, complete: bool
) -> None:
    limits = GuardLimits(max_step_per_tick=step, cooldown_s=0.0, hysteresis_ticks=1, max_staleness_s=30.0)
    ctx = context(current, group=group)
    w = window(current, staleness_s=staleness_s, complete=complete)
    action = ControlAction(pools={"g": target})
    before = copy.deepcopy((action, ctx, w))
    guard = SafetyGuard(limits)
    out = guard.apply(action, ctx, w, GuardState())
    again = guard.apply(action, ctx, w, GuardState())
    assert out == again, "deterministic"
    assert (action, ctx, w) == before, "pure: inputs untouched"
    result = out.action.pools["g"]
    assert abs(result.num_prefill - current.num_prefill) <= step
    assert abs(result.num_decode - current.num_decode) <= step
    max_p = group.max_prefill if group.max_prefill is not None else group.max_instances
    max_d = group.max_decode if group.max_decode is not None else group.max_instances
    for now, before_, low, high in (
        (result.num_prefill, current.num_prefill, group.min_prefill, max_p),
        (result.num_decode, current.num_decode, group.min_decode, max_d),
    ):
        # Inside the bounds stays inside; outside moves towards them, never further away.
        if low <= before_ <= high:
            assert low <= now <= high
        elif before_ > high:
            assert now <= before_
        else:
            assert now >= before_
    if current.num_instances <= group.max_instances:
        assert result.num_instances <= group.max_instances
    else:
        assert result.num_instances <= current.num_instances
    if staleness_s > limits.max_staleness_s or not complete:
        assert result.num_prefill >= current.num_prefill
        assert result.num_decode >= current.num_decode


def _thresholds_step(
    guard: SafetyGuard, current: RoutingThresholds, requested: RoutingThresholds, now_s: float, state: GuardState
) -> tuple[dict[str, RoutingThresholds], list[ClampReason], GuardState]:
    ctx = replace(context(PoolTargets(2, 4), now_s=now_s), current_thresholds={"a": current})
    result = guard.apply(ControlAction(thresholds={"a": requested}), ctx, window(PoolTargets(2, 4)), state)
    return dict(result.action.thresholds), [c.reason for c in result.clamps], result.state


def test_a_threshold_change_inside_the_dead_band_is_held() -> None:
    guard = SafetyGuard(GuardLimits(cooldown_s=0.0, threshold_dead_band_frac=0.05))
    base = RoutingThresholds()  # remote >= 2048, local <= 1024
    nudge = replace(base, min_remote_input_tokens=2000)  # 2.3 %
    out, reasons, state = _thresholds_step(guard, base, nudge, 1000.0, GuardState())
    assert out == {}
    assert reasons == [ClampReason.THRESHOLD_DEAD_BAND]
    assert state.tenants == {}
    step = replace(base, min_remote_input_tokens=1900)  # 7.2 %: outside the band
    assert _thresholds_step(guard, base, step, 1000.0, GuardState())[0] == {"a": step}
    # A switch (no direction) is never inside the band, however small the numeric changes.
    switch = replace(base, prefer_local_on_prefix_hit=False)
    assert _thresholds_step(guard, base, switch, 1000.0, GuardState())[0] == {"a": switch}
    # 0 turns the band off.
    off = SafetyGuard(GuardLimits(cooldown_s=0.0, threshold_dead_band_frac=0.0))
    assert _thresholds_step(off, base, nudge, 1000.0, GuardState())[0] == {"a": nudge}


def test_a_threshold_reversal_within_the_hold_is_refused_then_allowed() -> None:
    guard = SafetyGuard(GuardLimits(cooldown_s=60.0, threshold_reversal_hold_s=600.0))
    base = RoutingThresholds()
    lowered = replace(base, min_remote_input_tokens=1536)
    out, _, state = _thresholds_step(guard, base, lowered, 1000.0, GuardState())
    assert out == {"a": lowered}
    assert state.threshold_moves["a"]["min_remote_input_tokens"].direction == -1
    # Relaxing it back 2 minutes later (past the cooldown) is a reversal: refused, the memory unchanged.
    out, reasons, held = _thresholds_step(guard, lowered, base, 1120.0, state)
    assert out == {}
    assert reasons == [ClampReason.THRESHOLD_REVERSAL]
    assert held.threshold_moves == state.threshold_moves
    # Lowering further (same direction) is no reversal.
    further = replace(base, min_remote_input_tokens=1152)
    assert _thresholds_step(guard, lowered, further, 1120.0, state)[0] == {"a": further}
    # After the hold the move back passes and becomes the field's last move.
    out, reasons, after = _thresholds_step(guard, lowered, base, 1600.0, state)
    assert out == {"a": base}
    assert reasons == []
    assert after.threshold_moves["a"]["min_remote_input_tokens"] == ThresholdMove(1, 1600.0)
    # Only the field that moved is checked: moving another field up is not a reversal of this one.
    wider = replace(lowered, max_prefill_queue_wait_s=0.6)
    assert _thresholds_step(guard, lowered, wider, 1120.0, state)[0] == {"a": wider}


def test_without_reversal_hold_a_flapping_policy_flaps_and_with_it_does_not() -> None:
    base, lowered = RoutingThresholds(), RoutingThresholds(min_remote_input_tokens=1536)

    def reversals(limits: GuardLimits) -> int:
        guard, state, current, count, last = SafetyGuard(limits), GuardState(), base, 0, 0
        for tick in range(60):  # ten minutes at 10 s; the policy asks for the other side every tick
            ask = lowered if current == base else base
            out, _, state = _thresholds_step(guard, current, ask, 1000.0 + 10.0 * tick, state)
            if out:
                direction = 1 if out["a"].min_remote_input_tokens > current.min_remote_input_tokens else -1
                count += int(direction == -last)
                current, last = out["a"], direction
        return count

    assert reversals(GuardLimits(cooldown_s=10.0, threshold_reversal_hold_s=0.0)) == 59
    assert reversals(GuardLimits(cooldown_s=10.0, threshold_reversal_hold_s=600.0)) == 0
    assert reversals(GuardLimits(cooldown_s=10.0, threshold_reversal_hold_s=120.0)) == 4


def test_every_threshold_field_is_ordered_or_a_switch() -> None:
    from dataclasses import fields as dataclass_fields

    numeric = {f.name for f in dataclass_fields(RoutingThresholds) if f.type in ("int", "float")}
    assert numeric == set(ORDERED_THRESHOLD_FIELDS)


def test_guard_limits_refuse_bad_hysteresis_knobs() -> None:
    import pytest

    with pytest.raises(ValueError, match=r"^threshold_dead_band_frac must be within \[0, 1\), got 1.0$"):
        GuardLimits(threshold_dead_band_frac=1.0)
    with pytest.raises(ValueError, match=r"^threshold_reversal_hold_s must be >= 0, got -1\.0$"):
        GuardLimits(threshold_reversal_hold_s=-1.0)
    with pytest.raises(ValueError, match=r"^pool_reversal_hold_s must be >= 0, got -1\.0$"):
        GuardLimits(pool_reversal_hold_s=-1.0)


def test_a_handover_to_another_policy_may_reverse_at_once() -> None:
    guard = SafetyGuard(GuardLimits(cooldown_s=0.0, threshold_reversal_hold_s=600.0))
    base, raised = RoutingThresholds(), RoutingThresholds(min_remote_input_tokens=4096)
    ctx = replace(context(PoolTargets(2, 4), now_s=1000.0), current_thresholds={"a": base})
    first = guard.apply(
        ControlAction(thresholds={"a": raised}, policy_id="learned:x"), ctx, window(PoolTargets(2, 4)), GuardState()
    )
    assert first.state.threshold_moves["a"]["min_remote_input_tokens"] == ThresholdMove(1, 1000.0, "learned:x")
    later = replace(ctx, now_s=1060.0, current_thresholds={"a": raised})
    back = ControlAction(thresholds={"a": base}, policy_id="learned:x")
    assert guard.apply(back, later, window(PoolTargets(2, 4)), first.state).action.thresholds == {}
    # The watchdog's fallback (another policy id) undoes the primary's move at once.
    fallback = ControlAction(thresholds={"a": base}, policy_id="watchdog[baseline:dynamo-legacy]:learned:x")
    handed = guard.apply(fallback, later, window(PoolTargets(2, 4)), first.state)
    assert handed.action.thresholds == {"a": base}
    assert [c.reason for c in handed.clamps] == []


def test_a_change_of_route_rule_is_a_handover_not_a_reversal() -> None:
    """The rule selector moving a group to another rule gets that rule's thresholds, even against a recent move."""
    guard = SafetyGuard(GuardLimits(cooldown_s=60.0, threshold_reversal_hold_s=600.0))
    legacy = RoutingThresholds(rule=RouteRule.DYNAMO_LEGACY, min_remote_input_tokens=1000, max_local_input_tokens=1000)
    isl = RoutingThresholds(rule=RouteRule.DYNAMO_ISL_OR_LOAD, min_remote_input_tokens=2048)
    out, _, state = _thresholds_step(guard, legacy, isl, 1000.0, GuardState())
    assert out == {"a": isl}
    # Two minutes later the same policy moves the group back to legacy: the threshold falls again, but the rule
    # changes with it, so the change passes (before, the old rule kept running under the new rule's name).
    out, reasons, after = _thresholds_step(guard, isl, legacy, 1120.0, state)
    assert out == {"a": legacy}
    assert reasons == []
    assert after.threshold_moves["a"]["min_remote_input_tokens"] == ThresholdMove(-1, 1120.0)
    # Within one rule the reversal hold still applies.
    back_up = replace(legacy, min_remote_input_tokens=2048)
    assert _thresholds_step(guard, legacy, back_up, 1240.0, after)[1] == [ClampReason.THRESHOLD_REVERSAL]


def test_a_change_of_route_rule_passes_the_cooldown_and_restarts_it() -> None:
    """A handover between rules acts at once, within the cooldown of the last change; a change within one rule,
    asked for inside the cooldown that handover restarted, is held; a stale window holds the handover too."""
    guard = SafetyGuard(GuardLimits(cooldown_s=60.0, threshold_reversal_hold_s=0.0))
    legacy = RoutingThresholds(rule=RouteRule.DYNAMO_LEGACY, min_remote_input_tokens=1000, max_local_input_tokens=1000)
    isl = RoutingThresholds(rule=RouteRule.DYNAMO_ISL_OR_LOAD, min_remote_input_tokens=2048)
    out, _, state = _thresholds_step(guard, legacy, isl, 1000.0, GuardState())
    assert out == {"a": isl}
    out, reasons, state = _thresholds_step(guard, isl, legacy, 1020.0, state)  # 20 s later: inside the cooldown
    assert out == {"a": legacy}
    assert reasons == []
    assert state.tenants == {"a": 1020.0}  # an applied change: the cooldown restarts from it
    tweaked = replace(legacy, max_prefill_queue_requests=4)
    out, reasons, _ = _thresholds_step(guard, legacy, tweaked, 1060.0, state)
    assert out == {}
    assert reasons == [ClampReason.THRESHOLD_COOLDOWN]
    assert _thresholds_step(guard, legacy, tweaked, 1081.0, state)[0] == {"a": tweaked}
    stale = replace(context(PoolTargets(2, 4), now_s=1030.0), current_thresholds={"a": isl})
    held = guard.apply(
        ControlAction(thresholds={"a": legacy}), stale, window(PoolTargets(2, 4), staleness_s=600.0), state
    )
    assert held.action.thresholds == {}
    assert [c.reason for c in held.clamps] == [ClampReason.STALE_HOLD_THRESHOLDS]


# ----------------------------------------------------------------------------------- rollback on a broken path


def _broken(current: PoolTargets, *, failed: float = 0.6, staleness_s: float = 0.0, pending: int = 0) -> MetricWindow:
    """A window in which half the group's 15 remote legs (1 rps x 0.5 remote x 30 s) failed, or not."""
    group = GroupWindow(
        num_prefill=current.num_prefill,
        num_decode=current.num_decode,
        pending_prefill=pending,
        decode_kv_usage_frac=0.5,
        kv_transfer_time_p95_s=0.05,
        kv_transfer_failure_frac=failed,
    )
    tenants = {"a": TenantWindow(request_rate_rps=1.0, remote_prefill_frac=0.5)}
    return MetricWindow(1000.0, 30.0, tenants, {"g": group}, staleness_s)


def _guarded(
    current: PoolTargets, target: PoolTargets, window_: MetricWindow, state: GuardState | None = None
) -> tuple[PoolTargets, set[ClampReason]]:
    limits = GuardLimits(max_step_per_tick=1, cooldown_s=60.0, hysteresis_ticks=2, max_staleness_s=30.0)
    result = SafetyGuard(limits).apply(
        ControlAction(pools={"g": target}), context(current), window_, state or GuardState()
    )
    return result.action.pools["g"], {c.reason for c in result.clamps}


def test_a_broken_transfer_path_lets_a_move_toward_aggregated_through_in_one_tick() -> None:
    cooling = GuardState(groups={"g": GroupGuardState(last_change_s=990.0)})
    for state in (None, cooling):  # past the step limit, the hysteresis (2 ticks) and the cooldown
        target, reasons = _guarded(PoolTargets(5, 2), PoolTargets(1, 6), _broken(PoolTargets(5, 2)), state)
        assert target == PoolTargets(1, 6)  # still within bounds: min_prefill 1, max_decode 6
        assert reasons == {ClampReason.TRANSFER_ROLLBACK}
    target, _ = _guarded(PoolTargets(5, 2), PoolTargets(1, 6), _broken(PoolTargets(5, 2), pending=1))
    assert target == PoolTargets(1, 6)  # and past the pending-change hold
    target, reasons = _guarded(PoolTargets(5, 2), PoolTargets(0, 9), _broken(PoolTargets(5, 2)))
    assert target == PoolTargets(1, 6)  # bounds still apply
    assert ClampReason.BELOW_MIN in reasons
    assert ClampReason.ABOVE_MAX in reasons


def test_a_healthy_path_stale_data_or_a_move_toward_prefill_stay_paced() -> None:
    held = {ClampReason.MAX_STEP, ClampReason.HYSTERESIS}
    healthy = _guarded(PoolTargets(5, 2), PoolTargets(1, 6), _broken(PoolTargets(5, 2), failed=0.1))
    assert healthy == (PoolTargets(5, 2), held)
    stale = _guarded(PoolTargets(5, 2), PoolTargets(1, 6), _broken(PoolTargets(5, 2), staleness_s=60.0))
    assert stale[0] == PoolTargets(5, 2)
    assert ClampReason.TRANSFER_ROLLBACK not in stale[1]
    toward_prefill = _guarded(PoolTargets(2, 6), PoolTargets(5, 3), _broken(PoolTargets(2, 6)))
    assert toward_prefill == (PoolTargets(2, 6), held)


# ------------------------------------------------------------------------------------------ pool reversal hold

HOLD = GuardLimits(max_step_per_tick=1, cooldown_s=60.0, hysteresis_ticks=1, pool_reversal_hold_s=600.0)


def _pool_step(
    current: PoolTargets,
    target: PoolTargets,
    now_s: float,
    state: GuardState,
    *,
    policy_id: str = "baseline:queue_kv",
    limits: GuardLimits = HOLD,
    thresholds: tuple[RoutingThresholds, RoutingThresholds] | None = None,
    group: TenantGroup = GROUP,
) -> tuple[PoolTargets, set[ClampReason], GuardState]:
    """One guarded tick; ``thresholds`` = (running, asked) for tenant ``a`` (a change of its route rule, say)."""
    ctx = context(current, now_s=now_s, group=group)
    asked: dict[str, RoutingThresholds] = {}
    if thresholds is not None:
        ctx = replace(ctx, current_thresholds={"a": thresholds[0]})
        asked = {"a": thresholds[1]}
    action = ControlAction(thresholds=asked, pools={"g": target}, policy_id=policy_id)
    result = SafetyGuard(limits).apply(action, ctx, window(current), state)
    return result.action.pools["g"], {c.reason for c in result.clamps}, result.state


def test_a_pool_move_reversed_within_the_hold_is_held_then_allowed() -> None:
    """A sizer that adds a prefill instance and gives it back three minutes later is held for the hold's length;
    a move onward in the same direction, and the move back after the hold, pass."""
    target, reasons, state = _pool_step(PoolTargets(2, 4), PoolTargets(3, 3), 1000.0, GuardState())
    assert (target, reasons) == (PoolTargets(3, 3), set())
    assert state.groups["g"].last_move == (1, -1)
    assert state.groups["g"].last_move_policy_id == "baseline:queue_kv"
    target, reasons, held = _pool_step(PoolTargets(3, 3), PoolTargets(2, 4), 1180.0, state)
    assert (target, reasons) == (PoolTargets(3, 3), {ClampReason.POOL_REVERSAL})
    assert held.groups["g"].last_change_s == 1000.0  # a hold is not a change
    # Reversing one pool is enough: prefill back down with decode unchanged is held too.
    assert _pool_step(PoolTargets(3, 3), PoolTargets(2, 3), 1180.0, state)[1] == {ClampReason.POOL_REVERSAL}
    # Onward in the same direction passes (cooldown over).
    assert _pool_step(PoolTargets(3, 3), PoolTargets(4, 2), 1180.0, state)[0] == PoolTargets(4, 2)
    # After the hold the move back passes.
    target, reasons, _ = _pool_step(PoolTargets(3, 3), PoolTargets(2, 4), 1600.0, state)
    assert (target, reasons) == (PoolTargets(2, 4), set())
    # Off: the move back passes once the cooldown is over.
    off = replace(HOLD, pool_reversal_hold_s=0.0)
    assert _pool_step(PoolTargets(3, 3), PoolTargets(2, 4), 1180.0, state, limits=off)[0] == PoolTargets(2, 4)


def test_a_pool_that_grows_is_never_held() -> None:
    """Only giving back an instance is held: a sizer that shrank both pools in a quiet start and grows them again
    when a flood arrives gets its capacity at once (holding that halved the reactive sizers' goodput)."""
    _, _, state = _pool_step(PoolTargets(3, 3), PoolTargets(2, 2), 1000.0, GuardState())
    assert state.groups["g"].last_move == (-1, -1)
    target, reasons, _ = _pool_step(PoolTargets(2, 2), PoolTargets(3, 3), 1120.0, state)
    assert (target, reasons) == (PoolTargets(3, 3), set())
    # A rebalance back is held for the pool it shrinks: decode grew, so giving it back to prefill waits.
    _, _, toward_decode = _pool_step(PoolTargets(3, 3), PoolTargets(2, 4), 1000.0, GuardState())
    target, reasons, _ = _pool_step(PoolTargets(2, 4), PoolTargets(3, 3), 1120.0, toward_decode)
    assert (target, reasons) == (PoolTargets(2, 4), {ClampReason.POOL_REVERSAL})
    # Growing the pool that shrank, with the other unchanged, passes.
    assert _pool_step(PoolTargets(2, 4), PoolTargets(3, 4), 1120.0, toward_decode)[0] == PoolTargets(3, 4)


def test_a_pool_reversal_is_held_by_the_hold_not_only_by_the_cooldown() -> None:
    """The hold outlasts the cooldown: 61 s after a move, its reversal is held as a reversal."""
    _, _, state = _pool_step(PoolTargets(2, 4), PoolTargets(3, 4), 1000.0, GuardState())
    assert _pool_step(PoolTargets(3, 4), PoolTargets(2, 4), 1030.0, state)[1] == {ClampReason.COOLDOWN}
    assert _pool_step(PoolTargets(3, 4), PoolTargets(2, 4), 1061.0, state)[1] == {ClampReason.POOL_REVERSAL}


def test_another_policy_or_a_change_of_route_rule_may_reverse_the_pools_at_once() -> None:
    _, _, state = _pool_step(PoolTargets(2, 4), PoolTargets(3, 3), 1000.0, GuardState(), policy_id="learned:x")
    # The watchdog's fallback (another policy id) undoes the primary's move at once.
    fallback = _pool_step(
        PoolTargets(3, 3), PoolTargets(2, 4), 1180.0, state, policy_id="watchdog[baseline:dynamo-legacy]:learned:x"
    )
    assert fallback[:2] == (PoolTargets(2, 4), set())
    # The same policy moving the group to another rule: the new rule's pools act at once ...
    legacy = RoutingThresholds(rule=RouteRule.DYNAMO_LEGACY)
    aggregated = RoutingThresholds(rule=RouteRule.AGGREGATED_ONLY)
    to_aggregated = _pool_step(
        PoolTargets(3, 3), PoolTargets(2, 4), 1180.0, state, policy_id="learned:x", thresholds=(legacy, aggregated)
    )
    assert to_aggregated[:2] == (PoolTargets(2, 4), set())
    # ... and the group's move memory is forgotten even when the rule's first move waits (here: the hysteresis),
    # so the same move asked on the next tick, under the new rule, is not held as a reversal either.
    paced = replace(HOLD, hysteresis_ticks=2)
    waited = _pool_step(
        PoolTargets(3, 3), PoolTargets(2, 4), 1180.0, state,
        policy_id="learned:x", limits=paced, thresholds=(legacy, aggregated),
    )  # fmt: skip
    assert waited[:2] == (PoolTargets(3, 3), {ClampReason.HYSTERESIS})
    assert waited[2].groups["g"].last_move == (0, 0)
    next_tick = _pool_step(PoolTargets(3, 3), PoolTargets(2, 4), 1240.0, waited[2], policy_id="learned:x", limits=paced)
    assert next_tick[:2] == (PoolTargets(2, 4), set())
    # Without a change of rule the same policy is held.
    same_rule = _pool_step(
        PoolTargets(3, 3), PoolTargets(2, 4), 1180.0, state, policy_id="learned:x", thresholds=(legacy, legacy)
    )
    assert same_rule[1] == {ClampReason.POOL_REVERSAL}


def test_a_correction_into_the_bounds_is_never_held_as_a_reversal() -> None:
    """A group running outside its bounds (a narrowed policy file, say) is moved back into them at once."""
    _, _, state = _pool_step(PoolTargets(2, 4), PoolTargets(3, 3), 1000.0, GuardState())
    narrowed = replace(GROUP, max_prefill=2, min_decode=4)
    target, reasons, _ = _pool_step(PoolTargets(3, 3), PoolTargets(2, 4), 1180.0, state, group=narrowed)
    assert (target, reasons) == (PoolTargets(2, 4), set())
    # Within the bounds the same move is a reversal, and held.
    assert _pool_step(PoolTargets(3, 3), PoolTargets(2, 4), 1180.0, state)[1] == {ClampReason.POOL_REVERSAL}


def test_a_transfer_rollback_leaves_no_move_to_hold_the_way_back() -> None:
    """The rollback on a broken path applies at once and records no direction: the paced way back to a split,
    once the path works again, is not held as its reversal."""
    limits = replace(HOLD, hysteresis_ticks=1)
    rolled = SafetyGuard(limits).apply(
        ControlAction(pools={"g": PoolTargets(1, 6)}, policy_id="baseline:queue_kv"),
        context(PoolTargets(5, 2)),
        _broken(PoolTargets(5, 2)),
        GuardState(),
    )
    assert rolled.action.pools["g"] == PoolTargets(1, 6)
    assert rolled.state.groups["g"].last_move == (0, 0)
    # The rollback itself passes the hold: it reverses a move toward prefill made 10 s before.
    toward_prefill = GuardState(
        {"g": GroupGuardState(990.0, last_move=(1, -1), last_move_policy_id="baseline:queue_kv")}
    )
    again = SafetyGuard(limits).apply(
        ControlAction(pools={"g": PoolTargets(1, 6)}, policy_id="baseline:queue_kv"),
        context(PoolTargets(5, 2)),
        _broken(PoolTargets(5, 2)),
        toward_prefill,
    )
    assert again.action.pools["g"] == PoolTargets(1, 6)
    assert {c.reason for c in again.clamps} == {ClampReason.TRANSFER_ROLLBACK}
    target, reasons, _ = _pool_step(PoolTargets(1, 6), PoolTargets(2, 5), 1120.0, rolled.state, limits=limits)
    assert (target, reasons) == (PoolTargets(2, 5), set())
