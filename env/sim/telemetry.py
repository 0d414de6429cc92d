"""Telemetry with vLLM's metric names and bucket boundaries, cheap enough for the simulator's hot path.

* :class:`Histogram`: cumulative-bucket histogram (Prometheus semantics: ``le`` upper bounds, ``+Inf`` implied)
  with a closed-form :meth:`Histogram.observe_linear` for a run of samples that grow linearly (a run of decode
  steps), so a run of ``n`` steps costs O(buckets crossed), not O(n).
* :class:`InstanceCounters`: the per-instance counters and per-step histograms an engine updates
  (``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:prefix_cache_queries_total``,
  ``vllm:prefix_cache_hits_total``, ``vllm:num_preemptions_total``, ``vllm:request_success_total``,
  ``vllm:iteration_tokens_total``, ``vllm:inter_token_latency_seconds``). Per-request histograms (TTFT, e2e,
  queue time, ...) are built from the simulator's request records on demand (:func:`request_histograms`).
* Bucket lists are vLLM's (``reference/vllm-interface.md`` §5.2, §5.4).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from policies.scoring import histogram_quantile

__all__ = [
    "BUCKETS_ITERATION_TOKENS",
    "BUCKETS_ITL_S",
    "BUCKETS_LATENCY_S",
    "BUCKETS_NIXL_BYTES",
    "BUCKETS_NIXL_XFER_S",
    "BUCKETS_TTFT_S",
    "Histogram",
    "InstanceCounters",
    "buckets_1_2_5",
    "request_histograms",
]

BUCKETS_TTFT_S: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)  # fmt: skip
BUCKETS_ITL_S: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
BUCKETS_LATENCY_S: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)  # fmt: skip
BUCKETS_ITERATION_TOKENS: tuple[float, ...] = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
BUCKETS_NIXL_XFER_S: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
BUCKETS_NIXL_BYTES: tuple[float, ...] = tuple(float(2**k) for k in range(11, 35, 2))


def buckets_1_2_5(max_value: int) -> tuple[float, ...]:
    """The ``build_1_2_5_buckets`` of vLLM: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


@dataclass(slots=True)
class Histogram:
    """A Prometheus-style histogram: ``counts[i]`` samples fell in ``(bounds[i-1], bounds[i]]``; the last is +Inf."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, weight: int = 1) -> None:
        """Add ``weight`` samples of ``value``."""
        self.counts[bisect.bisect_left(self.bounds, value)] += weight
        self.total += value * weight
        self.count += weight

    def observe_many(self, values: npt.ArrayLike) -> None:
        """Add an array of samples."""
        array = np.asarray(values, dtype=np.float64)
        if array.size == 0:
            return
        index = np.searchsorted(np.asarray(self.bounds), array, side="left")
        binned = np.bincount(index, minlength=len(self.counts))
        for i, c in enumerate(binned.tolist()):
            self.counts[i] += c
        self.total += float(array.sum())
        self.count += int(array.size)

    def observe_linear(self, first: float, increment: float, num: int, weight: int = 1) -> None:
        """Add samples ``first + k x increment`` for ``k = 0 .. num-1``, each ``weight`` times (``increment >= 0``)."""
        if num <= 0:
            return
        bounds = self.bounds
        last = first + increment * (num - 1)
        self.total += weight * (num * first + increment * num * (num - 1) / 2.0)
        self.count += weight * num
        lo = bisect.bisect_left(bounds, first)
        hi = bisect.bisect_left(bounds, last)
        if lo == hi or increment <= 0:
            self.counts[lo] += weight * num
            return
        placed = 0
        for i in range(lo, hi):
            # samples <= bounds[i]: k <= (bound - first) / increment
            bound = bounds[i]
            upto = min(max(math.floor((bound - first) / increment) + 1, placed), num)
            # settle floating-point ties exactly as the samples first + k * increment compare
            while upto < num and first + upto * increment <= bound:
                upto += 1
            while upto > placed and first + (upto - 1) * increment > bound:
                upto -= 1
            self.counts[i] += weight * (upto - placed)
            placed = upto
        self.counts[hi] += weight * (num - placed)

    def merge(self, other: Histogram) -> None:
        """Add another histogram with the same bounds."""
        if other.bounds != self.bounds:
            raise ValueError("histogram bounds differ")
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.total += other.total
        self.count += other.count

    def cumulative(self) -> list[tuple[float, int]]:
        """``(le, cumulative count)`` pairs, ending with ``(+inf, count)``, as exposed by Prometheus."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, c in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += c
            out.append((bound, running))
        return out

    def quantile(self, q: float) -> float | None:
        """:func:`policies.scoring.histogram_quantile` of the buckets; None when empty."""
        return histogram_quantile(q, self.cumulative())


