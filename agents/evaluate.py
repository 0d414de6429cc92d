"""Evaluate policies over scenarios and seeds: one loop, the same env and guard for every policy.

Every run drives :class:`env.gym_env.PDClusterEnv` with ``policy.decide(observation, context)`` once per control
interval (:meth:`~env.gym_env.PDClusterEnv.control`: guard, apply, simulate), then lets in-flight requests
finish (:meth:`~env.gym_env.PDClusterEnv.drain`) and scores the run. Baselines, rule files, the grid-searched
static optimum and learned policies are therefore judged by the very same code path.

Policy specs: ``baseline:NAME`` (:mod:`policies.baselines`, plus ``queue_kv`` of :mod:`policies.rules`),
``file:PATH`` (a policy file; each scenario tenant gets the file's thresholds for it), ``grid:`` (the best
static configuration of :mod:`agents.grid_search` for the scenario), ``learned:PATH``
(:meth:`policies.learned.LearnedPolicy.load`) and ``expert:H`` (:class:`agents.lookahead.LookaheadPolicy`: the
clairvoyant lookahead expert with an ``H``-interval horizon over :data:`EXPERT_TEACHERS` and the best
:data:`EXPERT_GRID_CANDIDATES` static configurations of the grid on the search seeds; it sees each episode's
future, so it bounds what switching between those candidates can win rather than being a deployable policy).
``watchdog:PRIMARY`` and ``watchdog[FALLBACK]:PRIMARY`` run a ``baseline:``, ``file:`` or ``learned:`` policy under
the SLO watchdog of :mod:`policies.watchdog` (default parameters) with a ``baseline:`` or ``file:`` fallback
(:data:`WATCHDOG_FALLBACK` when none is named), as the controller does with ``watchdog:`` in its configuration.

Scores per tenant (and an ``ALL`` row per run), as :mod:`policies.scoring` defines them: TTFT/TPOT p50/p95/p99
over finished requests; SLO attainment = requests meeting both objectives / requests that arrived in the episode
(failed and unfinished requests count as misses);
goodput = SLO-meeting requests per second of ``duration_s``; goodput per GPU = goodput / mean GPUs held;
GPU-seconds (the tenant's group; the cluster for ``ALL``); churn = instances added, removed or switched;
failures; KV bytes transferred. ``ALL`` also carries the priority-weighted goodput (the ranking metric) and the
episode return. Means over seeds come with a 95 % Student-t confidence half-width.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.lookahead import LookaheadPolicy
from env.gym_env import SCENARIO_DIR, PDClusterEnv, resolve_scenario
from env.perf.model import InterpolatedExecutionTimeModel
from env.scenario import Scenario
from env.sim.build import load_profile
from env.sim.records import SimRequest
from env.sim.simulator import ClusterSimulator
from policies.base import Policy, PolicyContext
from policies.baselines import BASELINES, make_baseline
from policies.features import Observation, ObservationLayout
from policies.policy_file import load_policy_file, resolve_policy
from policies.rules import QueueKvPolicy
from policies.schema import ControlAction, Tenant
from policies.scoring import count_slo_met, quantiles, slo_attainment_frac
from policies.watchdog import FALLBACK_KINDS, SloWatchdog

__all__ = [
    "EXPERT_GRID_CANDIDATES",
    "EXPERT_TEACHERS",
    "METRICS",
    "WATCHDOG_FALLBACK",
    "RunResult",
    "RunSpec",
    "aggregate",
    "all_baseline_specs",
    "evaluate",
    "fixed_layout",
    "load_suites",
    "make_policy",
    "parse_watchdog_spec",
    "profiled_throughputs",
    "run_one",
    "scale_rates",
    "scenario_paths",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
SEED_POLICY_SPEC = "file:policies/examples/seed_pd_policy.yaml"
SUITES_FILE = SCENARIO_DIR / "suites.yaml"
ALL_TENANTS = "ALL"
EXPERT_TEACHERS: tuple[str, ...] = (
    "baseline:aggregated",
    "baseline:dynamo-legacy",
    "baseline:vllm-proxy",
    "baseline:dynamo-isl-or-load",
    "baseline:queue_kv",
)
"""The rule policies among the candidates of ``expert:H``."""
EXPERT_GRID_CANDIDATES = 19
"""Static configurations among the candidates of ``expert:H`` (the best on the grid-search seeds; 19 is the whole
grid of a one-group scenario with four instances)."""
WATCHDOG_FALLBACK = "baseline:dynamo-legacy"
"""The fallback of ``watchdog:PRIMARY`` (the best baseline on most shipped scenarios)."""
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


# ------------------------------------------------------------------------------------------------ scenarios


def load_suites() -> dict[str, list[str]]:
    """The scenario suites of ``experiments/scenarios/suites.yaml`` (suite name → scenario names)."""
    import yaml

    suites: dict[str, list[str]] = yaml.safe_load(SUITES_FILE.read_text(encoding="utf-8")) or {}
    return suites


def scenario_paths(specs: Iterable[str]) -> list[Path]:
    """Scenario files from names, paths or ``suite:NAME`` (a list in ``experiments/scenarios/suites.yaml``)."""
    out: list[Path] = []
    for spec in specs:
        spec = spec.strip()
        if not spec:
            continue
        if spec.startswith("suite:"):
            suites = load_suites()
            name = spec.removeprefix("suite:")
            if name not in suites:
                raise ValueError(f"unknown suite {name!r} (known: {', '.join(sorted(suites))})")
            out.extend(SCENARIO_DIR / f"{n}.yaml" for n in suites[name])
            continue
        path = Path(spec)
        if not path.suffix and not path.exists():
            path = SCENARIO_DIR / f"{spec}.yaml"
        if not path.exists():
            raise ValueError(f"scenario {spec!r}: no such file {path}")
        out.append(path)
    return list(dict.fromkeys(out))


def scale_rates(scenario: Scenario, factor: float) -> Scenario:
    """The scenario with every tenant's request rate multiplied by ``factor`` (trace replays: ``rate_scale``)."""
    if factor == 1.0:
        return scenario
    tenants = []
    for tenant in scenario.tenants:
        w = tenant.workload
        update: dict[str, Any]
        if w.kind in ("poisson", "gamma"):
            update = {"rate_rps": w.rate_rps * factor}  # type: ignore[union-attr]
        elif w.kind == "diurnal":
            update = {"mean_rate_rps": w.mean_rate_rps * factor}  # type: ignore[union-attr]
        elif w.kind == "step":
            segments = tuple(s.model_copy(update={"rate_rps": s.rate_rps * factor}) for s in w.segments)  # type: ignore[union-attr]
            update = {"segments": segments}
        else:
            update = {"rate_scale": w.rate_scale * factor}  # type: ignore[union-attr]
        tenants.append(tenant.model_copy(update={"workload": w.model_copy(update=update)}))
    return scenario.model_copy(update={"tenants": tenants, "name": f"{scenario.name}@x{factor:g}"})


