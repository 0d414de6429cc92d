"""control_step: decision, guard, overrides, pool diff, threshold table and document, next states."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from policies.base import PolicyContext
from policies.control import POLICY_ERROR_REASON, ControlInputs, ControlState, control_step
from policies.features import Observation
from policies.guard import ClampReason, GuardLimits, SafetyGuard
from policies.overrides import load_override
from policies.policy_file import PolicyFile, load_policy_text, resolve_policy
from policies.rules import FilePolicy
from policies.schema import ControlAction, GroupWindow, MetricWindow, PoolTargets, TenantWindow

BASE = resolve_policy(
    load_policy_text(
        """
tenant_groups:
  - {name: g, gpu_budget: 6, pools: {prefill: {min: 1, max: 4}, decode: {min: 1, max: 4}}}
tenants:
  - {name: chat, group: g, slo: {ttft_p95_ms: 1000}}
  - {name: rag, group: g, slo: {ttft_p95_ms: 4000}}
""",
        "base.yaml",
    ),
    "base.yaml",
)
TENANTS = tuple(tp.tenant for name, tp in BASE.tenants.items() if name != "default")
BASE_THRESHOLDS = {name: BASE.tenants[name].thresholds for name in ("chat", "rag")}
GUARD = SafetyGuard(GuardLimits(max_step_per_tick=1, cooldown_s=30.0, hysteresis_ticks=1, max_staleness_s=30.0))
NOW = datetime(2026, 1, 1, tzinfo=UTC)
OTHER = replace(BASE_THRESHOLDS["rag"], min_remote_input_tokens=3072)


def inputs(now_s: float = 100.0, staleness_s: float = 0.0, **kwargs: object) -> ControlInputs:
    tenants = {t.name: TenantWindow(request_rate_rps=1.0) for t in TENANTS}
    window = MetricWindow(now_s, 10.0, tenants, {"g": GroupWindow(2, 2, decode_kv_usage_frac=0.5)}, staleness_s)
    values: dict[str, object] = {
        "window": window,
        "tenants": TENANTS,
        "groups": tuple(BASE.groups.values()),
        "current_pools": {"g": PoolTargets(2, 2)},
        "base_thresholds": BASE_THRESHOLDS,
        "now_s": now_s,
        "interval_s": 10.0,
        "now": NOW + timedelta(seconds=now_s),
    }
    values.update(kwargs)
    return ControlInputs(**values)  # type: ignore[arg-type]


class Broken:
    policy_id = "broken"

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        raise ZeroDivisionError("boom")


def test_a_decided_action_is_guarded_and_diffed_against_the_running_pools() -> None:
    action = ControlAction(thresholds={"rag": OTHER}, pools={"g": PoolTargets(4, 2)}, reason="ask")
    effects = control_step(action, inputs(), ControlState.start(BASE_THRESHOLDS), GUARD)
    assert effects.pool_changes == {"g": PoolTargets(3, 2)}  # one instance per pool per tick
    assert [c.reason for c in effects.clamps] == [ClampReason.MAX_STEP]
    assert effects.publish  # nothing published yet: the first step publishes the full table
    assert effects.thresholds == {"chat": BASE_THRESHOLDS["chat"], "rag": OTHER}
    assert effects.policy_document is None  # no base policy given
    assert effects.reason == "ask"
    assert not effects.override_active
    assert not effects.in_fallback
    assert not effects.stale


def test_next_state_applied_or_held() -> None:
    state = ControlState.start(BASE_THRESHOLDS)
    effects = control_step(ControlAction(thresholds={"rag": OTHER}), inputs(), state, GUARD)
    applied, held = effects.next_state(applied=True), effects.next_state(applied=False)
    assert applied.policy_thresholds["rag"] == OTHER
    assert applied.published == effects.thresholds
    assert held.policy_thresholds == state.policy_thresholds
    assert held.published is None
    assert applied.guard == held.guard  # the guard's memory moves on either way
    assert held.guard.tenants == {"rag": 100.0}
    # Applied: the same table again has nothing to publish; the threshold cooldown holds a further change.
    again = control_step(ControlAction(thresholds={"rag": OTHER}), inputs(110.0), applied, GUARD)
    assert again.empty
    further = replace(OTHER, min_remote_input_tokens=4096)
    held_change = control_step(ControlAction(thresholds={"rag": further}), inputs(110.0), applied, GUARD)
    assert [c.reason for c in held_change.clamps] == [ClampReason.THRESHOLD_COOLDOWN]


def test_policy_document_round_trips_the_published_table() -> None:
    effects = control_step(
        ControlAction(thresholds={"rag": OTHER}), inputs(base_policy=BASE), ControlState.start(BASE_THRESHOLDS), GUARD
    )
    assert effects.policy_document is not None
    resolved = resolve_policy(PolicyFile.model_validate(effects.policy_document), "doc")
    assert {n: resolved.tenants[n].thresholds for n in ("chat", "rag")} == effects.thresholds


def test_overrides_win_in_force_but_not_in_the_policys_view() -> None:
    override = load_override(
        "tenants: [{name: rag, pd_disaggregation_policy: {remote_prefill: {min_input_tokens: 9000}}}]\n"
        f"expires_at: '{(NOW + timedelta(seconds=150)).isoformat()}'\n",
        "o.yaml",
        BASE,
    )
    state = ControlState.start(BASE_THRESHOLDS)
    effects = control_step(ControlAction(thresholds={"rag": OTHER}), inputs(overrides=(override,)), state, GUARD)
    assert effects.override_active
    assert effects.override_tenants == ("rag",)
    assert effects.thresholds["rag"].min_remote_input_tokens == 9000
    assert effects.next_state(applied=True).policy_thresholds["rag"] == OTHER
    expired = control_step(
        ControlAction(), inputs(160.0, overrides=(override,)), effects.next_state(applied=True), GUARD
    )
    assert not expired.override_active
    assert expired.publish
    assert expired.thresholds["rag"] == OTHER


def test_a_policy_that_raises_holds_only_when_asked() -> None:
    state = ControlState.start(BASE_THRESHOLDS)
    with pytest.raises(ZeroDivisionError):
        control_step(Broken(), inputs(), state, GUARD)
    effects = control_step(Broken(), inputs(), state, GUARD, hold_on_policy_error=True)
    assert effects.decision.reason == POLICY_ERROR_REASON
    assert effects.decision.policy_id == "broken"
    assert effects.pool_changes == {}
    assert effects.policy_error == "ZeroDivisionError: boom"
    assert isinstance(effects.policy_exception, ZeroDivisionError)


def test_a_policy_is_asked_on_the_context_the_step_builds() -> None:
    policy = FilePolicy(BASE, "file:base.yaml")
    state = ControlState(policy_thresholds={"chat": BASE_THRESHOLDS["chat"], "rag": OTHER})
    effects = control_step(policy, inputs(staleness_s=60.0), state, GUARD)
    assert effects.stale
    assert effects.decision.policy_id == "file:base.yaml"
    # The file policy asks for the base thresholds; the window is stale, so the guard holds rag's change.
    assert ClampReason.STALE_HOLD_THRESHOLDS in {c.reason for c in effects.clamps}
    assert effects.thresholds["rag"] == OTHER
