"""Capacity with a policy in the loop (``pdctl plan --policy SPEC``): what the controller is worth in GPUs.

Two questions, both answered on the whole source (:attr:`agents.planning.inputs.PlanSource.whole`) and scored
like every probe (:func:`agents.planning.probes.run_policy_episode`: the one episode loop of
:mod:`agents.runs`, SLO attainment over arrived requests as :mod:`policies.scoring` defines it):

* **GPUs needed** at the workload's own rate (multiplier 1): the fewest instances ``n`` (GPUs = ``n × tp``) at
  which the policy, controlling thresholds and pools from its starting split, meets the attainment target;
  against the fewest at which *some* static configuration (every split under every route level, as the planner
  searches them) meets it. The difference is the GPUs the controller saves (negative: it costs GPUs).
* **Sustainable rate at the budget**: the largest multiplier on the planner's grid at which the policy meets
  the target with ``--gpus``, to compare with the best static configuration's.

A policy starts every episode from :func:`starting_pools` (half the instances prefilling unless the caller
gives another share), with the scenario's pool bounds; a policy that moves no pools keeps
them. Both searches assume attainment does not rise when instances are removed or the rate is raised: an
exponential ladder, then bisection (instances to one, multipliers to one grid step). A fresh policy is built
for every episode (policies keep state), by the caller's ``make`` (the registry's grammar for a scenario).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.planning.inputs import DEFAULT_LEVELS_TOKENS, PlanConfig, candidate_configs, configured_scenario
from agents.planning.probes import Probe, ProbeRunner, run_policy_episode
from agents.planning.search import grid_scale
from env.scenario import Scenario
from policies.base import Policy

__all__ = ["PolicyCapacity", "policy_capacity", "starting_pools", "with_instances"]

MakePolicy = Callable[[Scenario], Policy]
"""Builds a fresh policy for one deployed scenario."""
_MAX_LADDER = 7
"""The instance ladder stops at ``2**7`` times its start."""


def with_instances(scenario: Scenario, num_instances: int) -> Scenario:
    """``scenario`` with a GPU budget of ``num_instances`` instances, all decoding (each probe sets its pools)."""
    group = scenario.tenant_groups[0]
    update = {"gpu_budget": num_instances * scenario.cluster.tp, "prefill": 0, "decode": num_instances, "aggregated": 0}
    return Scenario.model_validate({**scenario.model_dump(), "tenant_groups": [{**group.model_dump(), **update}]})


def starting_pools(num_instances: int, prefill_share: float = 0.5) -> PlanConfig:
    """The split a policy starts from: ``round(n × share)`` prefill instances (at least one of each when n ≥ 2)."""
    if num_instances < 2:
        return PlanConfig(0, max(num_instances, 1), "aggregated")
    prefill = min(max(round(num_instances * prefill_share), 1), num_instances - 1)
    return PlanConfig(prefill, num_instances - prefill, "policy")


@dataclass(slots=True)
class PolicyCapacity:
    """What :func:`policy_capacity` found."""

    spec: str
    target_frac: float
    gpus_per_instance: int
    policy_instances: int | None = None
    """Fewest instances meeting the target at the workload's rate with the policy (None: not within the ladder)."""
    static_instances: int | None = None
    static_config: str | None = None
    """The static configuration that meets it with ``static_instances``."""
    budget_gpus: int = 0
    policy_rate_scale: float = 0.0
    """Largest multiplier the policy sustains with ``budget_gpus`` (0: not even the smallest)."""
    policy_rate_rps: float = 0.0
    """Requests per second offered at ``policy_rate_scale`` (measured)."""
    episodes: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def policy_gpus(self) -> int | None:
        """GPUs the policy needs (None: more than the ladder tried)."""
        return None if self.policy_instances is None else self.policy_instances * self.gpus_per_instance

    @property
    def static_gpus(self) -> int | None:
        """GPUs the best static configuration needs."""
        return None if self.static_instances is None else self.static_instances * self.gpus_per_instance

    @property
    def gpus_saved(self) -> int | None:
        """Static GPUs minus policy GPUs (positive: the controller saves GPUs)."""
        if self.policy_gpus is None or self.static_gpus is None:
            return None
        return self.static_gpus - self.policy_gpus

    def as_dict(self) -> dict[str, Any]:
        """JSON form (``plan.json``'s ``policy``)."""
        return {
            "spec": self.spec,
            "target_frac": self.target_frac,
            "policy_gpus": self.policy_gpus,
            "static_gpus": self.static_gpus,
            "static_config": self.static_config,
            "gpus_saved": self.gpus_saved,
            "budget_gpus": self.budget_gpus,
            "policy_max_rate_scale": self.policy_rate_scale,
            "policy_max_rate_rps": self.policy_rate_rps,
            "episodes": self.episodes,
            "wall_s": self.wall_s,
        }


