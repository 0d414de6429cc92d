"""Model constants and measured operator profiles (the calibration CSVs shipped under ``env/profiles/``).

A *profile name* such as ``h200-llama3-8b`` names a measurement directory (``h200-llama3``: one GPU type, the
CSVs of ``calibration/measure_operators.py``) plus a model inside it (``llama3-8b``). Another GPU or model is
another directory with the same CSV files; :func:`load_operator_profile` also takes a directory path.

Loading reads files; nothing else in :mod:`env.perf` does I/O.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

from env.perf.derive import (
    ELEMENTWISE_MIN_TOKENS,
    MEMORY_BOUND_MAX_TOKENS,
    elementwise_bandwidth_frac,
    fit_affine_in_bytes,
    gemm_bytes,
)
from env.perf.elementwise import elementwise_op

__all__ = [
    "ELEMENTWISE_FILE",
    "MODELS",
    "GemmTable",
    "ModelSpec",
    "OperatorProfile",
    "ProfileError",
    "available_profiles",
    "load_operator_profile",
    "model_spec_from_hf_config",
    "split_profile_name",
]

FloatArray = npt.NDArray[np.float64]

ELEMENTWISE_FILE = "elementwise.csv"
"""Optional table of a folder: the element-wise kernels of one layer (``model, tp, op, m, bytes, ms``)."""


class ProfileError(ValueError):
    """A profile is missing or malformed (message names the file)."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Architecture constants of a decoder-only transformer (Llama-style, gated MLP, GQA)."""

    name: str
    num_layers: int
    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    bytes_per_param: int = 2
    bytes_per_kv_element: int = 2

    @property
    def num_params(self) -> int:
        """Total parameters (untied embedding and LM head)."""
        d, dq, dkv = self.hidden_size, self.num_q_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = 2 * d * dq + 2 * d * dkv + 3 * d * self.ffn_size
        return self.num_layers * per_layer + 2 * self.vocab_size * d

    def weight_bytes(self, tp: int = 1) -> int:
        """Weight bytes held by one GPU of a TP group."""
        return self.num_params * self.bytes_per_param // tp

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV-cache bytes of one token on one GPU: 2 (K and V) x layers x KV heads x head dim x dtype, / TP.

        KV heads are sharded over TP (never below one head per GPU).
        """
        heads = max(self.num_kv_heads // tp, 1)
        return 2 * self.num_layers * heads * self.head_dim * self.bytes_per_kv_element


MODELS: dict[str, ModelSpec] = {
    "llama3-8b": ModelSpec("llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    "llama3-70b": ModelSpec("llama3-70b", 80, 8192, 64, 8, 128, 28672, 128256),
}
"""Known model architectures (Llama-3 8B and 70B), keyed as in the calibration CSVs."""


@dataclass(frozen=True, slots=True)
class GemmTable:
    """Measured times of one linear layer over token counts ``m`` (ascending)."""

    m_tokens: FloatArray
    time_s: FloatArray
    k: int = 0
    n: int = 0


@dataclass(frozen=True, slots=True)
class OperatorProfile:
    """Measured operator timings of one model on one GPU type, per TP degree.

    Attributes:
        gpu: GPU description from ``env.txt``.
        gpu_memory_bytes: device memory of one GPU.
        model: architecture constants.
        gemm: ``(tp, op) -> GemmTable`` for ops ``qkv``, ``o``, ``gate_up``, ``down``, ``lm_head``.
        attn_prefill: ``tp -> (seq_tokens, time_s)`` of causal attention over one sequence (one layer).
        attn_decode: ``tp -> (batch, ctx_tokens, time_s)`` rows of one-token attention (one layer).
        copy_bandwidth_bytes_per_s: device copy rate counting bytes read plus written.
        gemm_peak_flops: measured square-GEMM rate (FLOP/s), the compute ceiling.
        host_bandwidth_bytes_per_s: pinned host-device copy rate.
        launch_overhead_s: per-call dispatch latency each eager operator time carries (derived, see
            :mod:`env.perf.derive`; from every model's memory-bound GEMM rows in the file).
        stream_bandwidth_bytes_per_s: the rate memory-bound GEMMs stream weights (derived alike).
        attn_decode_kv_heads: ``tp -> KV heads per GPU`` of the decode-attention rows.
        elementwise_bandwidth_frac: fraction of the copy rate the element-wise kernels reach, derived from the
            model's rows of ``elementwise.csv`` (see :mod:`env.perf.derive`); ``None`` without that file, or
            without rows of at least :data:`~env.perf.derive.ELEMENTWISE_MIN_TOKENS` tokens for this model.
        source: where the profile was read from.
    """

    gpu: str
    gpu_memory_bytes: float
    model: ModelSpec
    gemm: dict[tuple[int, str], GemmTable]
    attn_prefill: dict[int, tuple[FloatArray, FloatArray]]
    attn_decode: dict[int, tuple[FloatArray, FloatArray, FloatArray]]
    copy_bandwidth_bytes_per_s: float
    gemm_peak_flops: float
    host_bandwidth_bytes_per_s: float
    launch_overhead_s: float = 0.0
    stream_bandwidth_bytes_per_s: float = math.inf
    attn_decode_kv_heads: dict[int, int] = field(default_factory=dict)
    elementwise_bandwidth_frac: float | None = None
    source: str = ""
    tp_degrees: tuple[int, ...] = field(default=())


_HF_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def _config_int(config: dict[str, object], key: str, path: Path) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ProfileError(f"{path}: field {key!r} missing or not a positive integer (got {value!r})")
    return value


def model_spec_from_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` (Llama-style field names).

    Reads ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``, ``vocab_size``,
    optional ``num_key_value_heads`` (default: the attention heads) and ``head_dim`` (default: hidden / heads).
    ``name`` defaults to the file's parent folder name.

    Raises:
        ProfileError: the file is unreadable, not a JSON object, or a field is missing or invalid (names it).
    """
    file = Path(path)
    try:
        config = json.loads(file.read_text())
    except OSError as exc:
        raise ProfileError(f"{file}: cannot read ({exc.strerror or exc})") from exc
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{file}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(config, dict):
        raise ProfileError(f"{file}: expected a JSON object with Hugging Face config fields")
    hidden, ffn, layers, q_heads, vocab = (_config_int(config, key, file) for key in _HF_FIELDS)
    kv_heads = _config_int(config, "num_key_value_heads", file) if "num_key_value_heads" in config else q_heads
    if "head_dim" in config and config["head_dim"] is not None:
        head_dim = _config_int(config, "head_dim", file)
    elif hidden % q_heads == 0:
        head_dim = hidden // q_heads
    else:
        raise ProfileError(f"{file}: field 'hidden_size' {hidden} is not a multiple of 'num_attention_heads'")
    if q_heads % kv_heads != 0:
        raise ProfileError(f"{file}: field 'num_key_value_heads' {kv_heads} does not divide {q_heads} query heads")
    return ModelSpec(name or file.resolve().parent.name, layers, hidden, q_heads, kv_heads, head_dim, ffn, vocab)


def split_profile_name(name: str) -> tuple[str, str]:
    """``h200-llama3-8b`` -> (``h200-llama3``, ``llama3-8b``): the directory and the model key."""
    for model in sorted(MODELS, key=len, reverse=True):
        suffix = "-" + model.split("-", 1)[1]
        family = model.split("-", 1)[0]
        if name.endswith(suffix) and name[: -len(suffix)].endswith(family):
            return name[: -len(suffix)], model
    raise ProfileError(
        f"profile {name!r}: expected <directory>-<size> such as h200-llama3-8b; known models {sorted(MODELS)}"
    )


def available_profiles() -> list[str]:
    """Profile names shipped with the package (directory x model)."""
    names: list[str] = []
    root = resources.files("env.profiles")
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.is_dir() and entry.joinpath("gemm.csv").is_file():
            names.extend(f"{entry.name}-{m.split('-', 1)[1]}" for m in MODELS if entry.name.endswith(m.split("-")[0]))
    return names


def _read_rows(directory: Path, filename: str) -> list[dict[str, str]]:
    path = directory / filename
    try:
        with path.open(newline="") as handle:
            return list(csv.DictReader(handle))
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def _num(row: dict[str, str], key: str, path: Path) -> float:
    try:
        return float(row[key])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"{path}: column {key!r} missing or not a number in row {row}") from exc


