"""The one scoring definition: SLO met, attainment over arrivals, sample quantiles, Prometheus histogram_quantile."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.scoring import (
    count_slo_met,
    histogram_quantile,
    meets_slo,
    pooled_attainment_frac,
    quantile,
    quantiles,
    slo_attainment_frac,
    slo_met_mask,
)

INF = math.inf

# ------------------------------------------------------------------------------------------------ SLO met


def test_met_needs_both_objectives_and_bounds_are_inclusive() -> None:
    assert meets_slo(0.5, 0.05, 0.5, 0.05)
    assert not meets_slo(0.51, 0.05, 0.5, 0.05)
    assert not meets_slo(0.5, 0.051, 0.5, 0.05)


def test_failed_and_unfinished_requests_never_meet() -> None:
    assert not meets_slo(0.1, 0.01, 0.5, 0.05, succeeded=False)
    assert not meets_slo(None, None, 0.5, 0.05)  # no first token
    assert not meets_slo(None, None)  # even without objectives


def test_no_objective_and_no_tpot_meet() -> None:
    assert meets_slo(100.0, 10.0, None, None)
    assert meets_slo(100.0, 10.0, INF, INF)
    assert meets_slo(0.1, None, 0.5, 0.05)  # one output token: no TPOT
    assert not meets_slo(math.nan, 0.01, 0.5, 0.05)
    assert not meets_slo(0.1, math.nan, 0.5, 0.05)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan])
def test_bad_objective_is_refused_by_name(bad: float) -> None:
    with pytest.raises(ValueError, match="tpot_objective_s"):
        meets_slo(0.1, 0.01, 0.5, bad)
    with pytest.raises(ValueError, match="ttft_objective_s"):
        count_slo_met([0.1], [0.01], bad, 0.05)


def test_count_agrees_with_the_scalar_definition() -> None:
    rng = np.random.default_rng(7)
    ttft = rng.uniform(0.0, 1.0, 500)
    tpot = rng.uniform(0.0, 0.1, 500)
    tpot[::7] = 0.0  # one-token outputs, as the simulator records them
    scalar = [meets_slo(float(a), float(b), 0.5, 0.05) for a, b in zip(ttft, tpot, strict=True)]
    expected = sum(scalar)
    assert count_slo_met(ttft, tpot, 0.5, 0.05) == expected
    assert slo_met_mask(ttft, tpot, 0.5, 0.05).tolist() == scalar  # request by request
    assert 0 < expected < 500
    assert count_slo_met([], [], 0.5, 0.05) == 0
    assert count_slo_met([0.1, math.nan], [math.nan, 0.01], None, None) == 0
    with pytest.raises(ValueError, match="shape"):
        count_slo_met([0.1, 0.2], [0.01], 0.5, 0.05)


# ------------------------------------------------------------------------------------------------ attainment


def test_attainment_is_over_arrivals() -> None:
    # 10 arrived: 6 finished within the SLO, 2 finished late, 1 failed, 1 still running → 6 / 10
    assert slo_attainment_frac(6, 10) == pytest.approx(0.6)
    assert slo_attainment_frac(0, 3) == 0.0
    assert slo_attainment_frac(0, 0) is None


def test_attainment_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        slo_attainment_frac(5, 4)
    with pytest.raises(ValueError, match=">= 0"):
        slo_attainment_frac(-1, 4)


def test_pooled_attainment_equals_the_union() -> None:
    # tenant a: 8 of 10 met, tenant b: 1 of 30 met → 9 of 40
    assert pooled_attainment_frac([(10, 0.8), (30, 1 / 30)]) == pytest.approx(9 / 40)
    assert pooled_attainment_frac([(10, 0.8), (None, 0.1), (5, None), (INF, 0.5), (3, math.nan)]) == 0.8
    assert pooled_attainment_frac([]) is None
    assert pooled_attainment_frac([(0.0, 0.3)]) is None
    with pytest.raises(ValueError, match="weights"):
        pooled_attainment_frac([(-1.0, 0.5)])


# ------------------------------------------------------------------------------------------------ quantiles


def test_sample_quantiles_interpolate_linearly() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert quantile(values, 0.5) == pytest.approx(2.5)
    assert quantiles(values, (0.0, 1.0, 0.95)) == pytest.approx((1.0, 4.0, 3.85))
    assert quantile([7.0], 0.99) == 7.0
    assert quantile([], 0.5) is None
    assert quantiles(np.zeros(0), (0.5, 0.95)) == (None, None)


def test_sample_quantiles_refuse_bad_input() -> None:
    with pytest.raises(ValueError, match="q must be within"):
        quantile([1.0], 95)
    with pytest.raises(ValueError, match="NaN"):
        quantile([1.0, math.nan], 0.5)


# ------------------------------------------------------------------------------------------------ histogram_quantile


def test_histogram_quantile_interpolates_inside_the_bucket() -> None:
    buckets = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (INF, 40.0)]
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (10 / 20))
    assert histogram_quantile(0.95, buckets) == pytest.approx(0.5 + 0.5 * (8 / 10))
    assert histogram_quantile(0.05, buckets) == pytest.approx(0.02)  # lowest bucket starts at 0
    assert histogram_quantile(1.0, buckets) == 1.0


def test_histogram_quantile_prometheus_worked_example() -> None:
    # bounds 0, 0.5, 1, +Inf with cumulative 6, 11, 14, 19: the median is 0.35
    buckets = [(0.0, 6.0), (0.5, 11.0), (1.0, 14.0), (INF, 19.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.35)
    # a rank in a lowest bucket whose upper bound is not positive returns that bound
    assert histogram_quantile(0.1, buckets) == 0.0
    assert histogram_quantile(0.2, [(-1.0, 5.0), (1.0, 10.0), (INF, 10.0)]) == -1.0


def test_histogram_quantile_inf_bucket_returns_highest_finite_bound() -> None:
    assert histogram_quantile(0.99, [(0.1, 1.0), (INF, 5.0)]) == 0.1
    assert histogram_quantile(0.5, [(0.1, 0.0), (1.0, 0.0), (INF, 5.0)]) == 1.0
    assert histogram_quantile(0.0, [(0.1, 0.0), (1.0, 0.0), (INF, 5.0)]) == 1.0


def test_histogram_quantile_unknown_cases() -> None:
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(0.1, 0.0), (INF, 0.0)]) is None  # no observations
    assert histogram_quantile(0.5, [(0.1, 3.0), (1.0, 5.0)]) is None  # no +Inf bucket
    assert histogram_quantile(0.5, [(INF, 5.0)]) is None  # fewer than two buckets


def test_histogram_quantile_coalesces_and_repairs_counts() -> None:
    # two series with the same le are added up (summed over instances)
    split = [(0.1, 4.0), (0.1, 6.0), (1.0, 10.0), (1.0, 10.0), (INF, 20.0), (INF, 20.0)]
    assert histogram_quantile(0.5, split) == pytest.approx(0.1 + 0.9 * (10 / 10))
    # a cumulative count below the one before (a non-atomic scrape) is raised to it
    assert histogram_quantile(0.5, [(0.1, 10.0), (0.5, 9.0), (INF, 10.0)]) == pytest.approx(0.05)


def test_histogram_quantile_q_zero_is_the_lower_edge_of_the_first_observation() -> None:
    assert histogram_quantile(0.0, [(0.1, 0.0), (0.5, 4.0), (INF, 4.0)]) == 0.1
    assert histogram_quantile(0.0, [(0.1, 2.0), (INF, 4.0)]) == 0.0


@pytest.mark.parametrize("q", [-0.1, 1.01, math.nan])
def test_histogram_quantile_refuses_q_outside_unit_interval(q: float) -> None:
    with pytest.raises(ValueError, match="q must be within"):
        histogram_quantile(q, [(0.1, 1.0), (INF, 1.0)])


@given(
    increments=st.lists(st.integers(0, 50), min_size=3, max_size=8),
    q1=st.floats(0.0, 1.0),
    q2=st.floats(0.0, 1.0),
)
def test_histogram_quantile_is_monotone_and_inside_the_buckets(increments: list[int], q1: float, q2: float) -> None:
    bounds = [0.01 * 2**i for i in range(len(increments))]
    cumulative, running = [], 0.0
    for bound, inc in zip(bounds, increments, strict=True):
        running += inc
        cumulative.append((bound, running))
    cumulative.append((INF, running + increments[0]))
    a, b = histogram_quantile(min(q1, q2), cumulative), histogram_quantile(max(q1, q2), cumulative)
    if running + increments[0] == 0:
        assert a is None
        assert b is None
        return
    assert a is not None
    assert b is not None
    assert 0.0 <= a <= b <= bounds[-1]


@given(samples=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=200), q=st.floats(0.01, 0.99))
def test_histogram_quantile_lies_in_the_bucket_of_the_sample_quantile(samples: list[float], q: float) -> None:
    """The estimate lands in the bucket that holds the rank-th smallest sample (bucket resolution)."""
    bounds = [0.5, 1.0, 2.0, 5.0]
    array = np.sort(np.asarray(samples))
    cumulative = [(b, float(np.count_nonzero(array <= b))) for b in bounds] + [(INF, float(array.size))]
    estimate = histogram_quantile(q, cumulative)
    assert estimate is not None
    rank_sample = array[max(math.ceil(q * array.size) - 1, 0)]
    upper = next((b for b in bounds if rank_sample <= b), bounds[-1])
    lower = max((b for b in (0.0, *bounds) if b < upper), default=0.0)
    assert lower <= estimate <= upper
