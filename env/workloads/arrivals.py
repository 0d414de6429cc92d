"""Arrival processes: sorted arrival times on ``[0, duration_s)`` drawn from a given ``numpy.random.Generator``."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

__all__ = ["diurnal_arrivals", "diurnal_rate_rps", "gamma_arrivals", "poisson_arrivals", "renewal_arrivals"]


def renewal_arrivals(
    draw_gaps: Callable[[int], NDArray[np.float64]], rate_rps: float, duration_s: float
) -> NDArray[np.float64]:
    """Arrivals of a renewal process (first arrival one gap after 0) until ``duration_s``.

    ``draw_gaps(n)`` returns ``n`` independent gaps of mean ``1/rate_rps``; gaps are drawn in blocks sized from the
    expected count, so a call costs a few vectorised draws.
    """
    if rate_rps <= 0 or duration_s <= 0:
        return np.zeros(0)
    expected = rate_rps * duration_s
    block = int(expected * 1.1 + 5.0 * math.sqrt(expected) + 16)
    chunks: list[NDArray[np.float64]] = []
    elapsed = 0.0
    while elapsed < duration_s:
        times = elapsed + np.cumsum(draw_gaps(block))
        chunks.append(times)
        elapsed = float(times[-1])
    times = np.concatenate(chunks)
    return times[: int(np.searchsorted(times, duration_s, side="left"))]


def poisson_arrivals(rng: np.random.Generator, rate_rps: float, duration_s: float) -> NDArray[np.float64]:
    """Poisson arrivals at ``rate_rps`` on ``[0, duration_s)``."""
    return renewal_arrivals(lambda n: rng.exponential(1.0 / rate_rps, n), rate_rps, duration_s)


def gamma_arrivals(rng: np.random.Generator, rate_rps: float, cv: float, duration_s: float) -> NDArray[np.float64]:
    """Renewal arrivals with Gamma gaps of mean ``1/rate_rps`` and coefficient of variation ``cv`` (shape 1/cv²)."""
    shape = 1.0 / (cv * cv)
    scale_s = 1.0 / (rate_rps * shape)
    return renewal_arrivals(lambda n: rng.gamma(shape, scale_s, n), rate_rps, duration_s)


def diurnal_rate_rps(
    t_s: NDArray[np.float64], mean_rate_rps: float, peak_to_mean: float, period_s: float, phase_s: float
) -> NDArray[np.float64]:
    """The diurnal rate curve ``mean·(1 + (peak_to_mean − 1)·cos(2π(t − phase_s)/period_s))``."""
    amplitude = peak_to_mean - 1.0
    return mean_rate_rps * (1.0 + amplitude * np.cos(2.0 * np.pi * (t_s - phase_s) / period_s))


def diurnal_arrivals(
    rng: np.random.Generator,
    mean_rate_rps: float,
    peak_to_mean: float,
    period_s: float,
    phase_s: float,
    duration_s: float,
) -> NDArray[np.float64]:
    """Inhomogeneous Poisson arrivals following :func:`diurnal_rate_rps`, by thinning a Poisson stream at the peak."""
    peak_rps = mean_rate_rps * peak_to_mean
    candidates = poisson_arrivals(rng, peak_rps, duration_s)
    keep = rng.random(len(candidates)) * peak_rps < diurnal_rate_rps(
        candidates, mean_rate_rps, peak_to_mean, period_s, phase_s
    )
    return candidates[keep]
