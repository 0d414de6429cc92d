"""Probes of the capacity planner: one simulator run of a configuration at a rate multiplier, cached and pooled.

:func:`run_probe` simulates one configuration as a static policy through the one episode loop
(:func:`agents.runs.run_episode`) and scores it by the simulator's own summary
(:func:`env.sim.summary.summarize`: goodput = requests meeting both objectives per second of horizon;
attainment is over *arrived* requests, so unfinished and rejected requests count as misses, as everywhere
(:mod:`policies.scoring`)). A search probe stops early once its attainment can no longer reach the target
(only a failing run can stop); tables and the front use complete runs.

:class:`ProbeRunner` runs probes in parallel processes and caches each as a JSON file keyed by a content hash
of the scenario (with the size and modification time of the trace files it reads), the configuration, the
rate multiplier, the early-stop target and the code version (:func:`code_version`: the source of the
simulator, performance model, workloads, routing, the episode loop and this package). Everything is seeded;
results do not depend on ``workers`` or on the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from agents.planning.inputs import PlanConfig, configured_scenario
from agents.runs import episode_env, run_episode
from agents.source_digest import source_digest
from env.gym_env import PDClusterEnv
from env.scenario import Scenario
from env.sim.simulator import ClusterSimulator
from env.sim.summary import summarize
from policies.base import Policy
from policies.rules import FilePolicy
from policies.scoring import count_slo_met, slo_attainment_frac

__all__ = [
    "PLAN_VERSION",
    "Probe",
    "ProbeRunner",
    "code_version",
    "probe_key",
    "run_policy_episode",
    "run_probe",
    "scenario_key",
]

PLAN_VERSION = 1
"""Bump when the meaning of a cached probe changes in a way the code hash does not see."""
_CODE_PATHS = (
    "agents/planning",
    "agents/runs.py",
    "env/gym_env.py",
    "env/sim",
    "env/perf",
    "env/workloads",
    "env/scenario.py",
    "policies/control.py",
    "policies/guard.py",
    "policies/placement.py",
    "policies/routing.py",
    "policies/route_levels.py",
    "policies/rules.py",
    "policies/schema.py",
    "policies/scoring.py",
)
"""Source (relative to the repository root) that decides what a probe returns."""


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

    Besides the simulator, performance model, workloads, routing, placement and scoring, that is the episode
    loop and the control step a probe runs through, and this package.
    """
    return source_digest(f"plan-v{PLAN_VERSION}", _CODE_PATHS)


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
    return run_policy_episode(deployed, policy, config, rate_scale, stop_below_frac, start)


def run_policy_episode(
    deployed: Scenario,
    policy: Policy,
    config: PlanConfig,
    rate_scale: float,
    stop_below_frac: float | None = None,
    start_s: float | None = None,
) -> Probe:
    """Run ``policy`` on the deployed scenario through the one episode loop and score it as a probe.

    ``config`` labels the probe (for a policy in the loop: its starting pools). Early stop as :func:`run_probe`.
    """
    start = time.perf_counter() if start_s is None else start_s
    env = episode_env(deployed, policy)
    stop = None if stop_below_frac is None else _Hopeless(stop_below_frac)
    episode = run_episode(env, policy, deployed.seed, stop=stop)
    sim, complete = episode.sim, not episode.stopped
    horizon_s = deployed.duration_s
    summary = summarize(sim, time.perf_counter() - start, deployed.name, policy.policy_id, deployed.seed, horizon_s)
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