# ------------------------------------------------------------------------------------------------ policies


def profiled_throughputs(scenario: Scenario) -> tuple[float, float]:
    """Per-instance prefill and decode token throughput from the calibrated performance model (Dynamo's profile).

    Prefill: a full ``max_num_batched_tokens`` chunk per step. Decode: the largest batch whose step (at 2,048
    context tokens per sequence) stays within the tightest TPOT objective of the scenario (50 ms when none).
    """
    cluster = scenario.cluster
    profile = load_profile(scenario)
    prefill_model = InterpolatedExecutionTimeModel(profile, cluster.prefill_tp or cluster.tp)
    chunk = cluster.max_num_batched_tokens
    prefill_tokens_per_s = chunk / prefill_model.step_time_s(chunk, 1, 0, 0, [(chunk, 0)])
    targets = [t.slo.to_slo().tpot_target_s() for t in scenario.tenants]
    itl_target_s = min([t for t in targets if math.isfinite(t)], default=0.05)
    decode_model = InterpolatedExecutionTimeModel(profile, cluster.tp, max_batch=cluster.max_num_seqs)
    best = 1.0 / decode_model.decode_step_time_s(1, 2048)
    for batch in range(1, cluster.max_num_seqs + 1):
        step_s = decode_model.decode_step_time_s(batch, 2048 * batch)
        if step_s <= itl_target_s:
            best = batch / step_s
    return prefill_tokens_per_s, best


