"""Which part of the source a plan covered, and how that part compares with the whole.

A probe replays a part of its source: the whole trace (time-compressed by the rate multiplier ``m``), a window
of it that holds its peak, or, with ``--horizon H``, the first ``m × H`` seconds of trace time (tiled when the
trace is shorter). :func:`workload_stats` summarises a request stream the same way for both: request rate,
burstiness (coefficient of variation of the per-minute request counts and their peak-to-mean ratio, the minute of
the peak) and the input/output length percentiles. :func:`compare_stats` names every material difference
between a part and the whole (thresholds in :data:`MATERIAL`), and :func:`coverage` puts it together for a
planner scenario. Every figure is in the source's own time (multiplier 1).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agents.planning.inputs import PlanSource
from env.scenario import Scenario
from env.workloads.generate import generate_columns
from policies.scoring import quantile

__all__ = [
    "MATERIAL",
    "Coverage",
    "WorkloadStats",
    "compare_stats",
    "coverage_of",
    "covered_interval_s",
    "scenario_requests",
    "workload_stats",
]

BIN_S = 60.0
"""Burstiness is measured on per-minute request counts."""
MATERIAL = {"rate": 0.25, "minute_cv": 0.35, "peak_to_mean": 0.35, "length": 0.25}
"""Relative differences (part vs whole) that count as material: request rate, per-minute CV, peak-to-mean, and each
of the input/output length p50 and p99."""


@dataclass(frozen=True, slots=True)
class WorkloadStats:
    """Summary of a request stream over ``span_s`` seconds (source time)."""

    requests: int
    span_s: float
    rate_rps: float
    minute_cv: float
    """Coefficient of variation of the per-minute request counts (0 for a span under two minutes)."""
    peak_to_mean: float
    """Busiest minute's count / the mean per-minute count."""
    peak_minute_s: float
    """Start of the busiest minute (source time)."""
    input_p50_tokens: float
    input_p90_tokens: float
    input_p99_tokens: float
    output_p50_tokens: float
    output_p90_tokens: float
    output_p99_tokens: float

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


