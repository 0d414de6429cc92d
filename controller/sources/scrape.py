"""The built-in scraper: reads ``/metrics`` of the router and every instance, diffs counters between scrapes.

Each tick scrapes all endpoints concurrently, keeps only the samples the window queries read, parses them
(by metric and label name), labels instance series with the instance id, and answers window queries by diffing the
newest scrape against the oldest one still inside the window — the same aggregates Prometheus would return
(counter resets count from zero; a series that appears while its endpoint was already answering counts
from zero, one whose endpoint was not read at the window start has no increase yet; quantiles from bucket
deltas).
An endpoint that fails contributes no series (unknown); when every endpoint fails the readout is unavailable.
"""

from __future__ import annotations

import asyncio
import functools
import math
import re
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from controller.sources.base import Query, Readout, Row, SourceUnavailableError, Topology
from policies.scoring import histogram_quantile

__all__ = ["ScrapeReader", "Snapshot", "parse_exposition", "wanted_samples"]

LabelKey = frozenset[tuple[str, str]]
Samples = dict[str, dict[LabelKey, float]]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every sample of one scrape round, by sample name then label set."""

    time_s: float
    samples: Samples
    answered: frozenset[str] = frozenset()
    """Endpoints (instance ids; ``""`` for the router) that answered this scrape."""


_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+-?[0-9]+)?[ \t]*")
_PAIR = r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*'
_LABEL = re.compile(_PAIR)
_LABEL_SET = re.compile(rf"(?:{_PAIR},)*(?:{_PAIR})?,?[ \t]*")
_ESCAPE = re.compile(r"\\(.)")


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def _labels(inner: str | None) -> list[tuple[str, str]] | None:
    """Label pairs of a sample line, ``None`` if the fast path cannot read them."""
    if not inner:
        return []
    if _LABEL_SET.fullmatch(inner) is None:
        return None
    pairs: list[tuple[str, str]] = _LABEL.findall(inner)
    if "\\" in inner:
        pairs = [(name, _unescape(value)) for name, value in pairs]
    return pairs


@functools.lru_cache(maxsize=1 << 16)
def _label_key(inner: str | None, extra: tuple[tuple[str, str], ...]) -> LabelKey | None:
    """A sample's label set (its own labels and ``extra``), ``None`` if the fast path cannot read them.

    Memoised: a scrape repeats the label sets of the one before (only the values change), so each is read once.
    """
    pairs = _labels(inner)
    return None if pairs is None else frozenset((*pairs, *extra))


def _sample_name(line: str) -> str:
    brace, space = line.find("{"), line.find(" ")
    if brace >= 0 and (space < 0 or brace < space):
        return line[:brace]
    return line[:space] if space >= 0 else line.split("\t", 1)[0]


_Node = dict[str, "_Node"]


def _prefix_tree_pattern(words: Iterable[str]) -> str:
    """A regex matching exactly ``words``, their common prefixes factored out (a branch fails on its first char)."""
    tree: _Node = {}
    for word in words:
        node = tree
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def emit(node: _Node) -> str:
        branches = [re.escape(char) + emit(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(tree)


@functools.lru_cache(maxsize=16)
def _line_filter(wanted: frozenset[str]) -> re.Pattern[str]:
    """One regex finding the sample lines of the wanted names in the text behind one more newline.

    The scan runs in C and jumps from newline to newline (the pattern starts with a literal), and the names are
    one prefix tree, so a line of another metric is dropped after a few characters.
    """
    return re.compile(rf"\n({_prefix_tree_pattern(wanted)}(?=[{{ \t])[^\n]*)")


def parse_exposition(
    text: str, extra_labels: Mapping[str, str], into: Samples, wanted: frozenset[str] | None = None
) -> None:
    """Add the samples of one ``/metrics`` text to ``into``, each labelled with ``extra_labels`` too.

    Only samples named in ``wanted`` are kept (all when ``None``); ``_created`` series are skipped. Sample
    lines are read by a fast path for the text format; a line it cannot read is handed to prometheus_client's
    parser (which the tests use as the reference for the fast path on real expositions).
    """
    extra = tuple(extra_labels.items())
    lines: Iterable[str]
    if wanted is None:
        lines = (line for line in text.splitlines() if line and line[0] != "#")
    else:
        lines = _line_filter(wanted).findall("\n" + text)
    for line in lines:
        name = _sample_name(line)
        if (wanted is not None and name not in wanted) or name.endswith("_created"):
            continue
        match = _SAMPLE.fullmatch(line)
        key = _label_key(match.group(2), extra) if match is not None else None
        if match is None or key is None:
            for family in text_string_to_metric_families(line + "\n"):
                for sample in family.samples:
                    into.setdefault(sample.name, {})[frozenset((*sample.labels.items(), *extra))] = float(sample.value)
            continue
        into.setdefault(name, {})[key] = float(match.group(3))


def wanted_samples(queries: Sequence[Query]) -> frozenset[str]:
    """Sample names the queries read (histogram queries read ``_bucket``)."""
    return frozenset(q.metric + "_bucket" if q.kind in ("buckets", "quantile") else q.metric for q in queries)


@functools.lru_cache(maxsize=1 << 16)
def _project(key: LabelKey, by: tuple[str, ...]) -> tuple[tuple[str, str], ...] | None:
    """``key``'s values of the labels ``by``, in that order; ``None`` if it lacks one (memoised like the keys)."""
    labels = dict(key)
    if any(name not in labels for name in by):
        return None
    return tuple((name, labels[name]) for name in by)


