"""Whole-step fidelity: compare the composed step time with measured whole-model steps, and fit the constants.

A profile folder may hold whole-step timings of one model next to its operator tables (``e2e_prefill.csv``:
``model, batch, seq, ms``; ``e2e_decode.csv``: ``model, batch, ctx, ms``; ``e2e_mixed.csv``:
``model, prefill_tokens, decode_batch, decode_ctx, ms``). They time a plain stack (no scheduler, no sampling), so
they are compared with ``step_overhead_s`` = 0.

The three fitted constants of :class:`~env.perf.model.StepOverheads` enter a step linearly (per-layer launch
cost, the inverse of the element-wise bandwidth fraction, the prefill-attention factor), so :func:`fit_overheads`
is a closed-form least squares on relative error.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from env.perf.model import InterpolatedExecutionTimeModel, StepOverheads
from env.perf.profile import OperatorProfile, ProfileError

__all__ = ["E2E_FILES", "StepPoint", "fit_overheads", "load_e2e_points", "relative_errors", "summarize"]

E2E_FILES = ("e2e_prefill.csv", "e2e_decode.csv", "e2e_mixed.csv")


@dataclass(frozen=True, slots=True)
class StepPoint:
    """One measured whole step: ``prefill_sequences`` prefills of ``prefill_tokens`` each, plus decodes."""

    source: str
    prefill_sequences: int
    prefill_tokens: int
    decode_batch: int
    decode_context_tokens_each: int
    measured_s: float

    @property
    def label(self) -> str:
        """Short description, e.g. ``prefill 4x2048`` or ``decode 64@2048``."""
        parts = []
        if self.prefill_tokens:
            parts.append(f"prefill {self.prefill_sequences}x{self.prefill_tokens}")
        if self.decode_batch:
            parts.append(f"decode {self.decode_batch}@{self.decode_context_tokens_each}")
        return " + ".join(parts)


def _int(row: dict[str, str], key: str, path: Path) -> int:
    try:
        return int(row[key])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"{path}: column {key!r} missing or not an integer in row {row}") from exc


def _ms(row: dict[str, str], path: Path) -> float:
    try:
        value = float(row["ms"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"{path}: column 'ms' missing or not a number in row {row}") from exc
    if value <= 0:
        raise ProfileError(f"{path}: column 'ms' must be positive in row {row}")
    return value / 1000.0


def load_e2e_points(directory: str | Path, model_key: str) -> list[StepPoint]:
    """The whole-step timings of ``model_key`` in ``directory`` (files that are absent contribute nothing)."""
    points: list[StepPoint] = []
    for name in E2E_FILES:
        path = Path(directory) / name
        if not path.is_file():
            continue
        with path.open(newline="") as handle:
            rows = [row for row in csv.DictReader(handle) if row.get("model") == model_key]
        for row in rows:
            if name == "e2e_prefill.csv":
                point = StepPoint(name, _int(row, "batch", path), _int(row, "seq", path), 0, 0, _ms(row, path))
            elif name == "e2e_decode.csv":
                point = StepPoint(name, 0, 0, _int(row, "batch", path), _int(row, "ctx", path), _ms(row, path))
            else:
                prefill = _int(row, "prefill_tokens", path)
                point = StepPoint(
                    name,
                    1 if prefill else 0,
                    prefill,
                    _int(row, "decode_batch", path),
                    _int(row, "decode_ctx", path),
                    _ms(row, path),
                )
            points.append(point)
    return points


def _components(model: InterpolatedExecutionTimeModel, point: StepPoint) -> dict[str, float]:
    b = model.breakdown(
        prefill_tokens=point.prefill_tokens,
        decode_batch=point.decode_batch,
        decode_context_tokens_each=point.decode_context_tokens_each,
        prefill_sequences=max(point.prefill_sequences, 1),
    )
    return b.as_dict()


def relative_errors(
    profile: OperatorProfile, points: list[StepPoint], overheads: StepOverheads, tp: int = 1
) -> list[tuple[StepPoint, float, float]]:
    """``(point, predicted_s, relative_error)`` per point (``step_overhead_s`` forced to 0, see module doc)."""
    plain = replace(overheads, step_overhead_s=0.0)
    model = InterpolatedExecutionTimeModel(profile, tp, plain)
    out = []
    for point in points:
        predicted = sum(_components(model, point).values())
        out.append((point, predicted, predicted / point.measured_s - 1.0))
    return out


def fit_overheads(profile: OperatorProfile, points: list[StepPoint], tp: int = 1) -> StepOverheads:
    """The constants that minimise the squared relative error over ``points`` (closed form; see module doc).

    Raises:
        ValueError: fewer points than constants, or a fit outside the physical range (non-positive values).
    """
    if len(points) < 3:
        raise ValueError(f"need at least 3 whole-step timings to fit 3 constants, got {len(points)}")
    unit = InterpolatedExecutionTimeModel(profile, tp, StepOverheads(0.0, 1e-6, 1.0, 1.0))
    design, target = [], []
    for point in points:
        c = _components(unit, point)
        fixed = c["gemm_s"] + c["lm_head_s"] + c["decode_attention_s"] + c["tp_allreduce_s"]
        # launch_s is L x 1 us here: the coefficient comes out in microseconds per layer
        row = np.array([c["launch_s"], c["elementwise_s"], c["prefill_attention_s"]]) / point.measured_s
        design.append(row)
        target.append(1.0 - fixed / point.measured_s)
    coef, *_ = np.linalg.lstsq(np.array(design), np.array(target), rcond=None)
    launch_us, inverse_frac, attention = (float(c) for c in coef)
    if launch_us <= 0 or inverse_frac <= 0 or attention <= 0:
        raise ValueError(f"fit left the physical range: {launch_us=:.3g}, {inverse_frac=:.3g}, {attention=:.3g}")
    return StepOverheads(0.0, launch_us * 1e-6, 1.0 / inverse_frac, attention)


def summarize(errors: list[tuple[StepPoint, float, float]]) -> dict[str, tuple[float, float, int]]:
    """``source -> (median |error|, worst |error|, points)`` per file and for ``all``."""
    groups: dict[str, list[float]] = {"all": []}
    for point, _, error in errors:
        groups.setdefault(point.source, []).append(abs(error))
        groups["all"].append(abs(error))
    return {k: (float(np.median(v)), float(np.max(v)), len(v)) for k, v in groups.items() if v}
