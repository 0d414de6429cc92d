"""One scored evaluation run, and many in parallel: a policy on a scenario and seed → rows per tenant.

:func:`run_one` builds the policy (:func:`agents.policy_specs.make_policy`) and its env
(:func:`agents.runs.episode_env`), runs the episode (:func:`agents.runs.run_episode`: every interval through the
env's guard and simulator, then the drain) and scores it, as :mod:`policies.scoring` defines: per tenant (and an
``ALL`` row) TTFT/TPOT p50/p95/p99 over finished requests; SLO attainment = requests meeting both objectives /
requests that arrived in the episode (failed and unfinished requests count as misses); goodput = SLO-meeting
requests per second of ``duration_s``; goodput per GPU = goodput / mean GPUs held; GPU-seconds (the tenant's
group; the cluster for ``ALL``); churn = instances added, removed or switched; failures; KV bytes transferred.
``ALL`` also carries the priority-weighted goodput (the ranking metric) and the episode return.
:func:`run_many` spreads runs over processes; :mod:`agents.evaluate` and :mod:`agents.grid_search` use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from agents.lookahead import LookaheadPolicy
from agents.policy_specs import make_policy
from agents.runs import episode_env, run_episode, scale_rates
from env.gym_env import ControlStep, PDClusterEnv, resolve_scenario
from env.sim.records import SimRequest
from env.sim.simulator import ClusterSimulator
from policies.admission import AdmissionConfig
from policies.guard import GuardLimits
from policies.schema import Tenant
from policies.scoring import quantiles, slo_attainment_frac, slo_met_mask
from policies.watchdog import SloWatchdog

__all__ = [
    "ALL_TENANTS",
    "METRICS",
    "RunResult",
    "RunSpec",
    "guard_changes",
    "run_label",
    "run_many",
    "run_one",
    "run_one_safe",
    "slo_met",
    "slo_met_arrivals_s",
    "weighted_goodput_rps",
]

ALL_TENANTS = "ALL"
_CDF_SAMPLES = 4000

METRICS: tuple[str, ...] = (
    "arrived",
    "finished",
    "failed",
    "ttft_p50_s",
    "ttft_p95_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p95_s",
    "tpot_p99_s",
    "slo_attainment_frac",
    "goodput_rps",
    "weighted_goodput_rps",
    "offered_weighted_rps",
    "goodput_per_gpu_rps",
    "gpu_seconds",
    "churn_changes",
    "transfer_bytes",
    "episode_return",
)
"""Numeric columns of a result row (``weighted_goodput_rps``, ``offered_weighted_rps`` and ``episode_return`` only
on ``ALL`` rows). ``offered_weighted_rps`` is Σ priority × arrivals / duration: the weighted goodput of a run in
which every arriving request met both SLOs — a ceiling no policy can pass on that seed."""


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One evaluation run (picklable: it crosses process boundaries)."""

    policy: str
    scenario_path: str
    seed: int
    rate_scale: float = 1.0
    record: bool = False
    """Keep the decision timeline and TTFT/TPOT samples (for plots)."""
    grid_point: dict[str, Any] | None = None
    traces_dir: str | None = None
    candidate_points: tuple[dict[str, Any], ...] = ()
    """``expert:H`` only: the static configurations among its candidates."""
    admission_ttft_slack_frac: float | None = None
    """The router's admission stage (:class:`policies.admission.AdmissionConfig`); None: every request admitted."""
    guard: GuardLimits | None = None
    """The safety guard's limits; None: the controller's defaults (``GuardLimits()``)."""

    @property
    def label(self) -> str:
        """The policy as result rows name it (:func:`run_label`)."""
        return run_label(self.policy, self.admission_ttft_slack_frac, self.guard)