@dataclass(slots=True)
class _Memo:
    """Per-evaluation caches: counter increases by sample name, grouped sums by (gauge, name, labels)."""

    increases: dict[str, dict[LabelKey, float]] = field(default_factory=dict)
    sums: dict[tuple[bool, str, tuple[str, ...]], dict[tuple[tuple[str, str], ...], float]] = field(
        default_factory=dict
    )


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

    async def scrape(self, topology: Topology, now_s: float, wanted: frozenset[str] | None = None) -> Snapshot:
        """Scrape every endpoint once and remember the result (only the ``wanted`` samples, if given).

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
            endpoint: Samples = {}
            try:
                parse_exposition(text, labels, endpoint, wanted)
            except ValueError:  # a malformed exposition makes the endpoint unreadable, as in Prometheus
                continue
            for name, series in endpoint.items():
                samples.setdefault(name, {}).update(series)
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
        await self.scrape(topology, now_s, wanted_samples(queries))
        return self.evaluate(queries)

    def evaluate(self, queries: Sequence[Query]) -> Readout:
        """Answer ``queries`` from the remembered scrapes (no I/O)."""
        if not self._history:
            raise SourceUnavailableError("nothing scraped yet")
        newest, base = self._history[-1], self._base()
        memo = _Memo()
        results = {query: self._answer(query, newest, base, memo) for query in queries}
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

    def _sums(
        self, query: Query, newest: Snapshot, base: Snapshot | None, memo: _Memo
    ) -> dict[tuple[tuple[str, str], ...], float]:
        gauge = query.kind == "gauge"
        name = query.metric if query.kind in ("gauge", "increase") else query.metric + "_bucket"
        by = (*query.by, "le") if query.kind in ("buckets", "quantile") else query.by
        memo_key = (gauge, name, by)
        cached = memo.sums.get(memo_key)
        if cached is not None:
            return cached
        if gauge:
            series = newest.samples.get(name, {})
        else:
            series = memo.increases.get(name) or memo.increases.setdefault(name, self._increase(name, newest, base))
        sums: dict[tuple[tuple[str, str], ...], float] = defaultdict(float)
        for key, value in series.items():
            projected = _project(key, by)
            if projected is not None:
                sums[projected] += value
        memo.sums[memo_key] = sums
        return sums

    def _answer(self, query: Query, newest: Snapshot, base: Snapshot | None, memo: _Memo) -> list[Row]:
        sums = self._sums(query, newest, base, memo)
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
