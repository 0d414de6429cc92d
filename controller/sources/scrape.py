"""The built-in scraper: reads ``/metrics`` of the router and every instance, diffs counters between scrapes.

Each tick scrapes all endpoints concurrently, parses them with prometheus_client's text parser (by metric
and label name), labels instance series with the instance id, and answers window queries by diffing the
newest scrape against the oldest one still inside the window — the same aggregates Prometheus would return
(counter resets count from zero; a series that appears while its endpoint was already answering counts
from zero, one whose endpoint was not read at the window start has no increase yet; quantiles from bucket
deltas).
An endpoint that fails contributes no series (unknown); when every endpoint fails the readout is unavailable.
"""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from controller.sources.base import Query, Readout, Row, SourceUnavailableError, Topology
from controller.sources.quantile import histogram_quantile

__all__ = ["ScrapeReader", "Snapshot", "parse_exposition"]

LabelKey = frozenset[tuple[str, str]]
Samples = dict[str, dict[LabelKey, float]]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every sample of one scrape round, by sample name then label set."""

    time_s: float
    samples: Samples
    answered: frozenset[str] = frozenset()
    """Endpoints (instance ids; ``""`` for the router) that answered this scrape."""


def parse_exposition(text: str, extra_labels: Mapping[str, str], into: Samples) -> None:
    """Add the samples of one ``/metrics`` text to ``into``, each labelled with ``extra_labels`` too."""
    extra = tuple(extra_labels.items())
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            key: LabelKey = frozenset((*sample.labels.items(), *extra))
            into.setdefault(sample.name, {})[key] = float(sample.value)


def _project(key: LabelKey, by: Sequence[str]) -> tuple[tuple[str, str], ...] | None:
    labels = dict(key)
    if any(name not in labels for name in by):
        return None
    return tuple((name, labels[name]) for name in by)


class ScrapeReader:
    """Answers window queries from its own scrapes (the embedded default when no Prometheus is given)."""

    def __init__(
        self, router_metrics_url: str | None, window_s: float, timeout_s: float, instance_label: str = "instance_id"
    ) -> None:
        self.router_metrics_url = router_metrics_url
        self.window_s = window_s
        self.instance_label = instance_label
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._history: deque[Snapshot] = deque()

    def _targets(self, topology: Topology) -> list[tuple[str, dict[str, str]]]:
        targets: list[tuple[str, dict[str, str]]] = []
        if self.router_metrics_url:
            targets.append((self.router_metrics_url, {}))
        targets.extend(
            (f"{info.url.rstrip('/')}/metrics", {self.instance_label: info.id})
            for info in topology.instances
            if info.url
        )
        return targets

    async def _get(self, url: str) -> str | None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.get(url) as response:
                if response.status != 200:
                    return None
                return await response.text()
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return None

    async def scrape(self, topology: Topology, now_s: float) -> Snapshot:
        """Scrape every endpoint once and remember the result.

        Raises:
            SourceUnavailableError: no endpoint answered.
        """
        targets = self._targets(topology)
        if not targets:
            raise SourceUnavailableError("no endpoints to scrape")
        texts = await asyncio.gather(*(self._get(url) for url, _ in targets))
        samples: Samples = {}
        answered: set[str] = set()
        for (_, labels), text in zip(targets, texts, strict=True):
            if text is None:
                continue
            try:
                parse_exposition(text, labels, samples)
            except ValueError:
                continue
            answered.add(labels.get(self.instance_label, ""))
        if not answered:
            raise SourceUnavailableError(f"none of {len(targets)} /metrics endpoints answered")
        snapshot = Snapshot(now_s, samples, frozenset(answered))
        self.remember(snapshot)
        return snapshot

    def remember(self, snapshot: Snapshot) -> None:
        """Append a snapshot and forget those no longer needed for the window."""
        self._history.append(snapshot)
        while len(self._history) > 2 and self._history[1].time_s <= snapshot.time_s - self.window_s:
            self._history.popleft()

    def _base(self) -> Snapshot | None:
        if len(self._history) < 2:
            return None
        newest = self._history[-1]
        for snapshot in self._history:
            if snapshot.time_s >= newest.time_s - self.window_s - 1e-9 and snapshot is not newest:
                return snapshot
        return self._history[-2]

    async def fetch(self, queries: Sequence[Query], topology: Topology, now_s: float) -> Readout:
        """Scrape, then answer ``queries`` from the newest scrape and the oldest one inside the window."""
        await self.scrape(topology, now_s)
        return self.evaluate(queries)

    def evaluate(self, queries: Sequence[Query]) -> Readout:
        """Answer ``queries`` from the remembered scrapes (no I/O)."""
        if not self._history:
            raise SourceUnavailableError("nothing scraped yet")
        newest, base = self._history[-1], self._base()
        results = {query: self._answer(query, newest, base) for query in queries}
        window_s = newest.time_s - base.time_s if base is not None else self.window_s
        return Readout(results, window_s, newest.time_s)

    def _increase(self, name: str, newest: Snapshot, base: Snapshot | None) -> dict[LabelKey, float]:
        if base is None:
            return {}
        before = base.samples.get(name, {})
        out: dict[LabelKey, float] = {}
        for key, value in newest.samples.get(name, {}).items():
            previous = before.get(key)
            if previous is None:
                # A series absent from an endpoint that did answer the base scrape was born inside the window
                # (counters start at zero); one whose endpoint did not answer has no base yet.
                endpoint = dict(key).get(self.instance_label, "")
                if endpoint not in base.answered:
                    continue
                previous = 0.0
            out[key] = value - previous if value >= previous else value
        return out

    def _answer(self, query: Query, newest: Snapshot, base: Snapshot | None) -> list[Row]:
        if query.kind == "gauge":
            series = newest.samples.get(query.metric, {})
        elif query.kind == "increase":
            series = self._increase(query.metric, newest, base)
        else:
            series = self._increase(query.metric + "_bucket", newest, base)
        by = (*query.by, "le") if query.kind in ("buckets", "quantile") else query.by
        sums: dict[tuple[tuple[str, str], ...], float] = defaultdict(float)
        for key, value in series.items():
            projected = _project(key, by)
            if projected is not None:
                sums[projected] += value
        if query.kind != "quantile":
            return [(dict(labels), value) for labels, value in sums.items()]
        histograms: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = defaultdict(list)
        for labels, value in sums.items():
            histograms[labels[:-1]].append((float(labels[-1][1]), value))
        rows: list[Row] = []
        for labels, buckets in histograms.items():
            quantile = histogram_quantile(query.q, buckets)
            rows.append((dict(labels), quantile if quantile is not None else math.nan))
        return rows

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