def run_label(policy: str, admission_ttft_slack_frac: float | None, guard: GuardLimits | None = None) -> str:
    """A policy as result rows name it.

    Its spec, with ``+admission`` (and the slack unless 1) behind admission, and ``+guard[FIELD=VALUE,...]`` (the
    limits that differ from the controller's defaults) under another guard.
    """
    label = policy
    if admission_ttft_slack_frac == 1.0:
        label = f"{label}+admission"
    elif admission_ttft_slack_frac is not None:
        label = f"{label}+admission{admission_ttft_slack_frac:g}"
    changed = guard_changes(guard)
    if changed:
        label += "+guard[" + ",".join(f"{name}={value:g}" for name, value in changed.items()) + "]"
    return label


def guard_changes(guard: GuardLimits | None) -> dict[str, float]:
    """The limits of ``guard`` that differ from the controller's defaults (``GuardLimits()``), by field name."""
    if guard is None:
        return {}
    default = GuardLimits()
    return {
        f.name: float(getattr(guard, f.name))
        for f in fields(GuardLimits)
        if getattr(guard, f.name) != getattr(default, f.name)
    }


@dataclass(slots=True)
class RunResult:
    """Rows (one per tenant plus ``ALL``) and, when recorded, the timeline and latency samples."""

    spec: RunSpec
    scenario: str
    rows: list[dict[str, Any]]
    timeline: list[dict[str, Any]] = field(default_factory=list)
    samples: dict[str, list[float]] = field(default_factory=dict)
    wall_s: float = 0.0
    error: str | None = None
    """Set when the run raised (the simulator or the policy); such a run has no rows."""
    expert_choices: dict[str, int] = field(default_factory=dict)
    """``expert:H`` only: how many intervals the expert acted as each candidate."""
    watchdog: dict[str, int] = field(default_factory=dict)
    """``watchdog:`` only: ``trips`` and ``fallback_intervals`` (intervals the fallback decided)."""


@dataclass(slots=True)
class _Tally:
    """What :func:`run_one` adds up over the control intervals."""

    episode_return: float = 0.0
    churn: int = 0
    fallback_intervals: int = 0
    timeline: list[dict[str, Any]] = field(default_factory=list)
    gpu_seconds_total: float = 0.0
    group_gpu_s: dict[str, float] = field(default_factory=dict)


def _quantiles(values: np.ndarray) -> tuple[float | None, float | None, float | None]:
    p50, p95, p99 = quantiles(values, (0.5, 0.95, 0.99))
    return p50, p95, p99


def _slo_met_mask(sim: ClusterSimulator, tenant_index: int) -> tuple[list[SimRequest], np.ndarray]:
    finished: list[SimRequest] = sim.finished[tenant_index]
    ttft = np.fromiter((r.ttft_s for r in finished), dtype=np.float64, count=len(finished))
    tpot = np.fromiter((r.tpot_s for r in finished), dtype=np.float64, count=len(finished))
    return finished, slo_met_mask(ttft, tpot, sim.slo_ttft_s[tenant_index], sim.slo_tpot_s[tenant_index])


def slo_met(sim: ClusterSimulator, tenant_index: int) -> int:
    """Finished requests of one tenant that met both its TTFT and TPOT objectives (:mod:`policies.scoring`)."""
    return int(np.count_nonzero(_slo_met_mask(sim, tenant_index)[1]))


def slo_met_arrivals_s(sim: ClusterSimulator, tenant_index: int) -> np.ndarray:
    """Arrival times (s) of one tenant's requests that met both objectives (those :func:`slo_met` counts)."""
    finished, mask = _slo_met_mask(sim, tenant_index)
    arrivals = np.fromiter((r.arrival_s for r in finished), dtype=np.float64, count=len(finished))
    out: np.ndarray = arrivals[mask]
    return out


def weighted_goodput_rps(sim: ClusterSimulator, tenants: Sequence[Tenant], duration_s: float) -> float:
    """Priority-weighted goodput of a drained run: Σ priority × (requests meeting both SLOs) / duration."""
    return sum(t.priority * slo_met(sim, ti) / duration_s for ti, t in enumerate(tenants))


