"""Types shared by the metric sources: queries, readouts, the reader port and the cluster topology.

A :class:`SeriesReader` answers a fixed list of :class:`Query` objects — sums of counter increases over the
window, sums of gauges, bucket increases and histogram quantiles, each grouped by some labels — from
Prometheus (PromQL) or from its own scrapes. :mod:`controller.sources.window` turns the answers into the
schema's :class:`~policies.schema.MetricWindow`, so both sources share one derivation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from policies.schema import PoolTargets

__all__ = ["InstanceInfo", "Query", "Readout", "Row", "SeriesReader", "SourceUnavailableError", "Topology"]

QueryKind = Literal["increase", "gauge", "buckets", "quantile"]


@dataclass(frozen=True, slots=True)
class Query:
    """One aggregate over the window.

    Attributes:
        kind: ``increase`` (sum of counter increases), ``gauge`` (sum of gauges at window end), ``buckets``
            (sum of ``_bucket`` increases, grouped by ``le`` too) or ``quantile`` (``histogram_quantile`` of the
            summed bucket increases).
        metric: sample name for ``increase``/``gauge``; histogram base name for ``buckets``/``quantile``.
        by: labels kept (everything else is summed away).
        q: quantile in 0-1 (``quantile`` only).
    """

    kind: QueryKind
    metric: str
    by: tuple[str, ...]
    q: float = 0.0


Row = tuple[Mapping[str, str], float]
"""Labels (those of ``Query.by``, plus ``le`` for buckets) and a value."""


@dataclass(frozen=True, slots=True)
class Readout:
    """A reader's answers for one window.

    Attributes:
        results: rows per query; a query with no rows had no series (unknown, not zero).
        window_s: length of the window the increases cover, seconds.
        newest_sample_s: wall time (epoch seconds) of the newest sample seen, ``None`` if none.
    """

    results: Mapping[Query, Sequence[Row]]
    window_s: float
    newest_sample_s: float | None


class SourceUnavailableError(RuntimeError):
    """The backend (Prometheus, or every scrape target) could not be read this tick."""


class SeriesReader(Protocol):
    """Answers window queries from some backend."""

    async def fetch(self, queries: Sequence[Query], topology: Topology, now_s: float) -> Readout:
        """Answer ``queries`` for the window ending at ``now_s`` (epoch seconds).

        Raises:
            SourceUnavailableError: nothing could be read.
        """
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """One serving instance as the controller knows it (``healthy``: as the router last reported it)."""

    id: str
    group: str
    role: str
    url: str | None = None
    pending_role: str | None = None
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class Topology:
    """Instances, pool counts and pending changes per tenant group, as known at the start of a tick.

    ``capacity`` lists, for the groups whose instance set is fixed (the router actuator can move instances
    between roles but cannot add any), how many healthy instances they have: the most they can run now.
    """

    instances: tuple[InstanceInfo, ...] = ()
    pools: Mapping[str, PoolTargets] = field(default_factory=dict)
    pending: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    capacity: Mapping[str, int] = field(default_factory=dict)

    def instance(self, instance_id: str) -> InstanceInfo | None:
        """The instance named ``instance_id``, if known."""
        for info in self.instances:
            if info.id == instance_id:
                return info
        return None

    @staticmethod
    def from_instances(instances: Sequence[InstanceInfo], groups: Sequence[str] = ()) -> Topology:
        """Counts, pending changes and capacity of the healthy instances, by role (every group in ``groups`` present).

        An unhealthy instance serves nothing: it is in no pool, and a move can only come from a healthy one.
        """
        counts: dict[str, list[int]] = {g: [0, 0] for g in groups}
        pending: dict[str, list[int]] = {g: [0, 0] for g in groups}
        for info in instances:
            counts.setdefault(info.group, [0, 0])
            if not info.healthy:
                continue
            counts.setdefault(info.group, [0, 0])[0 if info.role == "prefill" else 1] += 1
            if info.pending_role is not None and info.pending_role != info.role:
                pending.setdefault(info.group, [0, 0])[0 if info.pending_role == "prefill" else 1] += 1
        return Topology(
            instances=tuple(instances),
            pools={g: PoolTargets(c[0], c[1]) for g, c in counts.items()},
            pending={g: (p[0], p[1]) for g, p in pending.items()},
            capacity={g: c[0] + c[1] for g, c in counts.items()},
        )