def _elementwise_frac(path: Path, model_key: str, model: ModelSpec, launch_s: float, copy_bw: float) -> float | None:
    """The element-wise rate from ``elementwise.csv`` (``None`` if absent or no bandwidth-bound rows of the model).

    Every row of the model is checked: a known ``op``, positive ``tp``, ``m`` and ``ms``, and ``bytes`` equal to
    the op's counted traffic (:mod:`env.perf.elementwise`) at that ``m`` and TP shard.
    """
    file = path / ELEMENTWISE_FILE
    if not file.is_file():
        return None
    nbytes: list[float] = []
    time_s: list[float] = []
    calls: list[int] = []
    for row in _read_rows(path, ELEMENTWISE_FILE):
        if row.get("model") != model_key:
            continue
        try:
            op = elementwise_op(row.get("op") or "")
        except KeyError as exc:
            raise ProfileError(f"{file}: column 'op': {exc.args[0]} in row {row}") from None
        values = {key: _num(row, key, file) for key in ("tp", "m", "bytes", "ms")}
        for key, value in values.items():
            if value <= 0:
                raise ProfileError(f"{file}: column {key!r} must be positive in row {row}")
        tp, m = int(values["tp"]), values["m"]
        counted = round(m * op.bytes_per_token(model, tp))
        if abs(values["bytes"] - counted) > 0.5:
            raise ProfileError(
                f"{file}: column 'bytes' is {values['bytes']:.0f}, not the {counted} bytes {op.name} moves at "
                f"m={m:.0f}, tp={tp} for {model_key} (env/perf/elementwise.py) in row {row}"
            )
        if m >= ELEMENTWISE_MIN_TOKENS:
            nbytes.append(values["bytes"])
            time_s.append(values["ms"] / 1000.0)
            calls.append(op.calls_per_layer)
    if not nbytes:
        return None
    return elementwise_bandwidth_frac(nbytes, time_s, calls, launch_s, copy_bw)


