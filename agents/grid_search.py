"""The oracle-ish upper reference: the best *static* configuration of a scenario, found by grid search.

A configuration is a prefill:decode split per tenant group (every split of the group's instance budget within
its pool bounds) and one route level for every tenant:

* ``aggregated`` — aggregated serving (only with no prefill instances; a split with 0 prefill is served this way);
* ``always_remote`` — every request prefilled remotely (B1);
* ``remote>=N`` for N in 512, 1024, 2048, 4096, 8192 — the project's rule with a crisp threshold at N tokens.

The levels are :mod:`policies.route_levels`'s, the same the capacity planner searches. Each configuration is a
static policy (:func:`agents.policy_specs.static_policy`) run through :func:`agents.harness.run_one` — the same
env, guard and scoring as every policy, from the same starting deployment (the scenario's): its thresholds are
in force from the first simulated second, it asks for its split from the first interval and the guard walks the
pools there, as it would for any policy — on the search seeds.
``pdctl evaluate`` searches on the evaluation seeds themselves, so ``grid:`` is the exact best static
configuration *of the evaluated sample paths* (an oracle over static configurations: it knows the load it will be
scored on). The best mean priority-weighted goodput wins (ties: higher return). It is not an upper bound for
dynamic policies: a per-request rule that reads queues (e.g. legacy Dynamo's) can beat every static threshold.

The grid is the product of every group's splits, so it grows as the budgets multiply: 49,147 configurations for a
generated scenario of three groups. Beyond :data:`MAX_EXHAUSTIVE_POINTS`, a scenario of several groups is searched
group by group (``per_group``, :func:`_per_group_candidates`): the groups share nothing a static configuration
touches, so each group's splits are scanned side by side per level and only the best combinations are run whole
(hundreds of runs instead of tens of thousands; ``experiments/grid_per_group_check.py`` compares it with the
exhaustive search where both fit).
Results are cached as JSON (under ``$PDCTL_DATA_DIR/grid_cache``, ``./data/grid_cache`` by default) per scenario
content, grid definition, seeds and the digest of the source that scores a point (simulator, env, core, harness), so
an entry is never read across a code change; runs are spread over processes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from agents.harness import ALL_TENANTS, RunResult, RunSpec, run_many
from agents.source_digest import source_digest
from env.gym_env import resolve_scenario
from env.scenario import Scenario, TenantGroupConfig
from env.workloads.trace_catalog import data_dir
from policies.route_levels import AGGREGATED, ALWAYS_REMOTE, remote_level

__all__ = [
    "DEFAULT_CACHE_DIR",
    "GRID_VERSION",
    "ROUTE_LEVELS",
    "SEARCH_SEEDS",
    "best_points",
    "grid_points",
    "search",
]

GRID_VERSION = 4
"""Bump when the grid, the scoring or the env changes what a cached result means (4: crisp ``remote>=N``
levels of :mod:`policies.route_levels`, named ``aggregated`` / ``always_remote``, in force from the start)."""
SEARCH_SEEDS: tuple[int, ...] = (0, 1, 2)
DEFAULT_CACHE_DIR = data_dir() / "grid_cache"
_REMOTE_LEVELS_TOKENS = (512, 1024, 2048, 4096, 8192)
ROUTE_LEVELS: tuple[str, ...] = (AGGREGATED, ALWAYS_REMOTE, *(remote_level(n) for n in _REMOTE_LEVELS_TOKENS))


def _group_options(scenario: Scenario, group: TenantGroupConfig) -> list[tuple[int, int]]:
    """Every (prefill, decode) split of one group's budget within its pool bounds."""
    options: list[tuple[int, int]] = []
    prefill_tp = scenario.cluster.prefill_tp or scenario.cluster.tp
    for num_prefill in range(0, group.gpu_budget // prefill_tp + 1):
        num_decode = (group.gpu_budget - num_prefill * prefill_tp) // scenario.cluster.tp
        if num_prefill < group.prefill_pool.min or (
            group.prefill_pool.max is not None and num_prefill > group.prefill_pool.max
        ):
            continue
        if num_decode < max(group.decode_pool.min, 1) or (
            group.decode_pool.max is not None and num_decode > group.decode_pool.max
        ):
            continue
        options.append((num_prefill, num_decode))
    return options


def _splits(scenario: Scenario) -> list[dict[str, tuple[int, int]]]:
    per_group = [[(g.name, split) for split in _group_options(scenario, g)] for g in scenario.tenant_groups]
    return [dict(combo) for combo in itertools.product(*per_group)]


def grid_points(scenario: Scenario) -> list[dict[str, Any]]:
    """Every configuration of the grid: ``{"pools": {group: [prefill, decode]}, "route": level}``."""
    points: list[dict[str, Any]] = []
    for split in _splits(scenario):
        any_prefill = any(p > 0 for p, _ in split.values())
        levels = [lvl for lvl in ROUTE_LEVELS if lvl != AGGREGATED] if any_prefill else [AGGREGATED]
        points.extend({"pools": {g: list(p) for g, p in split.items()}, "route": level} for level in levels)
    return points


_CODE_PATHS = (
    "agents/harness.py",
    "agents/runs.py",
    "agents/policy_specs.py",
    "agents/grid_search.py",
    "env",
    "policies",
)
"""Source a grid point's score depends on: the run harness and episode loop, the simulator and env, the core."""


SearchMethod = Literal["auto", "exhaustive", "per_group"]

MAX_EXHAUSTIVE_POINTS = 400
"""Above this many configurations, a scenario of several groups is searched group by group (``per_group``)."""
TOP_SPLITS_PER_GROUP = 3
"""``per_group``: each group's best splits (per level) that are combined into candidates."""
CONFIRMED_PER_LEVEL = 4
"""``per_group``: the candidate combinations per route level that are run and scored as whole configurations."""


def search_method(scenario: Scenario, method: SearchMethod = "auto") -> Literal["exhaustive", "per_group"]:
    """The method :func:`search` uses for ``scenario``.

    ``auto`` is exhaustive for one group or up to :data:`MAX_EXHAUSTIVE_POINTS` configurations, ``per_group`` beyond.
    """
    if method != "auto":
        return method
    if len(scenario.tenant_groups) > 1 and len(grid_points(scenario)) > MAX_EXHAUSTIVE_POINTS:
        return "per_group"
    return "exhaustive"


def _cache_key(scenario: Scenario, seeds: Sequence[int], method: str) -> str:
    payload: dict[str, Any] = {
        "version": GRID_VERSION,
        "code": source_digest(f"grid-v{GRID_VERSION}", _CODE_PATHS),
        "scenario": scenario.model_dump(mode="json"),
        "levels": ROUTE_LEVELS,
        "seeds": list(seeds),
    }
    if method != "exhaustive":  # a per-group result is never read for an exhaustive search
        payload["method"] = [method, TOP_SPLITS_PER_GROUP, CONFIRMED_PER_LEVEL]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


class _Runner:
    """Runs grid points on every seed, counting runs for the progress callback."""

    def __init__(
        self,
        scenario_path: str | Path,
        seeds: Sequence[int],
        workers: int,
        traces_dir: str | None,
        total_runs: int,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self.scenario_path, self.seeds, self.workers, self.traces_dir = str(scenario_path), seeds, workers, traces_dir
        self.total_runs, self.progress, self.done = total_runs, progress, 0

    def _tick(self, _: object) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total_runs)

    def run(self, points: Sequence[dict[str, Any]]) -> list[list[RunResult]]:
        """Per point, its runs on every seed (in seed order)."""
        specs = [
            RunSpec("grid:", self.scenario_path, seed, grid_point=point, traces_dir=self.traces_dir)
            for point in points
            for seed in self.seeds
        ]
        results = run_many(specs, self.workers, self._tick)
        n = len(self.seeds)
        return [results[i * n : (i + 1) * n] for i in range(len(points))]


def _score(points: Sequence[dict[str, Any]], runs: list[list[RunResult]]) -> tuple[list[dict[str, Any]], list[Any]]:
    """Each point with its mean score over the seeds; the points whose runs crashed apart, with their errors."""
    scored, errors = [], []
    for point, point_runs in zip(points, runs, strict=True):
        failed = [r.error for r in point_runs if r.error is not None]
        if failed:  # a configuration whose run crashed cannot be chosen; reported in the cache file
            errors.append({**point, "errors": failed})
            continue
        totals = [next(r for r in res.rows if r["tenant"] == ALL_TENANTS) for res in point_runs]
        scored.append(
            {
                **point,
                "weighted_goodput_rps": sum(t["weighted_goodput_rps"] for t in totals) / len(totals),
                "episode_return": sum(t["episode_return"] for t in totals) / len(totals),
                "slo_attainment_frac": sum(t["slo_attainment_frac"] or 0.0 for t in totals) / len(totals),
            }
        )
    return scored, errors


def _per_group_candidates(
    scenario: Scenario, runner: _Runner
) -> tuple[list[dict[str, Any]], dict[str, dict[str, list[dict[str, Any]]]], list[Any]]:
    """The ``per_group`` method: the points to run whole, each group's scan, and the scan's crashed runs.

    Groups share no instance, tenant, pool or guard state; with a static policy, a group's priority-weighted goodput
    depends on its own split and the route level, not on the others' splits (the simulator's one random stream,
    which draws KV-transfer failures, couples them in sample path only, not in distribution). So per level, run
    ``K`` = the most splits any group has, the ``k``-th run giving every group its ``k``-th split (cycling through
    the shorter lists), read each group's tenants' weighted goodput from every run, and combine each group's
    :data:`TOP_SPLITS_PER_GROUP` best splits; the :data:`CONFIRMED_PER_LEVEL` combinations with the largest summed
    estimate per level, and aggregated serving, are then run whole and ranked like exhaustive points.
    """
    groups = scenario.tenant_groups
    options = [_group_options(scenario, g) for g in groups]
    levels = [lvl for lvl in ROUTE_LEVELS if lvl != AGGREGATED]
    width = max(len(o) for o in options)
    scan: list[dict[str, Any]] = [
        {"pools": {g.name: list(options[gi][k % len(options[gi])]) for gi, g in enumerate(groups)}, "route": level}
        for level in levels
        for k in range(width)
    ]
    weight = {t.name: (t.group, t.priority) for t in scenario.tenants}
    # level -> group -> split -> per-seed weighted goodput of the group's tenants
    estimates: dict[str, dict[str, dict[tuple[int, int], list[float]]]] = {
        lvl: {g.name: {} for g in groups} for lvl in levels
    }
    errors: list[Any] = []
    for point, point_runs in zip(scan, runner.run(scan), strict=True):
        for res in point_runs:
            if res.error is not None:
                errors.append({**point, "errors": [res.error]})
                continue
            by_group: dict[str, float] = dict.fromkeys(point["pools"], 0.0)
            for row in res.rows:
                if row["tenant"] != ALL_TENANTS:
                    group, priority = weight[row["tenant"]]
                    by_group[group] += priority * row["goodput_rps"]
            for group, value in by_group.items():
                split = point["pools"][group]
                estimates[point["route"]][group].setdefault((split[0], split[1]), []).append(value)
    candidates: list[dict[str, Any]] = []
    report: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for level in levels:
        ranked: list[list[tuple[float, tuple[int, int]]]] = []
        report[level] = {}
        for g in groups:
            means = sorted(
                ((sum(v) / len(v), split) for split, v in estimates[level][g.name].items()),
                key=lambda item: (-item[0], item[1]),
            )
            report[level][g.name] = [{"split": list(sp), "weighted_goodput_rps": m} for m, sp in means]
            ranked.append(means[:TOP_SPLITS_PER_GROUP])
        if any(not r for r in ranked):  # a group none of whose scan runs finished: nothing to combine
            continue
        combos = sorted(itertools.product(*ranked), key=lambda c: -sum(m for m, _ in c))[:CONFIRMED_PER_LEVEL]
        for combo in combos:
            pools = {g.name: list(split) for g, (_, split) in zip(groups, combo, strict=True)}
            # as in the exhaustive grid, a configuration without a prefill instance is aggregated serving
            candidates.append({"pools": pools, "route": level if any(p for p, _ in pools.values()) else AGGREGATED})
    aggregated = _aggregated_point(groups, options)
    if aggregated is not None:
        candidates.append(aggregated)
    unique = {json.dumps(c, sort_keys=True): c for c in candidates}
    return list(unique.values()), report, errors


def _aggregated_point(
    groups: Sequence[TenantGroupConfig], options: Sequence[list[tuple[int, int]]]
) -> dict[str, Any] | None:
    """Aggregated serving, when every group may run without a prefill instance (its splits start at 0 prefill)."""
    if not all(o and o[0][0] == 0 for o in options):
        return None
    return {"pools": {g.name: list(o[0]) for g, o in zip(groups, options, strict=True)}, "route": AGGREGATED}


def _per_group_runs(scenario: Scenario, seeds: Sequence[int]) -> int:
    """How many runs the ``per_group`` method makes at most.

    The scan, then the candidates; fewer when candidates of several levels are the same aggregated configuration.
    """
    options = [_group_options(scenario, g) for g in scenario.tenant_groups]
    levels = len(ROUTE_LEVELS) - 1
    combos = min(CONFIRMED_PER_LEVEL, math.prod(min(TOP_SPLITS_PER_GROUP, len(o)) for o in options))
    aggregated = int(_aggregated_point(scenario.tenant_groups, options) is not None)
    return (levels * max(len(o) for o in options) + levels * combos + aggregated) * len(seeds)


def search(
    scenario_path: str | Path,
    *,
    seeds: Sequence[int] = SEARCH_SEEDS,
    workers: int = 2,
    cache_dir: Path | None = None,
    traces_dir: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    method: SearchMethod = "auto",
) -> dict[str, Any]:
    """Grid-search the best static configuration of a scenario (cached; see the module docstring).

    ``method`` (:func:`search_method`): ``exhaustive`` runs every configuration; ``per_group`` searches each group's
    split apart and runs only the best combinations whole (:func:`_per_group_candidates`); ``auto`` picks.

    Returns ``{"scenario", "key", "seeds", "method", "runs", "best", "best_score", "points": [{"pools", "route",
    "weighted_goodput_rps", "episode_return", "slo_attainment_frac"}, ...], "errors"}`` (``per_group`` adds
    ``"scan"``: per level and group, every split's estimated weighted goodput); ``points`` are the configurations
    run whole.
    """
    scenario = resolve_scenario(Path(scenario_path), traces_dir)
    chosen = search_method(scenario, method)
    key = _cache_key(scenario, seeds, chosen)
    cache = (cache_dir or DEFAULT_CACHE_DIR) / f"{scenario.name}-{key}.json"
    if cache.exists():
        cached: dict[str, Any] = json.loads(cache.read_text())
        return cached
    extra: dict[str, Any] = {}
    if chosen == "exhaustive":
        points = grid_points(scenario)
        runner = _Runner(scenario_path, seeds, workers, traces_dir, len(points) * len(seeds), progress)
        scored, errors = _score(points, runner.run(points))
    else:
        runner = _Runner(scenario_path, seeds, workers, traces_dir, _per_group_runs(scenario, seeds), progress)
        points, scan, errors = _per_group_candidates(scenario, runner)
        runner.total_runs = runner.done + len(points) * len(seeds)  # the candidates, now known
        scored, whole_errors = _score(points, runner.run(points))
        errors += whole_errors
        extra["scan"] = scan
    if not scored:
        first = errors[0]["errors"][0]
        raise RuntimeError(f"grid search of {scenario.name}: every configuration failed; first: {first}")
    best = max(scored, key=lambda p: (p["weighted_goodput_rps"], p["episode_return"]))
    result = {
        "scenario": scenario.name,
        "key": key,
        "seeds": list(seeds),
        "method": chosen,
        "runs": runner.done,
        "best": {"pools": best["pools"], "route": best["route"]},
        "best_score": best,
        "points": scored,
        "errors": errors,
        **extra,
    }
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(result, indent=1) + "\n")
    return result


def best_points(scenario_path: str | Path, count: int, **search_options: Any) -> list[dict[str, Any]]:
    """The ``count`` best configurations of :func:`search` (by weighted goodput), as ``{"pools", "route"}`` points.

    ``search_options`` go to :func:`search` (by default the search seeds, never the evaluation seeds).
    """
    ranked = sorted(search(scenario_path, **search_options)["points"], key=lambda p: -p["weighted_goodput_rps"])
    return [{"pools": p["pools"], "route": p["route"]} for p in ranked[:count]]
