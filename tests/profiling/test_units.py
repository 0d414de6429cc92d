from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from livestack.profiling.arrivals import arrival_stats, rate_curve_stats
from livestack.profiling.distributions import BucketDistribution, SampleDistribution, log2_edges
from livestack.profiling.prefix import leading_hit_tokens, prefix_reuse_from_hashes, prefix_reuse_from_hits


def test_weighted_quantiles_equal_expanded_sample() -> None:
    values = np.array([10.0, 20.0, 30.0, 40.0])
    weights = np.array([1.0, 2.0, 3.0, 4.0])
    dist = SampleDistribution.of(values, weights)
    expanded = np.repeat(values, weights.astype(int))
    assert dist.mean() == pytest.approx(expanded.mean())
    assert dist.quantile(0.5) == 30.0  # cumulative 0.1, 0.3, 0.6: first reaching 0.5 is 30
    assert dist.quantile(0.1) == 10.0
    assert dist.quantile(1.0) == 40.0
    assert dist.share_at_least(30) == pytest.approx(0.7)
    assert dist.share_below(30) == pytest.approx(0.3)
    edges, counts = dist.histogram()
    assert sum(counts) == pytest.approx(10.0)
    assert edges[:3] == [0.0, 1.0, 2.0]


def test_unweighted_quantiles_are_numpy_linear() -> None:
    values = np.arange(1, 102, dtype=float)
    dist = SampleDistribution.of(np.append(values, np.nan))
    assert dist.count == 101
    assert dist.quantile(0.9) == pytest.approx(np.percentile(values, 90))
    assert dist.minimum() == 1.0
    assert dist.maximum() == 101.0
    assert math.isnan(SampleDistribution.of(np.zeros(0)).mean())


def test_bucket_distribution_follows_histogram_quantile() -> None:
    # 100 observations: 20 in (0,1], 60 in (1,10], 20 in (10,+Inf]
    dist = BucketDistribution(np.array([1.0, 10.0, math.inf]), np.array([20.0, 80.0, 100.0]), total_sum=500.0)
    assert dist.count == 100
    assert dist.mean() == 5.0
    assert dist.quantile(0.1) == pytest.approx(0.5)
    assert dist.quantile(0.5) == pytest.approx(1 + 9 * 30 / 60)
    assert dist.quantile(0.99) == 10.0  # +Inf bucket → highest finite bound
    assert dist.share_at_least(5.5) == pytest.approx(1 - (20 + 60 * 0.5) / 100)
    assert dist.share_at_least(100.0) == pytest.approx(0.2)
    edges, counts = dist.histogram()
    assert counts == [20.0, 60.0, 20.0]
    assert edges == [0.0, 1.0, 10.0, 20.0]


def test_log2_edges_cover_maximum() -> None:
    edges = log2_edges(5000)
    assert edges[0] == 0
    assert edges[-1] >= 5000


def test_prefix_reuse_small_example() -> None:
    # r0: [0,1,2]  r1: [0,1,5] (2 leading hits)  r2: [7] (none)  r3: [0,9] (1 leading hit)  r4: [] (no blocks)
    ids = np.array([0, 1, 2, 0, 1, 5, 7, 0, 9])
    offsets = np.array([0, 3, 6, 7, 9, 9])
    inputs = np.array([1500, 1200, 100, 800, 0])
    reuse = prefix_reuse_from_hashes(ids, offsets, inputs, 512)
    assert reuse.num_blocks == 9
    assert reuse.unique_blocks == 6
    assert reuse.block_reuse_frac == pytest.approx(3 / 9)
    assert leading_hit_tokens(ids, offsets, inputs, 512).tolist() == [0, 1024, 0, 512, 0]
    assert reuse.token_reuse_frac == pytest.approx((1024 + 512) / inputs.sum())
    assert reuse.hit_any_frac == pytest.approx(2 / 5)
    assert reuse.hit_2plus_frac == pytest.approx(1 / 5)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), min_size=0, max_size=8), min_size=1, max_size=30))
def test_block_reuse_is_one_minus_unique_share(rows: list[list[int]]) -> None:
    ids = np.array([x for row in rows for x in row], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum([len(r) for r in rows]))).astype(np.int64)
    inputs = np.array([512 * len(r) for r in rows], dtype=np.int64)
    reuse = prefix_reuse_from_hashes(ids, offsets, inputs, 512)
    seen: set[int] = set()
    expected_seen = 0
    for row in rows:
        expected_seen += sum(1 for x in row if x in seen)
        seen.update(row)
    assert reuse.block_reuse_frac == pytest.approx(expected_seen / len(ids) if len(ids) else 0.0)
    assert 0.0 <= reuse.token_reuse_frac <= 1.0


