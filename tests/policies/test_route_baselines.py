"""The peer systems' per-request rules (B1-B5) in the shared core."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies import (
    LiveState,
    RequestFeatures,
    Route,
    RouteReason,
    RoutingThresholds,
    decide_route,
    load_policy_text,
    resolve_policy,
)
from policies.schema import RouteRule


def req(input_tokens: int) -> RequestFeatures:
    return RequestFeatures("r", "t", input_tokens, 10)


B2 = RoutingThresholds(rule=RouteRule.LLMD_NONCACHED, min_remote_input_tokens=16, max_local_input_tokens=0)
B3 = RoutingThresholds(rule=RouteRule.DYNAMO_ISL_BOUNDING, min_remote_input_tokens=2048)
B4 = RoutingThresholds(
    rule=RouteRule.DYNAMO_ISL_OR_LOAD, min_remote_input_tokens=2048, decode_pressure_threshold_frac=0.9
)
B5 = RoutingThresholds(rule=RouteRule.DYNAMO_LEGACY, max_local_input_tokens=1000, min_remote_input_tokens=1000)


@pytest.mark.parametrize(
    ("thresholds", "input_tokens", "live", "route"),
    [
        (RoutingThresholds(rule=RouteRule.ALWAYS_REMOTE), 10, LiveState(), Route.REMOTE_PREFILL),
        (RoutingThresholds(rule=RouteRule.AGGREGATED_ONLY), 50_000, LiveState(), Route.LOCAL_PREFILL),
        (B2, 100, LiveState(prefix_hit_tokens=90), Route.LOCAL_PREFILL),
        (B2, 100, LiveState(prefix_hit_tokens=84), Route.REMOTE_PREFILL),
        # isl_bounding bypasses only with a large cached share: a cold short prompt still goes remote
        (B3, 1000, LiveState(prefix_hit_tokens=0), Route.REMOTE_PREFILL),
        (B3, 1000, LiveState(prefix_hit_tokens=400), Route.LOCAL_PREFILL),
        (B3, 10_000, LiveState(prefix_hit_tokens=9000), Route.LOCAL_PREFILL),
        (B3, 10_000, LiveState(prefix_hit_tokens=5000), Route.REMOTE_PREFILL),
        # isl_or_load: prefill busy → local, unless the decode gate vetoes
        (B4, 8000, LiveState(prefill_active_tokens=200_000, prefill_max_batched_tokens=8192), Route.LOCAL_PREFILL),
        (B4, 8000, LiveState(prefill_active_tokens=100_000, prefill_max_batched_tokens=8192), Route.REMOTE_PREFILL),
        (
            B4,
            8000,
            LiveState(prefill_active_tokens=200_000, prefill_max_batched_tokens=8192, decode_kv_usage_frac=0.95),
            Route.REMOTE_PREFILL,
        ),
        (B5, 1001, LiveState(prefill_queue_requests=1), Route.REMOTE_PREFILL),
        (B5, 1001, LiveState(prefill_queue_requests=2), Route.LOCAL_PREFILL),
        (B5, 1000, LiveState(), Route.LOCAL_PREFILL),
    ],
)
def test_baseline_rules(thresholds: RoutingThresholds, input_tokens: int, live: LiveState, route: Route) -> None:
    assert decide_route(req(input_tokens), thresholds, live).route is route


def test_deployment_facts_hold_for_every_rule() -> None:
    for rule in RouteRule:
        t = RoutingThresholds(rule=rule)
        assert decide_route(req(50_000), t, LiveState(kv_transfer_healthy=False)).reason is (
            RouteReason.KV_TRANSFER_UNHEALTHY
        )
        assert decide_route(req(50_000), replace(t, disaggregation_enabled=False), LiveState()).route is (
            Route.LOCAL_PREFILL
        )


def test_rule_and_params_from_a_policy_file() -> None:
    text = (
        "pd_disaggregation_policy:\n  rule: dynamo_legacy\n  baseline_params: {max_prefill_queue_requests: 4}\n"
        "  local_prefill: {max_input_tokens: 1000}\n"
    )
    t = resolve_policy(load_policy_text(text)).thresholds_for("default")
    assert t.rule is RouteRule.DYNAMO_LEGACY
    assert t.max_prefill_queue_requests == 4
    assert decide_route(req(1500), t, LiveState(prefill_queue_requests=3)).is_remote
