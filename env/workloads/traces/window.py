"""Time window, rate scaling and request cap applied to a replayed trace."""

from __future__ import annotations

import numpy as np

from env.workloads.columns import RequestColumns

__all__ = ["apply_window"]


def apply_window(
    columns: RequestColumns,
    *,
    start_s: float = 0.0,
    duration_s: float | None = None,
    rate_scale: float = 1.0,
    horizon_s: float | None = None,
    max_requests: int | None = None,
) -> RequestColumns:
    """Cut a window out of a trace and compress its time.

    Keeps rows with ``start_s ≤ arrival < start_s + duration_s`` (trace time), shifts them so the window starts at
    0, divides the offsets by ``rate_scale``, then keeps those before ``horizon_s`` (workload time) and at most
    ``max_requests`` of them (the earliest).
    """
    if rate_scale <= 0:
        raise ValueError("rate_scale must be positive")
    arrival = columns.arrival_s
    lo = int(np.searchsorted(arrival, start_s, side="left"))
    hi = len(arrival) if duration_s is None else int(np.searchsorted(arrival, start_s + duration_s, side="left"))
    shifted = (arrival[lo:hi] - start_s) / rate_scale
    if horizon_s is not None:
        hi = lo + int(np.searchsorted(shifted, horizon_s, side="left"))
    if max_requests is not None:
        hi = min(hi, lo + max_requests)
    window = columns.take(np.arange(lo, hi))
    return window.with_arrivals(shifted[: hi - lo])
