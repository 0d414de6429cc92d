"""Execution time of one engine step, composed from measured operator timings.

One vLLM engine step runs the whole model once over a *batch*: ``T`` scheduled tokens (decode tokens plus
prefill-chunk tokens), of which ``S`` rows are sampled (one per decoding sequence and per prefill that
finishes in this step). Its time is modelled as the sum of:

``gemm``
    ``L x (qkv + o + gate_up + down)`` at ``T`` tokens, interpolated piecewise-linearly over the measured token
    counts (``gemm.csv``; beyond the last point, extrapolated with the last segment's slope).
``lm_head``
    the LM-head GEMM at ``S`` rows (only sampled rows go through it).
``prefill_attention``
    per prefill chunk of ``N`` new tokens after ``c`` cached tokens: ``L x P(sqrt(N^2 + 2Nc))``, where ``P(s)`` is
    the measured causal attention of one ``s``-token sequence. A chunk does ``N^2/2 + Nc`` query-key pairs, the
    same as a full causal pass over ``sqrt(N^2 + 2Nc)`` tokens (Vidur's equivalent-length rule).
``decode_attention``
    ``L x (a(B) + b(B) x C)`` for ``B`` decoding sequences with ``C`` context tokens in total: decode attention
    reads every cached K/V once, so it is linear in ``C``. ``a`` and ``b`` are fitted per measured batch size
    (least squares on relative error over the measured contexts of ``attn_decode.csv``) and interpolated over
    ``log B`` (a paged kernel reads the same bytes whatever the spread of contexts, so ``C`` is what matters).
``elementwise``
    the memory-bound work the GEMM and attention rows leave out (two RMSNorms, two residual adds, rotary
    embedding of q and k, SiLU-and-multiply): ``L x T x (12.5 d + 3 d_ff) x dtype bytes`` at a fraction
    (:attr:`StepOverheads.elementwise_bandwidth_frac`) of the measured device-copy bandwidth (which counts bytes
    read plus written, as these kernels do), plus a small per-layer launch gap for these kernels.
``tp_allreduce``
    with TP > 1, two all-reduces of ``T x d x dtype`` bytes per layer, each ``alpha_tp + bytes / bw_tp``.
    **Assumption** (not measured here): H200 NVLink figures of APEX+ (``reference/simulators.md`` §7.3):
    alpha = 7 / 10 / 17 us and bus-limited 236 / 194 / 152 GB/s at TP 2 / 4 / 8.
``overhead``
    a fixed per-step cost (scheduler, sampling, input preparation, CUDA-graph launch),
    :attr:`StepOverheads.step_overhead_s`.

The last three terms are what a naive sum of GEMM and attention rows misses (10-30 % of whole-model time).

TP degrees without their own rows are derived from the nearest measured degree assuming perfect sharding
(time x tp_measured / tp); the result says which degree was used.

Fast path: for a decode-only step the time is affine in the total context, ``A[B] + K[B] x C``
(:meth:`InterpolatedExecutionTimeModel.decode_coefficients`), which lets the simulator advance many decode
steps in closed form.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from env.perf.profile import FloatArray, OperatorProfile

__all__ = [
    "TP_ALLREDUCE_ASSUMPTION",
    "ExecutionTimeModel",
    "InterpolatedExecutionTimeModel",
    "StepBreakdown",
    "StepOverheads",
]

TP_ALLREDUCE_ASSUMPTION: dict[int, tuple[float, float]] = {
    1: (0.0, math.inf),
    2: (7e-6, 236e9),
    4: (10e-6, 194e9),
    8: (17e-6, 152e9),
}
"""TP degree -> (latency_s, bandwidth_bytes_per_s) of one all-reduce (H200 NVLink, APEX+; an assumption)."""

_GEMM_OPS = ("qkv", "o", "gate_up", "down")
_TABLE_TOKENS = 65_536
_PREFILL_GRID_TOKENS = 16


@dataclass(frozen=True, slots=True)
class StepOverheads:
    """Terms outside the measured operators (named profile parameters).

    Attributes:
        step_overhead_s: fixed cost of every engine step (scheduling, sampling, launch with CUDA graphs).
        elementwise_elems_per_token_hidden: element-wise traffic per token per layer, in units of the hidden size.
        elementwise_elems_per_token_ffn: element-wise traffic per token per layer, in units of the MLP width.
        elementwise_bandwidth_frac: fraction of the copy bandwidth small element-wise kernels reach.
        per_layer_overhead_s: launch gaps of the element-wise kernels of one layer (CUDA graphs keep it small).

    These four are not measured by the operator profile; the defaults put the unmeasured share of a step at
    4-15 % of the naive GEMM + attention sum for Llama-3-8B on H200 (more for small batches). Calibrate them
    against whole-model step times when such measurements exist.
    """

    step_overhead_s: float = 1.5e-3
    elementwise_elems_per_token_hidden: float = 12.5
    elementwise_elems_per_token_ffn: float = 3.0
    elementwise_bandwidth_frac: float = 0.5
    per_layer_overhead_s: float = 8e-6


@dataclass(frozen=True, slots=True)
class StepBreakdown:
    """Components of one step's predicted time (seconds)."""

    gemm_s: float
    lm_head_s: float
    prefill_attention_s: float
    decode_attention_s: float
    elementwise_s: float
    tp_allreduce_s: float
    overhead_s: float

    @property
    def step_time_s(self) -> float:
        """Sum of the components."""
        return (
            self.gemm_s
            + self.lm_head_s
            + self.prefill_attention_s
            + self.decode_attention_s
            + self.elementwise_s
            + self.tp_allreduce_s
            + self.overhead_s
        )

    def as_dict(self) -> dict[str, float]:
        """Components and total, for JSON output."""
        return {
            "gemm_s": self.gemm_s,
            "lm_head_s": self.lm_head_s,
            "prefill_attention_s": self.prefill_attention_s,
            "decode_attention_s": self.decode_attention_s,
            "elementwise_s": self.elementwise_s,
            "tp_allreduce_s": self.tp_allreduce_s,
            "overhead_s": self.overhead_s,
        }


