"""Constants derived from the operator tables alone (no whole-step timing is used).

Each measured operator time is a CUDA-event interval around one eagerly launched PyTorch call, so it carries the
call's dispatch latency on top of the kernel's own time. Across the memory-bound GEMM rows (token counts ``m`` up
to 16) the time is affine in the bytes moved, ``t = launch_overhead + bytes / stream_bandwidth``: the intercept is
that per-call overhead (about 22 us on the H200 profile), the slope the rate at which a kernel streams weights
from memory. Decode attention is affine in the K/V bytes it reads in the same way.

The element-wise kernels (``elementwise.csv``, when a folder has it) give the rate of the memory-bound work
between the GEMMs: each row's kernel time is ``max(t - launch_overhead, bytes / copy_bandwidth)``, exactly as a
GEMM row's (the roofline being the measured device-copy rate, the ceiling the composition scales), and the
fraction of the copy rate they reach is ``sum(w x bytes) / copy_bandwidth / sum(w x kernel_time)``, ``w`` being
the op's calls per layer, over the rows of at least :data:`ELEMENTWISE_MIN_TOKENS` tokens: a layer's element-wise
work at the token counts where it is bandwidth-bound. At 256 tokens an 8B layer's ops move 1-22 MB (under
6 us at 4 TB/s): their eager time is mostly the ~20 us dispatch latency being subtracted (with a few us of
run-to-run noise) and the kernel's minimum duration, which the per-layer launch cost already carries. From 1 Ki
tokens up (4-88 MB per op) the bytes decide, and the byte-weighted sum is dominated by the largest rows (4 Ki and
16 Ki tokens on the GPU grid), where the subtracted latency is a small correction.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = [
    "ELEMENTWISE_MIN_TOKENS",
    "MEMORY_BOUND_MAX_TOKENS",
    "elementwise_bandwidth_frac",
    "fit_affine_in_bytes",
    "gemm_bytes",
]

MEMORY_BOUND_MAX_TOKENS = 16
"""GEMM rows with at most this many tokens are memory-bound (weights dominate the traffic)."""

ELEMENTWISE_MIN_TOKENS = 1024
"""Element-wise rows with at least this many tokens are bandwidth-bound (see the module doc)."""


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


def elementwise_bandwidth_frac(
    nbytes: npt.ArrayLike,
    time_s: npt.ArrayLike,
    calls_per_layer: npt.ArrayLike,
    launch_overhead_s: float,
    copy_bandwidth_bytes_per_s: float,
) -> float:
    """Fraction of the copy rate element-wise kernels reach: ``sum(w b) / copy / sum(w max(t - delta, b / copy))``.

    Rows are element-wise ops already cut to the bandwidth-bound ones (:data:`ELEMENTWISE_MIN_TOKENS`); ``w`` is
    each op's calls per layer, so the result is the rate of a layer's element-wise work. At most 1: a kernel
    time is never under its bytes at the copy rate.

    Raises:
        ValueError: no rows, lengths differ, or a non-positive byte count, time, weight or copy rate.
    """
    b = np.asarray(nbytes, dtype=np.float64)
    t = np.asarray(time_s, dtype=np.float64)
    w = np.asarray(calls_per_layer, dtype=np.float64)
    if len(b) == 0 or b.shape != t.shape or b.shape != w.shape:
        raise ValueError("need one byte count, time and weight per row, and at least one row")
    if np.any(b <= 0) or np.any(t <= 0) or np.any(w <= 0) or copy_bandwidth_bytes_per_s <= 0:
        raise ValueError("bytes, times, weights and the copy rate must be positive")
    roofline = b / copy_bandwidth_bytes_per_s
    kernel = np.maximum(t - launch_overhead_s, roofline)
    return float(np.sum(w * roofline) / np.sum(w * kernel))
