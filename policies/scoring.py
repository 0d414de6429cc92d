"""How requests are scored: SLO met, SLO attainment, latency quantiles and ``histogram_quantile``.

The one definition every part of the project uses (the simulator's summary and windows, evaluation, the planner,
the demo report, the load generator, the watchdog, the controller's metric sources), so a number called
"attainment" or "p95" means the same thing in training, in evaluation and in production.

**SLO met.** A request meets its SLO when it *finished successfully* and

* its TTFT is at most the TTFT objective, and
* its TPOT (mean time per output token after the first) is at most the TPOT objective.

An objective of ``None`` or ``+inf`` is no objective (met). A request with no TPOT (one output token: there is
no inter-token interval) meets the TPOT objective; the simulator records such a TPOT as 0, which meets it too.
A finished request with no TTFT, or with a NaN TTFT or TPOT, misses. A **failed** request (refused, dropped,
an error) and a request **unfinished** when the run is scored never meet the SLO.

**SLO attainment** = requests that met the SLO / **requests that arrived**. The denominator is arrivals, not
completions: failed and unfinished requests stay in it and count as misses, so a policy cannot raise its
attainment by refusing or stalling requests. No arrivals: unknown (``None``), never zero or one.

**Quantiles of samples** (:func:`quantile`, :func:`quantiles`): exact, with linear interpolation between order
statistics (numpy's default ``linear`` method, Hyndman and Fan's type 7); ``None`` when there are no samples.

**Quantiles of histograms** (:func:`histogram_quantile`) follow Prometheus's documented ``histogram_quantile``
on classic (``le``) buckets: linear interpolation inside the bucket holding the rank; the lowest bucket starts at
0 when its upper bound is positive (otherwise a rank there returns that upper bound); a rank in the ``+Inf``
bucket returns the upper bound of the highest finite bucket; no observations, fewer than two buckets or no
``+Inf`` bucket give ``None`` (Prometheus: NaN). Buckets with the same bound are added up and decreasing
cumulative counts are raised to the running maximum, as Prometheus repairs non-atomic scrapes. Two deliberate
differences, both where Prometheus's answer is no answer: ``q`` outside [0, 1] raises :class:`ValueError`
(PromQL returns ±Inf; here ``q`` is a programme constant, so it is a bug), and ``q = 0`` returns the lower
edge of the first non-empty bucket (PromQL divides 0 by 0 when the lowest bucket is empty).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "count_slo_met",
    "histogram_quantile",
    "meets_slo",
    "pooled_attainment_frac",
    "quantile",
    "quantiles",
    "slo_attainment_frac",
    "slo_met_mask",
]


def _objective(name: str, value: float | None) -> float:
    if value is None:
        return math.inf
    if math.isnan(value) or value <= 0:
        raise ValueError(f"{name} must be positive (or None for no objective), got {value}")
    return value


def meets_slo(
    ttft_s: float | None,
    tpot_s: float | None,
    ttft_objective_s: float | None = None,
    tpot_objective_s: float | None = None,
    *,
    succeeded: bool = True,
) -> bool:
    """Whether one request meets its SLO (module docstring).

    Args:
        ttft_s: time to first token (``None``: no first token was seen, a miss).
        tpot_s: mean time per output token after the first (``None``: one output token, no TPOT, met).
        ttft_objective_s: per-request TTFT bound (``None`` or ``inf``: no objective).
        tpot_objective_s: per-request TPOT bound (``None`` or ``inf``: no objective).
        succeeded: ``False`` for a failed or unfinished request, which never meets the SLO.

    Returns:
        True when the request finished successfully within both objectives.

    Raises:
        ValueError: an objective is zero, negative or NaN.
    """
    ttft_bound = _objective("ttft_objective_s", ttft_objective_s)
    tpot_bound = _objective("tpot_objective_s", tpot_objective_s)
    if not succeeded or ttft_s is None or not ttft_s <= ttft_bound:
        return False
    return tpot_s is None or tpot_s <= tpot_bound


def slo_met_mask(
    ttft_s: ArrayLike, tpot_s: ArrayLike, ttft_objective_s: float | None, tpot_objective_s: float | None
) -> np.ndarray:
    """Which finished requests met the SLO: :func:`meets_slo` vectorised over successful completions.

    Args:
        ttft_s: TTFT of each successfully finished request, seconds.
        tpot_s: TPOT of each (0 for a one-token output), seconds, same length; NaN misses.
        ttft_objective_s: per-request TTFT bound (``None`` or ``inf``: no objective).
        tpot_objective_s: per-request TPOT bound (``None`` or ``inf``: no objective).

    Returns:
        A boolean array of the inputs' shape.

    Raises:
        ValueError: the arrays differ in shape, or an objective is zero, negative or NaN.
    """
    ttft_bound = _objective("ttft_objective_s", ttft_objective_s)
    tpot_bound = _objective("tpot_objective_s", tpot_objective_s)
    ttft = np.asarray(ttft_s, dtype=np.float64)
    tpot = np.asarray(tpot_s, dtype=np.float64)
    if ttft.shape != tpot.shape:
        raise ValueError(f"ttft_s and tpot_s differ in shape: {ttft.shape} vs {tpot.shape}")
    mask: np.ndarray = (ttft <= ttft_bound) & (tpot <= tpot_bound)
    return mask


def count_slo_met(
    ttft_s: ArrayLike, tpot_s: ArrayLike, ttft_objective_s: float | None, tpot_objective_s: float | None
) -> int:
    """How many finished requests met the SLO (the true entries of :func:`slo_met_mask`).

    Raises:
        ValueError: the arrays differ in shape, or an objective is zero, negative or NaN.
    """
    return int(np.count_nonzero(slo_met_mask(ttft_s, tpot_s, ttft_objective_s, tpot_objective_s)))


def slo_attainment_frac(num_met: int, num_arrived: int) -> float | None:
    """SLO attainment: requests that met the SLO / requests that **arrived** (failed, unfinished: misses).

    Args:
        num_met: requests that met the SLO (:func:`meets_slo`, :func:`count_slo_met`).
        num_arrived: requests that arrived in the same period, whatever became of them.

    Returns:
        The fraction in [0, 1]; ``None`` when nothing arrived.

    Raises:
        ValueError: a count is negative, or more requests met the SLO than arrived.
    """
    if num_met < 0 or num_arrived < 0:
        raise ValueError(f"counts must be >= 0, got num_met={num_met}, num_arrived={num_arrived}")
    if num_met > num_arrived:
        raise ValueError(f"num_met ({num_met}) exceeds num_arrived ({num_arrived})")
    return num_met / num_arrived if num_arrived else None


def pooled_attainment_frac(parts: Iterable[tuple[float | None, float | None]]) -> float | None:
    """Attainment of several populations pooled: ``Σ weight × frac / Σ weight``.

    With each ``weight`` the number (or rate) of requests the fraction is over, this is the attainment of the
    union; an extra factor (a tenant's priority) weights populations unequally. Unknown parts (``None`` or
    non-finite weight or fraction) are left out, never taken as zero.

    Args:
        parts: ``(weight, attainment_frac)`` pairs; weights must be >= 0.

    Returns:
        The pooled fraction; ``None`` when no known part has a positive weight.

    Raises:
        ValueError: a known weight is negative.
    """
    num = den = 0.0
    for weight, frac in parts:
        if weight is None or frac is None or not (math.isfinite(weight) and math.isfinite(frac)):
            continue
        if weight < 0:
            raise ValueError(f"attainment weights must be >= 0, got {weight}")
        num += weight * frac
        den += weight
    return num / den if den > 0 else None


def _check_q(q: float) -> None:
    if not 0.0 <= q <= 1.0:  # also refuses NaN
        raise ValueError(f"quantile q must be within [0, 1], got {q}")


def quantiles(values: ArrayLike, qs: Sequence[float]) -> tuple[float | None, ...]:
    """Exact quantiles of samples, linear interpolation between order statistics.

    Args:
        values: the samples (finite numbers, any order).
        qs: quantiles wanted, each within [0, 1] (0.95 is the 95th percentile).

    Returns:
        One value per ``q``; all ``None`` when there are no samples.

    Raises:
        ValueError: a ``q`` outside [0, 1], or a NaN sample.
    """
    for q in qs:
        _check_q(q)
    array = np.asarray(values, dtype=np.float64).ravel()
    if array.size == 0:
        return tuple(None for _ in qs)
    if np.isnan(array).any():
        raise ValueError("quantile samples contain NaN")
    return tuple(float(v) for v in np.quantile(array, list(qs)))


def quantile(values: ArrayLike, q: float) -> float | None:
    """One exact quantile of samples (:func:`quantiles`); ``None`` when there are no samples."""
    return quantiles(values, (q,))[0]


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """Quantile ``q`` of a histogram given as ``(upper_bound, cumulative_count)`` pairs, as Prometheus computes it.

    Semantics in the module docstring: interpolation inside the bucket, ``+Inf`` bucket → highest finite bound,
    no observations → ``None``.

    Args:
        q: the quantile, within [0, 1].
        buckets: ``(le, cumulative count)`` pairs in any order, including the ``(+inf, total)`` bucket.

    Returns:
        The estimated quantile; ``None`` with no observations, fewer than two buckets or no ``+Inf`` bucket.

    Raises:
        ValueError: ``q`` outside [0, 1] or NaN.
    """
    _check_q(q)
    merged: dict[float, float] = {}
    for upper, count in buckets:
        merged[upper] = merged.get(upper, 0.0) + count
    ordered = sorted(merged.items())
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]) or ordered[-1][0] < 0:
        return None
    bounds = [upper for upper, _ in ordered]
    cumulative: list[float] = []
    running = 0.0
    for _, count in ordered:
        running = max(running, count)
        cumulative.append(running)
    total = cumulative[-1]
    if not total > 0:
        return None
    rank = q * total
    # first bucket whose cumulative count reaches the rank and that holds observations (only q = 0 can meet
    # empty buckets first)
    index = next(i for i, count in enumerate(cumulative) if count >= rank and count > 0)
    if index == len(bounds) - 1:
        return bounds[-2]
    if index == 0 and bounds[0] <= 0:
        return bounds[0]
    lower = 0.0 if index == 0 else bounds[index - 1]
    below = 0.0 if index == 0 else cumulative[index - 1]
    return lower + (bounds[index] - lower) * (rank - below) / (cumulative[index] - below)
