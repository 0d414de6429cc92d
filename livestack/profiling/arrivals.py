"""Arrival-rate curve and burstiness of a request stream.

Definitions (those of ``../shared/traces/README.md``): the mean rate is ``(N − 1) / span``; the inter-arrival CV is
``std/mean`` of the gaps (population std); counts are taken in bins of ``bin_s`` starting at the first arrival, the
last bin possibly partial; the variance-to-mean ratio (index of dispersion) uses every bin; peak-to-mean and the
per-bin range use full bins only (the partial last bin is reported apart).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["ArrivalStats", "arrival_stats", "rate_curve_stats"]


@dataclass(frozen=True, slots=True)
class ArrivalStats:
    """Arrival statistics of a stream.

    Attributes:
        span_s: last minus first arrival (s).
        mean_rate_rps: ``(N − 1) / span_s`` (for a rate curve: the mean of the curve).
        iat_cv: coefficient of variation of inter-arrival gaps, when per-request arrivals are known.
        bin_s: width of the rate-curve bins (s).
        rate_curve_rps: requests per second in each bin (the last may be partial).
        peak_to_mean: largest full-bin rate over the mean full-bin rate.
        dispersion_1s: variance-to-mean ratio of per-second counts, when per-request arrivals are known.
        dispersion_bin: variance-to-mean ratio of per-bin counts, when per-request arrivals are known.
        min_full_bin_count: fewest requests in a full bin.
        max_full_bin_count: most requests in a full bin.
        empty_bins: bins without any request.
        last_bin_count: requests in the last bin when it is partial, else None.
        zero_gap_frac: share of inter-arrival gaps that are exactly 0 (quantised timestamps), when known.
    """

    span_s: float
    mean_rate_rps: float
    iat_cv: float | None
    bin_s: float
    rate_curve_rps: list[float]
    peak_to_mean: float
    dispersion_1s: float | None
    dispersion_bin: float | None
    min_full_bin_count: float
    max_full_bin_count: float
    empty_bins: int
    last_bin_count: float | None
    zero_gap_frac: float | None = None


def _dispersion(counts: NDArray[np.int64]) -> float:
    mean = float(counts.mean())
    return float(counts.var() / mean) if mean > 0 else math.nan


def arrival_stats(arrival_s: NDArray[np.float64], bin_s: float = 60.0) -> ArrivalStats | None:
    """Statistics of sorted per-request arrival times; None with fewer than two arrivals or a zero span."""
    if len(arrival_s) < 2:
        return None
    t = np.sort(np.asarray(arrival_s, dtype=np.float64))
    span_s = float(t[-1] - t[0])
    if span_s <= 0:
        return None
    gaps = np.diff(t)
    offsets = t - t[0]
    per_second = np.bincount(np.floor(offsets).astype(np.int64))
    per_bin = np.bincount(np.floor(offsets / bin_s).astype(np.int64))
    full = math.floor(span_s / bin_s)
    full_counts = per_bin[:full] if full > 0 else per_bin
    mean_full = float(full_counts.mean())
    return ArrivalStats(
        span_s=span_s,
        mean_rate_rps=(len(t) - 1) / span_s,
        iat_cv=float(gaps.std() / gaps.mean()),
        bin_s=bin_s,
        rate_curve_rps=(per_bin / bin_s).tolist(),
        peak_to_mean=float(full_counts.max()) / mean_full if mean_full > 0 else math.nan,
        dispersion_1s=_dispersion(per_second),
        dispersion_bin=_dispersion(per_bin),
        min_full_bin_count=float(full_counts.min()),
        max_full_bin_count=float(full_counts.max()),
        empty_bins=int((per_bin == 0).sum()),
        last_bin_count=float(per_bin[-1]) if len(per_bin) > full else None,
        zero_gap_frac=float((gaps == 0).mean()),
    )


def rate_curve_stats(rate_rps: NDArray[np.float64], bin_s: float, iat_cv: float | None = None) -> ArrivalStats:
    """Statistics of a rate curve given per bin (ServeGen windows, Prometheus rates): no per-request detail."""
    rates = np.asarray(rate_rps, dtype=np.float64)
    rates = rates[np.isfinite(rates)]
    mean = float(rates.mean()) if len(rates) else math.nan
    counts = rates * bin_s
    return ArrivalStats(
        span_s=len(rates) * bin_s,
        mean_rate_rps=mean,
        iat_cv=iat_cv,
        bin_s=bin_s,
        rate_curve_rps=rates.tolist(),
        peak_to_mean=float(rates.max() / mean) if mean > 0 else math.nan,
        dispersion_1s=None,
        dispersion_bin=None,
        min_full_bin_count=float(counts.min()) if len(counts) else math.nan,
        max_full_bin_count=float(counts.max()) if len(counts) else math.nan,
        empty_bins=int((rates == 0).sum()),
        last_bin_count=None,
    )
