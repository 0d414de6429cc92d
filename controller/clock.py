"""Time for the daemon: one injected clock, so that tests run on virtual time.

``now()`` is wall time (timezone-aware; for audit records and override expiry), ``monotonic()`` is for
scheduling and durations, ``sleep()`` waits. :class:`WallClock` is the production clock;
:class:`VirtualClock` only moves when a test calls :meth:`VirtualClock.advance` and is refused by the daemon
in production (``production_safe`` is false).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol

__all__ = ["Clock", "VirtualClock", "WallClock"]


class Clock(Protocol):
    """The daemon's source of time."""

    @property
    def production_safe(self) -> bool:
        """Whether the daemon may run on this clock outside tests."""
        ...

    def now(self) -> datetime:
        """Wall time, timezone-aware (UTC)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""
        ...


class WallClock:
    """The real clock."""

    @property
    def production_safe(self) -> bool:
        """Always true."""
        return True

    def now(self) -> datetime:
        """``datetime.now(UTC)``."""
        return datetime.now(UTC)

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """``asyncio.sleep``."""
        await asyncio.sleep(max(seconds, 0.0))


class VirtualClock:
    """A clock that moves only when told to; sleepers wake in deadline order as it advances."""

    def __init__(self, start: datetime | None = None) -> None:
        self._start = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._elapsed_s = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @property
    def production_safe(self) -> bool:
        """Always false: the daemon refuses a virtual clock outside tests."""
        return False

    def now(self) -> datetime:
        """Start time plus the virtual seconds elapsed."""
        return self._start + timedelta(seconds=self._elapsed_s)

    def monotonic(self) -> float:
        """Virtual seconds elapsed."""
        return self._elapsed_s

    async def sleep(self, seconds: float) -> None:
        """Park until the clock has advanced by ``seconds``."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._elapsed_s + seconds, next(self._seq), future))
        await future

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking every sleeper whose deadline passes (in order), and let them run."""
        target = self._elapsed_s + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, future = heapq.heappop(self._sleepers)
            self._elapsed_s = max(self._elapsed_s, deadline)
            if not future.done():
                future.set_result(None)
            for _ in range(5):
                await asyncio.sleep(0)
        self._elapsed_s = target
        await asyncio.sleep(0)
