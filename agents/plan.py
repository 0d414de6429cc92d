"""Capacity planning with the simulator: which P:D split and routing threshold serve a workload best at its SLO.

:func:`plan` searches static configurations of one tenant group of ``N`` GPUs (``N // tp`` instances):

* **aggregated** — every instance serves prefill and decode (``aggregated`` role, every request local);
* **disaggregated** ``P:D`` with ``P + D = N // tp`` and ``P, D ≥ 1``, under one route level for every tenant:
  ``always_remote`` (every prompt prefilled remotely) or ``remote>=T`` for T in ``levels_tokens``
  (as :mod:`policies.route_levels` defines them: the project's rule with a crisp threshold: inputs ≥ T
  tokens, after prefix-cache hits, go remote; the seed's prefill-queue overload fallback stays on; no
  decode-pressure or expected-output condition).

**Score.** A configuration's capacity is its *maximum sustainable rate*: the largest multiplier ``m`` of the
workload's request rate at which ≥ ``target_frac`` (90 %) of the arrived requests meet both their TTFT and
TPOT objectives, found by bisection over ``m`` on the grid ``2 ** (k / steps_per_doubling)`` (≈ 4.4 % steps by
default, the same grid for every configuration and stage). Every probe is one simulator run of ``horizon_s``
seconds of arrivals (plus a drain), on the same seed for every configuration (common random numbers), scored
by the simulator's own summary (:func:`env.sim.summary.summarize`: goodput = requests meeting both objectives
per second of horizon; attainment is over *arrived* requests, so unfinished and rejected requests count as
misses, as everywhere (:mod:`policies.scoring`)). A search probe stops early once its attainment can no longer reach
the target (only a failing run can stop); tables and the front use complete runs. The best configuration has
the highest sustainable rate; ties (within one grid step) go to fewer per-tenant exceptions (an exception must
raise the capacity), then the higher attainment at the first failing multiplier (run to the end for the tied
leaders), then the higher goodput at the sustainable rate, then the simpler configuration (aggregated, then
fewer prefill instances).

**Search** (AIConfigurator-style offline sweep, made cheap):

1. *Shared bisection with elimination.* All candidates are probed at one rate multiplier at a time. The
   ladder doubles (or halves) from 1 until no candidate passes; candidates failing a rung are rejected there
   (their capacity is below a rung some other candidate sustains: dominated). The survivors are bisected
   together; at each probe the ones that fail drop out. Low rungs are cheap (few requests), and most
   candidates leave early.
2. *Coarse to fine over splits.* The first round runs aggregated plus the splits at 1, about 1/4, 1/2 and 3/4
   of the instances, and N-1, under three levels (always remote and every other ``remote>=T``). The second
   round runs every split within one coarse step of the best disaggregated one under the best two levels,
   the third every level at the best split and its neighbours, and the *plateau* rounds every level around
   each configuration that ties with the best, until the tied set is closed (the tie-break then sees what an
   exhaustive search sees). These rounds start from the capacity already known: a weaker candidate costs one
   probe, a tying one two. ``exhaustive=True`` runs one round over every candidate (the reference the tests
   compare with).
3. *Per tenant.* With several tenants, each tenant in turn tries every other level at the best split while
   the others keep theirs (coordinate ascent); an exception is kept only if it raises the capacity.

Probes run in parallel processes and are cached as JSON files keyed by a content hash of the scenario (with
the size and modification time of the trace files it reads), the configuration, the rate multiplier, the
early-stop target and the code version (the source of the simulator, performance model, workloads, routing and
this module). Everything is seeded; results do not depend on ``workers`` or on the cache.

Besides the best configuration the result carries every probe (goodput at the SLO per configuration and
rate), each configuration's goodput at its sustainable rate, and the **Pareto front of goodput per GPU versus
offered rate**: the two leading configurations and the best aggregated one are run on a common rate grid
(fractions of the best capacity) and, at each rate, the configuration with the highest goodput per GPU is on
the front (the others are dominated at that rate). :func:`policy_document` turns the best configuration into a
per-tenant policy file.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from agents.runs import episode_env, run_episode, scale_rates
from env.gym_env import PDClusterEnv
from env.perf.profile import OperatorProfile, ProfileError, load_operator_profile
from env.scenario import ClusterConfig, Scenario, ScenarioError, SloConfig, TenantConfig, load_scenario
from env.sim.simulator import ClusterSimulator, kv_capacity_tokens
from env.sim.summary import summarize
from env.workloads.config import WorkloadConfig, parse_workload_config
from env.workloads.errors import WorkloadError
from livestack.profiling.fit import fit_workload
from livestack.profiling.sources import detect_source_kind, load_records
from policies.route_levels import AGGREGATED, ALWAYS_REMOTE, level_min_remote_tokens, remote_level, route_thresholds
from policies.rules import FilePolicy
from policies.schema import FallbackAction, RoutingThresholds
from policies.scoring import count_slo_met, slo_attainment_frac

__all__ = [
    "AGGREGATED",
    "ALWAYS_REMOTE",
    "DEFAULT_LEVELS_TOKENS",
    "PLAN_VERSION",
    "PlanConfig",
    "PlanInputError",
    "PlanResult",
    "Probe",
    "candidate_configs",
    "configured_scenario",
    "load_plan_scenario",
    "parse_slo",
    "plan",
    "policy_document",
]

PLAN_VERSION = 1
"""Bump when the meaning of a cached probe changes in a way the code hash does not see."""
DEFAULT_LEVELS_TOKENS: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
GROUP_NAME = "main"
_REPO_ROOT = Path(__file__).resolve().parents[1]
_CODE_PATHS = (
    "agents/runs.py",
    "env/gym_env.py",
    "env/sim",
    "env/perf",
    "env/workloads",
    "env/scenario.py",
    "policies/control.py",
    "policies/guard.py",
    "policies/routing.py",
    "policies/route_levels.py",
    "policies/rules.py",
    "policies/schema.py",
)
_PARETO_GRID_FRACS = (0.25, 0.5, 0.75, 1.0, 1.25)
_MIN_INDEX_DOUBLINGS = -6
_MAX_INDEX_DOUBLINGS = 8
"""The rate ladder spans multipliers 2**-6 .. 2**8."""


class PlanInputError(ValueError):
    """Bad planner input; ``str()`` is one line naming the file or field."""


# ------------------------------------------------------------------------------------------------ SLO syntax

_SLO_FIELDS = ("ttft_p95", "ttft_p99", "tpot_p95", "tpot_p99")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s)?\s*$")


def parse_slo(text: str) -> SloConfig:
    """Parse ``ttft_p95=2s,tpot_p95=80ms`` (fields ttft/tpot × p95/p99; units ``s`` or ``ms``, bare = s).

    Raises:
        PlanInputError: bad syntax, an unknown or repeated field, or a non-positive value (the field named).
    """
    values: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, sep, raw = part.partition("=")
        name = name.strip()
        if not sep:
            raise PlanInputError(f"--slo: {part.strip()!r}: expected FIELD=VALUE (e.g. ttft_p95=2s)")
        if name not in _SLO_FIELDS:
            raise PlanInputError(f"--slo: {name!r}: unknown field (known: {', '.join(_SLO_FIELDS)})")
        if f"{name}_s" in values:
            raise PlanInputError(f"--slo: {name}: given twice")
        match = _DURATION.match(raw)
        if match is None:
            raise PlanInputError(f"--slo: {name}: {raw.strip()!r} is not a duration (e.g. 2s or 80ms)")
        seconds = float(match.group(1)) / (1000.0 if match.group(2) == "ms" else 1.0)
        if not seconds > 0 or not math.isfinite(seconds):
            raise PlanInputError(f"--slo: {name}: must be positive")
        values[f"{name}_s"] = seconds
    if not values:
        raise PlanInputError("--slo: no objective given (e.g. ttft_p95=2s,tpot_p95=80ms)")
    return SloConfig(**values)


# ------------------------------------------------------------------------------------------------ configurations


@dataclass(frozen=True, slots=True, order=True)
class PlanConfig:
    """One static configuration: instance counts, the route level of every tenant, and per-tenant exceptions."""

    num_prefill: int
    num_decode: int
    route: str
    """``aggregated``, ``always_remote`` or ``remote>=T``."""
    tenant_routes: tuple[tuple[str, str], ...] = ()
    """``(tenant, level)`` pairs overriding ``route`` for those tenants (the per-tenant refinement)."""

    @property
    def is_aggregated(self) -> bool:
        """Aggregated serving (no prefill pool)."""
        return self.route == AGGREGATED

    @property
    def min_remote_input_tokens(self) -> int | None:
        """T of the common ``remote>=T`` level (0 for always remote, None when aggregated)."""
        return level_min_remote_tokens(self.route)

    def route_for(self, tenant: str) -> str:
        """The route level of ``tenant``."""
        return dict(self.tenant_routes).get(tenant, self.route)

    @property
    def label(self) -> str:
        """Short human form, e.g. ``4P:12D remote>=2048 [rag: always_remote]`` or ``aggregated x16``."""
        if self.is_aggregated:
            return f"aggregated x{self.num_decode}"
        extra = "".join(f" [{tenant}: {level}]" for tenant, level in self.tenant_routes)
        return f"{self.num_prefill}P:{self.num_decode}D {self.route}{extra}"

    def thresholds(self, tenant: str | None = None) -> RoutingThresholds:
        """The routing thresholds of ``tenant`` (default: of the common level) under this configuration."""
        return route_thresholds(self.route if tenant is None else self.route_for(tenant))

    def thresholds_for(self, tenant: str) -> RoutingThresholds:
        """The routing thresholds of ``tenant`` (what :class:`policies.rules.FilePolicy` publishes)."""
        return self.thresholds(tenant)

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        out: dict[str, Any] = {"num_prefill": self.num_prefill, "num_decode": self.num_decode, "route": self.route}
        if self.tenant_routes:
            out["tenant_routes"] = [list(pair) for pair in self.tenant_routes]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanConfig:
        """Inverse of :meth:`as_dict`."""
        routes = tuple((str(t), str(level)) for t, level in data.get("tenant_routes", ()))
        return cls(int(data["num_prefill"]), int(data["num_decode"]), str(data["route"]), routes)


def route_levels(levels_tokens: Sequence[int]) -> list[str]:
    """The disaggregated route levels: always remote, then ``remote>=T`` for each T."""
    return [ALWAYS_REMOTE, *(remote_level(t) for t in sorted(set(levels_tokens)))]


def candidate_configs(num_instances: int, levels_tokens: Sequence[int] = DEFAULT_LEVELS_TOKENS) -> list[PlanConfig]:
    """Every configuration of ``num_instances``: aggregated, then each split P:D under each route level."""
    if num_instances < 1:
        raise PlanInputError("--gpus: not enough GPUs for one instance at this TP")
    out = [PlanConfig(0, num_instances, AGGREGATED)]
    for num_prefill in range(1, num_instances):
        out.extend(PlanConfig(num_prefill, num_instances - num_prefill, lvl) for lvl in route_levels(levels_tokens))
    return out


# ------------------------------------------------------------------------------------------------ the workload


def load_plan_scenario(
    source: str | Path,
    *,
    gpus: int | None,
    slo: SloConfig | None = None,
    model_profile: str | None = None,
    tp: int | None = None,
    horizon_s: float = 30.0,
    seed: int = 0,
    traces_dir: str | Path | None = None,
) -> Scenario:
    """The scenario the planner searches: the source's tenants in one group of ``gpus`` GPUs.

    ``source`` is a scenario YAML (its cluster and tenants; groups are merged into one), a fitted-workload file
    of ``pdctl profile --emit-workload`` (tenant → workload), an Azure CSV, a Mooncake JSONL, a router JSONL log
    (fitted with :func:`livestack.profiling.fit.fit_workload`) or a ServeGen folder. A trace is replayed from its
    start, compressed by the rate multiplier ``m`` (a probe of ``horizon_s`` covers ``m × horizon_s`` seconds of
    the trace, repeated when the trace is shorter), so probes near capacity see a broad part of it. ``slo``
    replaces every tenant's objectives (required when the source carries none).

    Raises:
        PlanInputError: a missing or invalid source or option (one line naming the file or field).
    """
    path = Path(source)
    if not path.exists():
        raise PlanInputError(f"{path}: no such file or folder")
    base_cluster = ClusterConfig()
    if path.suffix.lower() in (".yaml", ".yml"):
        tenants, cluster, default_gpus = _yaml_source(path, traces_dir)
        base_cluster = cluster or base_cluster
    else:
        tenants, default_gpus = _trace_source(path), None
    budget = gpus if gpus is not None else default_gpus
    if budget is None:
        raise PlanInputError("--gpus: required for this source (the GPU budget to plan)")
    if budget < 1:
        raise PlanInputError(f"--gpus: must be at least 1 (got {budget})")
    cluster_update: dict[str, Any] = {"prefill_tp": None}
    if model_profile is not None:
        cluster_update["profile"] = model_profile
    if tp is not None:
        cluster_update["tp"] = tp
    cluster = base_cluster.model_copy(update=cluster_update)
    if budget // cluster.tp < 1:
        raise PlanInputError(f"--gpus: {budget} GPUs hold no instance at TP {cluster.tp}")
    out_tenants = []
    for tenant in tenants:
        tenant_slo = slo if slo is not None else tenant.slo
        if tenant_slo.to_slo().ttft_target_s() == math.inf and tenant_slo.to_slo().tpot_target_s() == math.inf:
            raise PlanInputError(f"--slo: required (tenant {tenant.name!r} of {path} has no objective)")
        out_tenants.append(tenant.model_copy(update={"slo": tenant_slo, "group": GROUP_NAME}))
    data = {
        "name": f"plan-{_slug(path.stem)}",
        "description": f"pdctl plan of {path}",
        "duration_s": horizon_s,
        "drain_s": 300.0,
        "control_interval_s": 10.0,
        "seed": seed,
        "cluster": cluster.model_dump(),
        "tenant_groups": [{"name": GROUP_NAME, "gpu_budget": budget, "decode": budget // cluster.tp}],
        "tenants": [t.model_dump() for t in out_tenants],
    }
    try:
        scenario = Scenario.model_validate(data)
    except ValueError as exc:
        first = str(exc).splitlines()
        raise PlanInputError(f"{path}: {first[-1].strip() if first else exc}") from None
    _check_profile(scenario)
    return scenario


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "workload"


def _check_profile(scenario: Scenario) -> None:
    cluster = scenario.cluster
    try:
        profile = _profile_cached(cluster.profile, str(cluster.profile_dir))
    except (ProfileError, KeyError, OSError) as exc:
        message = str(exc).strip("'\"")
        raise PlanInputError(f"--model-profile: {cluster.profile}: {message}") from None
    capacity = cluster.kv_capacity_tokens or kv_capacity_tokens(
        profile, cluster.tp, cluster.gpu_memory_utilization, cluster.activation_reserve_bytes
    )
    if capacity <= 1:
        raise PlanInputError(f"--tp: {cluster.profile} leaves no memory for the KV cache at TP {cluster.tp}")


@cache
def _profile_cached(name: str, directory: str) -> OperatorProfile:
    return load_operator_profile(name, None if directory == "None" else directory)


def _yaml_source(path: Path, traces_dir: str | Path | None) -> tuple[list[TenantConfig], ClusterConfig | None, int]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanInputError(f"{path}: cannot read ({exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise PlanInputError(f"{path}{line}: not valid YAML") from None
    if isinstance(data, dict) and "tenants" in data:
        try:
            scenario = load_scenario(path, traces_dir=traces_dir)
        except ScenarioError as exc:
            raise PlanInputError(exc.problems[0]) from None
        return list(scenario.tenants), scenario.cluster, sum(g.gpu_budget for g in scenario.tenant_groups)
    if not isinstance(data, dict) or not data:
        raise PlanInputError(f"{path}: expected a scenario or a fitted-workload file (tenant: workload)")
    tenants = []
    for name, spec in data.items():
        try:
            workload: WorkloadConfig = parse_workload_config(spec)
            tenants.append(TenantConfig(name=str(name), group=GROUP_NAME, workload=workload))
        except ValueError as exc:
            detail = str(exc).splitlines()
            raise PlanInputError(f"{path}: {name}: not a workload ({detail[-1].strip() if detail else exc})") from None
    return tenants, None, 0


def _trace_source(path: Path) -> list[TenantConfig]:
    try:
        kind = detect_source_kind(str(path))
    except WorkloadError as exc:
        raise PlanInputError(str(exc).splitlines()[0]) from None
    spec: dict[str, Any]
    window = {"start_s": 0.0, "repeat": True}
    if kind == "azure":
        spec = {"kind": "trace_azure", "path": str(path), **window}
    elif kind == "mooncake":
        spec = {"kind": "trace_mooncake", "path": str(path), **window}
    elif kind == "servegen":
        spec = {"kind": "servegen", "path": str(path), "start_s": 0.0}
    elif kind == "router":
        try:
            records, _ = load_records(str(path), "router")
            return [TenantConfig(name="default", group=GROUP_NAME, workload=fit_workload(records))]
        except (WorkloadError, ValueError) as exc:
            raise PlanInputError(f"{path}: cannot fit a workload ({str(exc).splitlines()[0]})") from None
    else:  # pragma: no cover - detect_source_kind returns prometheus only for URLs, refused above
        raise PlanInputError(f"{path}: not a trace file")
    return [TenantConfig(name="default", group=GROUP_NAME, workload=parse_workload_config(spec))]


def configured_scenario(scenario: Scenario, config: PlanConfig, rate_scale: float = 1.0) -> Scenario:
    """``scenario`` with its group deployed as ``config`` and every tenant's rate multiplied by ``rate_scale``."""
    group = scenario.tenant_groups[0]
    if config.is_aggregated:
        pools = {"prefill": 0, "decode": 0, "aggregated": config.num_decode}
    else:
        pools = {"prefill": config.num_prefill, "decode": config.num_decode, "aggregated": 0}
    deployed = scenario.model_copy(update={"tenant_groups": [group.model_copy(update=pools)]})
    return scale_rates(deployed, rate_scale)