def _fewest(passes: Callable[[int], bool], start: int) -> int | None:
    """Fewest ``n ≥ 1`` with ``passes(n)`` (monotone): a doubling ladder from ``start``, then bisection."""
    n = max(start, 1)
    lo, hi = 0, None  # lo fails (no instance serves nothing), hi passes
    for _ in range(_MAX_LADDER + 1):
        if passes(n):
            hi = n
            break
        lo, n = n, 2 * n
    if hi is None:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            hi = mid
        else:
            lo = mid
    return hi


def policy_capacity(
    whole: Scenario,
    spec: str,
    make: MakePolicy,
    *,
    budget_instances: int,
    target_frac: float = 0.9,
    prefill_share: float = 0.5,
    levels_tokens: tuple[int, ...] = DEFAULT_LEVELS_TOKENS,
    steps_per_doubling: int = 16,
    workers: int = 1,
    cache_dir: Path | None = None,
) -> PolicyCapacity:
    """GPUs needed with ``spec`` in the loop vs the best static split, and its sustainable rate (module doc)."""
    start_wall = time.perf_counter()
    out = PolicyCapacity(spec, target_frac, whole.cluster.tp, budget_gpus=budget_instances * whole.cluster.tp)
    known: dict[tuple[int, float], Probe] = {}
    static_label: dict[int, str | None] = {}

    def policy_run(num_instances: int, rate_scale: float) -> Probe:
        key = (num_instances, rate_scale)
        if key not in known:
            start = starting_pools(num_instances, prefill_share)
            deployed = configured_scenario(with_instances(whole, num_instances), start, rate_scale)
            probe = run_policy_episode(deployed, make(deployed), start, rate_scale, target_frac)
            known[key] = probe
            out.episodes.append(
                {
                    "instances": num_instances,
                    "gpus": num_instances * whole.cluster.tp,
                    "rate_scale": rate_scale,
                    "start": start.label,
                    "slo_attainment_frac": probe.slo_attainment_frac,
                    "complete": probe.complete,
                    "passed": probe.slo_attainment_frac >= target_frac,
                }
            )
        return known[key]

    def static_passes(num_instances: int) -> bool:
        if num_instances not in static_label:
            with ProbeRunner(
                with_instances(whole, num_instances), workers=workers, cache_dir=cache_dir, stop_below_frac=target_frac
            ) as runner:
                pairs = [(c, 1.0) for c in candidate_configs(num_instances, levels_tokens)]
                passing = [p for p in runner.run(pairs) if p.slo_attainment_frac >= target_frac]
            top = max(passing, key=lambda p: p.slo_attainment_frac, default=None)
            static_label[num_instances] = None if top is None else top.config.label
        return static_label[num_instances] is not None

    out.policy_instances = _fewest(lambda n: policy_run(n, 1.0).slo_attainment_frac >= target_frac, budget_instances)
    out.static_instances = _fewest(static_passes, budget_instances)
    if out.static_instances is not None:
        out.static_config = static_label[out.static_instances]
    out.policy_rate_scale = _max_rate(
        lambda scale: policy_run(budget_instances, scale).slo_attainment_frac >= target_frac, steps_per_doubling
    )
    if out.policy_rate_scale > 0:
        out.policy_rate_rps = policy_run(budget_instances, out.policy_rate_scale).offered_rps
    out.wall_s = time.perf_counter() - start_wall
    return out


def _max_rate(passes: Callable[[float], bool], steps: int) -> float:
    """Largest grid multiplier that passes (doubling/halving from 1, then bisection to one grid step)."""
    index = 0
    if passes(1.0):
        lo, hi = 0, None
        for _ in range(8):
            index += steps
            if not passes(grid_scale(index, steps)):
                hi = index
                break
            lo = index
        if hi is None:
            return grid_scale(lo, steps)
    else:
        hi = 0
        lo = None
        for _ in range(6):
            index -= steps
            if passes(grid_scale(index, steps)):
                lo = index
                break
            hi = index
        if lo is None:
            return 0.0
    assert lo is not None  # each branch above returns or sets both
    assert hi is not None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(grid_scale(mid, steps)):
            lo = mid
        else:
            hi = mid
    return grid_scale(lo, steps)