def test_prefix_reuse_from_router_hits() -> None:
    reuse = prefix_reuse_from_hits(np.array([100.0, np.nan, 0.0, 900.0]), np.array([200, 50, 300, 500]))
    assert reuse.token_reuse_frac == pytest.approx((100 + 0 + 500) / (200 + 300 + 500))
    assert reuse.hit_any_frac == pytest.approx(2 / 3)


def test_arrival_stats_definitions() -> None:
    arrival = np.array([0.0, 0.5, 1.0, 1.0, 61.0, 130.0])
    stats = arrival_stats(arrival, bin_s=60.0)
    assert stats is not None
    assert stats.span_s == 130.0
    assert stats.mean_rate_rps == pytest.approx(5 / 130)
    gaps = np.diff(arrival)
    assert stats.iat_cv == pytest.approx(gaps.std() / gaps.mean())
    assert stats.rate_curve_rps == pytest.approx([4 / 60, 1 / 60, 1 / 60])
    assert (stats.min_full_bin_count, stats.max_full_bin_count, stats.last_bin_count) == (1, 4, 1)
    assert stats.peak_to_mean == pytest.approx(4 / 2.5)
    assert stats.zero_gap_frac == pytest.approx(1 / 5)
    assert arrival_stats(np.array([3.0])) is None


def test_rate_curve_stats() -> None:
    stats = rate_curve_stats(np.array([1.0, 3.0, np.nan, 2.0]), 600.0)
    assert stats.mean_rate_rps == pytest.approx(2.0)
    assert stats.peak_to_mean == pytest.approx(1.5)
    assert stats.iat_cv is None


def test_merging_tenant_streams_namespaces_hash_ids() -> None:
    from env.workloads.columns import RequestColumns
    from livestack.profiling.records import RequestRecords

    a = RequestColumns.from_arrays(
        np.array([0.0, 2.0]), np.array([600, 600]), np.array([1, 1]),
        hash_ids=np.array([0, 1, 0, 2]), hash_offsets=np.array([0, 2, 4]),
    )  # fmt: skip
    b = RequestColumns.from_arrays(
        np.array([1.0]), np.array([600]), np.array([1]), hash_ids=np.array([0, 1]), hash_offsets=np.array([0, 2])
    )
    c = RequestColumns.from_arrays(np.array([0.5]), np.array([10]), np.array([5]))
    records = RequestRecords.from_tenant_columns({"a": a, "b": b, "c": c})
    assert records.tenant is not None
    assert records.tenant.tolist() == ["a", "c", "b", "a"]
    assert records.arrival_s is not None
    assert records.arrival_s.tolist() == [0.0, 0.5, 1.0, 2.0]
    assert records.hash_offsets is not None
    assert records.hash_ids is not None
    assert records.hash_offsets.tolist() == [0, 2, 2, 4, 6]
    assert records.hash_ids.tolist() == [0, 1, 3, 4, 0, 2]  # b's ids shifted past a's max id
    reuse = prefix_reuse_from_hashes(records.hash_ids, records.hash_offsets, records.input_tokens, 512)
    assert reuse.block_reuse_frac == pytest.approx(1 / 6)  # only a's second request reuses block 0


@settings(max_examples=40, deadline=None)
@given(
    inputs=st.lists(st.integers(1, 200_000), min_size=1, max_size=300),
    seed=st.integers(0, 2**16),
    threshold=st.integers(1, 10_000),
)
def test_profile_invariants(inputs: list[int], seed: int, threshold: int) -> None:
    import json

    from livestack.profiling import ProfileOptions, RequestRecords, profile_records

    rng = np.random.default_rng(seed)
    n = len(inputs)
    records = RequestRecords(
        input_tokens=np.array(inputs, dtype=np.int64),
        output_tokens=rng.integers(1, 3000, n),
        arrival_s=np.sort(rng.random(n) * 100),
        tenant=rng.choice(np.array(["a", "b", "c"]), n),
    )
    p = profile_records(records, source="h", options=ProfileOptions(long_context_threshold_tokens=threshold))
    for frac in (p.long_context_frac, p.short_short_frac):
        assert 0.0 <= frac <= 1.0
    assert p.short_short_frac <= 1.0 - p.long_context_frac + 1e-12
    for stats in (p.input, p.output):
        assert stats.min is not None
        assert stats.max is not None
        assert stats.min <= stats.p50 <= stats.p90 <= stats.p95 <= stats.p99 <= stats.max
        assert sum(stats.histogram_counts) == n
    assert sum(g.num_requests for g in p.by_tenant) == n
    assert sum(g.share_frac for g in p.by_tenant) == pytest.approx(1.0)
    json.dumps(p.to_dict(), allow_nan=False)