def _resolve_directory(directory: str | Path) -> Path:
    path = Path(directory)
    if path.is_dir():
        return path
    shipped = resources.files("env.profiles").joinpath(str(directory))
    candidate = Path(str(shipped))
    if candidate.is_dir():
        return candidate
    raise ProfileError(f"profile directory {directory!r} not found (shipped: {available_profiles()})")


def _models_in(path: Path, gemm_file: str) -> list[str]:
    return sorted({row.get("model", "") for row in _read_rows(path, gemm_file)} - {""})


def _ceilings(path: Path) -> tuple[float, float, float]:
    """Copy bandwidth, square-GEMM rate and host bandwidth from ``ceilings.csv``."""
    ceilings = {row.get("what", ""): row for row in _read_rows(path, "ceilings.csv")}
    try:
        copy_bw = float(ceilings["d2d_copy_read_plus_write"]["rate"]) * 1e9
        peak = float(ceilings["gemm_square_bf16"]["rate"]) * 1e12
        host_bw = float(ceilings["h2d_pinned"]["rate"]) * 1e9
    except (KeyError, ValueError) as exc:
        raise ProfileError(f"{path / 'ceilings.csv'}: missing or bad row ({exc})") from exc
    if min(copy_bw, peak, host_bw) <= 0:
        raise ProfileError(f"{path / 'ceilings.csv'}: column 'rate' must be positive")
    return copy_bw, peak, host_bw


def _gpu(path: Path) -> tuple[str, float]:
    """GPU description and memory bytes from ``env.txt`` (defaults when absent)."""
    gpu, memory_bytes = "unknown GPU", 80e9
    env_path = path / "env.txt"
    if env_path.is_file():
        for line in env_path.read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == "gpu" and "mem_gb" in parts:
                at = parts.index("mem_gb")
                gpu = " ".join(parts[1:at])
                memory_bytes = float(parts[at + 1]) * 1e9
    return gpu, memory_bytes


def _locate(
    name: str, directory: str | Path | None, gemm_file: str, model_config: str | Path | None
) -> tuple[Path, str, ModelSpec]:
    """The folder, the ``model`` column value and the architecture a profile name (and config) stand for."""
    if model_config is None:
        dir_name, model_key = split_profile_name(name)
        return _resolve_directory(directory if directory is not None else dir_name), model_key, MODELS[model_key]
    if directory is None:
        raise ProfileError(f"model config {model_config}: a profile directory is required with it")
    spec = model_spec_from_hf_config(model_config)
    path = _resolve_directory(directory)
    present = _models_in(path, gemm_file)
    candidates = [name]
    with contextlib.suppress(ProfileError):
        candidates.append(split_profile_name(name)[1])
    named = [c for c in candidates if c in present]
    if named:
        model_key = named[0]
    elif len(present) == 1:
        model_key = present[0]
    else:
        raise ProfileError(f"{path / gemm_file}: column 'model' has {present}; name one of them, not {name!r}")
    return path, model_key, replace(spec, name=model_key)