class TenantFilePolicy:
    """A policy file applied to the scenario's tenants: each tenant gets the file's thresholds for its name."""

    def __init__(self, path: Path, policy_id: str) -> None:
        self._resolved = resolve_policy(load_policy_file(path), str(path))
        self._policy_id = policy_id

    @property
    def policy_id(self) -> str:
        """The spec."""
        return self._policy_id

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """The file's thresholds per tenant (unknown tenants get the file's default); pools held."""
        del observation
        thresholds = {t.name: self._resolved.thresholds_for(t.name) for t in context.tenants}
        return ControlAction(thresholds=thresholds, reason="file_thresholds", policy_id=self._policy_id)


def all_baseline_specs() -> list[str]:
    """Every named baseline, the seed rule file, and the grid-searched static optimum."""
    names = [*BASELINES, "dynamo-throughput", "queue_kv"]
    return [f"baseline:{n}" for n in names] + [SEED_POLICY_SPEC, "grid:"]


def make_policy(
    spec: str,
    scenario: Scenario,
    grid_point: Mapping[str, Any] | None = None,
    candidate_points: Sequence[Mapping[str, Any]] = (),
) -> Policy:
    """Build the policy a spec names, for one scenario.

    ``grid:`` needs the searched ``grid_point``; ``expert:H`` takes ``candidate_points`` (static configurations)
    as candidates besides :data:`EXPERT_TEACHERS`, and must be bound to its simulator before it decides.
    """
    if spec.startswith("watchdog"):
        fallback, primary = parse_watchdog_spec(spec)
        return SloWatchdog(make_policy(primary, scenario), make_policy(fallback, scenario))
    kind, _, argument = spec.partition(":")
    if kind == "baseline":
        if argument == "queue_kv":
            return QueueKvPolicy(policy_id=spec)
        if argument == "dynamo-throughput":
            prefill_tps, decode_tps = profiled_throughputs(scenario)
            return make_baseline(argument, prefill_tokens_per_s=prefill_tps, decode_tokens_per_s=decode_tps)
        return make_baseline(argument)
    if kind == "file":
        path = Path(argument)
        if not path.is_absolute() and not path.exists():
            path = REPO_ROOT / path
        return TenantFilePolicy(path, spec)
    if kind == "grid":
        from agents.grid_search import static_policy

        if grid_point is None:
            raise ValueError("grid: needs the grid-search result of the scenario")
        return static_policy(grid_point, scenario, spec)
    if kind == "learned":
        from policies.artifacts import load_learned

        return load_learned(argument)
    if kind == "expert":
        return _expert(spec, argument, scenario, candidate_points)
    raise ValueError(
        f"policy spec {spec!r}: expected baseline:NAME, file:PATH, grid:, learned:PATH, expert:H or watchdog:PRIMARY"
    )


def parse_watchdog_spec(spec: str) -> tuple[str, str]:
    """``(fallback, primary)`` of ``watchdog:PRIMARY`` or ``watchdog[FALLBACK]:PRIMARY``.

    Raises:
        ValueError: one line naming the spec, when it has another shape, the primary is not a ``baseline:``,
            ``file:`` or ``learned:`` spec, or the fallback is not a ``baseline:`` or ``file:`` spec.
    """
    rest = spec.removeprefix("watchdog")
    if rest.startswith("[") and "]:" in rest:
        fallback, primary = rest[1:].split("]:", 1)
    elif rest.startswith(":"):
        fallback, primary = WATCHDOG_FALLBACK, rest[1:]
    else:
        raise ValueError(f"policy spec {spec!r}: expected watchdog:PRIMARY or watchdog[FALLBACK]:PRIMARY")
    if not primary.startswith(("baseline:", "file:", "learned:")) or primary.endswith(":"):
        raise ValueError(
            f"policy spec {spec!r}: the watchdog's primary must be baseline:NAME, file:PATH or learned:PATH"
        )
    if not fallback.startswith(tuple(f"{kind}:" for kind in FALLBACK_KINDS)) or fallback.endswith(":"):
        raise ValueError(f"policy spec {spec!r}: the watchdog's fallback must be baseline:NAME or file:PATH")
    return fallback, primary


