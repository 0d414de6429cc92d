"""How late the running asyncio event loop wakes a sleeping task, sampled while a live test runs.

The live parity tests run the load generator, the router and the emulated instances on one event loop in the test's
process, so every emulated decode step is a timer that wakes as late as the loop lets it. This probe sleeps
``period_s`` over and over and records each overshoot: the scheduling delay those timers see too, on this machine,
under whatever else it is running at the time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import TracebackType

import numpy as np


class LoopLag:
    """An ``async with`` block that samples the event loop's wake-up lag until it exits."""

    def __init__(self, period_s: float = 0.005) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s must be positive, got {period_s}")
        self.period_s = period_s
        self.lags_s: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _sample(self) -> None:
        while True:
            before_s = time.perf_counter()
            await asyncio.sleep(self.period_s)
            self.lags_s.append(max(0.0, time.perf_counter() - before_s - self.period_s))

    def quantile_s(self, q: float) -> float:
        """The ``q`` quantile of the wake-up lags sampled so far, in wall-clock seconds (0 before any sample)."""
        if not self.lags_s:
            return 0.0
        return float(np.quantile(self.lags_s, q))

    def stalled_s(self, min_lag_s: float) -> float:
        """The sum of the sampled lags of at least ``min_lag_s`` (the loop's stalls), in wall-clock seconds."""
        return float(sum(lag for lag in self.lags_s if lag >= min_lag_s))

    def max_s(self) -> float:
        """The longest wake-up lag sampled so far, in wall-clock seconds (0 before any sample)."""
        return max(self.lags_s, default=0.0)
