"""Sampling token lengths from a :data:`~env.workloads.config.LengthDistribution`."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from env.workloads.config import EmpiricalLength, FixedLength, LengthDistribution, LognormalLength
from env.workloads.errors import TraceFormatError
from env.workloads.traces.columns_file import read_int_column

__all__ = ["empirical_values", "sample_lengths"]


@functools.lru_cache(maxsize=32)
def _cached_column(path: Path, column: str, mtime_ns: int) -> NDArray[np.int64]:
    del mtime_ns  # part of the cache key only: a rewritten file is read again
    values = read_int_column(path, column)
    values.setflags(write=False)
    return values


def empirical_values(dist: EmpiricalLength) -> NDArray[np.int64]:
    """Return the observed values an empirical distribution resamples (read once per file version)."""
    if dist.values is not None:
        return np.array(dist.values, dtype=np.int64)
    assert dist.path is not None
    assert dist.column is not None
    try:
        mtime_ns = dist.path.stat().st_mtime_ns
    except OSError:
        mtime_ns = -1  # read_int_column raises the clear error
    values = _cached_column(dist.path, dist.column, mtime_ns)
    if len(values) == 0:
        raise TraceFormatError(dist.path, "no values to resample", column=dist.column)
    return values


def sample_lengths(dist: LengthDistribution, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
    """Draw ``n`` lengths (tokens, int64), clipped to the distribution's ``[min_tokens, max_tokens]``."""
    if isinstance(dist, FixedLength):
        return np.full(n, dist.tokens, dtype=np.int64)
    if isinstance(dist, LognormalLength):
        mu, sigma = dist.log_params()
        raw = np.rint(rng.lognormal(mu, sigma, n))
    else:
        values = empirical_values(dist)
        raw = values[rng.integers(0, len(values), n)].astype(np.float64)
    return np.clip(raw, dist.min_tokens, dist.max_tokens).astype(np.int64)
