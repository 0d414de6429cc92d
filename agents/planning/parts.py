"""Which part of a source the planner's probes replay: the whole, a window around its peak, or the first seconds.

:func:`choose_part` picks it for the tenants of a planner source (:func:`agents.planning.inputs.load_plan_source`
builds the scenarios) and returns a :class:`PlanSource`: the searched scenario, the whole source (what the
validation replay runs) and a description; :func:`time_compressed` says whether a probe at multiplier ``m``
lasts ``1 / m`` as long (a fixed window of a trace replayed faster).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from env.scenario import Scenario, TenantConfig
from env.workloads.config import AzureTraceWorkload, MooncakeTraceWorkload, ServeGenWorkload
from env.workloads.generate import generate_columns, load_trace_cached
from env.workloads.traces.servegen import SERVEGEN_WINDOW_S, load_servegen_folder

__all__ = [
    "MAX_WHOLE_REQUESTS",
    "STATIONARY_MAX_S",
    "STATIONARY_MIN_S",
    "STATIONARY_REQUESTS",
    "PlanSource",
    "choose_part",
    "plannable_without_duration",
    "time_compressed",
]

MAX_WHOLE_REQUESTS = 50_000
"""A trace with more requests is planned over the window of this many requests (at its mean rate) around its peak."""
STATIONARY_REQUESTS = 5_000
"""A stationary synthetic source (Poisson or Gamma arrivals, a fixed length mix) is planned over as many seconds as
hold this many requests at its rate, within [:data:`STATIONARY_MIN_S`, :data:`STATIONARY_MAX_S`] and at most the
scenario's own duration: queues that build up slowly under overload show within that time."""
STATIONARY_MIN_S = 60.0
STATIONARY_MAX_S = 600.0
_STATIONARY_KINDS = ("poisson", "gamma")


@dataclass(frozen=True, slots=True)
class PlanSource:
    """What the planner plans over: the searched scenario, the whole source, and which part the probes cover."""

    scenario: Scenario
    """What every search probe runs, at rate multiplier 1."""
    whole: Scenario
    """The whole source at multiplier 1 (the validation replay runs it at the recommended multiplier)."""
    mode: str
    """``whole``, ``peak-window``, ``horizon`` (``--horizon``), ``stationary`` or ``fitted`` (a router log)."""
    description: str
    """Which part of the source a probe covers, in words."""
    observed: tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]] | None = None
    """The requests the planned part is compared with when ``whole`` is not the whole source (a router log's own
    requests, a ServeGen day sampled once): arrivals from 0, input and output tokens."""


def _replay_span_s(workload: AzureTraceWorkload | MooncakeTraceWorkload) -> tuple[NDArray[np.float64], float]:
    """A trace's arrivals (from 0) and its span: to the last request plus one mean gap."""
    arrival = load_trace_cached(workload).arrival_s
    last = float(arrival[-1]) if len(arrival) else 0.0
    gap = last / (len(arrival) - 1) if len(arrival) > 1 else 1.0
    return arrival, max(last + gap, 1.0)


def plannable_without_duration(kinds: AbstractSet[str]) -> bool:
    """Whether :func:`choose_part` can pick a part of tenants of these workload kinds with no duration of their own.

    Traces (Azure, Mooncake) replay their own span, stationary synthetic workloads (Poisson, Gamma) run long enough
    for :data:`STATIONARY_REQUESTS`, a ServeGen folder its busiest window; anything else (a diurnal or step
    workload, or a mix of those classes) runs a scenario's own duration, which a fitted-workload file does not have.
    """
    return kinds <= {"trace_azure", "trace_mooncake"} or kinds <= set(_STATIONARY_KINDS) or kinds == {"servegen"}


