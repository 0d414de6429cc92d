"""Evaluate policies over scenarios and seeds: one loop, the same env and guard for every policy.

Every run is :func:`agents.harness.run_one`: the policy a spec names (:func:`agents.policy_specs.make_policy`, the
grammar of :mod:`policies.registry` plus ``grid:`` and ``expert:H``) drives :class:`env.gym_env.PDClusterEnv`
once per control interval through the one episode loop (:func:`agents.runs.run_episode`: guard, apply,
simulate, then the drain) and the run is scored. Baselines, rule files, the grid-searched static optimum,
learned policies and policies under the SLO watchdog are therefore judged by the very same code path.

Policy specs: ``baseline:NAME`` (:mod:`policies.baselines`, plus ``queue_kv`` of :mod:`policies.rules`),
``file:PATH`` (a policy file; each scenario tenant gets the file's thresholds for it, from the first simulated
second), ``grid:`` (the best static configuration of :mod:`agents.grid_search` for the scenario),
``learned:PATH`` (:meth:`policies.learned.LearnedPolicy.load`), ``registry:models:/NAME@ALIAS`` (where an
MLflow client is given), ``expert:H`` (the clairvoyant lookahead expert, :mod:`agents.policy_specs`), and
``watchdog:PRIMARY`` / ``watchdog[FALLBACK]:PRIMARY`` (a policy under the SLO watchdog of
:mod:`policies.watchdog` with a ``baseline:`` or ``file:`` fallback,
:data:`policies.registry.WATCHDOG_FALLBACK` when none is named).

Scores per tenant (and an ``ALL`` row per run) are :mod:`agents.harness`'s. Means over seeds come with a 95 %
Student-t confidence half-width.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents.gate import evaluate_specs, file_sha256
from agents.grid_search import best_points, search
from agents.harness import (
    ALL_TENANTS,
    METRICS,
    RunResult,
    RunSpec,
    guard_changes,
    run_label,
    run_many,
    run_one,
    run_one_safe,
    slo_met,
    weighted_goodput_rps,
)
from agents.policy_specs import (
    EXPERT_GRID_CANDIDATES,
    EXPERT_TEACHERS,
    SEED_POLICY_SPEC,
    all_baseline_specs,
    make_policy,
    profiled_throughputs,
)
from agents.runs import scale_rates
from agents.source_digest import source_digest
from env.gym_env import SCENARIO_DIR
from policies.guard import GuardLimits

__all__ = [
    "ALL_TENANTS",
    "EXPERT_GRID_CANDIDATES",
    "EXPERT_TEACHERS",
    "METRICS",
    "SEED_POLICY_SPEC",
    "Evaluation",
    "RunResult",
    "RunSpec",
    "aggregate",
    "all_baseline_specs",
    "evaluate",
    "evaluate_policies",
    "load_suites",
    "make_policy",
    "profiled_throughputs",
    "ranked",
    "run_many",
    "run_one",
    "run_one_safe",
    "scale_rates",
    "scenario_paths",
    "simulator_digest",
    "slo_met",
    "sweep_rate",
    "weighted_goodput_rps",
    "write_results",
]
"""Besides its own functions, the module re-exports the run harness, the policy factory and ``scale_rates``
under their old names (callers import them from here)."""

SUITES_FILE = SCENARIO_DIR / "suites.yaml"


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


# ------------------------------------------------------------------------------------------------ many runs


def _t95(n: int) -> float:
    from scipy.stats import t  # third-party and slow to import: only when seeds are aggregated

    return float(t.ppf(0.975, n - 1)) if n > 1 else math.nan


SIMULATOR_SOURCES = ("env/sim", "env/perf")
"""The source a simulated run's outcome is measured by (the engine, the event loop and the performance model)."""


def simulator_digest() -> str:
    """Digest of :data:`SIMULATOR_SOURCES`: rows measured by two different simulators are not to be compared."""
    return source_digest("simulator", SIMULATOR_SOURCES)