class ExecutionTimeModel(Protocol):
    """What the engine needs from a performance model."""

    def step_time_s(
        self,
        num_tokens: int,
        num_sampled: int,
        decode_batch: int,
        decode_context_tokens: int,
        prefill_chunks: Sequence[tuple[int, int]] = (),
    ) -> float:
        """Time of one step (see :class:`InterpolatedExecutionTimeModel`)."""
        ...

    def decode_coefficients(self, decode_batch: int) -> tuple[float, float]:
        """``(A, K)`` with decode-only step time ``A + K x total_context_tokens``."""
        ...


def _interp_extrapolate(x: FloatArray, xp: FloatArray, fp: FloatArray) -> FloatArray:
    """Piecewise-linear interpolation; linear with the end segments' slopes outside ``xp``."""
    y = np.interp(x, xp, fp)
    if len(xp) >= 2:
        hi = x > xp[-1]
        if np.any(hi):
            slope = (fp[-1] - fp[-2]) / (xp[-1] - xp[-2])
            y[hi] = fp[-1] + slope * (x[hi] - xp[-1])
    return np.asarray(y, dtype=np.float64)


def _fit_decode(batch: FloatArray, ctx: FloatArray, time_s: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per measured batch size, ``time = a + b x (batch x ctx)`` by least squares on relative error."""
    sizes = np.unique(batch)
    a_out, b_out = np.zeros(len(sizes)), np.zeros(len(sizes))
    for i, b in enumerate(sizes):
        sel = batch == b
        total = batch[sel] * ctx[sel]
        t = time_s[sel]
        if len(t) == 1:
            a_out[i], b_out[i] = 0.0, float(t[0] / total[0])
            continue
        weights = 1.0 / t
        design = np.stack([np.ones_like(total), total], axis=1) * weights[:, None]
        coef, *_ = np.linalg.lstsq(design, t * weights, rcond=None)
        a, slope = float(coef[0]), float(coef[1])
        if slope <= 0:
            a, slope = float(np.min(t)), 0.0
        if a < 0:
            a, slope = 0.0, float(np.sum(t * total) / np.sum(total * total))
        a_out[i], b_out[i] = a, slope
    return sizes, a_out, b_out


class InterpolatedExecutionTimeModel:
    """Step times of one model at one TP degree, composed from an :class:`OperatorProfile` (see module doc).

    Construction precomputes dense tables (per token count up to 64 Ki, per batch size up to ``max_batch``),
    so each query is a few list lookups.
    """

    def __init__(
        self,
        profile: OperatorProfile,
        tp: int = 1,
        overheads: StepOverheads | None = None,
        max_batch: int = 1024,
    ) -> None:
        if tp < 1:
            raise ValueError("tp must be >= 1")
        self.profile = profile
        self.tp = tp
        self.overheads = overheads or StepOverheads()
        self.model = profile.model
        self.max_batch = max_batch
        measured = profile.tp_degrees
        self.measured_tp = min(measured, key=lambda d: (abs(math.log(d / tp)), -d))
        self._shard = self.measured_tp / tp
        layers = self.model.num_layers

        tokens = np.arange(_TABLE_TOKENS + 1, dtype=np.float64)
        gemm_layer = np.zeros_like(tokens)
        for op in _GEMM_OPS:
            table = profile.gemm[(self.measured_tp, op)]
            gemm_layer += _interp_extrapolate(tokens, table.m_tokens, table.time_s)
        gemm_layer[0] = 0.0
        lm = profile.gemm[(self.measured_tp, "lm_head")]
        lm_head = _interp_extrapolate(tokens[: max_batch + 1 + 64], lm.m_tokens, lm.time_s) * self._shard
        lm_head[0] = 0.0
        elem_bytes = (
            self.overheads.elementwise_elems_per_token_hidden * self.model.hidden_size
            + self.overheads.elementwise_elems_per_token_ffn * self.model.ffn_size / tp
        ) * self.model.bytes_per_param
        elementwise = layers * (
            tokens * elem_bytes / (profile.copy_bandwidth_bytes_per_s * self.overheads.elementwise_bandwidth_frac)
            + self.overheads.per_layer_overhead_s
        )
        elementwise[0] = 0.0
        alpha, bw = TP_ALLREDUCE_ASSUMPTION.get(tp, (17e-6 * tp / 8, 152e9))
        allreduce = (
            2 * layers * (alpha + tokens * self.model.hidden_size * self.model.bytes_per_param / bw)
            if tp > 1
            else np.zeros_like(tokens)
        )
        allreduce[0] = 0.0
        self._per_token_sum: list[float] = (layers * gemm_layer * self._shard + elementwise + allreduce).tolist()
        self._gemm = (layers * gemm_layer * self._shard).tolist()
        self._lm_head = lm_head.tolist()
        self._elementwise = elementwise.tolist()
        self._allreduce = allreduce.tolist()

        seq, t_seq = profile.attn_prefill[self._nearest(profile.attn_prefill)]
        self._prefill_seq = seq
        self._prefill_t = t_seq * self._shard_attn(profile.attn_prefill)
        # all-layer prefill attention on a 16-token grid of equivalent lengths (interpolated linearly between)
        grid = np.arange(0, float(seq[-1]) + 32, _PREFILL_GRID_TOKENS)
        per_layer = np.interp(grid, seq, self._prefill_t)
        low = grid < seq[0]
        per_layer[low] = float(self._prefill_t[0]) * grid[low] / float(seq[0])
        self._prefill_grid: list[float] = (layers * per_layer).tolist()
        batch, ctx, t_dec = profile.attn_decode[self._nearest(profile.attn_decode)]
        sizes, a, b = _fit_decode(batch, ctx, t_dec)
        scale = self._shard_attn(profile.attn_decode)
        self._decode_sizes, self._decode_a, self._decode_b = sizes, a * scale, b * scale

        bs = np.arange(max_batch + 1, dtype=np.float64)
        a_b, k_b = self._decode_attention_coefficients(bs)
        dense = np.array([self._dense(int(n), int(n)) for n in bs])
        self._decode_attn_a: list[float] = (layers * a_b).tolist()
        self._decode_attn_k: list[float] = (layers * k_b).tolist()
        self._decode_a_s = (dense + layers * a_b + self.overheads.step_overhead_s).tolist()
        self._decode_k_s = (layers * k_b).tolist()
        self._decode_a_s[0] = 0.0
        self._decode_k_s[0] = 0.0

    # ----------------------------------------------------------------------------------------- building blocks

    def _nearest(self, table: Mapping[int, object]) -> int:
        return min(table, key=lambda d: (abs(math.log(d / self.tp)), -d))

    def _shard_attn(self, table: Mapping[int, object]) -> float:
        return self._nearest(table) / self.tp

    def _decode_attention_coefficients(self, batch: FloatArray) -> tuple[FloatArray, FloatArray]:
        logs = np.log(np.maximum(batch, 1.0))
        xs = np.log(self._decode_sizes)
        a = np.interp(logs, xs, self._decode_a)
        b = np.interp(logs, xs, self._decode_b)
        a = np.where(batch > 0, a, 0.0)
        b = np.where(batch > 0, b, 0.0)
        return a, b

    def _table(self, values: list[float], n: int, slope_from: int = 1024) -> float:
        if n < len(values):
            return values[n]
        last = len(values) - 1
        slope = (values[last] - values[last - slope_from]) / slope_from
        return values[last] + slope * (n - last)

    def _dense(self, num_tokens: int, num_sampled: int) -> float:
        """GEMMs, LM head, element-wise work and all-reduce for ``num_tokens`` tokens."""
        return (
            self._table(self._gemm, num_tokens)
            + self._table(self._lm_head, num_sampled, 16)
            + self._table(self._elementwise, num_tokens)
            + self._table(self._allreduce, num_tokens)
        )

    def prefill_attention_s(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Attention of one prefill chunk (all layers)."""
        if new_tokens <= 0:
            return 0.0
        s = math.sqrt(new_tokens * new_tokens + 2.0 * new_tokens * cached_tokens)
        position = s / _PREFILL_GRID_TOKENS
        index = int(position)
        grid = self._prefill_grid
        if index + 1 < len(grid) and s < self._prefill_seq[-1]:
            low = grid[index]
            return low + (grid[index + 1] - low) * (position - index)
        seq_max = float(self._prefill_seq[-1])
        return self.model.num_layers * float(self._prefill_t[-1]) * (s / seq_max) ** 2

    def decode_attention_s(self, decode_batch: int, context_tokens: int) -> float:
        """Decode attention of ``decode_batch`` sequences with ``context_tokens`` in total (all layers)."""
        if decode_batch <= 0:
            return 0.0
        if decode_batch <= self.max_batch:
            return self._decode_attn_a[decode_batch] + self._decode_attn_k[decode_batch] * context_tokens
        a, b = self._decode_attention_coefficients(np.array([float(decode_batch)]))
        return self.model.num_layers * (float(a[0]) + float(b[0]) * context_tokens)

    # ----------------------------------------------------------------------------------------------- queries

    def decode_coefficients(self, decode_batch: int) -> tuple[float, float]:
        """``(A, K)``: a decode-only step of ``decode_batch`` sequences with ``C`` context tokens takes ``A + K C``."""
        if decode_batch <= self.max_batch:
            return self._decode_a_s[decode_batch], self._decode_k_s[decode_batch]
        a_b, k_b = self._decode_attention_coefficients(np.array([float(decode_batch)]))
        layers = self.model.num_layers
        dense = self._dense(decode_batch, decode_batch)
        return dense + layers * float(a_b[0]) + self.overheads.step_overhead_s, layers * float(k_b[0])

    def decode_step_time_s(self, decode_batch: int, context_tokens: int) -> float:
        """Time of one decode-only step."""
        a, k = self.decode_coefficients(decode_batch)
        return a + k * context_tokens

    def step_time_s(
        self,
        num_tokens: int,
        num_sampled: int,
        decode_batch: int,
        decode_context_tokens: int,
        prefill_chunks: Sequence[tuple[int, int]] = (),
    ) -> float:
        """Time of one step.

        Args:
            num_tokens: tokens scheduled in the step (decode tokens plus prefill-chunk tokens).
            num_sampled: rows that are sampled (decoding sequences plus prefills finishing in this step).
            decode_batch: decoding sequences.
            decode_context_tokens: their total context.
            prefill_chunks: ``(new_tokens, cached_tokens)`` per prefill chunk.
        """
        if num_tokens <= 0:
            return 0.0
        per_token = self._per_token_sum
        lm_head = self._lm_head
        total = per_token[num_tokens] if num_tokens < len(per_token) else self._table(per_token, num_tokens)
        total += lm_head[num_sampled] if num_sampled < len(lm_head) else self._table(lm_head, num_sampled, 16)
        total += self.overheads.step_overhead_s
        if decode_batch > 0:
            if decode_batch <= self.max_batch:
                total += self._decode_attn_a[decode_batch] + self._decode_attn_k[decode_batch] * decode_context_tokens
            else:
                total += self.decode_attention_s(decode_batch, decode_context_tokens)
        for new, cached in prefill_chunks:
            total += self.prefill_attention_s(new, cached)
        return total

    def breakdown(
        self,
        prefill_tokens: int = 0,
        prefill_context_tokens: int = 0,
        decode_batch: int = 0,
        decode_context_tokens_each: int = 0,
    ) -> StepBreakdown:
        """Per-component time of a step co-batching one prefill chunk with ``decode_batch`` decodes."""
        num_tokens = prefill_tokens + decode_batch
        num_sampled = decode_batch + (1 if prefill_tokens > 0 else 0)
        if num_tokens <= 0:
            return StepBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        return StepBreakdown(
            gemm_s=self._table(self._gemm, num_tokens),
            lm_head_s=self._table(self._lm_head, num_sampled, 16),
            prefill_attention_s=self.prefill_attention_s(prefill_tokens, prefill_context_tokens),
            decode_attention_s=self.decode_attention_s(decode_batch, decode_batch * decode_context_tokens_each),
            elementwise_s=self._table(self._elementwise, num_tokens),
            tp_allreduce_s=self._table(self._allreduce, num_tokens),
            overhead_s=self.overheads.step_overhead_s,
        )
