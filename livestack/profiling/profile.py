"""The workload profile: pure functions from requests (or distributions) to a :class:`WorkloadProfile`.

:func:`profile_records` summarises per-request records (traces, generated streams, router logs);
:func:`profile_distributions` summarises sources that only have distributions (ServeGen PMFs, Prometheus
histograms). Both fill the same :class:`WorkloadProfile` and apply :func:`~livestack.profiling.verdict.decide_verdict`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from livestack.profiling.arrivals import ArrivalStats, arrival_stats
from livestack.profiling.distributions import Distribution, SampleDistribution
from livestack.profiling.prefix import PrefixReuse, leading_hit_tokens, prefix_reuse_from_hashes, prefix_reuse_from_hits
from livestack.profiling.records import RequestRecords
from livestack.profiling.verdict import (
    LONG_CONTEXT_THRESHOLD_TOKENS,
    SHORT_OUTPUT_MAX_TOKENS,
    Verdict,
    VerdictInputs,
    decide_verdict,
)

__all__ = [
    "GroupStats",
    "LatencyStats",
    "LengthStats",
    "ProfileOptions",
    "WorkloadProfile",
    "latency_stats",
    "length_stats",
    "profile_distributions",
    "profile_records",
]

#: Quantiles reported for lengths and latencies.
QUANTILES = (0.5, 0.9, 0.95, 0.99)
#: Share of zero inter-arrival gaps from which timestamps count as quantised (the CV then overstates burstiness
#: and the verdict ignores it).
QUANTISED_ZERO_GAP_FRAC = 0.5


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """Knobs of a profile.

    Attributes:
        long_context_threshold_tokens: inputs at or above this are long-context.
        short_output_max_tokens: outputs below this are short.
        bin_s: width of the arrival-rate curve's bins (s); peak-to-mean is stated at this bin.
        max_groups: at most this many tenants or routes are listed (the largest); the rest are summed as "other".
    """

    long_context_threshold_tokens: int = LONG_CONTEXT_THRESHOLD_TOKENS
    short_output_max_tokens: int = SHORT_OUTPUT_MAX_TOKENS
    bin_s: float = 60.0
    max_groups: int = 12


@dataclass(frozen=True, slots=True)
class LengthStats:
    """Token-length summary: count (or weight), mean, quantiles, extremes and a histogram."""

    count: float
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    min: float | None
    max: float | None
    histogram_edges: list[float]
    histogram_counts: list[float]


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Latency summary in seconds."""

    count: float
    mean_s: float
    p50_s: float
    p90_s: float
    p95_s: float
    p99_s: float


@dataclass(frozen=True, slots=True)
class GroupStats:
    """One tenant's or route's share of the traffic."""

    name: str
    num_requests: int
    share_frac: float
    input: LengthStats
    output: LengthStats
    long_context_frac: float
    latency: dict[str, LatencyStats]


