"""Fit a synthetic workload to observed requests: the bridge from a profile to a simulator scenario.

:func:`fit_workload` returns a :data:`~env.workloads.config.WorkloadConfig` that reproduces the stream's rate,
burstiness and length distributions: a Gamma renewal process with the observed mean rate and inter-arrival CV
(Poisson when the CV is within :data:`POISSON_CV_TOLERANCE` of 1, or when timestamps are quantised), and
log-normal input and output lengths matching the observed median and 90th percentile (the quantiles a routing
threshold cares about; a moment fit is pulled off by the short-prompt mass of real traces), clipped to the
observed range. Prefix reuse, diurnal shape and the joint input/output dependence are
not carried over (the profile reports them).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from env.workloads.config import FixedLength, GammaWorkload, LognormalLength, PoissonWorkload
from livestack.profiling.arrivals import arrival_stats
from livestack.profiling.records import RequestRecords

__all__ = ["POISSON_CV_TOLERANCE", "fit_lengths", "fit_workload"]

#: An inter-arrival CV within this distance of 1 is fitted as Poisson.
POISSON_CV_TOLERANCE = 0.1
#: Share of zero gaps above which timestamps count as quantised (the CV is then not trusted).
_QUANTISED_ZERO_GAP_FRAC = 0.5


#: z-score of the 90th percentile of a standard normal distribution.
_Z90 = 1.2815515655446004


def fit_lengths(values: NDArray[np.int64]) -> LognormalLength | FixedLength:
    """Log-normal through the observed median and 90th percentile of positive lengths (fixed when degenerate)."""
    positive = np.asarray(values, dtype=np.float64)
    positive = positive[positive > 0]
    if len(positive) == 0:
        raise ValueError("no positive lengths to fit")
    low, high = int(positive.min()), int(positive.max())
    median, p90 = (float(x) for x in np.percentile(positive, [50, 90]))
    if p90 <= median:
        return FixedLength(tokens=max(round(median), 1))
    sigma = math.log(p90 / median) / _Z90
    return LognormalLength(median_tokens=median, sigma=sigma, min_tokens=max(low, 1), max_tokens=high)


def fit_workload(records: RequestRecords, *, model: str = "") -> PoissonWorkload | GammaWorkload:
    """Fit a Poisson or Gamma workload with log-normal lengths to per-request records.

    Raises:
        ValueError: fewer than two arrivals (no rate), or no positive lengths.
    """
    if records.arrival_s is None:
        raise ValueError("the records have no arrival times")
    stats = arrival_stats(records.arrival_s)
    if stats is None:
        raise ValueError("at least two distinct arrival times are needed to fit a rate")
    inputs = fit_lengths(records.input_tokens)
    outputs = fit_lengths(records.output_tokens)
    quantised = (stats.zero_gap_frac or 0.0) >= _QUANTISED_ZERO_GAP_FRAC
    cv = stats.iat_cv
    if quantised or cv is None or abs(cv - 1.0) <= POISSON_CV_TOLERANCE:
        return PoissonWorkload(rate_rps=stats.mean_rate_rps, input_tokens=inputs, output_tokens=outputs, model=model)
    return GammaWorkload(rate_rps=stats.mean_rate_rps, cv=cv, input_tokens=inputs, output_tokens=outputs, model=model)