@dataclass(slots=True)
class InstanceCounters:
    """Per-instance counters and per-step histograms with vLLM names (see :meth:`as_metrics`)."""

    prompt_tokens: int = 0
    prompt_tokens_computed: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    request_success: int = 0
    busy_s: float = 0.0
    num_steps: int = 0
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(BUCKETS_ITERATION_TOKENS))
    inter_token_latency: Histogram = field(default_factory=lambda: Histogram(BUCKETS_ITL_S))

    def observe_step(self, duration_s: float, decode_batch: int, num_tokens: int) -> None:
        """One general step."""
        self.busy_s += duration_s
        self.num_steps += 1
        self.iteration_tokens.observe(num_tokens)
        if decode_batch:
            self.inter_token_latency.observe(duration_s, decode_batch)

    def observe_run(self, first_step_s: float, increment_s: float, num_steps: int, decode_batch: int) -> None:
        """A run of decode steps whose durations grow linearly."""
        self.busy_s += num_steps * first_step_s + increment_s * num_steps * (num_steps - 1) / 2.0
        self.num_steps += num_steps
        self.iteration_tokens.observe(decode_batch, num_steps)
        self.inter_token_latency.observe_linear(first_step_s, increment_s, num_steps, decode_batch)

    def as_metrics(self) -> dict[str, float | Histogram]:
        """Name -> value (counters with vLLM's exposed ``_total`` names) or histogram."""
        return {
            "vllm:prompt_tokens_total": float(self.prompt_tokens),
            "vllm:generation_tokens_total": float(self.generation_tokens),
            "vllm:prefix_cache_queries_total": float(self.prefix_cache_queries),
            "vllm:prefix_cache_hits_total": float(self.prefix_cache_hits),
            "vllm:num_preemptions_total": float(self.num_preemptions),
            "vllm:request_success_total": float(self.request_success),
            "vllm:iteration_tokens_total": self.iteration_tokens,
            "vllm:inter_token_latency_seconds": self.inter_token_latency,
        }


def request_histograms(
    ttft_s: Iterable[float],
    e2e_s: Iterable[float],
    queue_s: Iterable[float],
    prompt_tokens: Sequence[int],
    generation_tokens: Sequence[int],
    max_model_len: int = 131_072,
) -> dict[str, Histogram]:
    """The per-request histograms of vLLM, built from request records."""
    out = {
        "vllm:time_to_first_token_seconds": Histogram(BUCKETS_TTFT_S),
        "vllm:e2e_request_latency_seconds": Histogram(BUCKETS_LATENCY_S),
        "vllm:request_queue_time_seconds": Histogram(BUCKETS_LATENCY_S),
        "vllm:request_prompt_tokens": Histogram(buckets_1_2_5(max_model_len)),
        "vllm:request_generation_tokens": Histogram(buckets_1_2_5(max_model_len)),
    }
    out["vllm:time_to_first_token_seconds"].observe_many(list(ttft_s))
    out["vllm:e2e_request_latency_seconds"].observe_many(list(e2e_s))
    out["vllm:request_queue_time_seconds"].observe_many(list(queue_s))
    out["vllm:request_prompt_tokens"].observe_many(list(prompt_tokens))
    out["vllm:request_generation_tokens"].observe_many(list(generation_tokens))
    return out
