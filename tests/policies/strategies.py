"""Hypothesis strategies shared by the policy-file and actuation tests."""

from __future__ import annotations

from hypothesis import strategies as st

from policies.schema import FallbackAction, LengthBucket, Route, RouteRule, RoutingThresholds

_tokens = st.integers(min_value=0, max_value=1_000_000)


@st.composite
def _buckets(draw: st.DrawFn) -> LengthBucket:
    low = draw(_tokens)
    high = draw(st.none() | st.integers(min_value=low, max_value=2_000_000))
    return LengthBucket(draw(st.sampled_from(Route)), low, high)


@st.composite
def routing_thresholds(draw: st.DrawFn) -> RoutingThresholds:
    """Any thresholds a policy file can spell: every field drawn.

    Values a file converts (milliseconds, percent) are drawn in the file's unit and converted as the loader
    does. ``on_prefill_queue_overload`` is one of the local fallbacks (a file cannot spell
    ``retry_remote_prefill`` there); ``enabled_models=None`` has no spelling either but is what a tenant
    inherits from a document with no top-level ``rollout``.
    """
    local = draw(_tokens)
    return RoutingThresholds(
        disaggregation_enabled=draw(st.booleans()),
        min_remote_input_tokens=draw(st.integers(min_value=local, max_value=2_000_000)),
        max_local_input_tokens=local,
        max_prefill_queue_wait_s=draw(st.floats(0, 1e7, allow_nan=False, allow_infinity=False)) / 1000.0,
        min_expected_output_tokens=draw(_tokens),
        require_decode_pool_pressure=draw(st.booleans()),
        decode_pressure_threshold_frac=draw(st.floats(0, 100)) / 100.0,
        prefer_local_on_prefix_hit=draw(st.booleans()),
        on_kv_transfer_timeout=draw(st.sampled_from(FallbackAction)),
        on_prefill_queue_overload=draw(
            st.sampled_from([FallbackAction.LOCAL_AGGREGATED_SERVING, FallbackAction.LOCAL_PREFILL])
        ),
        traffic_percent=draw(st.floats(0, 100)),
        enabled_models=draw(st.none() | st.frozensets(st.text("abcxyz-./", min_size=1, max_size=8), max_size=3)),
        buckets=tuple(draw(st.lists(_buckets(), max_size=3))),
        rule=draw(st.sampled_from(RouteRule)),
        uncached_ratio_threshold_frac=draw(st.floats(0, 1)),
        max_prefill_queue_requests=draw(st.integers(min_value=0, max_value=10_000)),
        prefill_busy_factor=draw(st.floats(0, 1e6)),
    )