def workload_stats(
    arrival_s: NDArray[np.float64],
    input_tokens: NDArray[np.int64],
    output_tokens: NDArray[np.int64],
    span_s: float,
) -> WorkloadStats:
    """Rate, per-minute burstiness and length percentiles of requests arriving in ``[0, span_s)``."""
    bins = max(math.ceil(span_s / BIN_S), 1)
    counts = np.bincount(np.minimum((arrival_s // BIN_S).astype(np.int64), bins - 1), minlength=bins)
    full = counts[: max(int(span_s // BIN_S), 1)]  # a trailing partial minute would look like a lull
    mean = float(full.mean()) if len(full) else 0.0
    cv = float(full.std() / mean) if mean > 0 and len(full) > 1 else 0.0
    peak = int(np.argmax(counts)) if len(arrival_s) else 0

    def q(values: NDArray[np.int64], level: float) -> float:
        value = quantile(values.astype(float), level)
        return float("nan") if value is None else value

    return WorkloadStats(
        requests=len(arrival_s),
        span_s=span_s,
        rate_rps=len(arrival_s) / span_s if span_s > 0 else 0.0,
        minute_cv=cv,
        peak_to_mean=float(counts[peak] / mean) if mean > 0 else 0.0,
        peak_minute_s=peak * BIN_S,
        input_p50_tokens=q(input_tokens, 0.5),
        input_p90_tokens=q(input_tokens, 0.9),
        input_p99_tokens=q(input_tokens, 0.99),
        output_p50_tokens=q(output_tokens, 0.5),
        output_p90_tokens=q(output_tokens, 0.9),
        output_p99_tokens=q(output_tokens, 0.99),
    )


def _relative(part: float, whole: float) -> float:
    if not (math.isfinite(part) and math.isfinite(whole)):
        return 0.0
    if whole == 0:
        return 0.0 if part == 0 else math.inf
    return abs(part - whole) / abs(whole)


def compare_stats(part: WorkloadStats, whole: WorkloadStats) -> list[str]:
    """One line per material difference between ``part`` and ``whole`` (thresholds: :data:`MATERIAL`)."""
    out: list[str] = []
    if _relative(part.rate_rps, whole.rate_rps) > MATERIAL["rate"]:
        out.append(f"request rate {part.rate_rps:.3g} req/s vs {whole.rate_rps:.3g} req/s over the whole source")
    if whole.span_s >= 2 * BIN_S:
        if _relative(part.minute_cv, whole.minute_cv) > MATERIAL["minute_cv"]:
            out.append(f"burstiness (CV of per-minute counts) {part.minute_cv:.2f} vs {whole.minute_cv:.2f}")
        if _relative(part.peak_to_mean, whole.peak_to_mean) > MATERIAL["peak_to_mean"]:
            out.append(f"peak-to-mean per minute {part.peak_to_mean:.2f} vs {whole.peak_to_mean:.2f}")
    for name in ("input_p50", "input_p99", "output_p50", "output_p99"):
        a, b = getattr(part, f"{name}_tokens"), getattr(whole, f"{name}_tokens")
        if _relative(a, b) > MATERIAL["length"]:
            out.append(f"{name.replace('_', ' ')} {a:.0f} vs {b:.0f} tokens")
    return out


@dataclass(slots=True)
class Coverage:
    """Which part of the source the plan's probes covered (``description``), and its comparison with the whole."""

    mode: str
    """``whole`` (every probe replays all of it), ``peak-window`` (a window holding the peak), ``horizon``
    (``--horizon``: the first seconds), ``stationary`` (a synthetic stationary workload: any window alike) or
    ``fitted`` (a router log fitted to a stationary workload, compared with the log's own requests)."""
    description: str
    covered: WorkloadStats
    whole: WorkloadStats
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "mode": self.mode,
            "description": self.description,
            "covered": self.covered.as_dict(),
            "whole": self.whole.as_dict(),
            "warnings": list(self.warnings),
        }


def scenario_requests(
    scenario: Scenario, duration_s: float
) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]:
    """Arrivals, input and output lengths of every tenant of ``scenario`` on ``[0, duration_s)``, merged and sorted.

    Synthetic tenants draw from generators seeded with the scenario's seed (tenant ``i`` from ``seed + i``).
    """
    arrivals, inputs, outputs = [], [], []
    for index, tenant in enumerate(scenario.tenants):
        columns = generate_columns(tenant.workload, np.random.default_rng(scenario.seed + index), duration_s)
        arrivals.append(columns.arrival_s)
        inputs.append(columns.input_tokens)
        outputs.append(columns.output_tokens)
    arrival = np.concatenate(arrivals) if arrivals else np.zeros(0)
    order = np.argsort(arrival, kind="stable")
    return (
        arrival[order],
        np.concatenate(inputs)[order] if inputs else np.zeros(0, np.int64),
        np.concatenate(outputs)[order] if outputs else np.zeros(0, np.int64),
    )


def coverage_of(source: PlanSource, rate_scale: float) -> Coverage:
    """What the probes at ``rate_scale`` covered of ``source`` and how it compares with the whole (module doc).

    A trace under ``--horizon`` covers trace time ``[0, rate_scale × horizon)`` (tiled past the trace's end); every
    other part is the searched scenario's own duration at multiplier 1.
    """
    scenario, whole = source.scenario, source.whole
    duration_s = scenario.duration_s
    tiled = source.mode == "horizon" and _trace_time(scenario)
    if tiled:
        duration_s = scenario.duration_s * rate_scale
    part = workload_stats(*scenario_requests(scenario, duration_s), duration_s)
    if source.observed is not None:  # a fitted router log or a ServeGen day: compared with those requests
        arrival, inputs, outputs = source.observed
        gap_s = float(arrival[-1]) / max(len(arrival) - 1, 1) if len(arrival) else 1.0
        full = workload_stats(arrival, inputs, outputs, max(float(arrival[-1]) + gap_s if len(arrival) else 0.0, 1.0))
    else:
        full = workload_stats(*scenario_requests(whole, whole.duration_s), whole.duration_s)
    material = source.mode in ("horizon", "peak-window", "fitted")
    warnings = compare_stats(part, full) if material else []
    description = source.description
    if source.mode == "horizon":
        left = max(full.requests - part.requests, 0) if not tiled or duration_s < whole.duration_s else 0
        covered_s = min(duration_s, whole.duration_s)
        description += (
            f"; at the recommended multiplier x{rate_scale:.3g} that is {covered_s:.0f} s of {whole.duration_s:.0f} s, "
            f"leaving out {left} of {full.requests} requests"
        )
        if full.peak_minute_s >= covered_s:
            warnings.append(f"the busiest minute (at {full.peak_minute_s:.0f} s of the source) is not covered")
    if warnings:
        remedy = {
            "horizon": "drop --horizon to plan all",
            "peak-window": "raise --max-whole-requests to plan all"
            if source.observed is None
            else "a plan for the busiest window of the day",
        }.get(source.mode, "the fit is stationary: plan a scenario of the log's peak")
        warnings.insert(0, f"the planned part differs materially from the whole source ({remedy}):")
    return Coverage(source.mode, description, part, full, warnings)


def covered_interval_s(source: PlanSource, rate_scale: float) -> tuple[float, float]:
    """The source-time interval a probe at ``rate_scale`` replays (past the source's end: tiled from its start)."""
    scenario = source.scenario
    if source.mode == "peak-window":
        workload = scenario.tenants[0].workload
        start_s = float(getattr(workload, "start_s", 0.0))
        return start_s, start_s + float(getattr(workload, "duration_s", None) or scenario.duration_s)
    tiled = source.mode == "horizon" and _trace_time(scenario)
    return 0.0, scenario.duration_s * (rate_scale if tiled else 1.0)


def _trace_time(scenario: Scenario) -> bool:
    """Whether the rate multiplier compresses the source's time (trace replays and ServeGen sampling)."""
    return all(t.workload.kind in ("trace_azure", "trace_mooncake", "servegen") for t in scenario.tenants)
