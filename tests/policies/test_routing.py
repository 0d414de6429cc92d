from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import (
    LengthBucket,
    LiveState,
    RequestFeatures,
    Route,
    RouteReason,
    RoutingThresholds,
    decide_route,
    load_policy_text,
    resolve_policy,
    rollout_sampled,
)

SEED = RoutingThresholds()  # defaults equal the seed block
PRESSURED = LiveState(prefill_queue_wait_s=0.05, decode_pressure_frac=0.9)
QUIET = LiveState(prefill_queue_wait_s=0.05, decode_pressure_frac=0.1)


def req(input_tokens: int, output_tokens: int = 512, rid: str = "r1", model: str = "m") -> RequestFeatures:
    return RequestFeatures(rid, "t", input_tokens, output_tokens, model)


@pytest.mark.parametrize(
    ("features", "live", "route", "reason"),
    [
        (req(512), PRESSURED, Route.LOCAL_PREFILL, RouteReason.SHORT_PROMPT),
        (req(1024), PRESSURED, Route.LOCAL_PREFILL, RouteReason.SHORT_PROMPT),
        (req(4096), PRESSURED, Route.REMOTE_PREFILL, RouteReason.LONG_PROMPT),
        (req(2048), PRESSURED, Route.REMOTE_PREFILL, RouteReason.LONG_PROMPT),
        (req(4096), QUIET, Route.LOCAL_PREFILL, RouteReason.NO_DECODE_PRESSURE),
        (req(4096, output_tokens=16), PRESSURED, Route.LOCAL_PREFILL, RouteReason.SHORT_OUTPUT),
        (
            req(4096),
            replace(PRESSURED, prefill_queue_wait_s=0.5),
            Route.LOCAL_PREFILL,
            RouteReason.PREFILL_QUEUE_OVERLOAD,
        ),
        (req(4096), replace(PRESSURED, prefix_hit_tokens=3500), Route.LOCAL_PREFILL, RouteReason.PREFIX_CACHE_HIT),
        (
            req(4096),
            replace(PRESSURED, kv_transfer_healthy=False),
            Route.LOCAL_PREFILL,
            RouteReason.KV_TRANSFER_UNHEALTHY,
        ),
        (req(4096), replace(PRESSURED, num_prefill_instances=0), Route.LOCAL_PREFILL, RouteReason.NO_PREFILL_INSTANCE),
        # the gap (1024, 2048): remote only under decode pressure
        (req(1500), PRESSURED, Route.REMOTE_PREFILL, RouteReason.GAP_DECODE_PRESSURE),
        (req(1500), QUIET, Route.LOCAL_PREFILL, RouteReason.GAP_NO_PRESSURE),
        (req(1500), LiveState(), Route.LOCAL_PREFILL, RouteReason.GAP_NO_PRESSURE),
        # unknown live state does not block a long prompt
        (req(8192), LiveState(), Route.REMOTE_PREFILL, RouteReason.LONG_PROMPT),
    ],
)
def test_seed_rules(features: RequestFeatures, live: LiveState, route: Route, reason: RouteReason) -> None:
    decision = decide_route(features, SEED, live)
    assert (decision.route, decision.reason) == (route, reason)


def test_prefix_hit_ignored_when_not_preferred() -> None:
    t = replace(SEED, prefer_local_on_prefix_hit=False)
    assert decide_route(req(4096), t, replace(PRESSURED, prefix_hit_tokens=3500)).is_remote


def test_disabled_and_rollout_scope() -> None:
    assert decide_route(req(8192), replace(SEED, disaggregation_enabled=False), PRESSURED).reason is (
        RouteReason.DISAGGREGATION_DISABLED
    )
    scoped = replace(SEED, enabled_models=frozenset({"rag"}))
    assert decide_route(req(8192, model="chat"), scoped, PRESSURED).reason is RouteReason.ROLLOUT_MODEL_NOT_ENABLED
    assert decide_route(req(8192, model="rag"), scoped, PRESSURED).is_remote


def test_buckets_win_over_thresholds() -> None:
    t = replace(SEED, buckets=(LengthBucket(Route.LOCAL_PREFILL, 0, 8192), LengthBucket(Route.REMOTE_PREFILL, 8193)))
    assert decide_route(req(6000), t, PRESSURED).reason is RouteReason.BUCKET_RULE
    assert not decide_route(req(6000), t, PRESSURED).is_remote
    assert decide_route(req(9000, output_tokens=1), t, QUIET).is_remote


