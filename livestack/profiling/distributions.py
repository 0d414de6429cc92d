"""Length and latency distributions the profile summarises: samples, weighted samples (PMFs) or histogram buckets.

Three forms, one interface (:class:`Distribution`):

* :class:`SampleDistribution` without weights: per-request values; quantiles use numpy's linear interpolation
  (the convention of ``../shared/traces/README.md``);
* :class:`SampleDistribution` with weights: a probability mass function or a mixture of them; quantiles are the
  inverse CDF (the smallest value whose cumulative weight reaches q);
* :class:`BucketDistribution`: a cumulative histogram (Prometheus ``_bucket{le=...}``, ``_sum``, ``_count``);
  quantiles interpolate linearly inside a bucket as PromQL's ``histogram_quantile`` does, shares above a threshold
  interpolate the same way (approximate when the threshold falls inside a bucket).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from policies.scoring import histogram_quantile, quantile

__all__ = ["BucketDistribution", "Distribution", "SampleDistribution", "log2_edges"]


def log2_edges(max_value: float) -> NDArray[np.float64]:
    """Histogram edges ``0, 1, 2, 4, …`` up to the first power of two above ``max_value``."""
    top = max(1, math.ceil(math.log2(max(max_value, 1.0) + 1.0)))
    return np.concatenate(([0.0], 2.0 ** np.arange(top + 1)))


class Distribution(Protocol):
    """What the profile asks of a distribution."""

    @property
    def count(self) -> float:
        """Number of observations (a weighted total for PMFs)."""
        ...

    def mean(self) -> float:
        """Mean value."""
        ...

    def quantile(self, q: float) -> float:
        """Value at quantile ``q`` in [0, 1]."""
        ...

    def share_at_least(self, threshold: float) -> float:
        """Fraction of observations ``>= threshold``."""
        ...

    def share_below(self, threshold: float) -> float:
        """Fraction of observations ``< threshold``."""
        ...

    def minimum(self) -> float | None:
        """Smallest observation, when known."""
        ...

    def maximum(self) -> float | None:
        """Largest observation, when known."""
        ...

    def histogram(self) -> tuple[list[float], list[float]]:
        """``(edges, counts)``: bin edges and the count (or weight) per bin."""
        ...


@dataclass(frozen=True, slots=True, eq=False)
class SampleDistribution:
    """Observed values, optionally weighted (a PMF or a mixture); NaNs are dropped on construction."""

    values: NDArray[np.float64]
    weights: NDArray[np.float64] | None = None

    @classmethod
    def of(cls, values: NDArray[np.generic], weights: NDArray[np.float64] | None = None) -> SampleDistribution:
        """Build from any numeric array, dropping NaN values (and zero weights)."""
        array = np.asarray(values, dtype=np.float64)
        keep = ~np.isnan(array)
        if weights is None:
            return cls(array[keep])
        w = np.asarray(weights, dtype=np.float64)
        keep &= w > 0
        order = np.argsort(array[keep], kind="stable")
        return cls(array[keep][order], w[keep][order])

    @property
    def count(self) -> float:
        """Number of observations, or the total weight."""
        return float(len(self.values)) if self.weights is None else float(self.weights.sum())

    def mean(self) -> float:
        """Mean value (NaN when empty)."""
        if len(self.values) == 0:
            return math.nan
        if self.weights is None:
            return float(self.values.mean())
        return float(np.dot(self.values, self.weights) / self.weights.sum())

    def quantile(self, q: float) -> float:
        """Linear-interpolated percentile (unweighted) or inverse CDF (weighted)."""
        if len(self.values) == 0:
            return math.nan
        if self.weights is None:
            value = quantile(self.values, q)
            return math.nan if value is None else value
        cdf = np.cumsum(self.weights)
        index = int(np.searchsorted(cdf, q * cdf[-1] * (1 - 1e-12), side="left"))
        return float(self.values[min(index, len(self.values) - 1)])

    def _share(self, mask: NDArray[np.bool_]) -> float:
        if len(self.values) == 0:
            return math.nan
        if self.weights is None:
            return float(mask.mean())
        return float(self.weights[mask].sum() / self.weights.sum())

    def share_at_least(self, threshold: float) -> float:
        """Fraction of observations ``>= threshold``."""
        return self._share(self.values >= threshold)

    def share_below(self, threshold: float) -> float:
        """Fraction of observations ``< threshold``."""
        return self._share(self.values < threshold)

    def minimum(self) -> float | None:
        """Smallest value."""
        return float(self.values.min()) if len(self.values) else None

    def maximum(self) -> float | None:
        """Largest value."""
        return float(self.values.max()) if len(self.values) else None

    def histogram(self) -> tuple[list[float], list[float]]:
        """Counts (or weights) in power-of-two bins ``[0,1), [1,2), [2,4), …``."""
        edges = log2_edges(self.maximum() or 1.0)
        counts, _ = np.histogram(self.values, bins=edges, weights=self.weights)
        return edges.tolist(), counts.astype(np.float64).tolist()


@dataclass(frozen=True, slots=True, eq=False)
class BucketDistribution:
    """A cumulative histogram: ``upper_bounds`` (ascending, may end in +inf) and cumulative ``counts``."""

    upper_bounds: NDArray[np.float64]
    cumulative_counts: NDArray[np.float64]
    total_sum: float

    @property
    def count(self) -> float:
        """Number of observations."""
        return float(self.cumulative_counts[-1]) if len(self.cumulative_counts) else 0.0

    def mean(self) -> float:
        """``sum / count`` (NaN when empty)."""
        return self.total_sum / self.count if self.count > 0 else math.nan

    def _finite_bounds(self) -> NDArray[np.float64]:
        return self.upper_bounds[np.isfinite(self.upper_bounds)]

    def quantile(self, q: float) -> float:
        """:func:`policies.scoring.histogram_quantile` of the buckets (NaN, as elsewhere here, when unknown)."""
        value = histogram_quantile(q, zip(self.upper_bounds.tolist(), self.cumulative_counts.tolist(), strict=True))
        return math.nan if value is None else value

    def _cumulative_at(self, threshold: float) -> float:
        bounds = np.concatenate(([0.0], self.upper_bounds))
        counts = np.concatenate(([0.0], self.cumulative_counts))
        index = int(np.searchsorted(bounds, threshold, side="left"))
        if index >= len(bounds):
            return float(counts[-1])
        if index == 0:
            return 0.0
        lower, upper = float(bounds[index - 1]), float(bounds[index])
        if not math.isfinite(upper):
            return float(counts[index - 1])
        frac = (threshold - lower) / (upper - lower)
        return float(counts[index - 1] + frac * (counts[index] - counts[index - 1]))

    def share_at_least(self, threshold: float) -> float:
        """Fraction ``>= threshold``, interpolated inside the bucket holding the threshold."""
        return 1.0 - self._cumulative_at(threshold) / self.count if self.count > 0 else math.nan

    def share_below(self, threshold: float) -> float:
        """Fraction ``< threshold``, interpolated inside the bucket holding the threshold."""
        return self._cumulative_at(threshold) / self.count if self.count > 0 else math.nan

    def minimum(self) -> float | None:
        """Unknown for a histogram."""
        return None

    def maximum(self) -> float | None:
        """Unknown for a histogram."""
        return None

    def histogram(self) -> tuple[list[float], list[float]]:
        """The buckets themselves (the +inf bucket's upper edge is written as twice the last finite bound)."""
        finite = self._finite_bounds()
        top = float(finite[-1]) * 2.0 if len(finite) else 1.0
        edges = [0.0, *[float(b) if math.isfinite(b) else top for b in self.upper_bounds]]
        counts = np.diff(np.concatenate(([0.0], self.cumulative_counts)))
        return edges, counts.tolist()