# ------------------------------------------------------------------------------------------------ probes


@dataclass(frozen=True, slots=True)
class Probe:
    """One simulator run: a configuration at a rate multiplier, and how it met the SLO."""

    config: PlanConfig
    rate_scale: float
    offered_rps: float
    """Arrived requests per second of horizon."""
    goodput_rps: float
    slo_attainment_frac: float
    goodput_per_gpu_rps: float
    num_arrived: int
    remote_prefill_frac: float
    wall_s: float
    complete: bool = True
    """False when the run stopped early because the attainment could no longer reach the target (bounds only)."""
    cached: bool = False

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        out = asdict(self)
        out["config"] = self.config.as_dict()
        out["label"] = self.config.label
        return out


@cache
def code_version() -> str:
    """Hash of the source that decides what a probe returns (simulator to planner, see ``_CODE_PATHS``).

    Besides the simulator, performance model, workloads and routing, that is the episode loop and the control
    step a probe runs through.
    """
    digest = hashlib.sha256(f"plan-v{PLAN_VERSION}".encode())
    files: list[Path] = [Path(__file__)]
    for rel in _CODE_PATHS:
        target = _REPO_ROOT / rel
        files.extend(sorted(target.rglob("*.py")) if target.is_dir() else [target])
    for file in files:
        digest.update(file.relative_to(_REPO_ROOT).as_posix().encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def _inputs_fingerprint(scenario: Scenario) -> list[Any]:
    """Size and mtime of every file a workload reads (traces are not hashed byte by byte)."""
    out: list[Any] = []
    for tenant in scenario.tenants:
        path = getattr(tenant.workload, "path", None)
        if path is None:
            continue
        p = Path(path)
        files = sorted(p.iterdir()) if p.is_dir() else [p]
        out.append([[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files if f.exists()])
    return out


def scenario_key(scenario: Scenario) -> str:
    """Content hash of the searched scenario, the files its workloads read, and the code version."""
    payload = {"scenario": scenario.model_dump(mode="json"), "inputs": _inputs_fingerprint(scenario)}
    payload["code"] = code_version()
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def probe_key(scenario_hash: str, config: PlanConfig, rate_scale: float, stop_below_frac: float | None) -> str:
    """Content hash of one probe: scenario (with code version), configuration, multiplier, early-stop target."""
    payload = [scenario_hash, config.as_dict(), round(rate_scale, 12), stop_below_frac]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


_WORKER_SCENARIO: Scenario | None = None


def _init_worker(scenario_json: str) -> None:
    global _WORKER_SCENARIO
    _WORKER_SCENARIO = Scenario.model_validate_json(scenario_json)


def _run_probe_in_worker(config: PlanConfig, rate_scale: float, stop_below_frac: float | None) -> Probe:
    assert _WORKER_SCENARIO is not None
    return run_probe(_WORKER_SCENARIO, config, rate_scale, stop_below_frac)


def run_probe(scenario: Scenario, config: PlanConfig, rate_scale: float, stop_below_frac: float | None = None) -> Probe:
    """Simulate ``config`` at ``rate_scale`` for the scenario's horizon, drain, and score (no cache).

    The configuration runs as a static policy (its thresholds from the first simulated second, pools as
    deployed) through the one episode loop (:func:`agents.runs.run_episode`, seeded with the scenario's seed
    as ``pdctl sim`` and ``pdctl evaluate`` seed theirs). With ``stop_below_frac`` the run stops as soon as so
    many requests have missed their SLO (failed, or finished late) that the attainment cannot reach it; the
    probe is then marked incomplete (attainment and goodput are bounds: it failed).
    """
    start = time.perf_counter()
    deployed = configured_scenario(scenario, config, rate_scale)
    policy = FilePolicy(config, config.label)
    env = episode_env(deployed, policy)
    stop = None if stop_below_frac is None else _Hopeless(stop_below_frac)
    episode = run_episode(env, policy, deployed.seed, stop=stop)
    sim, complete = episode.sim, not episode.stopped
    horizon_s = deployed.duration_s
    summary = summarize(sim, time.perf_counter() - start, deployed.name, config.label, deployed.seed, horizon_s)
    arrived = sim.num_requests if not complete else sum(t.arrived for t in summary.tenants)
    met = sum(t.slo_met for t in summary.tenants)
    routed = sum(t.arrived - t.failed for t in summary.tenants)
    remote = sum((t.remote_prefill_frac or 0.0) * (t.arrived - t.failed) for t in summary.tenants)
    gpus = deployed.tenant_groups[0].gpu_budget
    return Probe(
        config=config,
        rate_scale=rate_scale,
        offered_rps=arrived / horizon_s,
        goodput_rps=met / horizon_s,
        slo_attainment_frac=slo_attainment_frac(arrived - _misses(sim) if not complete else met, arrived) or 0.0,
        goodput_per_gpu_rps=met / horizon_s / gpus,
        num_arrived=arrived,
        remote_prefill_frac=remote / routed if routed else 0.0,
        wall_s=time.perf_counter() - start,
        complete=complete,
    )


def _late(sim: ClusterSimulator, tenant_index: int, start: int = 0) -> int:
    """Finished requests of one tenant (from index ``start`` on) that missed its SLO (:mod:`policies.scoring`)."""
    finished = sim.finished[tenant_index][start:]
    ttft = [r.ttft_s for r in finished]
    tpot = [r.tpot_s for r in finished]
    return len(finished) - count_slo_met(ttft, tpot, sim.slo_ttft_s[tenant_index], sim.slo_tpot_s[tenant_index])


def _misses(sim: ClusterSimulator) -> int:
    """Requests already lost: failed, or finished outside their tenant's TTFT or TPOT objective."""
    return int(sim.num_failed) + sum(_late(sim, ti) for ti in range(len(sim.finished)))


class _Hopeless:
    """Stop check of a search probe: true once attainment < ``target_frac`` is certain (counted incrementally)."""

    def __init__(self, target_frac: float) -> None:
        self.target_frac = target_frac
        self._counted: list[int] = []
        self._late = 0

    def __call__(self, env: PDClusterEnv) -> bool:
        sim = env.sim
        if not self._counted:
            self._counted = [0] * len(sim.finished)
        for ti, finished in enumerate(sim.finished):
            self._late += _late(sim, ti, self._counted[ti])
            self._counted[ti] = len(finished)
        return bool(self._late + sim.num_failed > (1.0 - self.target_frac) * sim.num_requests)


class ProbeRunner:
    """Runs probes in parallel, caches them on disk and in memory, and reports progress.

    A probe run with early stopping (the search's) and one run to the end (``exact``: tables, the front) are
    kept apart, so a search sees the same values whatever the cache holds; a complete probe serves both, and a
    passing one is always complete (a run that passes never stops early).
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        workers: int = 1,
        cache_dir: Path | None = None,
        progress: Callable[[int, int, str], None] | None = None,
        stop_below_frac: float | None = None,
    ) -> None:
        self.scenario = scenario
        self.stop_below_frac = stop_below_frac
        self.workers = max(int(workers), 1)
        self.cache_dir = cache_dir
        self.progress = progress
        self.probes: dict[tuple[PlanConfig, float, float | None], Probe] = {}
        self.num_submitted = 0
        self.num_done = 0
        self.num_cache_hits = 0
        self.stage = ""
        self._pool: ProcessPoolExecutor | None = None
        self._scenario_hash = scenario_key(scenario) if cache_dir is not None else ""

    def __enter__(self) -> ProbeRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker processes."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers, initializer=_init_worker, initargs=(self.scenario.model_dump_json(),)
            )
        return self._pool

    def _cache_file(self, key: tuple[PlanConfig, float, float | None]) -> Path | None:
        if self.cache_dir is None:
            return None
        digest = probe_key(self._scenario_hash, *key)
        return self.cache_dir / digest[:2] / f"{digest}.json"

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(self.num_done, self.num_submitted, self.stage)

    def _lookup(self, config: PlanConfig, rate_scale: float, stop: float | None) -> tuple[Probe | None, bool]:
        """A known probe that answers this request (memory, then disk), and whether it came from disk."""
        own = (config, rate_scale, stop)
        other = (config, rate_scale, self.stop_below_frac if stop is None else None)
        for key in (own, other):
            from_disk = False
            probe = self.probes.get(key)
            if probe is None:
                file = self._cache_file(key)
                if file is None or not file.exists():
                    continue
                try:
                    probe = _probe_from_json(json.loads(file.read_text()))
                except (ValueError, KeyError, TypeError):
                    continue  # a damaged cache entry is recomputed
                self.probes[key] = probe
                from_disk = True
            passing = stop is not None and probe.slo_attainment_frac >= stop
            if key == own or (stop is None and probe.complete) or passing:
                return probe, from_disk
        return None, False

    def run(self, pairs: Iterable[tuple[PlanConfig, float]], exact: bool = False) -> list[Probe]:
        """Probes of ``(config, rate_scale)`` pairs, in order (known ones are not run again).

        Without ``exact`` a probe may stop early once it has certainly failed (:func:`run_probe`).
        """
        stop = None if exact else self.stop_below_frac
        wanted = list(dict.fromkeys(pairs))
        found: dict[tuple[PlanConfig, float], Probe] = {}
        todo: list[tuple[PlanConfig, float]] = []
        for pair in wanted:
            probe, from_disk = self._lookup(*pair, stop)
            if probe is not None:
                found[pair] = probe
                if from_disk:
                    self.num_cache_hits += 1
                    self.num_submitted += 1
                    self.num_done += 1
                continue
            self.num_submitted += 1
            todo.append(pair)
        self._report()
        if self.workers == 1 or len(todo) <= 1:
            for pair in todo:
                found[pair] = self._store((*pair, stop), run_probe(self.scenario, *pair, stop))
        else:
            pool = self._executor()
            futures = [(pair, pool.submit(_run_probe_in_worker, *pair, stop)) for pair in todo]
            for pair, future in futures:
                found[pair] = self._store((*pair, stop), future.result())
        return [found[pair] for pair in wanted]

    def _store(self, key: tuple[PlanConfig, float, float | None], probe: Probe) -> Probe:
        self.probes[key] = probe
        self.num_done += 1
        file = self._cache_file(key)
        if file is not None:
            file.parent.mkdir(parents=True, exist_ok=True)
            tmp = file.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(probe.as_dict()) + "\n")
            tmp.replace(file)
        self._report()
        return probe


def _probe_from_json(data: Mapping[str, Any]) -> Probe:
    config = PlanConfig.from_dict(data["config"])
    fields = {k: v for k, v in data.items() if k not in ("config", "label", "cached")}
    return Probe(config=config, cached=True, **fields)


# ------------------------------------------------------------------------------------------------ the search


@dataclass(slots=True)
class Capacity:
    """What the search knows about one configuration's sustainable rate multiplier: ``lo ≤ capacity < hi``."""

    config: PlanConfig
    lo: float = 0.0
    """Highest multiplier sustained (0: none probed was)."""
    hi: float | None = None
    """Lowest multiplier that failed (None: none did)."""
    attainment_at_hi: float = 0.0


def grid_scale(index: int, steps_per_doubling: int) -> float:
    """Rate multiplier of a grid index: ``2 ** (index / steps_per_doubling)`` (every stage probes this grid)."""
    return float(2.0 ** (index / steps_per_doubling))


def _shared_bisection(
    runner: ProbeRunner,
    configs: Sequence[PlanConfig],
    *,
    target_frac: float,
    steps_per_doubling: int,
    start_index: int = 0,
    start_is_floor: bool = False,
) -> dict[PlanConfig, Capacity]:
    """Bracket every config's capacity by probing all live ones at one grid multiplier at a time.

    The ladder doubles (halves) from ``start_index`` until no live config passes; the survivors of the last
    passing rung are bisected on the grid down to one step. With ``start_is_floor`` some config is known to
    sustain the start: configs failing there are rejected at once (no halving), and the next probe is one grid
    step up (the configs passing it beat the known one; those failing it tie with it).
    """
    caps = {c: Capacity(c) for c in configs}
    span = steps_per_doubling

    def probe(index: int, members: Sequence[PlanConfig]) -> list[PlanConfig]:
        level = grid_scale(index, span)
        passed = []
        for p in runner.run((c, level) for c in members):
            cap = caps[p.config]
            if p.slo_attainment_frac >= target_frac:
                cap.lo = max(cap.lo, level)
                passed.append(p.config)
            elif cap.hi is None or level < cap.hi:
                cap.hi = level
                cap.attainment_at_hi = p.slo_attainment_frac
        return passed

    alive = list(configs)
    index = start_index
    passed = probe(index, alive)
    while not passed and not start_is_floor and index - span >= _MIN_INDEX_DOUBLINGS * span:
        index -= span
        passed = probe(index, alive)
    if not passed:
        return caps
    lo = index
    step = 1 if start_is_floor else span  # from a known floor, first ask: does anyone beat it by one step?
    while passed and index + step <= _MAX_INDEX_DOUBLINGS * span:
        alive, lo = passed, index
        index += step
        step = span
        passed = probe(index, alive)
    if passed:  # sustained even the largest multiplier
        return caps
    hi = index
    while hi - lo > 1:
        mid = (lo + hi) // 2
        passed = probe(mid, alive)
        if passed:
            alive, lo = passed, mid
        else:
            hi = mid
    return caps


def _merge(old: Capacity | None, new: Capacity) -> Capacity:
    """Both stages' knowledge of one config: the higher sustained and the lower failing multiplier."""
    if old is None:
        return new
    merged = Capacity(old.config, max(old.lo, new.lo), old.hi, old.attainment_at_hi)
    if new.hi is not None and (old.hi is None or new.hi < old.hi):
        merged.hi, merged.attainment_at_hi = new.hi, new.attainment_at_hi
    return merged


def _coarse_splits(num_instances: int) -> list[int]:
    if num_instances <= 6:
        return list(range(1, num_instances))
    picks = {1, num_instances - 1, *(round(num_instances * f) for f in (0.25, 0.5, 0.75))}
    return sorted(p for p in picks if 1 <= p < num_instances)


@dataclass(slots=True)
class PlanResult:
    """What :func:`plan` found (see the module docstring)."""

    scenario: Scenario
    best: Capacity
    capacities: list[Capacity]
    probes: list[Probe]
    at_capacity: dict[PlanConfig, Probe]
    """Each configuration's probe at its sustainable multiplier (goodput at the SLO there)."""
    at_workload_rate: dict[PlanConfig, Probe]
    """Complete probes at the workload's own rate (multiplier 1), for the configurations the search ran there."""
    pareto: list[dict[str, Any]]
    curves: dict[str, list[dict[str, Any]]]
    wall_s: float
    num_probes: int
    num_cache_hits: int
    exhaustive: bool
    target_frac: float
    base_rate_rps: float
    stages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        """The planned GPU budget."""
        return self.scenario.tenant_groups[0].gpu_budget

    @property
    def max_sustainable_rps(self) -> float:
        """The best configuration's sustainable request rate (requests per second)."""
        return self.offered_rps(self.best.lo)

    def offered_rps(self, rate_scale: float) -> float:
        """Requests per second a probe at ``rate_scale`` offered (a trace's rate varies along it: measured)."""
        known = [p.offered_rps for p in self.probes if p.rate_scale == rate_scale]
        return known[0] if known else rate_scale * self.base_rate_rps

    def ranked(self) -> list[Capacity]:
        """Every searched configuration, best first."""
        return sorted(self.capacities, key=_rank_key(self.at_capacity))

    def as_dict(self) -> dict[str, Any]:
        """JSON form (``plan.json``)."""

        def cap_row(cap: Capacity) -> dict[str, Any]:
            probe = self.at_workload_rate.get(cap.config)
            top = self.at_capacity.get(cap.config)
            return {
                **cap.config.as_dict(),
                "label": cap.config.label,
                "max_rate_scale": cap.lo,
                "max_sustainable_rps": self.offered_rps(cap.lo) if cap.lo > 0 else 0.0,
                "first_failing_scale": cap.hi,
                "attainment_at_first_failing": cap.attainment_at_hi if cap.hi is not None else None,
                "goodput_rps_at_max_rate": None if top is None else top.goodput_rps,
                "goodput_per_gpu_rps_at_max_rate": None if top is None else top.goodput_per_gpu_rps,
                "slo_attainment_frac_at_max_rate": None if top is None else top.slo_attainment_frac,
                "goodput_rps_at_workload_rate": None if probe is None else probe.goodput_rps,
                "slo_attainment_frac_at_workload_rate": None if probe is None else probe.slo_attainment_frac,
            }

        return {
            "scenario": self.scenario.model_dump(mode="json"),
            "gpus": self.gpus,
            "instances": self.scenario.tenant_groups[0].gpu_budget // self.scenario.cluster.tp,
            "tp": self.scenario.cluster.tp,
            "target_frac": self.target_frac,
            "base_rate_rps": self.base_rate_rps,
            "best": cap_row(self.best),
            "max_sustainable_rps": self.max_sustainable_rps,
            "ranked": [cap_row(c) for c in self.ranked()],
            "pareto": self.pareto,
            "curves": self.curves,
            "probes": [p.as_dict() for p in self.probes],
            "stages": self.stages,
            "wall_s": self.wall_s,
            "num_probes": self.num_probes,
            "num_cache_hits": self.num_cache_hits,
            "exhaustive": self.exhaustive,
            "code_version": code_version(),
        }


def _rank_key(at_capacity: Mapping[PlanConfig, Probe]) -> Callable[[Capacity], tuple[float, ...]]:
    def key(cap: Capacity) -> tuple[float, ...]:
        probe = at_capacity.get(cap.config)
        goodput = probe.goodput_rps if probe is not None else 0.0
        simple = 0 if cap.config.is_aggregated else 1
        exceptions = len(cap.config.tenant_routes)
        config = cap.config
        return (-cap.lo, exceptions, -cap.attainment_at_hi, -goodput, simple, config.num_prefill, _level_order(config))

    return key


def _level_order(config: PlanConfig) -> int:
    tokens = config.min_remote_input_tokens
    return -1 if tokens is None else tokens


def plan(
    scenario: Scenario,
    *,
    levels_tokens: Sequence[int] = DEFAULT_LEVELS_TOKENS,
    target_frac: float = 0.9,
    steps_per_doubling: int = 16,
    workers: int = 1,
    cache_dir: Path | None = None,
    exhaustive: bool = False,
    pareto: bool = True,
    per_tenant: bool = True,
    progress: Callable[[int, int, str], None] | None = None,
) -> PlanResult:
    """Search the configurations of ``scenario``'s GPU budget (see the module docstring)."""
    start_wall = time.perf_counter()
    num_instances = scenario.tenant_groups[0].gpu_budget // scenario.cluster.tp
    everything = candidate_configs(num_instances, levels_tokens)
    caps: dict[PlanConfig, Capacity] = {}
    stages: list[dict[str, Any]] = []
    with ProbeRunner(
        scenario, workers=workers, cache_dir=cache_dir, progress=progress, stop_below_frac=target_frac
    ) as runner:

        def stage(name: str, configs: Sequence[PlanConfig], floor: float | None = None) -> None:
            runner.stage = name
            before = runner.num_submitted
            members = list(dict.fromkeys(configs))
            new = sum(1 for c in members if c not in caps)
            result = _shared_bisection(
                runner,
                members,
                target_frac=target_frac,
                steps_per_doubling=steps_per_doubling,
                start_index=0 if floor is None else round(steps_per_doubling * math.log2(floor)),
                start_is_floor=floor is not None,
            )
            for config, cap in result.items():
                caps[config] = _merge(caps.get(config), cap)
            stages.append({"stage": name, "configs": new, "probes": runner.num_submitted - before})

        def settle_ties() -> None:
            """Exact attainment at the first failing multiplier for the configurations tied at the top."""
            runner.stage = "tie-break"
            top_lo = max(c.lo for c in caps.values())
            if top_lo <= 0:
                return
            tied = [(c.config, c.hi) for c in caps.values() if c.lo == top_lo and c.hi is not None]
            for probe in runner.run(tied, exact=True):
                caps[probe.config].attainment_at_hi = probe.slo_attainment_frac

        def leader() -> Capacity:
            return min(caps.values(), key=_rank_key({}))

        if exhaustive or num_instances < 3:
            stage("exhaustive", everything)
        else:
            levels = route_levels(levels_tokens)
            coarse = _coarse_splits(num_instances)
            coarse_levels = levels if len(levels) <= 3 else [levels[0], *levels[2::2]]
            stage(
                "coarse",
                [everything[0], *(PlanConfig(p, num_instances - p, lvl) for p in coarse for lvl in coarse_levels)],
            )
            best = leader()
            if best.lo > 0:  # else nothing sustained even the smallest multiplier: no finer search helps
                step = max((b - a for a, b in itertools.pairwise(coarse)), default=1)
                center = _center(caps.values())
                fine = [
                    PlanConfig(p, num_instances - p, lvl)
                    for p in range(max(center - step + 1, 1), min(center + step, num_instances))
                    for lvl in _top_levels(caps.values(), 2)
                ]
                stage("fine-splits", [best.config, *fine], floor=best.lo)
                best, center = leader(), _center(caps.values())
                neighbours = [
                    PlanConfig(p, num_instances - p, lvl)
                    for p in range(max(center - 1, 1), min(center + 2, num_instances))
                    for lvl in levels
                ]
                stage("fine-levels", [best.config, *neighbours], floor=best.lo)
                _explore_plateau(stage, caps, levels, num_instances)
        settle_ties()
        if per_tenant and len(scenario.tenants) > 1:
            _refine_tenants(stage, leader, [t.name for t in scenario.tenants], route_levels(levels_tokens))
            settle_ties()
        runner.stage = "goodput at capacity"
        sustained = [(c.config, c.lo) for c in caps.values() if c.lo > 0]
        at_capacity = {p.config: p for p in runner.run(sustained, exact=True)}  # passing probes: all known
        at_workload_rate = {c: p for (c, scale, _), p in runner.probes.items() if scale == 1.0 and p.complete}
        ranked = sorted(caps.values(), key=_rank_key(at_capacity))
        best = ranked[0]
        curves: dict[str, list[dict[str, Any]]] = {}
        front: list[dict[str, Any]] = []
        if pareto and best.lo > 0:
            runner.stage = "pareto"
            front, curves = _pareto(runner, ranked, best.lo)
        probes = _distinct_probes(runner.probes)
        base_rate = _base_rate_rps(probes)
        return PlanResult(
            scenario=scenario,
            best=best,
            capacities=list(caps.values()),
            probes=probes,
            at_capacity=at_capacity,
            at_workload_rate=at_workload_rate,
            pareto=front,
            curves=curves,
            wall_s=time.perf_counter() - start_wall,
            num_probes=runner.num_submitted,
            num_cache_hits=runner.num_cache_hits,
            exhaustive=exhaustive,
            target_frac=target_frac,
            base_rate_rps=base_rate,
            stages=stages,
        )


def _explore_plateau(
    stage: Callable[..., None], caps: Mapping[PlanConfig, Capacity], levels: Sequence[str], num_instances: int
) -> None:
    """Grow the set of configurations tied at the top until it is closed under its neighbours.

    Capacity landscapes are often flat at the top (several splits and levels within one grid step). Every
    disaggregated configuration tied with the best gets its neighbours searched (every level at its split and at
    one prefill instance more or fewer), from the known capacity, so the tie-break sees the plateau that an
    exhaustive search would.
    """
    for round_index in range(num_instances):
        top = max(c.lo for c in caps.values())
        if top <= 0:
            return
        tied = [c.config for c in caps.values() if c.lo == top and not c.config.is_aggregated]
        new: list[PlanConfig] = []
        for config in tied:
            p = config.num_prefill
            around = [
                PlanConfig(q, num_instances - q, level)
                for q in (p - 1, p, p + 1)
                if 1 <= q < num_instances
                for level in levels
            ]
            new.extend(c for c in around if c not in caps and c not in new)
        if not new:
            return
        stage(f"plateau-{round_index + 1}", [tied[0], *new], floor=top)


def _refine_tenants(
    stage: Callable[..., None], leader: Callable[[], Capacity], tenants: Sequence[str], levels: Sequence[str]
) -> None:
    """Per-tenant route levels at the best split: one tenant at a time tries every other level (coordinate ascent).

    Each pass tries, for every tenant without an exception yet, every other level on top of the current leader
    (from the leader's capacity, so a worse variant costs one probe); it stops when the leader keeps its levels.
    """
    for round_index in range(len(tenants)):
        best = leader()
        if best.config.is_aggregated or best.lo <= 0:
            return
        fixed = dict(best.config.tenant_routes)
        variants = [
            replace(best.config, tenant_routes=tuple(sorted({**fixed, tenant: level}.items())))
            for tenant in tenants
            if tenant not in fixed
            for level in levels
            if level != best.config.route
        ]
        if not variants:
            return
        stage(f"per-tenant-{round_index + 1}", [best.config, *variants], floor=best.lo)
        if leader().config == best.config:
            return


def _distinct_probes(known: Mapping[tuple[PlanConfig, float, float | None], Probe]) -> list[Probe]:
    """One probe per (configuration, multiplier): the complete one when both kinds exist."""
    out: dict[tuple[PlanConfig, float], Probe] = {}
    for (config, scale, _), probe in sorted(known.items(), key=lambda kv: kv[0][2] is None):
        current = out.get((config, scale))
        if current is None or (probe.complete and not current.complete):
            out[(config, scale)] = probe
    return [out[k] for k in sorted(out, key=lambda k: (k[0], k[1]))]


def _center(caps: Iterable[Capacity]) -> int:
    """Prefill instances of the best disaggregated configuration (1 when none sustained anything)."""
    disaggregated = [c for c in caps if not c.config.is_aggregated]
    if not disaggregated:
        return 1
    return min(disaggregated, key=_rank_key({})).config.num_prefill


def _top_levels(caps: Iterable[Capacity], count: int) -> list[str]:
    best_by_level: dict[str, Capacity] = {}
    key = _rank_key({})
    for cap in caps:
        if cap.config.is_aggregated:
            continue
        current = best_by_level.get(cap.config.route)
        if current is None or key(cap) < key(current):
            best_by_level[cap.config.route] = cap
    ordered = sorted(best_by_level.values(), key=key)
    return [c.config.route for c in ordered[:count]]


def _base_rate_rps(probes: Sequence[Probe]) -> float:
    """Offered rate at multiplier 1 (every configuration sees the same requests at one multiplier)."""
    at_one = [p.offered_rps for p in probes if p.rate_scale == 1.0]
    if at_one:
        return at_one[0]
    return probes[0].offered_rps / probes[0].rate_scale if probes else 0.0


def _pareto(
    runner: ProbeRunner, ranked: Sequence[Capacity], best_scale: float
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Rate curves of the leading configurations and their upper envelope (the front)."""
    shown: list[PlanConfig] = []
    best_agg = next((c for c in ranked if c.config.is_aggregated), None)
    for cap in [*ranked[:2], *([best_agg] if best_agg is not None else [])]:
        if cap.config not in shown:
            shown.append(cap.config)
    scales = [round(best_scale * f, 9) for f in _PARETO_GRID_FRACS]
    probes = runner.run(((c, s) for c in shown for s in scales), exact=True)
    curves: dict[str, list[dict[str, Any]]] = {}
    for p in probes:
        curves.setdefault(p.config.label, []).append(
            {
                "rate_scale": p.rate_scale,
                "offered_rps": p.offered_rps,
                "goodput_per_gpu_rps": p.goodput_per_gpu_rps,
                "slo_attainment_frac": p.slo_attainment_frac,
            }
        )
    front = []
    for s in scales:
        at = [p for p in probes if p.rate_scale == s]
        top = max(at, key=lambda p: (p.goodput_per_gpu_rps, -shown.index(p.config)))
        front.append(
            {
                "rate_scale": s,
                "offered_rps": top.offered_rps,
                "goodput_per_gpu_rps": top.goodput_per_gpu_rps,
                "slo_attainment_frac": top.slo_attainment_frac,
                "label": top.config.label,
                **top.config.as_dict(),
            }
        )
    return front, curves


# ------------------------------------------------------------------------------------------------ outputs


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 6)


def _pd_block(thresholds: RoutingThresholds) -> dict[str, Any]:
    """A complete ``pd_disaggregation_policy`` block: loading it gives back exactly ``thresholds``."""
    return {
        "rule": thresholds.rule.value,
        "remote_prefill": {
            "min_input_tokens": thresholds.min_remote_input_tokens,
            "max_prefill_queue_wait_ms": _ms(thresholds.max_prefill_queue_wait_s),
            "min_expected_output_tokens": thresholds.min_expected_output_tokens,
            "require_decode_pool_pressure": thresholds.require_decode_pool_pressure,
            "decode_pressure_threshold_perc": round(100.0 * thresholds.decode_pressure_threshold_frac, 9),
        },
        "local_prefill": {
            "max_input_tokens": thresholds.max_local_input_tokens,
            "prefer_when_prefix_cache_hit": thresholds.prefer_local_on_prefix_hit,
        },
    }


def policy_document(result: PlanResult, source: str = "") -> dict[str, Any]:
    """A per-tenant policy file (seed format) for the best configuration: thresholds, SLOs, pinned pools."""
    scenario = result.scenario
    config = result.best.config
    group = scenario.tenant_groups[0]
    thresholds = config.thresholds()
    pd = {"rule": "aggregated_only"} if config.is_aggregated else _pd_block(thresholds)
    fallback = {
        "on_kv_transfer_timeout": FallbackAction(thresholds.on_kv_transfer_timeout).value,
        "on_prefill_queue_overload": FallbackAction(thresholds.on_prefill_queue_overload).value,
    }
    tenants = []
    for tenant in scenario.tenants:
        slo = {
            f"{name}_ms": _ms(getattr(tenant.slo, f"{name}_s"))
            for name in _SLO_FIELDS
            if getattr(tenant.slo, f"{name}_s") is not None
        }
        entry: dict[str, Any] = {"name": tenant.name, "group": GROUP_NAME, "priority": tenant.priority, "slo": slo}
        if tenant.expected_output_tokens is not None:
            entry["expected_output_tokens"] = tenant.expected_output_tokens
        if config.route_for(tenant.name) != config.route:
            entry["pd_disaggregation_policy"] = _pd_block(config.thresholds(tenant.name))
        tenants.append(entry)
    num_prefill = 0 if config.is_aggregated else config.num_prefill
    description = (
        f"pdctl plan{' of ' + source if source else ''}: {config.label} on {group.gpu_budget} GPUs "
        f"(TP {scenario.cluster.tp}); sustains x{result.best.lo:.3g} of the workload rate "
        f"({result.max_sustainable_rps:.3g} req/s) at >= {result.target_frac:.0%} SLO attainment"
    )
    return {
        "version": 1,
        "description": description,
        "mode": "aggregated_only" if config.is_aggregated else "disaggregated",
        "pd_disaggregation_policy": pd,
        "fallback": fallback,
        "tenant_groups": [
            {
                "name": GROUP_NAME,
                "gpu_budget": group.gpu_budget,
                "gpus_per_instance": scenario.cluster.tp,
                "pools": {
                    "prefill": {"min": num_prefill, "max": num_prefill},
                    "decode": {"min": config.num_decode, "max": config.num_decode},
                },
            }
        ],
        "tenants": tenants,
    }


def best_scenario(result: PlanResult, rate_scale: float = 1.0) -> Scenario:
    """The searched scenario deployed as the best configuration (what ``pdctl sim`` runs the policy file on)."""
    return configured_scenario(result.scenario, result.best.config, rate_scale)