def test_rollout_sampling_is_deterministic_and_close_to_the_percentage() -> None:
    ids = [f"req-{i}" for i in range(20_000)]
    picked = [rollout_sampled(i, 5.0) for i in ids]
    assert picked == [rollout_sampled(i, 5.0) for i in ids]
    assert 0.04 < sum(picked) / len(ids) < 0.06
    assert all(rollout_sampled(i, 100.0) for i in ids[:100])
    assert not any(rollout_sampled(i, 0.0) for i in ids[:100])
    # monotone: a request sampled at 5 % is sampled at 50 %
    assert all(rollout_sampled(i, 50.0) for i, p in zip(ids, picked, strict=True) if p)


def test_seed_rollout_policy_end_to_end() -> None:
    text = (
        "rollout:\n  enabled_models: [rag-answer-service]\n  traffic_percent: 5\n"
        "  remote_prefill_when: {input_tokens_gte: 4096}\n"
    )
    t = resolve_policy(load_policy_text(text)).thresholds_for("default")
    routes = [decide_route(req(8192, rid=f"x{i}", model="rag-answer-service"), t, PRESSURED) for i in range(4000)]
    remote = sum(d.is_remote for d in routes) / len(routes)
    assert 0.035 < remote < 0.065
    everyone = replace(t, traffic_percent=100)
    # 3000 tokens lies in the rollout's gap (1024, 4096): remote only under decode pressure
    assert decide_route(req(3000, model="rag-answer-service"), everyone, QUIET).reason is RouteReason.GAP_NO_PRESSURE
    assert decide_route(req(5000, model="rag-answer-service"), everyone, PRESSURED).reason is RouteReason.LONG_PROMPT


@st.composite
def thresholds(draw: st.DrawFn) -> RoutingThresholds:
    low = draw(st.integers(0, 100_000))
    return RoutingThresholds(
        disaggregation_enabled=draw(st.booleans()),
        min_remote_input_tokens=draw(st.integers(low, 200_000)),
        max_local_input_tokens=low,
        max_prefill_queue_wait_s=draw(st.floats(0, 100, allow_nan=False)),
        min_expected_output_tokens=draw(st.integers(0, 10_000)),
        require_decode_pool_pressure=draw(st.booleans()),
        decode_pressure_threshold_frac=draw(st.floats(0, 1)),
        prefer_local_on_prefix_hit=draw(st.booleans()),
        traffic_percent=draw(st.floats(0, 100)),
        enabled_models=draw(st.none() | st.frozensets(st.text(max_size=4), max_size=3)),
        buckets=tuple(
            LengthBucket(draw(st.sampled_from(list(Route))), a, draw(st.none() | st.integers(a, 300_000)))
            for a in draw(st.lists(st.integers(0, 200_000), max_size=3))
        ),
    )


live_states = st.builds(
    LiveState,
    prefill_queue_wait_s=st.none() | st.floats(0, 1e6, allow_nan=False),
    decode_pressure_frac=st.none() | st.floats(0, 1),
    prefix_hit_tokens=st.integers(-10, 10**7),
    kv_transfer_healthy=st.booleans(),
    num_prefill_instances=st.integers(-1, 64),
)
features = st.builds(
    RequestFeatures,
    request_id=st.text(max_size=40),
    tenant=st.text(max_size=8),
    input_tokens=st.integers(-5, 10**7),
    expected_output_tokens=st.integers(-5, 10**6),
    model=st.text(max_size=8),
)


@settings(max_examples=400, deadline=None)
@given(features, thresholds(), live_states)
def test_route_decision_is_total(f: RequestFeatures, t: RoutingThresholds, live: LiveState) -> None:
    decision = decide_route(f, t, live)
    assert decision.route in Route
    assert decision.reason in RouteReason
    assert decide_route(f, t, live) == decision  # pure
    if decision.is_remote:
        assert t.disaggregation_enabled
        assert live.kv_transfer_healthy
        assert live.num_prefill_instances > 0


def test_thresholds_refuse_inversion() -> None:
    with pytest.raises(ValueError, match="max_local_input_tokens"):
        RoutingThresholds(min_remote_input_tokens=100, max_local_input_tokens=200)
