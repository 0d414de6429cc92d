"""The fallback's record: bounded, matched by comparable load, silent below the minimum of evidence."""

from __future__ import annotations

import math

import pytest

from policies.base import PolicyContext
from policies.fallback_evidence import FallbackRecord, offered_load_rps_per_instance
from policies.features import build_observation
from policies.schema import MetricWindow, PoolTargets, Slo, Tenant, TenantGroup, TenantWindow

GROUP = TenantGroup("g", ("a", "b"), gpu_budget=8)
TENANTS = (Tenant("a", "g", Slo(ttft_p95_s=1.0)), Tenant("b", "g", Slo(ttft_p95_s=1.0)))


def test_estimate_is_the_mean_of_comparable_windows_only() -> None:
    record = FallbackRecord(max_windows=10)
    for load, attainment in ((1.0, 0.9), (1.2, 0.8), (0.85, 0.7), (2.0, 0.1), (0.5, 0.2)):
        record.add(load, attainment)
    estimate = record.estimate(1.0, tolerance_frac=0.25, min_windows=3)
    assert estimate is not None
    assert estimate.num_windows == 3  # 2.0 and 0.5 are outside [0.8, 1.25]
    assert estimate.attainment_frac == pytest.approx((0.9 + 0.8 + 0.7) / 3)
    assert record.estimate(1.0, tolerance_frac=0.25, min_windows=4) is None
    assert record.estimate(10.0, tolerance_frac=0.25, min_windows=1) is None


def test_the_record_is_bounded_and_ignores_non_finite_values() -> None:
    record = FallbackRecord(max_windows=3)
    for attainment in (0.1, 0.2, 0.3, 0.4, 0.5):
        record.add(1.0, attainment)
    record.add(math.nan, 0.9)
    record.add(1.0, math.inf)
    record.add(-1.0, 0.9)
    assert len(record) == 3
    estimate = record.estimate(1.0, tolerance_frac=0.1, min_windows=3)
    assert estimate is not None
    assert estimate.attainment_frac == pytest.approx(0.4)  # the oldest two were dropped
    with pytest.raises(ValueError, match=r"^fallback record max_windows must be >= 1, got 0$"):
        FallbackRecord(0)


def test_zero_load_matches_only_zero_load() -> None:
    record = FallbackRecord(max_windows=5)
    record.add(0.0, 1.0)
    record.add(0.1, 0.5)
    assert record.estimate(0.0, tolerance_frac=0.5, min_windows=1) is not None
    estimate = record.estimate(0.0, tolerance_frac=0.5, min_windows=1)
    assert estimate is not None
    assert estimate.attainment_frac == 1.0


def test_offered_load_is_known_rate_over_running_instances() -> None:
    def load(rates: dict[str, float | None], pools: PoolTargets) -> float | None:
        context = PolicyContext(TENANTS, (GROUP,), {"g": pools}, {}, {})
        tenants = {name: TenantWindow(request_rate_rps=rate) for name, rate in rates.items()}
        observation = build_observation(MetricWindow(0.0, 10.0, tenants, {}), context.observation_context())
        return offered_load_rps_per_instance(observation, context)

    assert load({"a": 3.0, "b": 1.0}, PoolTargets(2, 2)) == pytest.approx(1.0)
    assert load({"a": 3.0, "b": None}, PoolTargets(1, 2)) == pytest.approx(1.0)
    assert load({"a": None, "b": None}, PoolTargets(2, 2)) is None
    assert load({"a": 1.0}, PoolTargets(0, 0)) is None


def test_the_ceiling_is_the_mean_of_windows_at_this_load_or_lighter() -> None:
    record = FallbackRecord(10)
    for load, attainment in ((1.0, 0.2), (2.0, 0.1), (4.0, 0.9)):
        record.add(load, attainment)
    ceiling = record.ceiling(2.5, min_windows=2)
    assert ceiling is not None
    assert ceiling.attainment_frac == pytest.approx(0.15)
    assert (ceiling.num_windows, ceiling.lighter) == (2, True)
    assert record.ceiling(1.5, min_windows=2) is None  # one window at or below 1.5
    every = record.ceiling(5.0, min_windows=3)
    assert every is not None
    assert every.attainment_frac == pytest.approx(0.4)
    assert record.ceiling(math.nan, min_windows=1) is None