def _expert(spec: str, horizon: str, scenario: Scenario, points: Sequence[Mapping[str, Any]]) -> Policy:
    from agents.grid_search import static_policy

    if not horizon.isdigit() or not 1 <= int(horizon) <= 120:
        raise ValueError(f"expert:H takes a horizon of 1-120 control intervals, got {horizon!r}")
    candidates = {name: make_policy(name, scenario) for name in EXPERT_TEACHERS}
    for point in points:
        static = static_policy(point, scenario)
        candidates[static.policy_id] = static
    return LookaheadPolicy(candidates, int(horizon), spec)


# ------------------------------------------------------------------------------------------------ one run


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


def _quantiles(values: np.ndarray) -> tuple[float | None, float | None, float | None]:
    p50, p95, p99 = quantiles(values, (0.5, 0.95, 0.99))
    return p50, p95, p99


def slo_met(sim: ClusterSimulator, tenant_index: int) -> int:
    """Finished requests of one tenant that met both its TTFT and TPOT objectives (:mod:`policies.scoring`)."""
    finished: list[SimRequest] = sim.finished[tenant_index]
    ttft = np.fromiter((r.ttft_s for r in finished), dtype=np.float64, count=len(finished))
    tpot = np.fromiter((r.tpot_s for r in finished), dtype=np.float64, count=len(finished))
    return count_slo_met(ttft, tpot, sim.slo_ttft_s[tenant_index], sim.slo_tpot_s[tenant_index])


def weighted_goodput_rps(sim: ClusterSimulator, tenants: Sequence[Tenant], duration_s: float) -> float:
    """Priority-weighted goodput of a drained run: Σ priority × (requests meeting both SLOs) / duration."""
    return sum(t.priority * slo_met(sim, ti) / duration_s for ti, t in enumerate(tenants))


def fixed_layout(policy: Policy) -> ObservationLayout | None:
    """The slot layout a policy was trained on (a learned policy, also under the watchdog); None for rule policies."""
    from policies.learned import LearnedPolicy

    if isinstance(policy, SloWatchdog):
        return fixed_layout(policy.primary) or fixed_layout(policy.fallback)
    return policy.manifest.layout if isinstance(policy, LearnedPolicy) else None


def run_one(spec: RunSpec) -> RunResult:
    """Run one policy on one scenario and seed through the env, then score it."""
    import time

    start = time.perf_counter()
    scenario = scale_rates(resolve_scenario(Path(spec.scenario_path), spec.traces_dir), spec.rate_scale)
    policy = make_policy(spec.policy, scenario, spec.grid_point, spec.candidate_points)
    try:  # only a learned policy fixes the slot layout; rule policies run scenarios of any size
        env = PDClusterEnv(scenario, layout=fixed_layout(policy), traces_dir=spec.traces_dir)
    except ValueError as exc:
        raise ValueError(f"policy {spec.policy}: {exc}") from None
    env.reset(seed=spec.seed)
    if isinstance(policy, LookaheadPolicy):
        policy.bind(env)
    episode_return = 0.0
    churn = 0
    fallback_intervals = 0
    timeline: list[dict[str, Any]] = []
    duration_s = env.scenario.duration_s
    while env.sim.now_s < duration_s - 1e-9:
        step = env.control(policy.decide(env.observation(), env.policy_context()))
        if isinstance(policy, SloWatchdog) and policy.state.in_fallback:
            fallback_intervals += 1
        episode_return += step.reward
        churn += step.changes
        if spec.record:
            timeline.append(_timeline_row(env))
    gpu_seconds_total = env.sim.gpu_seconds()
    group_gpu_s = {g.name: env.sim.gpu_seconds(gi) for gi, g in enumerate(env.groups)}
    sim = env.drain()
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
        {"trips": policy.state.trips, "fallback_intervals": fallback_intervals}
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
        "policy": spec.policy,
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


# ------------------------------------------------------------------------------------------------ many runs


def _t95(n: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1)) if n > 1 else math.nan


