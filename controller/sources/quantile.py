"""Histogram quantiles from cumulative bucket counts, as Prometheus's ``histogram_quantile`` computes them.

Linear interpolation inside the bucket holding the rank; the lowest bucket starts at 0 (when its upper bound
is positive); a rank in the ``+Inf`` bucket returns the highest finite upper bound; no observations (or no
``+Inf`` bucket) gives ``None`` — unknown, never zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["histogram_quantile"]


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """Quantile ``q`` (0-1) of a histogram given as ``(upper_bound, cumulative_count)`` pairs."""
    merged: dict[float, float] = {}
    for upper, count in buckets:
        merged[upper] = merged.get(upper, 0.0) + count
    ordered = sorted(merged.items())
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]):
        return None
    # Cumulative counts must not decrease (Prometheus repairs small violations from non-atomic scrapes).
    fixed: list[tuple[float, float]] = []
    running = 0.0
    for upper, count in ordered:
        running = max(running, count)
        fixed.append((upper, running))
    total = fixed[-1][1]
    if total <= 0 or not 0.0 <= q <= 1.0:
        return None
    rank = q * total
    index = next(i for i, (_, count) in enumerate(fixed) if count >= rank)
    if index == len(fixed) - 1:
        return fixed[-2][0]
    upper, count = fixed[index]
    if index == 0 and upper <= 0:
        return upper
    start = 0.0 if index == 0 else fixed[index - 1][0]
    below = 0.0 if index == 0 else fixed[index - 1][1]
    in_bucket = count - below
    if in_bucket <= 0:
        return upper
    return start + (upper - start) * ((rank - below) / in_bucket)
