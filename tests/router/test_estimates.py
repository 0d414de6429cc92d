from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from router.estimates import PrefillRate, PrefixTracker, TransferHealth, prefix_blocks


def test_prefix_blocks_are_chained() -> None:
    a = prefix_blocks("x" * 100 + "y" * 100, 50)
    b = prefix_blocks("x" * 100 + "z" * 100, 50)
    assert len(a) == 4
    assert a[:2] == b[:2]
    assert a[2] != b[2]
    # a block's id depends on everything before it
    assert prefix_blocks("q" * 50 + "x" * 50, 50)[1] != a[1]
    assert prefix_blocks("x" * 49, 50) == []


@given(st.text(max_size=400), st.integers(min_value=1, max_value=64))
def test_prefix_blocks_of_a_prefix_are_a_prefix(text: str, block: int) -> None:
    full = prefix_blocks(text + "tail" * 20, block)
    head = prefix_blocks(text, block)
    assert full[: len(head)] == head


def test_prefix_tracker_counts_leading_hits_and_evicts_lru() -> None:
    tracker = PrefixTracker(capacity_blocks=4)
    tracker.record([1, 2, 3])
    assert tracker.hit_blocks([1, 2, 3, 4]) == 3
    assert tracker.hit_blocks([2, 3]) == 2  # ids are chained by construction, the tracker does not check order
    assert tracker.hit_blocks([9, 1, 2]) == 0
    tracker.record([1])  # 1 is now most recent
    tracker.record([7, 8])  # evicts 2 then 3
    assert tracker.hit_blocks([1, 2]) == 1
    assert tracker.hit_blocks([7, 8]) == 2
    tracker.clear()
    assert tracker.hit_blocks([7]) == 0


def test_transfer_health_window_and_recovery() -> None:
    health = TransferHealth(window_s=10.0, min_samples=4, unhealthy_frac=0.5)
    for t in range(3):
        health.record(float(t), False)
    assert health.healthy(3.0)  # too few samples to judge
    health.record(3.0, True)
    assert health.failure_frac(3.0) == 0.75
    assert not health.healthy(3.5)
    assert not health.allows_remote(12.9)
    # nothing new arrives while unhealthy; once the window has passed, probes try the path again (half-open)
    assert health.allows_remote(13.5)
    assert not health.healthy(13.5)
    assert health.failure_frac(13.5) is None


def test_prefill_rate_estimate() -> None:
    rate = PrefillRate(10_000.0, weight=0.5, min_sample_tokens=100)
    assert rate.wait_s(5_000) == 0.5
    rate.observe(50, 1.0)  # too small a sample
    assert rate.tokens_per_s == 10_000.0
    rate.observe(4_000, 1.0)
    assert rate.tokens_per_s == 7_000.0
    assert rate.wait_s(-3) == 0.0
