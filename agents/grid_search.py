"""The oracle-ish upper reference: the best *static* configuration of a scenario, found by grid search.

A configuration is a prefill:decode split per tenant group (every split of the group's instance budget within
its pool bounds) and one route level for every tenant:

* ``local`` — aggregated serving (only with no prefill instances; a split with 0 prefill is served this way);
* ``remote`` — every request prefilled remotely (B1);
* ``remote>=N`` for N in 512, 1024, 2048, 4096, 8192 — the project's rule with ``min_remote_input_tokens = N``,
  ``max_local_input_tokens = N/2``, no decode-pressure requirement, the seed's queue-wait fallback.

Each configuration runs through :func:`agents.evaluate.run_one` — the same env, guard and scoring as every
policy, from the same starting deployment (the scenario's): the static policy asks for its split from the first
interval and the guard walks the pools there, as it would for any policy — on the search seeds.
``pdctl evaluate`` searches on the evaluation seeds themselves, so ``grid:`` is the exact best static
configuration *of the evaluated sample paths* (an oracle over static configurations: it knows the load it will be
scored on). The best mean priority-weighted goodput wins (ties: higher return). It is not an upper bound for
dynamic policies: a per-request rule that reads queues (e.g. legacy Dynamo's) can beat every static threshold.
Results are cached as JSON per scenario content, grid definition and seeds; runs are spread over processes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from env.gym_env import resolve_scenario
from env.scenario import Scenario
from policies.base import PolicyContext
from policies.features import Observation
from policies.schema import ControlAction, PoolTargets, RouteRule, RoutingThresholds

__all__ = [
    "DEFAULT_CACHE_DIR",
    "GRID_VERSION",
    "ROUTE_LEVELS",
    "SEARCH_SEEDS",
    "StaticPolicy",
    "best_points",
    "grid_points",
    "route_thresholds",
    "search",
    "static_policy",
]

GRID_VERSION = 3
"""Bump when the grid, the scoring or the env changes what a cached result means."""
SEARCH_SEEDS: tuple[int, ...] = (0, 1, 2)
DEFAULT_CACHE_DIR = Path(__file__).resolve().parents[1] / "experiments" / "results" / "grid_cache"
_REMOTE_LEVELS_TOKENS = (512, 1024, 2048, 4096, 8192)
ROUTE_LEVELS: tuple[str, ...] = ("local", "remote", *(f"remote>={n}" for n in _REMOTE_LEVELS_TOKENS))


def route_thresholds(level: str, base: RoutingThresholds | None = None) -> RoutingThresholds:
    """The routing thresholds of a route level (see the module docstring)."""
    base = base or RoutingThresholds()
    if level == "local":
        return replace(base, rule=RouteRule.AGGREGATED_ONLY, buckets=())
    if level == "remote":
        return replace(base, rule=RouteRule.ALWAYS_REMOTE, buckets=())
    if level.startswith("remote>="):
        tokens = int(level.removeprefix("remote>="))
        return replace(
            base,
            rule=RouteRule.PDCTL,
            buckets=(),
            min_remote_input_tokens=tokens,
            max_local_input_tokens=tokens // 2,
            require_decode_pool_pressure=False,
        )
    raise ValueError(f"unknown route level {level!r} (known: {', '.join(ROUTE_LEVELS)})")


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
        levels = [lvl for lvl in ROUTE_LEVELS if lvl != "local"] if any_prefill else ["local"]
        points.extend({"pools": {g: list(p) for g, p in split.items()}, "route": level} for level in levels)
    return points


class StaticPolicy:
    """A fixed configuration: the same pool targets and thresholds every interval."""

    def __init__(self, pools: Mapping[str, PoolTargets], thresholds: Mapping[str, RoutingThresholds], policy_id: str):
        self._pools = dict(pools)
        self._thresholds = dict(thresholds)
        self._policy_id = policy_id

    @property
    def policy_id(self) -> str:
        """The spec plus the configuration."""
        return self._policy_id

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """Always the configuration."""
        del observation, context
        return ControlAction(
            thresholds=dict(self._thresholds), pools=dict(self._pools), reason="static", policy_id=self._policy_id
        )


def static_policy(point: Mapping[str, Any], scenario: Scenario, spec: str = "grid:") -> StaticPolicy:
    """The :class:`StaticPolicy` of one grid point for ``scenario``."""
    pools = {g: PoolTargets(int(p[0]), int(p[1])) for g, p in point["pools"].items()}
    thresholds = {t.name: route_thresholds(str(point["route"])) for t in scenario.tenants}
    label = ",".join(f"{g}={p[0]}P{p[1]}D" for g, p in point["pools"].items())
    return StaticPolicy(pools, thresholds, f"{spec}{label}/{point['route']}")


def _cache_key(scenario: Scenario, seeds: Sequence[int]) -> str:
    payload = {
        "version": GRID_VERSION,
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
    from agents.evaluate import RunSpec, run_many

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
        totals = [next(r for r in res.rows if r["tenant"] == "ALL") for res in runs]
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