def run_one(spec: RunSpec) -> RunResult:
    """Run one policy on one scenario and seed through the env (:func:`agents.runs.run_episode`), then score it."""
    start = time.perf_counter()
    scenario = scale_rates(resolve_scenario(Path(spec.scenario_path), spec.traces_dir), spec.rate_scale)
    policy = make_policy(spec.policy, scenario, spec.grid_point, spec.candidate_points)
    try:  # only a learned policy fixes the slot layout; rule policies run scenarios of any size
        env = episode_env(
            scenario,
            policy,
            spec.traces_dir,
            admission=AdmissionConfig(spec.admission_ttft_slack_frac),
            guard_limits=spec.guard,
        )
    except ValueError as exc:
        raise ValueError(f"policy {spec.policy}: {exc}") from None
    tally = _Tally()

    def on_interval(env: PDClusterEnv, step: ControlStep) -> None:
        if isinstance(policy, SloWatchdog) and policy.state.in_fallback:
            tally.fallback_intervals += 1
        tally.episode_return += step.reward
        tally.churn += step.changes
        if spec.record:
            tally.timeline.append(_timeline_row(env))

    def at_horizon(env: PDClusterEnv) -> None:  # GPU-seconds over the horizon, before the drain
        tally.gpu_seconds_total = env.sim.gpu_seconds()
        tally.group_gpu_s = {g.name: env.sim.gpu_seconds(gi) for gi, g in enumerate(env.groups)}

    sim = run_episode(env, policy, spec.seed, on_interval, at_horizon).sim
    episode_return, churn, timeline = tally.episode_return, tally.churn, tally.timeline
    gpu_seconds_total, group_gpu_s, duration_s = tally.gpu_seconds_total, tally.group_gpu_s, env.scenario.duration_s
    rows: list[dict[str, Any]] = []
    samples: dict[str, list[float]] = {}
    all_met = all_arrived = 0
    weighted = offered = 0.0
    for ti, tenant in enumerate(env.tenants):
        arrived: list[SimRequest] = sim.arrived[ti]
        finished: list[SimRequest] = sim.finished[ti]
        ttft = np.array([r.ttft_s for r in finished], dtype=np.float64)
        tpot = np.array([r.tpot_s for r in finished if r.output_tokens > 1], dtype=np.float64)
        met = slo_met(sim, ti)
        group_gpus = group_gpu_s[tenant.group] / duration_s
        row = _row(spec, env.scenario.name, tenant.name)
        row.update(
            arrived=len(arrived),
            finished=len(finished),
            failed=sum(1 for r in arrived if r.status == SimRequest.FAILED),
            slo_attainment_frac=slo_attainment_frac(met, len(arrived)),
            goodput_rps=met / duration_s,
            goodput_per_gpu_rps=(met / duration_s) / group_gpus if group_gpus > 0 else None,
            gpu_seconds=group_gpu_s[tenant.group],
            transfer_bytes=float(sum(r.transfer_bytes for r in arrived)),
        )
        row["ttft_p50_s"], row["ttft_p95_s"], row["ttft_p99_s"] = _quantiles(ttft)
        row["tpot_p50_s"], row["tpot_p95_s"], row["tpot_p99_s"] = _quantiles(tpot)
        rows.append(row)
        all_met += met
        all_arrived += len(arrived)
        weighted += tenant.priority * met / duration_s
        offered += tenant.priority * len(arrived) / duration_s
        if spec.record:
            samples[f"{tenant.name}/ttft_s"] = _subsample(ttft)
            samples[f"{tenant.name}/tpot_s"] = _subsample(tpot)
    total = _row(spec, env.scenario.name, ALL_TENANTS)
    finished_all = [r for per in sim.finished for r in per]
    ttft_all = np.array([r.ttft_s for r in finished_all], dtype=np.float64)
    tpot_multi = np.array([r.tpot_s for r in finished_all if r.output_tokens > 1], dtype=np.float64)
    gpus = gpu_seconds_total / duration_s
    total.update(
        arrived=all_arrived,
        finished=len(finished_all),
        failed=sum(r["failed"] for r in rows),
        slo_attainment_frac=slo_attainment_frac(all_met, all_arrived),
        goodput_rps=all_met / duration_s,
        weighted_goodput_rps=weighted,
        offered_weighted_rps=offered,
        goodput_per_gpu_rps=(all_met / duration_s) / gpus if gpus > 0 else None,
        gpu_seconds=gpu_seconds_total,
        churn_changes=churn,
        transfer_bytes=float(sum(r["transfer_bytes"] for r in rows)),
        episode_return=episode_return,
    )
    total["ttft_p50_s"], total["ttft_p95_s"], total["ttft_p99_s"] = _quantiles(ttft_all)
    total["tpot_p50_s"], total["tpot_p95_s"], total["tpot_p99_s"] = _quantiles(tpot_multi)
    for row in rows:
        row["churn_changes"] = churn
    rows.append(total)
    choices = dict(policy.chosen_intervals) if isinstance(policy, LookaheadPolicy) else {}
    watchdog = (
        {"trips": policy.state.trips, "fallback_intervals": tally.fallback_intervals}
        if isinstance(policy, SloWatchdog)
        else {}
    )
    wall_s = time.perf_counter() - start
    return RunResult(
        spec, env.scenario.name, rows, timeline, samples, wall_s, expert_choices=choices, watchdog=watchdog
    )


