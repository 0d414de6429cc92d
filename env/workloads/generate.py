"""Turn a :data:`~env.workloads.config.WorkloadConfig` into requests: columns or a list of :class:`RequestSpec`.

:func:`generate_columns` is the fast path (numpy arrays, see :mod:`env.workloads.columns`);
:func:`generate_requests` wraps it into sorted :class:`RequestSpec` records. Both are deterministic for a given
generator state. The generator is split into independent child streams (arrivals, input lengths, output lengths,
prefixes) with :meth:`numpy.random.Generator.spawn`, so changing a length distribution does not move the arrivals.
Trace files are read once per file version and cached (the cache holds read-only arrays).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from env.workloads.arrivals import diurnal_arrivals, gamma_arrivals, poisson_arrivals
from env.workloads.columns import RequestColumns
from env.workloads.config import (
    AzureTraceWorkload,
    DiurnalWorkload,
    GammaWorkload,
    LengthDistribution,
    MooncakeTraceWorkload,
    PoissonWorkload,
    PrefixSharing,
    ServeGenWorkload,
    StepWorkload,
    WorkloadConfig,
)
from env.workloads.lengths import sample_lengths
from env.workloads.traces.azure import load_azure_csv
from env.workloads.traces.mooncake import load_mooncake_jsonl
from env.workloads.traces.servegen import ServeGenClient, load_servegen_folder, sample_servegen
from env.workloads.traces.window import apply_window, repeat_window
from env.workloads.types import RequestSpec

__all__ = ["generate_columns", "generate_requests", "load_trace_cached"]


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1  # the loader raises the clear error


def _freeze(columns: RequestColumns) -> RequestColumns:
    for array in (
        columns.arrival_s,
        columns.input_tokens,
        columns.output_tokens,
        columns.hash_ids,
        columns.hash_offsets,
    ):
        array.setflags(write=False)
    return columns


@functools.lru_cache(maxsize=16)
def _azure(path: Path, mtime_ns: int) -> RequestColumns:
    del mtime_ns
    return _freeze(load_azure_csv(path))


@functools.lru_cache(maxsize=16)
def _mooncake(path: Path, keep_hash_ids: bool, block_tokens: int, mtime_ns: int) -> RequestColumns:
    del mtime_ns
    return _freeze(load_mooncake_jsonl(path, keep_hash_ids=keep_hash_ids, hash_block_tokens=block_tokens))


@functools.lru_cache(maxsize=8)
def _servegen(path: Path, clients: tuple[str, ...] | None, mtime_ns: int) -> tuple[ServeGenClient, ...]:
    del mtime_ns
    return load_servegen_folder(path, clients)


def load_trace_cached(config: AzureTraceWorkload | MooncakeTraceWorkload) -> RequestColumns:
    """Return the whole trace a replay config names (cached per file version; arrays are read-only)."""
    if isinstance(config, AzureTraceWorkload):
        path = config.csv_path()
        return _azure(path, _mtime_ns(path))
    return _mooncake(config.path, config.keep_hash_ids, config.hash_block_tokens, _mtime_ns(config.path))


def _prefix_hashes(
    prefix: PrefixSharing, rng: np.random.Generator, input_tokens: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Hash ids for synthetic prompts: shared prefix blocks (ids below the unique range) then unique blocks."""
    n = len(input_tokens)
    block = prefix.block_tokens
    blocks_per_prefix = prefix.prefix_tokens // block
    shares = rng.random(n) < prefix.share_frac
    which = rng.integers(0, prefix.num_prefixes, n)
    total_blocks = -(-input_tokens // block)
    shared_blocks = np.where(shares, np.minimum(blocks_per_prefix, input_tokens // block), 0)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(total_blocks, out=offsets[1:])
    position = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], total_blocks)
    row = np.repeat(np.arange(n), total_blocks)
    is_shared = position < shared_blocks[row]
    first_unique = prefix.num_prefixes * blocks_per_prefix
    unique_ids = first_unique + np.cumsum(~is_shared) - 1
    ids = np.where(is_shared, which[row] * blocks_per_prefix + position, unique_ids)
    return ids.astype(np.int64), offsets


def _synthetic(
    config: PoissonWorkload | GammaWorkload | DiurnalWorkload | StepWorkload,
    rng: np.random.Generator,
    duration_s: float,
) -> RequestColumns:
    arrival_rng, input_rng, output_rng, prefix_rng = rng.spawn(4)
    segment_of: NDArray[np.intp] | None = None
    if isinstance(config, PoissonWorkload):
        arrival_s = poisson_arrivals(arrival_rng, config.rate_rps, duration_s)
    elif isinstance(config, GammaWorkload):
        arrival_s = gamma_arrivals(arrival_rng, config.rate_rps, config.cv, duration_s)
    elif isinstance(config, DiurnalWorkload):
        arrival_s = diurnal_arrivals(
            arrival_rng, config.mean_rate_rps, config.peak_to_mean, config.period_s, config.phase_s, duration_s
        )
    else:
        parts = []
        ends = [s.start_s for s in config.segments[1:]] + [duration_s]
        for segment, end_s in zip(config.segments, ends, strict=True):
            length_s = min(end_s, duration_s) - segment.start_s
            parts.append(segment.start_s + poisson_arrivals(arrival_rng, segment.rate_rps, length_s))
        arrival_s = np.concatenate(parts) if parts else np.zeros(0)
        segment_of = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
    n = len(arrival_s)
    if segment_of is None or not isinstance(config, StepWorkload):
        inputs = sample_lengths(config.input_tokens, input_rng, n)
        outputs = sample_lengths(config.output_tokens, output_rng, n)
    else:
        inputs = np.empty(n, dtype=np.int64)
        outputs = np.empty(n, dtype=np.int64)
        for index, segment in enumerate(config.segments):
            rows = segment_of == index
            count = int(rows.sum())
            input_dist: LengthDistribution = segment.input_tokens or config.input_tokens
            output_dist: LengthDistribution = segment.output_tokens or config.output_tokens
            inputs[rows] = sample_lengths(input_dist, input_rng, count)
            outputs[rows] = sample_lengths(output_dist, output_rng, count)
    if config.prefix is None:
        return RequestColumns.from_arrays(arrival_s, inputs, outputs, model=config.model)
    ids, offsets = _prefix_hashes(config.prefix, prefix_rng, inputs)
    return RequestColumns.from_arrays(
        arrival_s,
        inputs,
        outputs,
        hash_ids=ids,
        hash_offsets=offsets,
        hash_block_tokens=config.prefix.block_tokens,
        model=config.model,
    )


def _replay(config: AzureTraceWorkload | MooncakeTraceWorkload, duration_s: float) -> RequestColumns:
    trace = load_trace_cached(config)
    if not config.repeat:
        return apply_window(
            trace,
            start_s=config.start_s,
            duration_s=config.duration_s,
            rate_scale=config.rate_scale,
            horizon_s=duration_s,
            max_requests=config.max_requests,
        )
    window = apply_window(trace, start_s=config.start_s, duration_s=config.duration_s, rate_scale=config.rate_scale)
    if len(window) == 0:
        return window
    if config.duration_s is not None:
        period_s = config.duration_s / config.rate_scale
    else:  # to the window's last request plus one mean gap
        last_s = float(window.arrival_s[-1])
        period_s = last_s + (last_s / (len(window) - 1) if len(window) > 1 else 1.0)
        period_s = max(period_s, np.nextafter(last_s, np.inf))
    return repeat_window(window, period_s, duration_s, config.max_requests)


def generate_columns(config: WorkloadConfig, rng: np.random.Generator, duration_s: float) -> RequestColumns:
    """Generate (or replay) the requests of one workload on ``[0, duration_s)``, as columns sorted by arrival.

    Trace replays take the configured window, compress it by ``rate_scale`` (tile it when ``repeat``) and stop at
    ``duration_s`` or ``max_requests``; they do not draw from ``rng`` (ServeGen sampling does).

    Raises:
        TraceNotFoundError: a trace file or folder is missing.
        TraceFormatError: a trace file is malformed (the message names file, line and column).
        ValueError: a negative duration, or a repeated replay asked for more than
            :data:`~env.workloads.traces.window.MAX_REPEATED_REQUESTS` requests.
    """
    if duration_s < 0:
        raise ValueError("duration_s must be non-negative")
    if isinstance(config, AzureTraceWorkload | MooncakeTraceWorkload):
        columns = _replay(config, duration_s)
        return RequestColumns(
            columns.arrival_s,
            columns.input_tokens,
            columns.output_tokens,
            columns.hash_ids,
            columns.hash_offsets,
            columns.hash_block_tokens,
            config.model,
        )
    if isinstance(config, ServeGenWorkload):
        clients = _servegen(config.path, config.clients, _mtime_ns(config.path))
        columns = sample_servegen(
            clients,
            rng,
            start_s=config.start_s,
            duration_s=config.duration_s,
            rate_scale=config.rate_scale,
            horizon_s=duration_s,
            max_requests=config.max_requests,
            max_tokens=config.max_tokens,
        )
        return RequestColumns(
            columns.arrival_s,
            columns.input_tokens,
            columns.output_tokens,
            columns.hash_ids,
            columns.hash_offsets,
            columns.hash_block_tokens,
            config.model,
        )
    return _synthetic(config, rng, duration_s)


def generate_requests(
    config: WorkloadConfig, rng: np.random.Generator, duration_s: float, tenant: str, id_prefix: str = ""
) -> list[RequestSpec]:
    """Generate one tenant's requests on ``[0, duration_s)``, sorted by arrival.

    Request ids are ``f"{id_prefix}{tenant}-{index}"``. See :func:`generate_columns` for the columnar form and
    the errors raised.
    """
    return generate_columns(config, rng, duration_s).to_specs(tenant, id_prefix)