def load_operator_profile(
    name: str,
    directory: str | Path | None = None,
    gemm_file: str = "gemm.csv",
    model_config: str | Path | None = None,
) -> OperatorProfile:
    """Load the measured operator profile ``name`` (e.g. ``h200-llama3-8b``).

    Reads ``gemm.csv`` (or ``gemm_file``), ``attn_prefill.csv``, ``attn_decode.csv``, ``ceilings.csv``,
    ``env.txt`` and, when present, ``elementwise.csv`` (older folders lack it; see
    :attr:`OperatorProfile.elementwise_bandwidth_frac`). A malformed file raises :class:`ProfileError` naming it.

    Args:
        name: profile name ``<directory>-<size>``; with ``directory`` given, only its model part is used. With
            ``model_config``, the value of the CSVs' ``model`` column to read (a folder measuring one model may
            be named by anything, e.g. ``""``).
        directory: a measurement directory to read instead of the shipped one.
        gemm_file: the GEMM table to read (``gemm_repeat.csv`` is a second, independent measurement run).
        model_config: a Hugging Face ``config.json`` giving the architecture (any Llama-shaped model); then
            ``directory`` is required.
    """
    path, model_key, model = _locate(name, directory, gemm_file, model_config)
    gemm_rows: dict[tuple[int, str], list[tuple[float, float]]] = {}
    shapes: dict[tuple[int, str], tuple[int, int]] = {}
    small_bytes: list[float] = []
    small_time_s: list[float] = []
    gemm_path = path / gemm_file
    for row in _read_rows(path, gemm_file):
        m, time_s = _num(row, "m", gemm_path), _num(row, "ms", gemm_path) / 1000.0
        k, n = int(_num(row, "k", gemm_path)), int(_num(row, "n", gemm_path))
        if m <= MEMORY_BOUND_MAX_TOKENS and time_s > 0:
            small_bytes.append(gemm_bytes(m, k, n))
            small_time_s.append(time_s)
        if row.get("model") != model_key:
            continue
        key = (int(_num(row, "tp", gemm_path)), row.get("op", ""))
        gemm_rows.setdefault(key, []).append((m, time_s))
        shapes[key] = (k, n)
    if not gemm_rows:
        raise ProfileError(f"{path / gemm_file}: no rows for model {model_key}")
    missing = [op for op in ("qkv", "o", "gate_up", "down", "lm_head") if not any(o == op for _, o in gemm_rows)]
    if missing:
        raise ProfileError(f"{path / gemm_file}: column 'op' has no rows {missing} for model {model_key}")
    try:
        launch_s, stream_bw = fit_affine_in_bytes(small_bytes, small_time_s)
    except ValueError as exc:
        raise ProfileError(f"{path / gemm_file}: rows with m <= {MEMORY_BOUND_MAX_TOKENS}: {exc}") from exc
    gemm = {
        key: GemmTable(np.array([m for m, _ in sorted(rows)]), np.array([t for _, t in sorted(rows)]), *shapes[key])
        for key, rows in gemm_rows.items()
    }

    prefill: dict[int, list[tuple[float, float]]] = {}
    prefill_path, decode_path = path / "attn_prefill.csv", path / "attn_decode.csv"
    for row in _read_rows(path, "attn_prefill.csv"):
        if row.get("model") == model_key:
            prefill.setdefault(int(_num(row, "tp", prefill_path)), []).append(
                (_num(row, "seq", prefill_path), _num(row, "ms", prefill_path) / 1000.0)
            )
    decode: dict[int, list[tuple[float, float, float]]] = {}
    kv_heads: dict[int, int] = {}
    for row in _read_rows(path, "attn_decode.csv"):
        if row.get("model") == model_key:
            kv_heads[int(_num(row, "tp", decode_path))] = int(_num(row, "kv_heads", decode_path))
            decode.setdefault(int(_num(row, "tp", decode_path)), []).append(
                (_num(row, "batch", decode_path), _num(row, "ctx", decode_path), _num(row, "ms", decode_path) / 1000.0)
            )
    if not prefill or not decode:
        raise ProfileError(f"{path}: attention tables have no rows for model {model_key}")

    copy_bw, peak, host_bw = _ceilings(path)
    gpu, memory_bytes = _gpu(path)
    elementwise_frac = _elementwise_frac(path, model_key, model, launch_s, copy_bw)

    return OperatorProfile(
        gpu=gpu,
        gpu_memory_bytes=memory_bytes,
        model=model,
        gemm=gemm,
        attn_prefill={
            tp: (np.array([s for s, _ in sorted(r)]), np.array([t for _, t in sorted(r)])) for tp, r in prefill.items()
        },
        attn_decode={
            tp: (np.array([b for b, _, _ in r]), np.array([c for _, c, _ in r]), np.array([t for _, _, t in r]))
            for tp, r in decode.items()
        },
        copy_bandwidth_bytes_per_s=copy_bw,
        gemm_peak_flops=peak,
        host_bandwidth_bytes_per_s=host_bw,
        launch_overhead_s=launch_s,
        stream_bandwidth_bytes_per_s=stream_bw,
        attn_decode_kv_heads=kv_heads,
        elementwise_bandwidth_frac=elementwise_frac,
        source=str(path),
        tp_degrees=tuple(sorted({tp for tp, _ in gemm})),
    )
