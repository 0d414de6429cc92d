"""The capacity planner's search: which P:D split and routing threshold serve a workload best at its SLO.

**Score.** A configuration's capacity is its *maximum sustainable rate*: the largest multiplier ``m`` of the
workload's request rate at which ≥ ``target_frac`` (90 %) of the arrived requests meet both their TTFT and
TPOT objectives, found by bisection over ``m`` on the grid ``2 ** (k / steps_per_doubling)`` (≈ 4.4 % steps by
default, the same grid for every configuration and stage). Every probe (:mod:`agents.planning.probes`) is one
simulator run of the scenario (the planned part of the source, :func:`agents.planning.inputs.load_plan_source`;
plus a drain), on the same seed for every configuration (common random numbers); the ranking is
:func:`agents.planning.result.rank_key`. Before it is recommended, the best configuration is replayed over the
whole source on another seed, falling back down the ranking until one passes (:mod:`agents.planning.validate`).

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
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agents.planning.inputs import DEFAULT_LEVELS_TOKENS, PlanConfig, candidate_configs, route_levels
from agents.planning.probes import ProbeRunner
from agents.planning.result import (
    Capacity,
    PlanResult,
    base_rate_rps,
    distinct_probes,
    pareto_front,
    rank_key,
)
from agents.planning.validate import validate
from env.scenario import Scenario

__all__ = ["grid_scale", "plan", "shared_bisection"]

_MIN_INDEX_DOUBLINGS = -6
_MAX_INDEX_DOUBLINGS = 8
"""The rate ladder spans multipliers 2**-6 .. 2**8."""


def grid_scale(index: int, steps_per_doubling: int) -> float:
    """Rate multiplier of a grid index: ``2 ** (index / steps_per_doubling)`` (every stage probes this grid)."""
    return float(2.0 ** (index / steps_per_doubling))


def shared_bisection(
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
    whole: Scenario | None = None,
    validation: bool = True,
) -> PlanResult:
    """Search the configurations of ``scenario``'s GPU budget (see the module docstring).

    With ``validation`` the best configuration is replayed over ``whole`` (default: ``scenario``) before it is
    recommended, falling back down the ranking until one passes (:func:`agents.planning.validate.validate`).
    """
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
            result = shared_bisection(
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
            return min(caps.values(), key=rank_key({}))

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
        ranked = sorted(caps.values(), key=rank_key(at_capacity))
        best = search_best = ranked[0]
        checked = None
        if validation and best.lo > 0:
            runner.stage = "validation"
            checked = validate(whole if whole is not None else scenario, ranked, target_frac)
            best = checked.recommended or best
        curves: dict[str, list[dict[str, Any]]] = {}
        front: list[dict[str, Any]] = []
        if pareto and best.lo > 0:
            runner.stage = "pareto"
            front, curves = pareto_front(runner, ranked, search_best.lo)
        probes = distinct_probes(runner.probes)
        base_rate = base_rate_rps(probes)
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
            search_best=search_best,
            validation=checked,
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


def _center(caps: Iterable[Capacity]) -> int:
    """Prefill instances of the best disaggregated configuration (1 when none sustained anything)."""
    disaggregated = [c for c in caps if not c.config.is_aggregated]
    if not disaggregated:
        return 1
    return min(disaggregated, key=rank_key({})).config.num_prefill


def _top_levels(caps: Iterable[Capacity], count: int) -> list[str]:
    best_by_level: dict[str, Capacity] = {}
    key = rank_key({})
    for cap in caps:
        if cap.config.is_aggregated:
            continue
        current = best_by_level.get(cap.config.route)
        if current is None or key(cap) < key(current):
            best_by_level[cap.config.route] = cap
    ordered = sorted(best_by_level.values(), key=key)
    return [c.config.route for c in ordered[:count]]