def aggregate(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Mean and 95 % confidence half-width over seeds, per (policy, scenario, rate scale, tenant)."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["policy"], row["scenario"], row["rate_scale"], row["tenant"]), []).append(row)
    out: list[dict[str, Any]] = []
    for (policy, scenario, rate_scale, tenant), members in groups.items():
        agg: dict[str, Any] = {
            "policy": policy,
            "scenario": scenario,
            "rate_scale": rate_scale,
            "tenant": tenant,
            "num_seeds": len(members),
        }
        for metric in METRICS:
            values = np.array([m[metric] for m in members if m[metric] is not None], dtype=np.float64)
            if values.size == 0:
                agg[f"{metric}_mean"] = None
                agg[f"{metric}_ci95"] = None
                continue
            agg[f"{metric}_mean"] = float(values.mean())
            half = _t95(values.size) * float(values.std(ddof=1)) / math.sqrt(values.size) if values.size > 1 else None
            agg[f"{metric}_ci95"] = half
        out.append(agg)
    return out


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


@dataclass(slots=True)
class Evaluation:
    """Everything one ``evaluate`` call produced."""

    runs: list[RunResult]
    aggregate: list[dict[str, Any]]
    grid_points: dict[str, dict[str, Any]]


def evaluate(
    scenarios: Sequence[Path],
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    workers: int = 2,
    traces_dir: str | None = None,
    grid_cache: Path | None = None,
    on_done: Callable[[RunResult], None] | None = None,
    on_grid_progress: Callable[[int, int], None] | None = None,
) -> Evaluation:
    """Run every policy × scenario × seed (the first seed records timelines and samples for plots)."""
    grid_points: dict[str, dict[str, Any]] = {}
    if any(p.startswith("grid:") for p in policies):
        from agents.grid_search import search

        for path in scenarios:
            result = search(
                path,
                seeds=seeds,
                workers=workers,
                cache_dir=grid_cache,
                traces_dir=traces_dir,
                progress=on_grid_progress,
            )
            grid_points[str(path)] = result["best"]
    candidates: dict[str, tuple[dict[str, Any], ...]] = {}
    if any(p.startswith("expert:") for p in policies):  # ranked on the search seeds, never the evaluation seeds
        from agents.grid_search import best_points

        for path in scenarios:
            points = best_points(
                path, EXPERT_GRID_CANDIDATES, workers=workers, cache_dir=grid_cache, traces_dir=traces_dir
            )
            candidates[str(path)] = tuple(points)
    specs = [
        RunSpec(
            policy,
            str(path),
            seed,
            record=seed == seeds[0],
            grid_point=grid_points.get(str(path)) if policy.startswith("grid:") else None,
            traces_dir=traces_dir,
            candidate_points=candidates.get(str(path), ()) if policy.startswith("expert:") else (),
        )
        for path in scenarios
        for policy in policies
        for seed in seeds
    ]
    runs = run_many(specs, workers, on_done)
    rows = [row for run in runs for row in run.rows]
    return Evaluation(runs, aggregate(rows), grid_points)


def write_results(evaluation: Evaluation, out: Path, command: str) -> None:
    """``results.csv`` (aggregates), ``results_seeds.csv`` (per run), ``results.json`` (all, plus the command).

    ``results.json`` also has, per ``expert:H`` run, how many intervals the expert acted as each candidate
    (``expert_choices``), and per ``watchdog:`` run its trips and the intervals its fallback decided
    (``watchdog``).
    """
    import csv

    out.mkdir(parents=True, exist_ok=True)
    rows = [row for run in evaluation.runs for row in run.rows]
    for name, table in (("results.csv", evaluation.aggregate), ("results_seeds.csv", rows)):
        if not table:
            continue
        with (out / name).open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(table[0].keys()))
            writer.writeheader()
            writer.writerows(table)
    payload = {
        "command": command,
        "aggregate": evaluation.aggregate,
        "runs": rows,
        "grid": {Path(k).stem: v for k, v in evaluation.grid_points.items()},
        "errors": [
            {"policy": r.spec.policy, "scenario": r.scenario, "seed": r.spec.seed, "error": r.error}
            for r in evaluation.runs
            if r.error is not None
        ],
        "wall_s": {f"{r.spec.policy}|{r.scenario}|{r.spec.seed}": r.wall_s for r in evaluation.runs},
        "expert_choices": {
            f"{r.spec.policy}|{r.scenario}|{r.spec.seed}": r.expert_choices for r in evaluation.runs if r.expert_choices
        },
        "watchdog": {f"{r.spec.policy}|{r.scenario}|{r.spec.seed}": r.watchdog for r in evaluation.runs if r.watchdog},
    }
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=_json_default) + "\n")
    (out / "COMMAND.txt").write_text(command + "\n")


