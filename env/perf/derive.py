"""Constants derived from the operator tables alone (no whole-step timing is used).

Each measured operator time is a CUDA-event interval around one eagerly launched PyTorch call, so it carries the
call's dispatch latency on top of the kernel's own time. Across the memory-bound GEMM rows (token counts ``m`` up
to 16) the time is affine in the bytes moved, ``t = launch_overhead + bytes / stream_bandwidth``: the intercept is
that per-call overhead (about 22 us on the H200 profile), the slope the rate at which a kernel streams weights
from memory. Decode attention is affine in the K/V bytes it reads in the same way.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["MEMORY_BOUND_MAX_TOKENS", "fit_affine_in_bytes", "gemm_bytes"]

MEMORY_BOUND_MAX_TOKENS = 16
"""GEMM rows with at most this many tokens are memory-bound (weights dominate the traffic)."""


def gemm_bytes(m_tokens: float, k: float, n: float, bytes_per_element: int = 2) -> float:
    """Bytes a ``(m x k) @ (k x n)`` GEMM reads and writes: input, weight and output."""
    return bytes_per_element * (m_tokens * k + k * n + m_tokens * n)


def fit_affine_in_bytes(nbytes: npt.ArrayLike, time_s: npt.ArrayLike) -> tuple[float, float]:
    """``(intercept_s, bandwidth_bytes_per_s)`` of ``time = intercept + bytes / bandwidth``.

    Least squares on relative error (every row counts alike, whatever its size). The intercept is clipped at 0
    and the bandwidth must come out positive; with fewer than two distinct sizes the intercept is 0.

    Raises:
        ValueError: no rows, or the times do not grow with the bytes.
    """
    x = np.asarray(nbytes, dtype=np.float64)
    t = np.asarray(time_s, dtype=np.float64)
    if len(x) == 0 or np.any(t <= 0):
        raise ValueError("need rows with positive times")
    if len(np.unique(x)) < 2:
        return 0.0, float(np.sum(x) / np.sum(t))
    weights = 1.0 / t
    design = np.stack([np.ones_like(x), x], axis=1) * weights[:, None]
    (intercept, slope), *_ = np.linalg.lstsq(design, t * weights, rcond=None)
    if slope <= 0:
        raise ValueError("times do not grow with the bytes moved")
    if intercept < 0:
        slope = float(np.sum(t * x) / np.sum(x * x))
        intercept = 0.0
    return float(intercept), float(1.0 / slope)
