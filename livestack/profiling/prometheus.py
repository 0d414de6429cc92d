"""Profile of a live deployment from Prometheus: vLLM's request histograms over a time range.

Queried (PromQL, evaluated at ``end`` over the range ``end − start``):

* ``sum by (le) (increase(<histogram>_bucket[range]))`` and ``sum(increase(<histogram>_sum[range]))`` for
  ``vllm:request_prompt_tokens``, ``vllm:request_generation_tokens``, ``vllm:time_to_first_token_seconds``,
  ``vllm:inter_token_latency_seconds`` and ``vllm:e2e_request_latency_seconds``;
* the request-rate curve ``sum(rate(vllm:e2e_request_latency_seconds_count[bin]))`` from ``start`` to ``end``
  in steps of ``bin`` (completions per second, which track arrivals over bins much longer than a request).

Quantiles and long-context shares are read off the histogram buckets (linear inside a bucket, as PromQL's
``histogram_quantile``); prompt and output lengths are taken as independent for the short-in/short-out share.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Protocol

import numpy as np

from env.workloads.errors import WorkloadError
from livestack.profiling.arrivals import rate_curve_stats
from livestack.profiling.distributions import BucketDistribution, Distribution
from livestack.profiling.profile import ProfileOptions, WorkloadProfile, profile_distributions

__all__ = [
    "VLLM_HISTOGRAMS",
    "PrometheusClient",
    "PrometheusSourceError",
    "bucket_distribution",
    "profile_prometheus",
]

#: The vLLM histograms the profile reads, by role.
VLLM_HISTOGRAMS: dict[str, str] = {
    "input": "vllm:request_prompt_tokens",
    "output": "vllm:request_generation_tokens",
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:inter_token_latency_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}
#: Counter whose rate gives the request-rate curve.
RATE_COUNTER = "vllm:e2e_request_latency_seconds_count"
#: Seconds to wait for Prometheus before calling it unreachable.
PROMETHEUS_TIMEOUT_S = 10


class PrometheusSourceError(WorkloadError):
    """Prometheus is unreachable, refuses a query or has no data in the range (one-line message)."""


class PrometheusClient(Protocol):
    """The two calls of ``prometheus_api_client.PrometheusConnect`` the profile uses."""

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Instant query."""
        ...

    def custom_query_range(
        self, query: str, start_time: datetime, end_time: datetime, step: str
    ) -> list[dict[str, Any]]:
        """Range query."""
        ...


def bucket_distribution(bucket_result: list[dict[str, Any]], total_sum: float) -> BucketDistribution:
    """Build a histogram from an instant-query result with one series per ``le`` label."""
    pairs = []
    for series in bucket_result:
        le = series.get("metric", {}).get("le")
        if le is None:
            continue
        pairs.append((math.inf if le in ("+Inf", "Inf", "inf") else float(le), float(series["value"][1])))
    pairs.sort()
    bounds = np.array([p[0] for p in pairs], dtype=np.float64)
    counts = np.maximum.accumulate(np.array([p[1] for p in pairs], dtype=np.float64)) if pairs else np.zeros(0)
    return BucketDistribution(bounds, counts, total_sum)


def _connect(url: str) -> PrometheusClient:
    from prometheus_api_client import PrometheusConnect
    from urllib3.util.retry import Retry

    client: PrometheusClient = PrometheusConnect(
        url=url, disable_ssl=True, retry=Retry(total=0), timeout=PROMETHEUS_TIMEOUT_S
    )
    return client


def _describe(exc: Exception) -> str:
    import requests  # a dependency of prometheus-api-client, needed only on failure

    if isinstance(exc, requests.exceptions.ConnectionError):
        return "Prometheus unreachable (connection failed)"
    if isinstance(exc, requests.exceptions.Timeout):
        return f"Prometheus unreachable (no answer within {PROMETHEUS_TIMEOUT_S} s)"
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    text = text if len(text) <= 160 else text[:157] + "..."
    return f"Prometheus query failed ({text})"


def _scalar(result: list[dict[str, Any]]) -> float:
    return float(result[0]["value"][1]) if result else 0.0


def profile_prometheus(
    url: str,
    start: datetime,
    end: datetime,
    *,
    options: ProfileOptions | None = None,
    client: PrometheusClient | None = None,
) -> WorkloadProfile:
    """Profile the vLLM instances a Prometheus scrapes, over ``[start, end]``.

    Raises:
        PrometheusSourceError: unreachable, a failed query, or no prompt-length samples in the range.
    """
    options = options or ProfileOptions()
    range_s = int((end - start).total_seconds())
    if range_s <= 0:
        raise PrometheusSourceError(f"{url}: --end must be after --start")
    client = client or _connect(url)
    at = {"time": end.timestamp()}
    dists: dict[str, Distribution] = {}
    try:
        for role, name in VLLM_HISTOGRAMS.items():
            buckets = client.custom_query(f"sum by (le) (increase({name}_bucket[{range_s}s]))", params=at)
            total = _scalar(client.custom_query(f"sum(increase({name}_sum[{range_s}s]))", params=at))
            dists[role] = bucket_distribution(buckets, total)
        bin_s = max(int(options.bin_s), 1)
        curve = client.custom_query_range(
            f"sum(rate({RATE_COUNTER}[{bin_s}s]))", start_time=start, end_time=end, step=f"{bin_s}s"
        )
    except Exception as exc:  # requests' and the client's exceptions have no common base worth naming
        raise PrometheusSourceError(f"{url}: {_describe(exc)}") from None
    if dists["input"].count <= 0:
        raise PrometheusSourceError(
            f"{url}: no {VLLM_HISTOGRAMS['input']} samples between {start.isoformat()} and {end.isoformat()}"
        )
    rates = np.array([float(v[1]) for v in curve[0]["values"]], dtype=np.float64) if curve else np.zeros(0)
    arrivals = rate_curve_stats(rates, float(bin_s)) if len(rates) else None
    return profile_distributions(
        source=url,
        source_kind="prometheus",
        num_requests=dists["input"].count,
        input_dist=dists["input"],
        output_dist=dists["output"],
        arrivals=arrivals,
        latency={role: dists[role] for role in ("ttft", "tpot", "e2e")},
        notes=[
            f"from vLLM histograms over {range_s} s: quantiles and shares interpolate inside buckets",
            "the rate curve counts completions per second (it tracks arrivals over bins longer than a request)",
        ],
        options=options,
    )