def aggregate(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Mean and 95 % confidence half-width over seeds, per (policy, scenario, rate scale, tenant)."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        key = (
            row["policy"],
            row["scenario"],
            row["rate_scale"],
            row["tenant"],
            row.get("scenario_sha256"),
            row.get("simulator_sha256"),
        )
        groups.setdefault(key, []).append(row)
    out: list[dict[str, Any]] = []
    for (policy, scenario, rate_scale, tenant, digest, simulator), members in groups.items():
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
        if digest is not None:
            agg["scenario_sha256"] = digest
        if simulator is not None:
            agg["simulator_sha256"] = simulator
        out.append(agg)
    return out


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
    admission_ttft_slack_frac: float | None = None,
    guard: GuardLimits | None = None,
) -> Evaluation:
    """Run every policy × scenario × seed (the first seed records timelines and samples for plots).

    ``admission_ttft_slack_frac`` runs every policy behind the router's admission stage
    (:class:`policies.admission.AdmissionConfig`); its rows name the policy ``SPEC+admission``. ``guard`` runs every
    policy under those safety-guard limits instead of the controller's defaults; its rows name the policy
    ``SPEC+guard[...]`` with the limits that differ (:func:`agents.harness.run_label`).

    Raises:
        ValueError: ``guard`` with a ``grid:`` or ``expert:`` policy (their searches rank under the default guard).
    """
    if guard_changes(guard) and any(p.startswith(("grid:", "expert:")) for p in policies):
        raise ValueError("grid: and expert: policies search under the default guard; run them without another guard")
    grid_points: dict[str, dict[str, Any]] = {}
    if any(p.startswith("grid:") for p in policies):
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
            admission_ttft_slack_frac=admission_ttft_slack_frac,
            guard=guard,
        )
        for path in scenarios
        for policy in policies
        for seed in seeds
    ]
    runs = run_many(specs, workers, on_done)
    # every row names the exact scenario file and simulator it was measured on: tables made from different files (a
    # generator or a performance model changed in between) or by different simulators cannot be compared by name
    digests = {str(path): file_sha256(path) for path in scenarios}
    simulator = simulator_digest()
    for run in runs:
        for row in run.rows:
            row["scenario_sha256"] = digests[run.spec.scenario_path]
            row["simulator_sha256"] = simulator
    rows = [row for run in runs for row in run.rows]
    return Evaluation(runs, aggregate(rows), grid_points)


def evaluate_policies(
    specs: Sequence[str],
    scenarios: Sequence[Path],
    seeds: Sequence[int],
    admission_ttft_slack_frac: float | None = None,
) -> dict[str, dict[str, float]]:
    """Mean priority-weighted goodput (req/s) per policy and scenario over ``seeds``, plus ``mean`` per policy.

    The gate's evaluation loop (:func:`agents.gate.evaluate_specs`), as a table. With ``admission_ttft_slack_frac``
    every policy runs behind the admission stage (:attr:`agents.harness.RunSpec.admission_ttft_slack_frac`).
    """
    scores = evaluate_specs(specs, scenarios, seeds, admission_ttft_slack_frac)
    return {spec: {**score.per_scenario, "mean": score.mean} for spec, score in scores.items()}


def write_results(evaluation: Evaluation, out: Path, command: str) -> None:
    """``results.csv`` (aggregates), ``results_seeds.csv`` (per run), ``results.json`` (all, plus the command).

    ``results.json`` also has, per ``expert:H`` run, how many intervals the expert acted as each candidate
    (``expert_choices``), and per ``watchdog:`` run its trips and the intervals its fallback decided
    (``watchdog``).
    """
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
            {"policy": r.spec.label, "scenario": r.scenario, "seed": r.spec.seed, "error": r.error}
            for r in evaluation.runs
            if r.error is not None
        ],
        "wall_s": {f"{r.spec.label}|{r.scenario}|{r.spec.seed}": r.wall_s for r in evaluation.runs},
        "expert_choices": {
            f"{r.spec.label}|{r.scenario}|{r.spec.seed}": r.expert_choices for r in evaluation.runs if r.expert_choices
        },
        "watchdog": {f"{r.spec.label}|{r.scenario}|{r.spec.seed}": r.watchdog for r in evaluation.runs if r.watchdog},
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
    admission_ttft_slack_frac: float | None = None,
    guard: GuardLimits | None = None,
) -> list[dict[str, Any]]:
    """Per policy and scenario, the highest rate multiplier at which ≥ ``target_frac`` of requests meet both SLOs.

    Doubles (or halves) from ``start`` until the attainment crosses the target, then bisects ``iterations``
    times; every probe runs all ``seeds`` (attainment = mean over seeds of the ``ALL`` row). Probes of all
    policies run in parallel. Returns one record per (policy, scenario) with the probed points and the
    :func:`simulator_digest` that measured them (``simulator_sha256``). ``admission_ttft_slack_frac`` and ``guard``
    as in :func:`evaluate`.
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
                specs.append(
                    RunSpec(
                        policy,
                        path,
                        seed,
                        probe_of[i],
                        grid_point=gp,
                        traces_dir=traces_dir,
                        admission_ttft_slack_frac=admission_ttft_slack_frac,
                        guard=guard,
                    )
                )
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
    simulator = simulator_digest()
    out = []
    for i, (policy, path) in enumerate(states):
        lo, hi = bracket[i]
        out.append(
            {
                "policy": run_label(policy, admission_ttft_slack_frac, guard),
                "scenario": Path(path).stem,
                "max_rate_scale": lo,
                "first_failing_scale": hi,
                "target_frac": target_frac,
                "points": sorted(points[i]),
                "simulator_sha256": simulator,
            }
        )
    return out
