"""The observation source the control loop calls: a reader plus the window derivation plus staleness.

When the reader is unavailable the window is *stale*: it carries only the pool counts the controller
knows, every statistic is unknown, and ``staleness_s`` says how old the newest data is — never zeros.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from controller.sources.base import SeriesReader, SourceUnavailableError, Topology
from controller.sources.window import WindowBuilder
from policies.schema import GroupWindow, MetricWindow

__all__ = ["MetricSource", "Observed"]


@dataclass(frozen=True, slots=True)
class Observed:
    """A window and, when the backend could not be read, why."""

    window: MetricWindow
    error: str | None = None


class MetricSource:
    """Reads one window per tick through a :class:`SeriesReader`."""

    def __init__(self, reader: SeriesReader, builder: WindowBuilder, window_s: float, started_s: float) -> None:
        self.reader = reader
        self.builder = builder
        self.window_s = window_s
        self._newest_s: float | None = None
        self._started_s = started_s

    def _staleness(self, now_s: float) -> float:
        reference = self._newest_s if self._newest_s is not None else self._started_s
        return max(now_s - reference, 0.0)

    async def observe(
        self, topology: Topology, tenants: Sequence[str], groups: Sequence[str], now_s: float
    ) -> Observed:
        """The window ending at ``now_s`` (epoch seconds)."""
        queries = self.builder.queries.all()
        try:
            readout = await self.reader.fetch(queries, topology, now_s)
        except SourceUnavailableError as exc:
            return Observed(self.stale_window(topology, groups, now_s), str(exc))
        if readout.newest_sample_s is not None:
            self._newest_s = max(self._newest_s or readout.newest_sample_s, readout.newest_sample_s)
        window = self.builder.build(readout, topology, tenants, groups, now_s, self._staleness(now_s))
        return Observed(window)

    def stale_window(self, topology: Topology, groups: Sequence[str], now_s: float) -> MetricWindow:
        """A window with only the known pool counts, every statistic unknown."""
        group_windows = {}
        for group in groups:
            pools = topology.pools.get(group)
            pending = topology.pending.get(group, (0, 0))
            group_windows[group] = GroupWindow(
                num_prefill=pools.num_prefill if pools else 0,
                num_decode=pools.num_decode if pools else 0,
                pending_prefill=pending[0],
                pending_decode=pending[1],
            )
        return MetricWindow(now_s, self.window_s, {}, group_windows, self._staleness(now_s))

    async def close(self) -> None:
        """Close the reader."""
        await self.reader.close()
