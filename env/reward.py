"""The reward of :class:`env.gym_env.PDClusterEnv`: pure per-interval terms and their weights.

One control interval earns

``reward = goodput_weight × Σ_tenants priority × met
         − gpu_cost_per_gpu_s × gpu_seconds
         − churn_cost_per_change × instance_changes
         − failure_cost_per_request × failed``

where, over the interval just simulated,

* ``met`` — a tenant's requests that finished in the interval meeting **both** its TTFT and TPOT objectives
  (:meth:`policies.schema.Slo.is_met`), weighted by the tenant's ``priority``;
* ``gpu_seconds`` — GPU-seconds of every instance that existed (starting, serving or draining), so a policy that
  runs fewer instances pays less;
* ``instance_changes`` — instances the guarded action asked to add, remove or flip (Σ |target − running| over
  both pools of every group): start-ups and role switches cost capacity while they happen;
* ``failed`` — requests refused or dropped (e.g. a prompt that fits no instance's KV cache).

The unit of every term is "one SLO-meeting request of priority 1"; the defaults price one GPU-second at 1/100 of
such a request, one instance change at two requests and one failed request at ten. :func:`reward_terms` returns
each term separately (the env puts them in ``info["reward_terms"]``) and :func:`total` adds them up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from policies.schema import MetricWindow, PoolTargets, Tenant

__all__ = ["REWARD_TERMS", "RewardWeights", "instance_changes", "reward_terms", "total"]

REWARD_TERMS: tuple[str, ...] = ("goodput", "gpu_cost", "churn", "failures")
"""Names of the terms, in the order :func:`reward_terms` returns them; costs are reported as negative values."""


@dataclass(frozen=True, slots=True)
class RewardWeights:
    """Weights of the reward terms (see the module docstring).

    Attributes:
        goodput_weight: reward per SLO-meeting request of priority 1.
        gpu_cost_per_gpu_s: cost of one GPU-second.
        churn_cost_per_change: cost of one instance added, removed or switched to the other role.
        failure_cost_per_request: cost of one failed or dropped request.
    """

    goodput_weight: float = 1.0
    gpu_cost_per_gpu_s: float = 0.01
    churn_cost_per_change: float = 2.0
    failure_cost_per_request: float = 10.0

    def __post_init__(self) -> None:
        for name in ("goodput_weight", "gpu_cost_per_gpu_s", "churn_cost_per_change", "failure_cost_per_request"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"reward weight {name} must be finite and >= 0, got {value}")


def instance_changes(current: Mapping[str, PoolTargets], targets: Mapping[str, PoolTargets]) -> int:
    """Instances a set of pool targets adds, removes or flips relative to ``current`` (Σ |Δ| over both pools)."""
    changes = 0
    for group, target in targets.items():
        now = current.get(group)
        if now is None:
            continue
        changes += abs(target.num_prefill - now.num_prefill) + abs(target.num_decode - now.num_decode)
    return changes


def reward_terms(
    window: MetricWindow,
    tenants: tuple[Tenant, ...],
    gpu_seconds: float,
    changes: int,
    weights: RewardWeights,
) -> dict[str, float]:
    """The signed reward terms of one interval (costs negative); ``total(terms)`` is the reward.

    Counts are recovered from the window's rates (``goodput_rps`` and ``failed_rate_rps`` × ``window_s``); an
    unknown rate contributes nothing.
    """
    met_weighted = 0.0
    failed = 0.0
    for tenant in tenants:
        tw = window.tenants.get(tenant.name)
        if tw is None:
            continue
        if tw.goodput_rps is not None:
            met_weighted += tenant.priority * round(tw.goodput_rps * window.window_s)
        if tw.failed_rate_rps is not None:
            failed += round(tw.failed_rate_rps * window.window_s)
    return {
        "goodput": weights.goodput_weight * met_weighted,
        "gpu_cost": -weights.gpu_cost_per_gpu_s * gpu_seconds,
        "churn": -weights.churn_cost_per_change * changes,
        "failures": -weights.failure_cost_per_request * failed,
    }


def total(terms: Mapping[str, float]) -> float:
    """Sum of the terms in :data:`REWARD_TERMS` order (a fixed order keeps the float sum reproducible)."""
    return float(sum(terms[name] for name in REWARD_TERMS))