@dataclass(frozen=True, slots=True)
class WorkloadProfile:
    """Portrait of a workload and the verdict on P/D disaggregation (JSON via :meth:`to_dict`).

    Attributes:
        source: what was profiled (path or URL).
        source_kind: ``azure_csv``, ``mooncake_jsonl``, ``servegen``, ``router_log``, ``prometheus`` or
            ``requests``.
        num_requests: number of requests (estimated for distribution sources).
        input: prompt-length summary.
        output: output-length summary.
        long_context_threshold_tokens: the long-context threshold used.
        long_context_frac: share of requests with input ≥ the threshold.
        uncached_long_context_frac: share whose prompt minus its reusable prefix is ≥ the threshold (needs
            per-request prefix reuse), else None.
        short_output_max_tokens: the short-output bound used.
        short_short_frac: share of requests short in and short out.
        arrivals: arrival-rate curve and burstiness, when the source has times.
        prefix_reuse: prefix reuse, when the source has hashes or cache hits.
        streaming_frac: share of streamed requests, when known.
        success_frac: share of requests that succeeded, when known.
        latency: TTFT, TPOT, E2E summaries (keys ``ttft``, ``tpot``, ``e2e``), when known.
        stages: per-stage durations (docs/design.md names), when known.
        by_tenant: per-tenant groups (empty when the source has no tenants).
        by_route: per-route groups (empty when the source has no routes).
        notes: caveats about how figures were obtained.
        verdict: the decision with reasons and first steps.
    """

    source: str
    source_kind: str
    num_requests: float
    input: LengthStats
    output: LengthStats
    long_context_threshold_tokens: int
    long_context_frac: float
    uncached_long_context_frac: float | None
    short_output_max_tokens: int
    short_short_frac: float
    arrivals: ArrivalStats | None
    prefix_reuse: PrefixReuse | None
    streaming_frac: float | None
    success_frac: float | None
    latency: dict[str, LatencyStats]
    stages: dict[str, LatencyStats]
    by_tenant: list[GroupStats]
    by_route: list[GroupStats]
    notes: list[str]
    verdict: Verdict
    extras: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (NaN written as None)."""
        cleaned: dict[str, Any] = _clean(dataclasses.asdict(self))
        return cleaned


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def length_stats(dist: Distribution) -> LengthStats:
    """Summarise a token-length distribution."""
    edges, counts = dist.histogram()
    p50, p90, p95, p99 = (dist.quantile(q) for q in QUANTILES)
    return LengthStats(dist.count, dist.mean(), p50, p90, p95, p99, dist.minimum(), dist.maximum(), edges, counts)


def latency_stats(dist: Distribution) -> LatencyStats:
    """Summarise a latency distribution (seconds)."""
    p50, p90, p95, p99 = (dist.quantile(q) for q in QUANTILES)
    return LatencyStats(dist.count, dist.mean(), p50, p90, p95, p99)


def _latencies(series: dict[str, NDArray[np.float64]]) -> dict[str, LatencyStats]:
    out = {}
    for name, values in series.items():
        dist = SampleDistribution.of(values)
        if dist.count > 0:
            out[name] = latency_stats(dist)
    return out


def _groups(records: RequestRecords, labels: NDArray[np.str_] | None, options: ProfileOptions) -> list[GroupStats]:
    if labels is None or len(records) == 0:
        return []
    names, counts = np.unique(labels, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    groups = []
    for index in order[: options.max_groups].tolist():
        mask = labels == names[index]
        groups.append(_group(str(names[index]), records, mask, options))
    rest = ~np.isin(labels, names[order[: options.max_groups]])
    if rest.any():
        groups.append(_group("other", records, rest, options))
    return groups


def _group(name: str, records: RequestRecords, mask: NDArray[np.bool_], options: ProfileOptions) -> GroupStats:
    part = records.take(mask)
    return GroupStats(
        name=name,
        num_requests=len(part),
        share_frac=len(part) / len(records),
        input=length_stats(SampleDistribution.of(part.input_tokens)),
        output=length_stats(SampleDistribution.of(part.output_tokens)),
        long_context_frac=float((part.input_tokens >= options.long_context_threshold_tokens).mean()),
        latency=_latencies(part.latency_s),
    )


def _verdict(
    *,
    num_requests: float,
    input_dist: Distribution,
    output_dist: Distribution,
    long_frac: float,
    uncached_long_frac: float | None,
    short_short_frac: float,
    arrivals: ArrivalStats | None,
    reuse: PrefixReuse | None,
    latency: dict[str, LatencyStats],
    options: ProfileOptions,
) -> Verdict:
    tpot = latency.get("tpot")
    return decide_verdict(
        VerdictInputs(
            num_requests=num_requests,
            long_context_threshold_tokens=options.long_context_threshold_tokens,
            long_context_frac=long_frac,
            uncached_long_context_frac=uncached_long_frac,
            short_short_frac=short_short_frac,
            output_p50_tokens=output_dist.quantile(0.5),
            input_mean_tokens=input_dist.mean(),
            output_mean_tokens=output_dist.mean(),
            token_reuse_frac=None if reuse is None else reuse.token_reuse_frac,
            iat_cv=None if arrivals is None else arrivals.iat_cv,
            peak_to_mean=None if arrivals is None else arrivals.peak_to_mean,
            bin_s=None if arrivals is None else arrivals.bin_s,
            tpot_p50_s=None if tpot is None else tpot.p50_s,
            tpot_p99_s=None if tpot is None else tpot.p99_s,
        )
    )


def profile_records(
    records: RequestRecords, *, source: str, source_kind: str = "requests", options: ProfileOptions | None = None
) -> WorkloadProfile:
    """Profile per-request records."""
    options = options or ProfileOptions()
    threshold = options.long_context_threshold_tokens
    inputs, outputs = records.input_tokens, records.output_tokens
    input_dist = SampleDistribution.of(inputs)
    output_dist = SampleDistribution.of(outputs)
    n = len(records)
    long_frac = float((inputs >= threshold).mean()) if n else math.nan
    short_short = float(((inputs < threshold) & (outputs < options.short_output_max_tokens)).mean()) if n else math.nan
    reuse: PrefixReuse | None = None
    uncached_long: float | None = None
    if records.hash_ids is not None and records.hash_offsets is not None:
        reuse = prefix_reuse_from_hashes(records.hash_ids, records.hash_offsets, inputs, records.hash_block_tokens)
        hits = leading_hit_tokens(records.hash_ids, records.hash_offsets, inputs, records.hash_block_tokens)
        uncached_long = float(((inputs - hits) >= threshold).mean())
    elif records.prefix_hit_tokens is not None:
        reuse = prefix_reuse_from_hits(records.prefix_hit_tokens, inputs)
        hits_known = np.nan_to_num(np.minimum(records.prefix_hit_tokens, inputs), nan=0.0)
        uncached_long = float(((inputs - hits_known) >= threshold).mean())
    arrivals = None if records.arrival_s is None else arrival_stats(records.arrival_s, options.bin_s)
    stream_known = None if records.stream is None else records.stream[np.isfinite(records.stream)]
    latency = _latencies(records.latency_s)
    notes = []
    if records.arrival_s is None:
        notes.append("the source has no arrival times: no rate curve or burstiness")
    verdict_arrivals = arrivals
    if arrivals is not None and (arrivals.zero_gap_frac or 0.0) >= QUANTISED_ZERO_GAP_FRAC:
        notes.append(
            f"{100 * (arrivals.zero_gap_frac or 0.0):.0f} % of inter-arrival gaps are 0 (quantised timestamps): "
            "the inter-arrival CV overstates burstiness and the verdict ignores it"
        )
        verdict_arrivals = dataclasses.replace(arrivals, iat_cv=None)
    return WorkloadProfile(
        source=source,
        source_kind=source_kind,
        num_requests=float(n),
        input=length_stats(input_dist),
        output=length_stats(output_dist),
        long_context_threshold_tokens=threshold,
        long_context_frac=long_frac,
        uncached_long_context_frac=uncached_long,
        short_output_max_tokens=options.short_output_max_tokens,
        short_short_frac=short_short,
        arrivals=arrivals,
        prefix_reuse=reuse,
        streaming_frac=None if stream_known is None or not len(stream_known) else float(stream_known.mean()),
        success_frac=None if records.ok is None else float(records.ok.mean()),
        latency=latency,
        stages=_latencies(records.stages_s),
        by_tenant=_groups(records, records.tenant, options),
        by_route=_groups(records, records.route, options),
        notes=notes,
        verdict=_verdict(
            num_requests=n,
            input_dist=input_dist,
            output_dist=output_dist,
            long_frac=long_frac,
            uncached_long_frac=uncached_long,
            short_short_frac=short_short,
            arrivals=verdict_arrivals,
            reuse=reuse,
            latency=latency,
            options=options,
        ),
    )


def profile_distributions(
    *,
    source: str,
    source_kind: str,
    num_requests: float,
    input_dist: Distribution,
    output_dist: Distribution,
    short_short_frac: float | None = None,
    arrivals: ArrivalStats | None = None,
    latency: dict[str, Distribution] | None = None,
    notes: list[str] | None = None,
    extras: dict[str, float] | None = None,
    options: ProfileOptions | None = None,
) -> WorkloadProfile:
    """Profile a source known only by distributions.

    ``short_short_frac`` is the joint short-in/short-out share when the source can compute it; otherwise input
    and output lengths are taken as independent (and a note says so).
    """
    options = options or ProfileOptions()
    notes = list(notes or [])
    threshold = options.long_context_threshold_tokens
    if short_short_frac is None:
        short_short_frac = input_dist.share_below(threshold) * output_dist.share_below(options.short_output_max_tokens)
        notes.append("short-in/short-out share assumes input and output lengths independent")
    long_frac = input_dist.share_at_least(threshold)
    latency_summary = {name: latency_stats(dist) for name, dist in (latency or {}).items() if dist.count > 0}
    return WorkloadProfile(
        source=source,
        source_kind=source_kind,
        num_requests=num_requests,
        input=length_stats(input_dist),
        output=length_stats(output_dist),
        long_context_threshold_tokens=threshold,
        long_context_frac=long_frac,
        uncached_long_context_frac=None,
        short_output_max_tokens=options.short_output_max_tokens,
        short_short_frac=short_short_frac,
        arrivals=arrivals,
        prefix_reuse=None,
        streaming_frac=None,
        success_frac=None,
        latency=latency_summary,
        stages={},
        by_tenant=[],
        by_route=[],
        notes=notes,
        verdict=_verdict(
            num_requests=num_requests,
            input_dist=input_dist,
            output_dist=output_dist,
            long_frac=long_frac,
            uncached_long_frac=None,
            short_short_frac=short_short_frac,
            arrivals=arrivals,
            reuse=None,
            latency=latency_summary,
            options=options,
        ),
        extras=dict(extras or {}),
    )
