"""Model constants and measured operator profiles (the calibration CSVs shipped under ``env/profiles/``).

A *profile name* such as ``h200-llama3-8b`` names a measurement directory (``h200-llama3``: one GPU type, the
CSVs of ``calibration/measure_operators.py``) plus a model inside it (``llama3-8b``). Another GPU or model is
another directory with the same CSV files; :func:`load_operator_profile` also takes a directory path.

Loading reads files; nothing else in :mod:`env.perf` does I/O.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = [
    "MODELS",
    "GemmTable",
    "ModelSpec",
    "OperatorProfile",
    "ProfileError",
    "available_profiles",
    "load_operator_profile",
    "split_profile_name",
]

FloatArray = npt.NDArray[np.float64]


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
    source: str = ""
    tp_degrees: tuple[int, ...] = field(default=())


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


def _resolve_directory(directory: str | Path) -> Path:
    path = Path(directory)
    if path.is_dir():
        return path
    shipped = resources.files("env.profiles").joinpath(str(directory))
    candidate = Path(str(shipped))
    if candidate.is_dir():
        return candidate
    raise ProfileError(f"profile directory {directory!r} not found (shipped: {available_profiles()})")


def load_operator_profile(
    name: str, directory: str | Path | None = None, gemm_file: str = "gemm.csv"
) -> OperatorProfile:
    """Load the measured operator profile ``name`` (e.g. ``h200-llama3-8b``).

    Args:
        name: profile name ``<directory>-<size>``; with ``directory`` given, only its model part is used.
        directory: a measurement directory to read instead of the shipped one.
        gemm_file: the GEMM table to read (``gemm_repeat.csv`` is a second, independent measurement run).
    """
    dir_name, model_key = split_profile_name(name)
    path = _resolve_directory(directory if directory is not None else dir_name)
    model = MODELS[model_key]

    gemm_rows: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for row in _read_rows(path, gemm_file):
        if row.get("model") != model_key:
            continue
        key = (int(_num(row, "tp", path)), row["op"])
        gemm_rows.setdefault(key, []).append((_num(row, "m", path), _num(row, "ms", path) / 1000.0))
    if not gemm_rows:
        raise ProfileError(f"{path / gemm_file}: no rows for model {model_key}")
    gemm = {
        key: GemmTable(np.array([m for m, _ in sorted(rows)]), np.array([t for _, t in sorted(rows)]))
        for key, rows in gemm_rows.items()
    }

    prefill: dict[int, list[tuple[float, float]]] = {}
    for row in _read_rows(path, "attn_prefill.csv"):
        if row.get("model") == model_key:
            prefill.setdefault(int(_num(row, "tp", path)), []).append(
                (_num(row, "seq", path), _num(row, "ms", path) / 1000.0)
            )
    decode: dict[int, list[tuple[float, float, float]]] = {}
    for row in _read_rows(path, "attn_decode.csv"):
        if row.get("model") == model_key:
            decode.setdefault(int(_num(row, "tp", path)), []).append(
                (_num(row, "batch", path), _num(row, "ctx", path), _num(row, "ms", path) / 1000.0)
            )
    if not prefill or not decode:
        raise ProfileError(f"{path}: attention tables have no rows for model {model_key}")

    ceilings = {row["what"]: row for row in _read_rows(path, "ceilings.csv")}
    try:
        copy_bw = float(ceilings["d2d_copy_read_plus_write"]["rate"]) * 1e9
        peak = float(ceilings["gemm_square_bf16"]["rate"]) * 1e12
        host_bw = float(ceilings["h2d_pinned"]["rate"]) * 1e9
    except (KeyError, ValueError) as exc:
        raise ProfileError(f"{path / 'ceilings.csv'}: missing or bad row ({exc})") from exc

    gpu, memory_bytes = "unknown GPU", 80e9
    env_path = path / "env.txt"
    if env_path.is_file():
        for line in env_path.read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == "gpu" and "mem_gb" in parts:
                at = parts.index("mem_gb")
                gpu = " ".join(parts[1:at])
                memory_bytes = float(parts[at + 1]) * 1e9

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
        source=str(path),
        tp_degrees=tuple(sorted({tp for tp, _ in gemm})),
    )