def choose_part(
    tenants: Sequence[TenantConfig],
    own_duration_s: float | None,
    horizon_s: float | None,
    build: Callable[[float, Sequence[TenantConfig]], Scenario],
    max_whole_requests: int = MAX_WHOLE_REQUESTS,
) -> PlanSource:
    """Which part of the source the probes replay (see :func:`load_plan_source`)."""
    kinds = {t.workload.kind for t in tenants}
    replay = own_duration_s is None and kinds <= {"trace_azure", "trace_mooncake"}
    if replay:
        tenant = tenants[0]
        workload = tenant.workload
        assert isinstance(workload, AzureTraceWorkload | MooncakeTraceWorkload)
        arrival, span_s = _replay_span_s(workload)
        whole_w = workload.model_copy(update={"start_s": 0.0, "duration_s": span_s, "repeat": False})
        whole = build(span_s, [tenant.model_copy(update={"workload": whole_w})])
        if horizon_s is not None:
            tiled = workload.model_copy(update={"start_s": 0.0, "duration_s": None, "repeat": True})
            scenario = build(horizon_s, [tenant.model_copy(update={"workload": tiled})])
            text = (
                f"--horizon {horizon_s:g}: each probe replays the first m x {horizon_s:g} s of the "
                f"{span_s:.0f}-s trace (m = rate multiplier; tiled when longer)"
            )
            return PlanSource(scenario, whole, "horizon", text)
        if len(arrival) <= max_whole_requests:
            text = f"every probe replays the whole {span_s:.0f}-s trace ({len(arrival)} requests), time-compressed by m"
            return PlanSource(whole, whole, "whole", text)
        length_s = span_s * max_whole_requests / len(arrival)
        counts = np.bincount((arrival // 60.0).astype(np.int64))
        peak_s = 60.0 * int(np.argmax(counts)) + 30.0
        start_s = min(max(peak_s - length_s / 2, 0.0), span_s - length_s)
        window_w = workload.model_copy(update={"start_s": start_s, "duration_s": length_s, "repeat": False})
        scenario = build(length_s, [tenant.model_copy(update={"workload": window_w})])
        text = (
            f"every probe replays trace time {start_s:.0f}-{start_s + length_s:.0f} s of {span_s:.0f} s "
            f"(the window of {max_whole_requests} requests at the mean rate, centred on the busiest minute at "
            f"{peak_s - 30:.0f} s)"
        )
        return PlanSource(scenario, whole, "peak-window", text)
    stationary = kinds <= set(_STATIONARY_KINDS)
    if stationary:
        rate_rps = sum(getattr(t.workload, "rate_rps", 0.0) for t in tenants)
        whole_s = min(max(STATIONARY_REQUESTS / max(rate_rps, 1e-9), STATIONARY_MIN_S), STATIONARY_MAX_S)
        whole_s = min(whole_s, own_duration_s or whole_s)
        whole = build(whole_s, tenants)
        if horizon_s is None:
            text = (
                f"stationary synthetic workload: every probe runs {whole_s:.0f} s of arrivals (about "
                f"{rate_rps * whole_s:.0f} requests at x1; any window that long is statistically alike)"
            )
            return PlanSource(whole, whole, "stationary", text)
        text = f"--horizon {horizon_s:g}: each probe runs {horizon_s:g} s of arrivals (validation: {whole_s:.0f} s)"
        return PlanSource(build(horizon_s, tenants), whole, "horizon", text)
    if own_duration_s is None and kinds == {"servegen"}:  # a ServeGen folder: a day of per-client distributions
        return _servegen_part(tenants[0], horizon_s, build, max_whole_requests)
    if own_duration_s is None:  # load_plan_source refuses such a source (plannable_without_duration)
        raise ValueError(f"workloads of kinds {sorted(kinds)} need the source's own duration to be planned")
    whole_s = own_duration_s
    whole = build(whole_s, tenants)
    if horizon_s is None:
        return PlanSource(whole, whole, "whole", f"every probe runs the source's whole {whole_s:g} s")
    text = f"--horizon {horizon_s:g}: each probe runs the first {horizon_s:g} s of the source's {whole_s:g} s"
    return PlanSource(build(horizon_s, tenants), whole, "horizon", text)


def _servegen_part(
    tenant: TenantConfig,
    horizon_s: float | None,
    build: Callable[[float, Sequence[TenantConfig]], Scenario],
    max_whole_requests: int,
) -> PlanSource:
    """The busiest :data:`SERVEGEN_WINDOW_S` of a ServeGen day (fewer seconds above ``max_whole_requests``).

    The day is sampled once (the scenario's seed) to compare the window with; the validation replay samples the
    window again on its own seed (a whole day is too long to replay).
    """
    workload = tenant.workload
    assert isinstance(workload, ServeGenWorkload)
    clients = load_servegen_folder(workload.path, workload.clients)
    totals: dict[float, float] = {}
    for client in clients:
        for start_s, rate_rps in zip(client.window_start_s, client.rate_rps, strict=True):
            totals[float(start_s)] = totals.get(float(start_s), 0.0) + float(rate_rps)
    day_s = max(totals, default=0.0) + SERVEGEN_WINDOW_S
    day = build(day_s, [tenant])
    columns = generate_columns(workload, np.random.default_rng(day.seed), day_s)
    observed = (columns.arrival_s, columns.input_tokens, columns.output_tokens)
    if horizon_s is not None:
        text = f"--horizon {horizon_s:g}: each probe samples the first m x {horizon_s:g} s of the {day_s:.0f}-s day"
        first = build(horizon_s, [tenant])
        return PlanSource(first, first, "horizon", text, observed)
    peak_s = max(totals, key=lambda start: totals[start], default=0.0)
    length_s = min(SERVEGEN_WINDOW_S, max_whole_requests / max(totals.get(peak_s, 0.0), 1e-9))
    window = workload.model_copy(update={"start_s": peak_s, "duration_s": length_s})
    scenario = build(length_s, [tenant.model_copy(update={"workload": window})])
    text = (
        f"ServeGen: every probe samples the busiest {length_s:.0f} s of the {day_s:.0f}-s day (from {peak_s:.0f} s, "
        f"{totals.get(peak_s, 0.0):.1f} req/s), time-compressed by m; the validation replay samples it again"
    )
    return PlanSource(scenario, scenario, "peak-window", text, observed)


def time_compressed(scenario: Scenario) -> bool:
    """Whether every tenant replays a fixed trace window once (no repeat; a ServeGen window samples one).

    Then a probe at multiplier ``m`` lasts ``duration_s / m``: it covers the same window at every multiplier.
    """
    return all(
        isinstance(t.workload, AzureTraceWorkload | MooncakeTraceWorkload | ServeGenWorkload)
        and not getattr(t.workload, "repeat", False)
        and t.workload.duration_s is not None
        for t in scenario.tenants
    )
