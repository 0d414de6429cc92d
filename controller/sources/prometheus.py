"""Window queries as PromQL against a Prometheus server (through ``prometheus-api-client``).

``increase`` → ``sum by (…) (increase(m[W]))``; ``gauge`` → ``sum by (…) (m)``; ``buckets`` →
``sum by (le, …) (increase(m_bucket[W]))``; ``quantile`` → ``histogram_quantile(q, sum by (le, …)
(increase(m_bucket[W])))``. All queries of a tick are evaluated at the same instant. No result = no row
(unknown); a query that fails makes the whole readout unavailable (the window is then stale, never zero).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from controller.sources.base import Query, Readout, Row, SourceUnavailableError, Topology

__all__ = ["PrometheusReader", "promql"]

FRESHNESS_METRICS = ("vllm:kv_cache_usage_perc", "pdctl_router_requests_total")
"""Series whose newest timestamp measures how fresh the data is."""


def _range(window_s: float) -> str:
    return f"{max(round(window_s * 1000), 1)}ms"


def promql(query: Query, window_s: float) -> str:
    """The PromQL expression answering ``query`` over a window of ``window_s`` seconds."""
    by = ", ".join(query.by)
    window = _range(window_s)
    if query.kind == "increase":
        return f"sum by ({by}) (increase({query.metric}[{window}]))"
    if query.kind == "gauge":
        return f"sum by ({by}) ({query.metric})"
    by_le = ", ".join(("le", *query.by))
    buckets = f"sum by ({by_le}) (increase({query.metric}_bucket[{window}]))"
    if query.kind == "buckets":
        return buckets
    return f"histogram_quantile({query.q:g}, {buckets})"


def _rows(result: list[dict[str, Any]]) -> list[Row]:
    rows: list[Row] = []
    for item in result:
        labels = {str(k): str(v) for k, v in item.get("metric", {}).items()}
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        rows.append((labels, value))
    return rows


class PrometheusReader:
    """Answers window queries with PromQL."""

    def __init__(self, url: str, window_s: float, timeout_s: float, bearer_token: str | None = None) -> None:
        self.url = url
        self.window_s = window_s
        self._timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else None
        self._client = PrometheusConnect(url=url, headers=headers, retry=Retry(total=0), timeout=timeout_s)

    def _query(self, expression: str, now_s: float) -> list[Row]:
        try:
            result = self._client.custom_query(expression, params={"time": f"{now_s:.3f}"}, timeout=self._timeout_s)
        except (requests.RequestException, PrometheusApiClientException, ValueError) as exc:
            raise SourceUnavailableError(f"prometheus {self.url}: {type(exc).__name__}: {exc}"[:300]) from exc
        return _rows(result)

    def _fetch(self, queries: Sequence[Query], now_s: float) -> Readout:
        results = {query: self._query(promql(query, self.window_s), now_s) for query in queries}
        names = "|".join(FRESHNESS_METRICS)
        newest = self._query(f'max(timestamp({{__name__=~"{names}"}}))', now_s)
        newest_s = newest[0][1] if newest and math.isfinite(newest[0][1]) else None
        return Readout(results, self.window_s, newest_s)

    async def fetch(self, queries: Sequence[Query], topology: Topology, now_s: float) -> Readout:
        """Evaluate every query at ``now_s`` (in a worker thread: the client is synchronous)."""
        del topology
        return await asyncio.to_thread(self._fetch, queries, now_s)

    async def close(self) -> None:
        """Close the HTTP session."""
        self._client._session.close()