def _json_default(value: object) -> object:
    if isinstance(value, float | np.floating) and not math.isfinite(float(value)):
        return None
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def ranked(aggregate_rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """``ALL`` rows per scenario, best priority-weighted goodput first."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for row in aggregate_rows:
        if row["tenant"] == ALL_TENANTS:
            out.setdefault(row["scenario"], []).append(row)
    for rows in out.values():
        rows.sort(key=lambda r: -(r["weighted_goodput_rps_mean"] or 0.0))
    return out


def default_workers() -> int:
    """Worker processes: the CPUs this process may use."""
    return max(len(os.sched_getaffinity(0)), 1)


# ------------------------------------------------------------------------------------------------ rate sweep


def sweep_rate(
    scenarios: Sequence[Path],
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    target_frac: float = 0.9,
    start: float = 1.0,
    max_scale: float = 8.0,
    min_scale: float = 1 / 16,
    iterations: int = 5,
    workers: int = 2,
    traces_dir: str | None = None,
    grid_points: Mapping[str, Mapping[str, Any]] | None = None,
    on_done: Callable[[RunResult], None] | None = None,
) -> list[dict[str, Any]]:
    """Per policy and scenario, the highest rate multiplier at which ≥ ``target_frac`` of requests meet both SLOs.

    Doubles (or halves) from ``start`` until the attainment crosses the target, then bisects ``iterations``
    times; every probe runs all ``seeds`` (attainment = mean over seeds of the ``ALL`` row). Probes of all
    policies run in parallel. Returns one record per (policy, scenario) with the probed points.
    """
    states = [(p, str(s)) for s in scenarios for p in policies]
    points: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(states))}
    bracket: dict[int, tuple[float, float | None]] = {i: (0.0, None) for i in range(len(states))}
    bisections = dict.fromkeys(range(len(states)), 0)
    done: set[int] = set()
    probe_of: dict[int, float] = {i: start for i in range(len(states))}
    while len(done) < len(states):
        specs: list[RunSpec] = []
        owners: list[int] = []
        for i, (policy, path) in enumerate(states):
            if i in done:
                continue
            gp = dict(grid_points[path]) if grid_points and policy.startswith("grid:") else None
            for seed in seeds:
                specs.append(RunSpec(policy, path, seed, probe_of[i], grid_point=gp, traces_dir=traces_dir))
                owners.append(i)
        results = run_many(specs, workers, on_done)
        by_state: dict[int, list[float]] = {}
        for owner, result in zip(owners, results, strict=True):
            if result.error is not None:  # a crashed run counts as missing the target
                by_state.setdefault(owner, []).append(0.0)
                continue
            total = next(r for r in result.rows if r["tenant"] == ALL_TENANTS)
            by_state.setdefault(owner, []).append(float(total["slo_attainment_frac"] or 0.0))
        for i, values in by_state.items():
            scale = probe_of[i]
            attainment = float(np.mean(values))
            points[i].append((scale, attainment))
            lo, hi = bracket[i]
            if attainment >= target_frac:
                lo = scale
            else:
                hi = scale
            bracket[i] = (lo, hi)
            if hi is None:
                if scale * 2 > max_scale:
                    done.add(i)
                else:
                    probe_of[i] = scale * 2
            elif lo == 0.0:
                if scale / 2 < min_scale:
                    done.add(i)
                else:
                    probe_of[i] = scale / 2
            else:
                bisections[i] += 1
                if bisections[i] > iterations:
                    done.add(i)
                else:
                    probe_of[i] = math.sqrt(lo * hi)
    out = []
    for i, (policy, path) in enumerate(states):
        lo, hi = bracket[i]
        out.append(
            {
                "policy": policy,
                "scenario": Path(path).stem,
                "max_rate_scale": lo,
                "first_failing_scale": hi,
                "target_frac": target_frac,
                "points": sorted(points[i]),
            }
        )
    return out