def run_one_safe(spec: RunSpec) -> RunResult:
    """:func:`run_one`, but an exception becomes a :class:`RunResult` with ``error`` set (the batch goes on)."""
    try:
        return run_one(spec)
    except Exception as exc:  # a crash of one run must not lose the others; it is reported, never hidden
        return RunResult(spec, Path(spec.scenario_path).stem, [], error=f"{type(exc).__name__}: {exc}")


def _row(spec: RunSpec, scenario: str, tenant: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "policy": spec.label,
        "scenario": scenario,
        "seed": spec.seed,
        "rate_scale": spec.rate_scale,
        "tenant": tenant,
    }
    row.update(dict.fromkeys(METRICS))
    return row


def _subsample(values: np.ndarray) -> list[float]:
    if values.size <= _CDF_SAMPLES:
        return [float(v) for v in np.sort(values)]
    index = np.linspace(0, values.size - 1, _CDF_SAMPLES).round().astype(np.int64)
    return [float(v) for v in np.sort(values)[index]]


def _timeline_row(env: PDClusterEnv) -> dict[str, Any]:
    window = env.observation().window
    row: dict[str, Any] = {"t_s": env.sim.now_s}
    for name, pools in env.current_pools().items():
        row[f"{name}/prefill"] = pools.num_prefill
        row[f"{name}/decode"] = pools.num_decode
    for tenant in env.tenants:
        tw = window.tenants.get(tenant.name)
        row[f"{tenant.name}/rate_rps"] = None if tw is None else tw.request_rate_rps
        row[f"{tenant.name}/slo_attainment_frac"] = None if tw is None else tw.slo_attainment_frac
        thresholds = env.thresholds[tenant.name]
        row[f"{tenant.name}/min_remote_input_tokens"] = (
            thresholds.min_remote_input_tokens if thresholds.disaggregation_enabled else None
        )
        row[f"{tenant.name}/rule"] = thresholds.rule.value
    return row


def _executor(workers: int) -> Executor:
    return ProcessPoolExecutor(max_workers=max(workers, 1))


def run_many(
    specs: Sequence[RunSpec], workers: int, on_done: Callable[[RunResult], None] | None = None
) -> list[RunResult]:
    """Run specs in parallel processes (in order of submission in the returned list)."""
    if workers <= 1:
        results = []
        for spec in specs:
            result = run_one_safe(spec)
            if on_done is not None:
                on_done(result)
            results.append(result)
        return results
    out: list[RunResult | None] = [None] * len(specs)
    with _executor(workers) as pool:
        futures = {pool.submit(run_one_safe, spec): i for i, spec in enumerate(specs)}
        for future in as_completed(futures):
            result = future.result()
            out[futures[future]] = result
            if on_done is not None:
                on_done(result)
    return [r for r in out if r is not None]
