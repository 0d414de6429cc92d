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
Results are cached as JSON (under ``$PDCTL_DATA_DIR/grid_cache``, ``./data/grid_cache`` by default) per scenario
content, grid definition, seeds and the digest of the source that scores a point (simulator, env, core, harness), so
an entry is never read across a code change; runs are spread over processes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agents.harness import ALL_TENANTS, RunSpec, run_many
from agents.source_digest import source_digest
from env.gym_env import resolve_scenario
from env.scenario import Scenario
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


def _splits(scenario: Scenario) -> list[dict[str, tuple[int, int]]]:
    per_group: list[list[tuple[str, tuple[int, int]]]] = []
    prefill_tp = scenario.cluster.prefill_tp or scenario.cluster.tp
    for g in scenario.tenant_groups:
        options = []
        for num_prefill in range(0, g.gpu_budget // prefill_tp + 1):
            num_decode = (g.gpu_budget - num_prefill * prefill_tp) // scenario.cluster.tp
            if num_prefill < g.prefill_pool.min or (
                g.prefill_pool.max is not None and num_prefill > g.prefill_pool.max
            ):
                continue
            if num_decode < max(g.decode_pool.min, 1) or (
                g.decode_pool.max is not None and num_decode > g.decode_pool.max
            ):
                continue
            options.append((g.name, (num_prefill, num_decode)))
        per_group.append(options)
    return [dict(combo) for combo in itertools.product(*per_group)]


def grid_points(scenario: Scenario) -> list[dict[str, Any]]:
    """Every configuration of the grid: ``{"pools": {group: [prefill, decode]}, "route": level}``."""
    points = []
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


def _cache_key(scenario: Scenario, seeds: Sequence[int]) -> str:
    payload = {
        "version": GRID_VERSION,
        "code": source_digest(f"grid-v{GRID_VERSION}", _CODE_PATHS),
        "scenario": scenario.model_dump(mode="json"),
        "levels": ROUTE_LEVELS,
        "seeds": list(seeds),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def search(
    scenario_path: str | Path,
    *,
    seeds: Sequence[int] = SEARCH_SEEDS,
    workers: int = 2,
    cache_dir: Path | None = None,
    traces_dir: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Grid-search the best static configuration of a scenario (cached; see the module docstring).

    Returns ``{"scenario", "key", "seeds", "best", "points": [{"pools", "route", "weighted_goodput_rps",
    "episode_return", "slo_attainment_frac"}, ...]}``.
    """
    scenario = resolve_scenario(Path(scenario_path), traces_dir)
    key = _cache_key(scenario, seeds)
    cache = (cache_dir or DEFAULT_CACHE_DIR) / f"{scenario.name}-{key}.json"
    if cache.exists():
        cached: dict[str, Any] = json.loads(cache.read_text())
        return cached
    points = grid_points(scenario)
    specs = [
        RunSpec("grid:", str(scenario_path), seed, grid_point=point, traces_dir=traces_dir)
        for point in points
        for seed in seeds
    ]
    done = [0]

    def tick(_: object) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], len(specs))

    results = run_many(specs, workers, tick)
    scored = []
    errors = []
    for i, point in enumerate(points):
        runs = results[i * len(seeds) : (i + 1) * len(seeds)]
        failed = [r.error for r in runs if r.error is not None]
        if failed:  # a configuration whose run crashed cannot be chosen; reported in the cache file
            errors.append({**point, "errors": failed})
            continue
        totals = [next(r for r in res.rows if r["tenant"] == ALL_TENANTS) for res in runs]
        scored.append(
            {
                **point,
                "weighted_goodput_rps": sum(t["weighted_goodput_rps"] for t in totals) / len(totals),
                "episode_return": sum(t["episode_return"] for t in totals) / len(totals),
                "slo_attainment_frac": sum(t["slo_attainment_frac"] or 0.0 for t in totals) / len(totals),
            }
        )
    if not scored:
        first = errors[0]["errors"][0]
        raise RuntimeError(f"grid search of {scenario.name}: every configuration failed; first: {first}")
    best = max(scored, key=lambda p: (p["weighted_goodput_rps"], p["episode_return"]))
    result = {
        "scenario": scenario.name,
        "key": key,
        "seeds": list(seeds),
        "best": {"pools": best["pools"], "route": best["route"]},
        "best_score": best,
        "points": scored,
        "errors": errors,
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
