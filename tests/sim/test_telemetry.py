"""vLLM-named telemetry: bucket lists, histogram semantics, closed-form run observation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from env.sim.telemetry import (
    BUCKETS_ITERATION_TOKENS,
    BUCKETS_ITL_S,
    BUCKETS_LATENCY_S,
    BUCKETS_TTFT_S,
    Histogram,
    InstanceCounters,
    buckets_1_2_5,
    request_histograms,
)


def test_bucket_lists_are_vllms() -> None:
    assert BUCKETS_TTFT_S[:4] == (0.001, 0.005, 0.01, 0.02)
    assert BUCKETS_TTFT_S[-1] == 2560.0
    assert len(BUCKETS_TTFT_S) == 22
    assert BUCKETS_ITL_S[0] == 0.01
    assert BUCKETS_ITL_S[-1] == 80.0
    assert len(BUCKETS_ITL_S) == 19
    assert BUCKETS_LATENCY_S[0] == 0.3
    assert BUCKETS_LATENCY_S[-1] == 7680.0
    assert BUCKETS_ITERATION_TOKENS == (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    assert buckets_1_2_5(100) == (1, 2, 5, 10, 20, 50, 100)


def test_histogram_le_semantics_and_quantile() -> None:
    h = Histogram((1.0, 2.0))
    h.observe(1.0)
    h.observe(1.5, 2)
    h.observe(5.0)
    assert h.counts == [1, 2, 1]
    assert h.count == 4
    assert h.total == pytest.approx(9.0)
    assert h.cumulative() == [(1.0, 1), (2.0, 3), (float("inf"), 4)]
    assert h.quantile(0.5) == pytest.approx(1.5)
    assert Histogram((1.0,)).quantile(0.5) is None


@settings(max_examples=60, deadline=None)
@given(
    first=st.floats(0.0, 0.2) | st.sampled_from([0.125, 0.01, 0.05]),
    inc=st.floats(0.0, 0.01) | st.sampled_from([0.005, 0.0025, 0.025]),
    num=st.integers(1, 400),
    weight=st.integers(1, 5),
)
def test_observe_linear_equals_a_loop(first: float, inc: float, num: int, weight: int) -> None:
    fast, slow = Histogram(BUCKETS_ITL_S), Histogram(BUCKETS_ITL_S)
    fast.observe_linear(first, inc, num, weight)
    for k in range(num):
        slow.observe(first + k * inc, weight)
    assert fast.count == slow.count
    assert fast.total == pytest.approx(slow.total, rel=1e-9, abs=1e-12)
    assert fast.counts == slow.counts


def test_instance_counters_names() -> None:
    c = InstanceCounters()
    c.observe_step(0.02, 4, 100)
    c.observe_run(0.01, 0.0001, 10, 4)
    metrics = c.as_metrics()
    assert metrics["vllm:inter_token_latency_seconds"].count == 4 + 40  # type: ignore[union-attr]
    assert metrics["vllm:iteration_tokens_total"].count == 11  # type: ignore[union-attr]
    assert c.busy_s == pytest.approx(0.02 + 10 * 0.01 + 0.0001 * 45)
    hist = request_histograms([0.1, 0.2], [1.0, 2.0], [0.0, 0.1], [10, 20], [5, 6])
    assert hist["vllm:time_to_first_token_seconds"].count == 2
    assert np.isclose(hist["vllm:e2e_request_latency_seconds"].total, 3.0)
