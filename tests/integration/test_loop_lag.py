"""The event-loop lag probe the live parity test scales its latency allowance by."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.integration.loop_lag import LoopLag


def _hold_the_loop(duration_s: float) -> None:
    """Block the calling thread (the event loop's, when called from a coroutine) for ``duration_s``."""
    time.sleep(duration_s)


async def test_a_blocked_loop_shows_as_lag_and_an_idle_one_does_not() -> None:
    async with LoopLag(period_s=0.002) as idle:
        await asyncio.sleep(0.2)
    assert len(idle.lags_s) > 10
    assert idle.quantile_s(0.5) < 0.02

    async with LoopLag(period_s=0.002) as busy:
        for _ in range(20):
            await asyncio.sleep(0.002)
            _hold_the_loop(0.03)  # a callback that holds the loop, as a CPU-bound step would
    assert busy.quantile_s(0.5) >= 0.02
    assert busy.quantile_s(0.95) > idle.quantile_s(0.95)


async def test_one_long_stall_shows_in_the_maximum_not_in_the_p95() -> None:
    """A single stall (what restarts the emulator's clock) hides from a quantile among hundreds of calm samples."""
    async with LoopLag(period_s=0.002) as lag:
        await asyncio.sleep(0.3)
        _hold_the_loop(0.1)
        await asyncio.sleep(0.3)
    assert lag.quantile_s(0.95) < 0.02
    assert lag.max_s() >= 0.09
    assert 0.09 <= lag.stalled_s(0.05) < 0.2  # the one stall, not the calm samples' millisecond overshoots


def test_no_sample_reads_as_no_lag_and_a_bad_period_is_refused() -> None:
    assert LoopLag().quantile_s(0.95) == 0.0
    assert LoopLag().max_s() == 0.0
    assert LoopLag().stalled_s(0.05) == 0.0
    with pytest.raises(ValueError, match="period_s"):
        LoopLag(period_s=0.0)
