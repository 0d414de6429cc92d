"""Time window, rate scaling and request cap applied to a replayed trace."""

from __future__ import annotations

import numpy as np

from env.workloads.columns import RequestColumns

__all__ = ["MAX_REPEATED_REQUESTS", "apply_window", "repeat_window"]


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


#: Most requests a repeated replay may produce (a guard against an unbounded horizon).
MAX_REPEATED_REQUESTS = 50_000_000


def repeat_window(
    window: RequestColumns, period_s: float, horizon_s: float, max_requests: int | None = None
) -> RequestColumns:
    """Tile a window (arrivals in ``[0, period_s)``) back to back until ``horizon_s``.

    Repetition ``k`` is shifted by ``k · period_s``; its hash ids are offset by ``k · (max id + 1)`` so that a
    repetition does not find the previous one's blocks in a prefix cache (the trace's own reuse is kept). At most
    ``max_requests`` rows are kept (the earliest).

    Raises:
        ValueError: arrivals outside ``[0, period_s)``, or more than :data:`MAX_REPEATED_REQUESTS` rows asked for.
    """
    limit = len(window) if max_requests is None else max_requests
    if len(window) == 0 or period_s <= 0 or horizon_s <= period_s:
        return window.take(np.flatnonzero(window.arrival_s < horizon_s)[:limit])
    if window.arrival_s[-1] >= period_s:
        raise ValueError("the window's arrivals must lie in [0, period_s)")
    copies = int(np.ceil(horizon_s / period_s))
    if max_requests is not None:
        copies = min(copies, -(-max_requests // len(window)))
    if copies * len(window) > MAX_REPEATED_REQUESTS:
        raise ValueError(
            f"repeating {len(window)} requests until {horizon_s:g} s makes more than {MAX_REPEATED_REQUESTS:,}; "
            "set max_requests or a shorter horizon"
        )
    arrival = (window.arrival_s[None, :] + period_s * np.arange(copies)[:, None]).ravel()
    id_span = int(window.hash_ids.max()) + 1 if window.has_hash_ids else 0
    hash_ids = (window.hash_ids[None, :] + id_span * np.arange(copies)[:, None]).ravel()
    blocks = int(window.hash_offsets[-1])
    offsets = (window.hash_offsets[:-1][None, :] + blocks * np.arange(copies)[:, None]).ravel()
    tiled = RequestColumns(
        arrival,
        np.tile(window.input_tokens, copies),
        np.tile(window.output_tokens, copies),
        hash_ids,
        np.append(offsets, blocks * copies),
        window.hash_block_tokens,
        window.model,
    )
    keep = int(np.searchsorted(arrival, horizon_s, side="left"))
    if max_requests is not None:
        keep = min(keep, max_requests)
    return tiled.take(np.arange(keep))
