from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import (
    GroupWindow,
    MetricWindow,
    ObservationContext,
    ObservationLayout,
    RoutingThresholds,
    Slo,
    Tenant,
    TenantGroup,
    TenantWindow,
    build_observation,
    feature_table_hash,
)
from policies.features import GROUP_FEATURES, TENANT_FEATURES, feature_table_markdown

TENANTS = (
    Tenant("chat", "g", Slo(ttft_p95_s=0.5, tpot_p95_s=0.05), 2.0),
    Tenant("rag", "g", Slo(ttft_p95_s=3.0, tpot_p95_s=0.08)),
)
GROUPS = (TenantGroup("g", ("chat", "rag"), gpu_budget=8),)
CONTEXT = ObservationContext(TENANTS, GROUPS, {"rag": RoutingThresholds()})
LAYOUT = ObservationLayout(max_groups=2, max_tenants=4)

# Bump FEATURES_VERSION / SCHEMA_VERSION (and the env id) when this changes.
GOLDEN_FEATURE_HASH = "ff0b547cf8b5c5b1"

opt = st.none() | st.floats(allow_nan=True, allow_infinity=True, width=64)
tenant_windows = st.builds(TenantWindow, *[opt] * 15)
group_windows = st.builds(
    GroupWindow,
    num_prefill=st.integers(0, 64),
    num_decode=st.integers(0, 64),
    pending_prefill=st.integers(0, 8),
    pending_decode=st.integers(0, 8),
    prefill_queue_wait_s=opt,
    prefill_queued_tokens=opt,
    decode_active_seqs=opt,
    decode_kv_usage_frac=opt,
    prefill_kv_usage_frac=opt,
    kv_transfer_time_p95_s=opt,
    kv_transfer_failure_frac=opt,
    prefix_cache_hit_frac=opt,
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["chat", "rag", "other"]), tenant_windows),
    st.dictionaries(st.sampled_from(["g", "h"]), group_windows),
    st.floats(0, 1e4),
)
def test_any_window_gives_a_finite_observation_inside_the_space(
    tenants: dict[str, TenantWindow], groups: dict[str, GroupWindow], staleness: float
) -> None:
    window = MetricWindow(end_s=10.0, window_s=10.0, tenants=tenants, groups=groups, staleness_s=staleness)
    vector = build_observation(window, CONTEXT).to_vector(LAYOUT)
    space = LAYOUT.observation_space()
    assert vector.shape == space.shape == (LAYOUT.size,)
    assert np.all(np.isfinite(vector))
    assert space.contains(vector)


def test_missing_series_is_unknown_not_zero() -> None:
    empty = MetricWindow(0.0, 10.0, {}, {})
    zero = MetricWindow(0.0, 10.0, {"chat": TenantWindow(request_rate_rps=0.0)}, {})
    v_empty = build_observation(empty, CONTEXT).to_vector(LAYOUT)
    v_zero = build_observation(zero, CONTEXT).to_vector(LAYOUT)
    half = LAYOUT.size // 2
    rate_index = LAYOUT.max_groups * len(GROUP_FEATURES)  # first tenant's first feature
    assert v_empty[rate_index] == v_zero[rate_index] == 0.0
    assert v_empty[half + rate_index] == 0.0  # unknown
    assert v_zero[half + rate_index] == 1.0  # known zero
    obs = build_observation(empty, CONTEXT)
    assert obs.value("tenant", "chat", "request_rate_rps") is None


def test_slo_ratio_and_context_features() -> None:
    window = MetricWindow(
        0.0,
        10.0,
        {"chat": TenantWindow(ttft_p95_s=1.0, tpot_p95_s=0.025)},
        {"g": GroupWindow(num_prefill=2, num_decode=6, decode_active_seqs=120.0)},
    )
    obs = build_observation(window, CONTEXT)
    assert obs.value("tenant", "chat", "ttft_slo_ratio") == 2.0
    assert obs.value("tenant", "chat", "tpot_slo_ratio") == 0.5
    assert obs.value("tenant", "chat", "priority") == 2.0
    assert obs.value("tenant", "rag", "min_remote_input_tokens") == 2048.0
    assert obs.value("group", "g", "num_prefill_frac") == 0.25
    assert obs.value("group", "g", "decode_active_seqs") == 20.0


def test_layout_too_small_is_refused() -> None:
    obs = build_observation(MetricWindow(0.0, 1.0, {}, {}), CONTEXT)
    with pytest.raises(ValueError, match="layout allows"):
        obs.to_vector(ObservationLayout(max_groups=1, max_tenants=1))


def test_feature_table_is_versioned() -> None:
    assert feature_table_hash() == GOLDEN_FEATURE_HASH, (
        "the feature table changed: bump FEATURES_VERSION/SCHEMA_VERSION and update the golden hash"
    )
    table = feature_table_markdown()
    for spec in GROUP_FEATURES + TENANT_FEATURES:
        assert f"`{spec.name}`" in table
        assert spec.scale > 0
        assert spec.high > 0
        assert not math.isnan(spec.high)
