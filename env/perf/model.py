"""Execution time of one engine step, composed from measured operator timings.

One engine step runs the whole model once over a *batch*: ``T`` scheduled tokens (decode tokens plus
prefill-chunk tokens), of which ``S`` rows go through the LM head (one per decoding sequence and per prefill that
finishes in this step). Every operator table holds eager CUDA-event times, which carry a per-call dispatch latency
``delta`` (:attr:`OperatorProfile.launch_overhead_s`, derived from the GEMM rows, see :mod:`env.perf.derive`);
inside a CUDA-graphed step that latency is gone, so each operator contributes its *kernel time*
``max(t_measured - delta, roofline)``, where the roofline is the kernel's bytes at the measured weight-streaming
rate or its FLOPs at the measured square-GEMM rate, whichever is slower. The step time is the sum of:

``gemm``
    ``L x (qkv + o + gate_up + down)`` kernel times at ``T`` tokens (``gemm.csv`` interpolated piecewise-linearly
    over the measured token counts; beyond the last point, extrapolated with the last segment's slope).
``lm_head``
    the LM-head GEMM at ``S`` rows.
``prefill_attention``
    per prefill chunk of ``N`` new tokens after ``c`` cached tokens: ``L x f_attn x P(sqrt(N^2 + 2Nc))``, where
    ``P(s)`` is the kernel time of causal attention over one ``s``-token sequence (``attn_prefill.csv``; Vidur's
    equivalent-length rule) and ``f_attn`` (:attr:`StepOverheads.prefill_attention_factor`) what a long-context
    attention costs inside a whole model relative to the isolated kernel.
``decode_attention``
    ``L x (a + bytes_kv / bw_kv)``: one-token attention reads every cached K/V once, so it is affine in the
    K/V bytes; ``a`` and ``bw_kv`` are fitted over all rows of ``attn_decode.csv`` (then ``delta`` removed).
``elementwise``
    the memory-bound work between the GEMMs (:func:`elementwise_bytes_per_token`: two RMSNorms, two residual
    adds, SiLU-and-multiply, the q/k/v layout copies and the K/V cache write of an unfused PyTorch layer) at a
    fraction (:attr:`StepOverheads.elementwise_bandwidth_frac`) of the measured device-copy bandwidth (per op
    in :mod:`env.perf.elementwise`; without a whole-step fit, the fraction a folder's ``elementwise.csv`` gives,
    :meth:`StepOverheads.operator_only_for`).
``launch``
    ``L x`` :attr:`StepOverheads.layer_overhead_s`: the launch gaps and minimum durations of a layer's ~27
    kernels inside a CUDA graph (fitted: 44 us, about 1.6 us a kernel; a quarter of a batch-1 decode step).
``tp_allreduce``
    with TP > 1, two all-reduces of ``T x d x dtype`` bytes per layer, each ``alpha_tp + bytes / bw_tp``.
    **Assumption** (cannot be measured on one GPU): H200 NVLink figures of APEX+
    (``reference/simulators.md`` §7.3): alpha = 7 / 10 / 17 us and bus-limited 236 / 194 / 152 GB/s at
    TP 2 / 4 / 8. See the profile README for the spread this leaves.
``overhead``
    a fixed per-step engine cost (scheduler, input preparation, sampling), :attr:`StepOverheads.step_overhead_s`;
    0 by default: the whole-step timings the constants are fitted on have none, and a scenario may set one.

The three fitted constants of :class:`StepOverheads` and how they were fitted are in
``env/profiles/h200-llama3/README.md``; ``pdctl perf check`` reproduces the fit and its error table.

TP degrees without their own rows are derived from the nearest measured degree assuming perfect sharding
(time x tp_measured / tp); the result says which degree was used.

Fast path: for a decode-only step the time is affine in the total context, ``A[B] + K[B] x C``
(:meth:`InterpolatedExecutionTimeModel.decode_coefficients`), which lets the simulator advance many decode
steps in closed form.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from env.perf.derive import fit_affine_in_bytes, gemm_bytes
from env.perf.elementwise import ELEMENTWISE_OPS
from env.perf.profile import FloatArray, GemmTable, ModelSpec, OperatorProfile

__all__ = [
    "TP_ALLREDUCE_ASSUMPTION",
    "ExecutionTimeModel",
    "InterpolatedExecutionTimeModel",
    "StepBreakdown",
    "StepOverheads",
    "elementwise_bytes_per_token",
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

KERNELS_PER_LAYER = 27
"""Kernels one unfused PyTorch Llama layer launches (an RMSNorm is 7: cast, square, mean, add, rsqrt, scale,
cast-and-weight; x2, plus 2 residual adds, 4 GEMMs, SiLU, multiply, 2 K/V cache writes, the q copy, attention and
the output copy)."""

GRAPH_KERNEL_PRIOR_S = 2e-6
"""Prior for the launch gap plus minimum duration of one kernel inside a CUDA graph on a current GPU (1-3 us)."""


def elementwise_bytes_per_token(model: ModelSpec, tp: int = 1) -> float:
    """Bytes of element-wise traffic per token per layer on one GPU (unfused PyTorch, bf16 activations).

    The sum over :data:`env.perf.elementwise.ELEMENTWISE_OPS` (the one place each op's bytes are defined): each
    RMSNorm reads/writes ``36 d`` bytes (cast to fp32 6d, square 8d, mean 4d, scale 8d, cast back 6d, weight
    4d), each residual add ``6 d``; SiLU-and-multiply ``10 d_ff / tp`` (SiLU 4, multiply 6); the q layout copy and
    the attention-output copy ``8 d_q / tp``; the K/V cache write ``8 d_kv / tp``. Norms and residual adds act on
    the full hidden state on every GPU of a TP group.
    """
    return sum(op.calls_per_layer * op.bytes_per_token(model, tp) for op in ELEMENTWISE_OPS)


@dataclass(frozen=True, slots=True)
class StepOverheads:
    """The composition's constants that the operator tables do not give (named, few; see the module doc).

    Attributes:
        step_overhead_s: fixed engine cost of every step (scheduler, sampling; not in the fitted timings).
        layer_overhead_s: launch gaps and minimum durations of one layer's kernels in a graphed step.
        elementwise_bandwidth_frac: fraction of the device-copy bandwidth the element-wise kernels reach.
        prefill_attention_factor: whole-model prefill attention time over the isolated kernel's.
        allreduce_latency_s: latency of one TP all-reduce (default: :data:`TP_ALLREDUCE_ASSUMPTION`).
        allreduce_bandwidth_bytes_per_s: its bus-limited rate (default: :data:`TP_ALLREDUCE_ASSUMPTION`).

    The defaults are fitted on the Llama-3-8B whole-step timings on H200 (``pdctl perf check --fit``);
    :meth:`operator_only` gives the priors used when no whole-step timing exists, :meth:`operator_only_for`
    the same with the element-wise rate a profile's ``elementwise.csv`` gives.
    """

    step_overhead_s: float = 0.0
    layer_overhead_s: float = 44.1e-6
    elementwise_bandwidth_frac: float = 0.611
    prefill_attention_factor: float = 1.109
    allreduce_latency_s: float | None = None
    allreduce_bandwidth_bytes_per_s: float | None = None

    @classmethod
    def operator_only(cls) -> StepOverheads:
        """Priors, not fitted on any whole-step timing: 27 kernels x 2 us, the copy ceiling, the kernel's time."""
        return cls(0.0, KERNELS_PER_LAYER * GRAPH_KERNEL_PRIOR_S, 1.0, 1.0)

    @classmethod
    def operator_only_for(cls, profile: OperatorProfile) -> StepOverheads:
        """:meth:`operator_only`, with the element-wise rate the profile's ``elementwise.csv`` gives when it has one.

        Still no whole-step timing: the rate is derived from the folder's own operator rows
        (:attr:`OperatorProfile.elementwise_bandwidth_frac`); without them the copy-ceiling prior 1.0 stays.
        """
        priors = cls.operator_only()
        if profile.elementwise_bandwidth_frac is None:
            return priors
        return replace(priors, elementwise_bandwidth_frac=profile.elementwise_bandwidth_frac)


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
    launch_s: float = 0.0

    @property
    def step_time_s(self) -> float:
        """Sum of the components."""
        return sum(self.as_dict().values())

    def as_dict(self) -> dict[str, float]:
        """Components, for JSON output."""
        return {
            "gemm_s": self.gemm_s,
            "lm_head_s": self.lm_head_s,
            "prefill_attention_s": self.prefill_attention_s,
            "decode_attention_s": self.decode_attention_s,
            "elementwise_s": self.elementwise_s,
            "launch_s": self.launch_s,
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


def _kernel_times(table: GemmTable, tokens: FloatArray, profile: OperatorProfile) -> FloatArray:
    """Kernel time of one GEMM over ``tokens``: measured minus the dispatch latency, never under the roofline."""
    measured = _interp_extrapolate(tokens, table.m_tokens, table.time_s)
    nbytes = np.asarray(gemm_bytes(tokens, table.k, table.n), dtype=np.float64)  # type: ignore[arg-type]
    roofline = np.maximum(
        nbytes / profile.stream_bandwidth_bytes_per_s, 2.0 * tokens * table.k * table.n / profile.gemm_peak_flops
    )
    out = np.maximum(measured - profile.launch_overhead_s, roofline)
    out[tokens <= 0] = 0.0
    return np.asarray(out, dtype=np.float64)


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
        delta = profile.launch_overhead_s

        tokens = np.arange(_TABLE_TOKENS + 1, dtype=np.float64)
        gemm_layer = np.zeros_like(tokens)
        for op in _GEMM_OPS:
            gemm_layer += _kernel_times(profile.gemm[(self.measured_tp, op)], tokens, profile)
        lm_tokens = tokens[: max_batch + 1 + 64]
        lm_head = _kernel_times(profile.gemm[(self.measured_tp, "lm_head")], lm_tokens, profile) * self._shard
        elem_bytes = elementwise_bytes_per_token(self.model, tp)
        elementwise = (
            layers
            * tokens
            * elem_bytes
            / (profile.copy_bandwidth_bytes_per_s * self.overheads.elementwise_bandwidth_frac)
        )
        alpha, bw = TP_ALLREDUCE_ASSUMPTION.get(tp, (17e-6 * tp / 8, 152e9))
        alpha = alpha if self.overheads.allreduce_latency_s is None else self.overheads.allreduce_latency_s
        bw = (
            bw
            if self.overheads.allreduce_bandwidth_bytes_per_s is None
            else self.overheads.allreduce_bandwidth_bytes_per_s
        )
        allreduce = (
            2 * layers * (alpha + tokens * self.model.hidden_size * self.model.bytes_per_param / bw)
            if tp > 1
            else np.zeros_like(tokens)
        )
        allreduce[0] = 0.0
        self._launch_s = layers * self.overheads.layer_overhead_s
        self._per_token_sum: list[float] = (layers * gemm_layer * self._shard + elementwise + allreduce).tolist()
        self._gemm = (layers * gemm_layer * self._shard).tolist()
        self._lm_head = lm_head.tolist()
        self._elementwise = elementwise.tolist()
        self._allreduce = allreduce.tolist()

        seq, t_seq = profile.attn_prefill[self._nearest(profile.attn_prefill)]
        self._prefill_seq = seq
        kernel_seq = np.maximum(t_seq - delta, 0.0)
        self._prefill_t = kernel_seq * self._shard_attn(profile.attn_prefill) * self.overheads.prefill_attention_factor
        # all-layer prefill attention on a 16-token grid of equivalent lengths (interpolated linearly between)
        grid = np.arange(0, float(seq[-1]) + 32, _PREFILL_GRID_TOKENS)
        per_layer = np.interp(grid, seq, self._prefill_t)
        low = grid < seq[0]
        per_layer[low] = float(self._prefill_t[0]) * grid[low] / float(seq[0])
        self._prefill_grid: list[float] = (layers * per_layer).tolist()

        decode_tp = self._nearest(profile.attn_decode)
        batch, ctx, t_dec = profile.attn_decode[decode_tp]
        heads = profile.attn_decode_kv_heads.get(decode_tp, max(self.model.num_kv_heads // decode_tp, 1))
        kv_bytes_per_token = 2.0 * heads * self.model.head_dim * self.model.bytes_per_kv_element
        intercept_s, bw_kv = fit_affine_in_bytes(batch * ctx * kv_bytes_per_token, t_dec)
        scale = self._shard_attn(profile.attn_decode)
        #: per layer: fixed kernel time of a decode-attention call, and seconds per context token
        self._decode_fixed_s = max(intercept_s - delta, 0.0) * scale
        self._decode_per_token_s = kv_bytes_per_token / bw_kv * scale

        bs = np.arange(max_batch + 1, dtype=np.float64)
        a_b, k_b = self._decode_attention_coefficients(bs)
        dense = np.array([self._dense(int(n), int(n)) for n in bs])
        self._decode_attn_a: list[float] = (layers * a_b).tolist()
        self._decode_attn_k: list[float] = (layers * k_b).tolist()
        self._decode_a_s = (dense + layers * a_b + self._fixed_s).tolist()
        self._decode_k_s = (layers * k_b).tolist()
        self._decode_a_s[0] = 0.0
        self._decode_k_s[0] = 0.0

    # ----------------------------------------------------------------------------------------- building blocks

    @property
    def _fixed_s(self) -> float:
        """Per-step costs independent of the batch: engine overhead and the layers' kernel launches."""
        return self.overheads.step_overhead_s + self._launch_s

    def _nearest(self, table: Mapping[int, object]) -> int:
        return min(table, key=lambda d: (abs(math.log(d / self.tp)), -d))

    def _shard_attn(self, table: Mapping[int, object]) -> float:
        return self._nearest(table) / self.tp

    def _decode_attention_coefficients(self, batch: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Per layer ``(a, k)`` with decode attention ``a + k x total_context`` for each batch size."""
        live = batch > 0
        return np.where(live, self._decode_fixed_s, 0.0), np.where(live, self._decode_per_token_s, 0.0)

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
        return self.model.num_layers * (self._decode_fixed_s + self._decode_per_token_s * context_tokens)

    # ----------------------------------------------------------------------------------------------- queries

    def decode_coefficients(self, decode_batch: int) -> tuple[float, float]:
        """``(A, K)``: a decode-only step of ``decode_batch`` sequences with ``C`` context tokens takes ``A + K C``."""
        if decode_batch <= self.max_batch:
            return self._decode_a_s[decode_batch], self._decode_k_s[decode_batch]
        layers = self.model.num_layers
        dense = self._dense(decode_batch, decode_batch)
        return dense + layers * self._decode_fixed_s + self._fixed_s, layers * self._decode_per_token_s

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
        total += self._fixed_s
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
        prefill_sequences: int = 1,
    ) -> StepBreakdown:
        """Per-component time of a step co-batching prefill chunks with ``decode_batch`` decodes.

        ``prefill_sequences`` chunks of ``prefill_tokens`` new tokens each (after ``prefill_context_tokens``
        cached), every one finishing in this step (one LM-head row each).
        """
        chunks = prefill_sequences if prefill_tokens > 0 else 0
        num_tokens = chunks * prefill_tokens + decode_batch
        num_sampled = decode_batch + chunks
        if num_tokens <= 0:
            return StepBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        return StepBreakdown(
            gemm_s=self._table(self._gemm, num_tokens),
            lm_head_s=self._table(self._lm_head, num_sampled, 16),
            prefill_attention_s=chunks * self.prefill_attention_s(prefill_tokens, prefill_context_tokens),
            decode_attention_s=self.decode_attention_s(decode_batch, decode_batch * decode_context_tokens_each),
            elementwise_s=self._table(self._elementwise, num_tokens),
            tp_allreduce_s=self._table(self._allreduce, num_tokens),
            overhead_s=self.overheads.step_overhead_s,
            launch_s=self._launch_s,
        )
