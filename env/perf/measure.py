"""Measure the operator timings of one Llama-shaped model on this machine and write a profile folder.

The folder has the format :func:`env.perf.profile.load_operator_profile` reads (``env.txt``, ``ceilings.csv``,
``gemm.csv``, ``attn_prefill.csv``, ``attn_decode.csv``, ``elementwise.csv``) plus the ``config.json`` of the
architecture measured. Method: every operator is timed alone, eagerly, as the median of CUDA-event intervals
after warm-up calls (``time.perf_counter`` on a CPU); linear layers are ``x @ W`` at the TP shard's shape over
token counts 1 ... 16 Ki; attention is PyTorch's ``scaled_dot_product_attention`` with grouped KV heads (causal
over one sequence for prefill, one query token against contiguous K/V caches for decode); the element-wise
kernels of one layer are the unfused PyTorch calls :mod:`env.perf.elementwise` lists, on bf16 activations (also
on a CPU) at the TP shard's widths over token counts 1 ... 16 Ki, each written with the bytes that module counts
for it; the ceilings are a 2 GiB device copy, pinned host<->device copies and a square bf16 GEMM. ``tables``
(``--only``) measures a subset of :data:`TABLES` (``elementwise`` alone takes well under a minute on a GPU).

``tiny`` swaps in a 2-layer stand-in model, small grids and float32 on the CPU, so the whole path runs in seconds
without a GPU (the folder then describes that stand-in, and its ``config.json`` says so).

Imports torch; only the ``pdctl perf measure`` command loads this module.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.nn.functional as F

from env.perf.elementwise import ELEMENTWISE_OPS
from env.perf.profile import ELEMENTWISE_FILE, ModelSpec

__all__ = ["TABLES", "Grid", "measure_profile"]

TABLES = ("ceilings", "gemm", "attention", "elementwise")
"""What :func:`measure_profile` can measure (``attention`` writes both attention files)."""


@dataclass(frozen=True, slots=True)
class Grid:
    """What is measured: token counts of the linear layers, prefill lengths, decode batches and contexts, ...

    ... the sizes of the ceilings, the timer's repetitions, and the token counts of the element-wise kernels.
    """

    gemm_tokens: tuple[int, ...] = tuple(2**i for i in range(15))
    prefill_tokens: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    decode_batches: tuple[int, ...] = (1, 4, 16, 64, 256)
    decode_contexts: tuple[int, ...] = (512, 2048, 8192, 32768)
    max_decode_kv_tokens: int = 1 << 21
    copy_elements: int = 1 << 30
    square_gemm: int = 8192
    reps: int = 20
    warmup: int = 3
    elementwise_tokens: tuple[int, ...] = (1, 16, 256, 1024, 4096, 16384)


TINY_GRID = Grid(
    (1, 16, 256), (64, 256), (1, 4), (64, 256), 1 << 21, 1 << 20, 256, 5, 1, elementwise_tokens=(1, 16, 256, 1024)
)
TINY_MODEL = ModelSpec("tiny", 2, 256, 4, 2, 64, 512, 1000)


class _Timer:
    """Median time of a callable: CUDA events on a GPU, the wall clock on a CPU."""

    def __init__(self, device: torch.device, reps: int, warmup: int) -> None:
        self.device, self.reps, self.warmup = device, reps, warmup

    def __call__(self, fn: Callable[[], object], reps: int | None = None) -> float:
        """Median seconds of ``fn()`` over ``reps`` calls after the warm-up calls."""
        for _ in range(self.warmup):
            fn()
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        times: list[float] = []
        for _ in range(reps or self.reps):
            if cuda:
                start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1000.0)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        times.sort()
        return times[len(times) // 2]


@contextmanager
def _table(path: Path, header: list[str]) -> Iterator[Callable[..., None]]:
    handle: TextIO
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)

        def row(*values: object) -> None:
            writer.writerow(values)
            handle.flush()

        yield row


def _linear_shapes(spec: ModelSpec, tp: int) -> dict[str, tuple[int, int]]:
    """``op -> (k, n)`` of the linear layers on one GPU of a TP group (column / row parallel)."""
    d, hd = spec.hidden_size, spec.head_dim
    kv = max(spec.num_kv_heads // tp, 1)
    return {
        "qkv": (d, (spec.num_q_heads // tp + 2 * kv) * hd),
        "o": (spec.num_q_heads // tp * hd, d),
        "gate_up": (d, 2 * spec.ffn_size // tp),
        "down": (spec.ffn_size // tp, d),
        "lm_head": (d, spec.vocab_size // tp),
    }


def _elementwise_calls(spec: ModelSpec, tp: int, m: int, device: torch.device) -> dict[str, Callable[[], object]]:
    """``op -> call`` of one layer's element-wise kernels over ``m`` tokens at the TP shard's widths (bf16).

    Each call is the unfused PyTorch operation :mod:`env.perf.elementwise` counts, on inputs shaped as in a
    layer: the SiLU gate and up halves are views into the fused gate/up output, q a view into the fused QKV
    output, the attention output heads-first, the K/V cache heads-first and contiguous. The two layout copies
    always copy (``clone``): at one token PyTorch would return a view of a size-1 transpose, but the bytes are
    counted, so the kernel is timed.
    """
    bf16, fp32, dense = torch.bfloat16, torch.float32, torch.contiguous_format
    d, hd, ffn = spec.hidden_size, spec.head_dim, spec.ffn_size // tp
    q_heads, kv_heads = spec.num_q_heads // tp, max(spec.num_kv_heads // tp, 1)

    def rand(*shape: int, dtype: torch.dtype = bf16) -> torch.Tensor:
        return torch.randn(*shape, dtype=dtype, device=device)

    x, residual, weight = rand(m, d), rand(m, d), rand(d)
    xf, inv_rms = rand(m, d, dtype=fp32), rand(m, 1, dtype=fp32)
    gate_up, act = rand(m, 2 * ffn), rand(m, ffn)
    gate, up = gate_up[:, :ffn], gate_up[:, ffn:]
    qkv = rand(m, (q_heads + 2 * kv_heads) * hd)
    q = qkv[:, : q_heads * hd].view(m, q_heads, hd)
    k = qkv[:, q_heads * hd : (q_heads + kv_heads) * hd].view(m, kv_heads, hd)
    attn_out = rand(1, q_heads, m, hd)
    cache = torch.empty(kv_heads, m, hd, dtype=bf16, device=device)
    return {
        "rmsnorm_cast_fp32": lambda: x.to(fp32),
        "rmsnorm_square": lambda: xf.pow(2),
        "rmsnorm_mean": lambda: xf.mean(-1, keepdim=True),
        "rmsnorm_scale": lambda: xf * inv_rms,
        "rmsnorm_cast_bf16": lambda: xf.to(bf16),
        "rmsnorm_weight": lambda: weight * x,
        "residual_add": lambda: x + residual,
        "silu": lambda: F.silu(gate),
        "silu_mul": lambda: act * up,
        "q_copy": lambda: q.transpose(0, 1).clone(memory_format=dense),
        "attn_out_copy": lambda: attn_out.transpose(1, 2).clone(memory_format=dense).view(m, q_heads * hd),
        "kv_cache_write": lambda: cache.copy_(k.transpose(0, 1)),
    }


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])


class _Session:
    """One measurement run: device, dtype, timer, output folder."""

    def __init__(self, out: Path, tiny: bool, log: Callable[[str], object]) -> None:
        cuda = torch.cuda.is_available() and not tiny
        if not cuda and not tiny:
            raise RuntimeError("no CUDA device here; measure on a GPU machine, or pass --tiny to check on a CPU")
        self.device = torch.device("cuda" if cuda else "cpu")
        self.dtype = torch.bfloat16 if cuda else torch.float32
        self.grid = Grid() if not tiny else TINY_GRID
        self.timer = _Timer(self.device, self.grid.reps, self.grid.warmup)
        self.out, self.log, self.t0 = out, log, time.perf_counter()

    def note(self, message: str) -> None:
        self.log(f"[{time.perf_counter() - self.t0:7.1f} s] {message}")

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=self.dtype, device=self.device)

    def env(self) -> None:
        lines = [f"torch {torch.__version__}"]
        if self.device.type == "cuda":
            props: Any = torch.cuda.get_device_properties(0)
            lines.append(f"gpu {props.name} mem_gb {props.total_memory / 2**30:.1f} sms {props.multi_processor_count}")
        else:
            lines.append("cpu tiny check (not a profile of a GPU)")
        lines.append(f"dtype {self.dtype}")
        (self.out / "env.txt").write_text("\n".join(lines) + "\n")

    def ceilings(self) -> None:
        g = self.grid
        with _table(self.out / "ceilings.csv", ["what", "bytes_or_flop", "ms", "rate"]) as row:
            for what, nbytes, seconds in self._copies(g.copy_elements):
                row(what, nbytes, seconds * 1e3, nbytes / seconds / 1e9)
            a, b = self.randn(g.square_gemm, g.square_gemm), self.randn(g.square_gemm, g.square_gemm)
            flop = 2 * g.square_gemm**3
            seconds = self.timer(lambda: a @ b, reps=10)
            row("gemm_square_bf16", flop, seconds * 1e3, flop / seconds / 1e12)
        self.note("ceilings done")

    def _copies(self, elements: int) -> list[tuple[str, int, float]]:
        """``(what, bytes, seconds)`` of a device copy (bytes read plus written) and pinned host copies."""
        src = self.randn(elements)
        dst = torch.empty_like(src)
        host = torch.empty(src.shape, dtype=self.dtype, pin_memory=self.device.type == "cuda")
        one_way = src.numel() * src.element_size()
        return [
            ("d2d_copy_read_plus_write", 2 * one_way, self.timer(lambda: dst.copy_(src), reps=10)),
            ("h2d_pinned", one_way, self.timer(lambda: src.copy_(host, non_blocking=True), reps=5)),
            ("d2h_pinned", one_way, self.timer(lambda: host.copy_(src, non_blocking=True), reps=5)),
        ]

    def gemm(self, spec: ModelSpec, degrees: list[int]) -> None:
        header = ["model", "tp", "op", "m", "k", "n", "ms", "tflops", "gbps"]
        with _table(self.out / "gemm.csv", header) as row:
            for tp in degrees:
                for op, (k, n) in _linear_shapes(spec, tp).items():
                    weight = self.randn(k, n) / math.sqrt(k)
                    for m in self.grid.gemm_tokens:
                        x = self.randn(m, k)
                        seconds = self.timer(partial(torch.matmul, x, weight))
                        flop, nbytes = 2 * m * k * n, 2 * (m * k + k * n + m * n)
                        row(spec.name, tp, op, m, k, n, f"{seconds * 1e3:.5f}", f"{flop / seconds / 1e12:.2f}",
                            f"{nbytes / seconds / 1e9:.1f}")  # fmt: skip
                self.note(f"gemm tp{tp} done")

    def attention(self, spec: ModelSpec, degrees: list[int]) -> None:
        hd, g = spec.head_dim, self.grid
        prefill_header = ["model", "tp", "q_heads", "kv_heads", "head_dim", "seq", "ms"]
        decode_header = ["model", "tp", "q_heads", "kv_heads", "head_dim", "batch", "ctx", "ms", "kv_gbps"]
        with _table(self.out / "attn_prefill.csv", prefill_header) as prefill_row:
            for tp in degrees:
                q_heads, kv_heads = spec.num_q_heads // tp, max(spec.num_kv_heads // tp, 1)
                for seq in g.prefill_tokens:
                    q = self.randn(1, q_heads, seq, hd)
                    k, v = self.randn(1, kv_heads, seq, hd), self.randn(1, kv_heads, seq, hd)
                    seconds = self.timer(partial(_attention, q, k, v, True), reps=10)
                    prefill_row(spec.name, tp, q_heads, kv_heads, hd, seq, f"{seconds * 1e3:.5f}")
                self.note(f"prefill attention tp{tp} done")
        with _table(self.out / "attn_decode.csv", decode_header) as decode_row:
            for tp in degrees:
                q_heads, kv_heads = spec.num_q_heads // tp, max(spec.num_kv_heads // tp, 1)
                for batch in g.decode_batches:
                    for ctx in g.decode_contexts:
                        if batch * ctx > g.max_decode_kv_tokens:
                            continue
                        q = self.randn(batch, q_heads, 1, hd)
                        k, v = self.randn(batch, kv_heads, ctx, hd), self.randn(batch, kv_heads, ctx, hd)
                        seconds = self.timer(partial(_attention, q, k, v, False))
                        kv_bytes = 2 * batch * kv_heads * ctx * hd * spec.bytes_per_kv_element
                        decode_row(spec.name, tp, q_heads, kv_heads, hd, batch, ctx, f"{seconds * 1e3:.5f}",
                                   f"{kv_bytes / seconds / 1e9:.1f}")  # fmt: skip
                self.note(f"decode attention tp{tp} done")

    def elementwise(self, spec: ModelSpec, degrees: list[int]) -> None:
        with _table(self.out / ELEMENTWISE_FILE, ["model", "tp", "op", "m", "bytes", "ms"]) as row:
            for tp in degrees:
                for m in self.grid.elementwise_tokens:
                    calls = _elementwise_calls(spec, tp, m, self.device)
                    if set(calls) != {op.name for op in ELEMENTWISE_OPS}:
                        raise RuntimeError("measure.py times other element-wise ops than env/perf/elementwise.py")
                    for op in ELEMENTWISE_OPS:
                        seconds = self.timer(calls[op.name])
                        nbytes = round(m * op.bytes_per_token(spec, tp))
                        row(spec.name, tp, op.name, m, nbytes, f"{seconds * 1e3:.5f}")
                self.note(f"element-wise tp{tp} done")


def _write_config(spec: ModelSpec, path: Path) -> None:
    config = {
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.ffn_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_q_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
    }
    path.write_text(json.dumps(config, indent=2) + "\n")


def measure_profile(
    spec: ModelSpec,
    tp: int,
    out: str | Path,
    *,
    tiny: bool = False,
    log: Callable[[str], object] = print,
    tables: Collection[str] = TABLES,
) -> Path:
    """Measure ``spec``'s operators at TP 1 and ``tp`` and write a profile folder to ``out``; returns ``out``.

    ``tables`` chooses what is measured (:data:`TABLES`); ``env.txt`` and ``config.json`` are always written.

    Raises:
        RuntimeError: no CUDA device and not ``tiny``.
        ValueError: ``tp`` does not divide the model's heads or MLP width, or an unknown table.
        OSError: the folder cannot be written.
    """
    unknown = sorted(set(tables) - set(TABLES))
    if unknown or not tables:
        raise ValueError(f"--only {','.join(unknown) or '(nothing)'}: choose from {', '.join(TABLES)}")
    measured = replace(TINY_MODEL, name=spec.name) if tiny else spec
    if measured.num_q_heads % tp or measured.ffn_size % tp:
        raise ValueError(f"--tp {tp} does not divide {measured.num_q_heads} heads and MLP width {measured.ffn_size}")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    session = _Session(folder, tiny, log)
    torch.manual_seed(0)
    degrees = sorted({1, tp})
    session.env()
    with torch.inference_mode():
        if "ceilings" in tables:
            session.ceilings()
        if "gemm" in tables:
            session.gemm(measured, degrees)
        if "attention" in tables:
            session.attention(measured, degrees)
        if "elementwise" in tables:
            session.elementwise(measured, degrees)
    _write_config(measured, folder / "config.json")
    session.note(f"wrote {folder}")
    return folder
