"""Baselines: what serving stacks ship today, as policies of this project's own contract.

Every baseline is a :class:`~policies.base.Policy`; it returns per-tenant routing thresholds that select a
peer system's per-request rule (:class:`~policies.schema.RouteRule`, implemented once in
:mod:`policies.routing`) and, for the pool-sizing baselines, per-group pool targets. Sources and defaults
follow ``../shared/reference/peer-systems.md`` §8:

| name | per-request route | pool sizing |
|---|---|---|
| ``aggregated`` | local always | all decode (prefill pool at its min) |
| ``fixed-split`` | remote always (B1) | fixed prefill share of the budget (½) |
| ``vllm-proxy`` | remote always (B1) | held as deployed |
| ``llmd-noncached`` | llm-d ``nonCachedTokens`` N = 16 (B2) | held |
| ``dynamo-isl-bounding`` | Dynamo ``isl_bounding`` 2048 / 0.7 (B3) | held |
| ``dynamo-isl-or-load`` | Dynamo ``isl_or_load`` + decode gate (B4) | held |
| ``dynamo-legacy`` | legacy Dynamo 1000 tokens, queue < 2 (B5) | held |
| ``dynamo-throughput`` | remote always | Dynamo throughput planner (S1) |
| ``dynamo-load`` | remote always | Dynamo load planner, throughput targets (S2) |
| ``wva-saturation`` | remote always | llm-d WVA saturation per pool (S3) |
| ``keda-queue`` | remote always | KEDA ``num_requests_waiting`` target 5 (S4) |

The seed's rule policy file is the baseline ``file:policies/examples/seed_pd_policy.yaml`` (a
:class:`policies.rules.FilePolicy`). Instance choice inside a pool is the simulator's and router's documented
rule for every baseline (the peers' round-robin or KV-aware pickers are not modelled separately).

Interpretations (stated, since the peers' code is not reproduced): S1 uses a constant (last-window) forecast,
Dynamo's warm-up predictor, and takes per-instance prefill and decode token throughput as parameters (the
caller computes them from the calibrated performance model); S2 reads the prefill signal as queued prompt
tokens per prefill instance / ``context_length_tokens`` and the decode signal as decode KV usage; S3 applies
WVA's saturation rule to pool means; S4's scale-down honours a stabilisation window (HPA default 300 s).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from policies.base import PolicyContext
from policies.features import Observation
from policies.schema import ControlAction, GroupWindow, PoolTargets, RouteRule, RoutingThresholds, TenantGroup

__all__ = [
    "BASELINES",
    "BaselinePolicy",
    "FixedSplitSizer",
    "HeldSizer",
    "KedaQueueSizer",
    "LoadPlannerSizer",
    "PoolSizer",
    "SaturationSizer",
    "ThroughputPlannerSizer",
    "make_baseline",
]

PoolSizer = Callable[[TenantGroup, PoolTargets, GroupWindow | None, Observation, PolicyContext], PoolTargets | None]
"""Returns the pool targets of one group, or ``None`` for no opinion."""


def _bounded(group: TenantGroup, num_prefill: int, num_decode: int) -> PoolTargets:
    budget = group.max_instances
    max_prefill = group.max_prefill if group.max_prefill is not None else budget
    max_decode = group.max_decode if group.max_decode is not None else budget
    num_prefill = min(max(num_prefill, group.min_prefill), max_prefill)
    num_decode = min(max(num_decode, group.min_decode), max_decode)
    while num_prefill + num_decode > budget and (num_prefill > group.min_prefill or num_decode > group.min_decode):
        if (num_prefill >= num_decode and num_prefill > group.min_prefill) or num_decode <= group.min_decode:
            num_prefill -= 1
        else:
            num_decode -= 1
    return PoolTargets(num_prefill, num_decode)


@dataclass(frozen=True, slots=True)
class HeldSizer:
    """No opinion on pool sizes: the deployment stays as it is."""

    def __call__(
        self, group: TenantGroup, current: PoolTargets, window: GroupWindow | None, obs: Observation, ctx: PolicyContext
    ) -> PoolTargets | None:
        """Always ``None``."""
        return None


@dataclass(frozen=True, slots=True)
class FixedSplitSizer:
    """A fixed share of the group's instances prefills; the rest decode. ``prefill_frac = 0`` = aggregated."""

    prefill_frac: float = 0.5

    def __call__(
        self, group: TenantGroup, current: PoolTargets, window: GroupWindow | None, obs: Observation, ctx: PolicyContext
    ) -> PoolTargets | None:
        """The fixed split of the budget."""
        budget = group.max_instances
        num_prefill = round(budget * self.prefill_frac)
        return _bounded(group, num_prefill, budget - num_prefill)


@dataclass(frozen=True, slots=True)
class ThroughputPlannerSizer:
    """Dynamo's throughput planner (S1): replicas from forecast load and profiled per-instance throughput.

    ``prefill = ceil(rate × ISL / prefill_tokens_per_s)``, ``decode = ceil(rate × OSL / decode_tokens_per_s)``
    summed over the group's tenants, at least one each, scaled down proportionally over the budget.
    """

    prefill_tokens_per_s: float
    decode_tokens_per_s: float

    def __call__(
        self, group: TenantGroup, current: PoolTargets, window: GroupWindow | None, obs: Observation, ctx: PolicyContext
    ) -> PoolTargets | None:
        """Replicas for the last window's rate, ISL and OSL; ``None`` if any of them is unknown."""
        prefill_load = decode_load = 0.0
        for tenant in ctx.tenants_of(group.name):
            tw = obs.window.tenants.get(tenant.name)
            if tw is None or tw.request_rate_rps is None:
                return None
            if tw.request_rate_rps == 0:
                continue
            if tw.mean_input_tokens is None or tw.mean_output_tokens is None:
                return None
            prefill_load += tw.request_rate_rps * tw.mean_input_tokens
            decode_load += tw.request_rate_rps * tw.mean_output_tokens
        num_prefill = max(math.ceil(prefill_load / self.prefill_tokens_per_s), 1)
        num_decode = max(math.ceil(decode_load / self.decode_tokens_per_s), 1)
        budget = group.max_instances
        if num_prefill + num_decode > budget:
            scale = budget / (num_prefill + num_decode)
            num_prefill = max(math.floor(num_prefill * scale), 1)
            num_decode = max(budget - num_prefill, 1)
        return _bounded(group, num_prefill, num_decode)


@dataclass(frozen=True, slots=True)
class LoadPlannerSizer:
    """Dynamo's load planner with the "throughput" easy targets (S2): ±1 per pool per tick.

    Prefill signal: queued prompt tokens per prefill instance / ``context_length_tokens`` (up ≥ 1.0,
    down ≤ 0.1). Decode signal: decode KV usage (up ≥ 1.0 − ε, i.e. full; down ≤ 0.6). No action while a
    change is pending. A move that does not fit the budget takes the instance from the other pool.
    """

    context_length_tokens: int = 8192
    prefill_up: float = 1.0
    prefill_down: float = 0.1
    decode_up: float = 0.98
    decode_down: float = 0.6

    def __call__(
        self, group: TenantGroup, current: PoolTargets, window: GroupWindow | None, obs: Observation, ctx: PolicyContext
    ) -> PoolTargets | None:
        """One step per pool from the two signals; ``None`` when a signal is unknown or a change is pending."""
        if window is None or window.pending_prefill or window.pending_decode:
            return None
        if window.prefill_queued_tokens is None or window.decode_kv_usage_frac is None:
            return None
        prefill_signal = window.prefill_queued_tokens / max(current.num_prefill, 1) / self.context_length_tokens
        num_prefill, num_decode = current.num_prefill, current.num_decode
        num_prefill += 1 if prefill_signal >= self.prefill_up else (-1 if prefill_signal <= self.prefill_down else 0)
        kv = window.decode_kv_usage_frac
        num_decode += 1 if kv >= self.decode_up else (-1 if kv <= self.decode_down else 0)
        if num_prefill + num_decode > group.max_instances:
            if num_prefill > current.num_prefill:
                num_decode = min(num_decode, current.num_decode - 1)
            else:
                num_prefill = min(num_prefill, current.num_prefill - 1)
        return _bounded(group, num_prefill, num_decode)


@dataclass(frozen=True, slots=True)
class SaturationSizer:
    """llm-d WVA's saturation rule applied to each pool's mean (S3): +1 when spare capacity runs low.

    An instance is saturated at KV usage ≥ 0.80 or ≥ 5 waiting requests; a pool scales up by one when its mean
    spare KV (0.80 − usage) < 0.10 or its mean spare queue (5 − waiting per instance) < 3, and down by one when
    spare KV > 0.5 and nothing waits. Held while a change is pending.
    """

    kv_threshold_frac: float = 0.80
    queue_threshold: float = 5.0
    kv_spare_trigger_frac: float = 0.10
    queue_spare_trigger: float = 3.0

    def _step(self, kv: float | None, waiting: float | None, instances: int) -> int:
        if kv is None or waiting is None:
            return 0
        spare_kv = self.kv_threshold_frac - kv
        spare_queue = self.queue_threshold - waiting / max(instances, 1)
        if spare_kv < self.kv_spare_trigger_frac or spare_queue < self.queue_spare_trigger:
            return 1
        if spare_kv > 0.5 and waiting == 0:
            return -1
        return 0

    def __call__(
        self, group: TenantGroup, current: PoolTargets, window: GroupWindow | None, obs: Observation, ctx: PolicyContext
    ) -> PoolTargets | None:
        """One step per pool; ``None`` while a change is pending or with no window."""
        if window is None or window.pending_prefill or window.pending_decode:
            return None
        d_prefill = self._step(window.prefill_kv_usage_frac, window.prefill_queue_requests, current.num_prefill)
        d_decode = self._step(window.decode_kv_usage_frac, window.decode_queue_requests, current.num_decode)
        return _bounded(group, current.num_prefill + d_prefill, current.num_decode + d_decode)


@dataclass(slots=True)
class KedaQueueSizer:
    """KEDA on ``vllm:num_requests_waiting`` per pool (S4): desired = ceil(waiting / target).

    Scale-up is immediate; scale-down takes the highest desired value over the stabilisation window.
    """

    target_waiting: float = 5.0
    stabilisation_s: float = 300.0
    _history: dict[str, list[tuple[float, int, int]]] | None = None

    def __call__(
        self, group: TenantGroup, current: PoolTargets, window: GroupWindow | None, obs: Observation, ctx: PolicyContext
    ) -> PoolTargets | None:
        """Desired replicas per pool; ``None`` when the queue gauges are unknown."""
        if window is None or window.prefill_queue_requests is None or window.decode_queue_requests is None:
            return None
        desired_p = max(math.ceil(window.prefill_queue_requests / self.target_waiting), 1)
        desired_d = max(math.ceil(window.decode_queue_requests / self.target_waiting), 1)
        if self._history is None:
            self._history = {}
        history = self._history.setdefault(group.name, [])
        history.append((ctx.now_s, desired_p, desired_d))
        history[:] = [h for h in history if ctx.now_s - h[0] <= self.stabilisation_s]
        stable_p = max(h[1] for h in history)
        stable_d = max(h[2] for h in history)
        return _bounded(
            group, max(desired_p, min(stable_p, current.num_prefill)), max(desired_d, min(stable_d, current.num_decode))
        )


class BaselinePolicy:
    """A per-request route rule plus a pool sizer, for every tenant and group."""

    def __init__(self, name: str, route: Mapping[str, object], sizer: PoolSizer, policy_id: str | None = None) -> None:
        self._name = name
        self._route = dict(route)
        self._sizer = sizer
        self._policy_id = policy_id or f"baseline:{name}"

    @property
    def policy_id(self) -> str:
        """``baseline:NAME``."""
        return self._policy_id

    @property
    def route_rule(self) -> RouteRule | None:
        """The per-request route rule this baseline sets for every tenant (``None``: it keeps the tenant's own)."""
        rule = self._route.get("rule")
        return rule if isinstance(rule, RouteRule) else None

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """The baseline's thresholds for every tenant and its pool targets for every group."""
        thresholds: dict[str, RoutingThresholds] = {}
        for tenant in context.tenants:
            base = context.base_thresholds.get(tenant.name) or context.current_thresholds.get(tenant.name)
            thresholds[tenant.name] = replace(base or RoutingThresholds(), buckets=(), **self._route)  # type: ignore[arg-type]
        pools: dict[str, PoolTargets] = {}
        for group in context.groups:
            current = context.current_pools.get(group.name)
            if current is None:
                continue
            target = self._sizer(group, current, observation.window.groups.get(group.name), observation, context)
            if target is not None:
                pools[group.name] = target
        return ControlAction(thresholds=thresholds, pools=pools, reason=self._name, policy_id=self._policy_id)


_REMOTE: dict[str, object] = {"rule": RouteRule.ALWAYS_REMOTE, "disaggregation_enabled": True}

BASELINES: dict[str, Callable[[], BaselinePolicy]] = {
    "aggregated": lambda: BaselinePolicy(
        "aggregated", {"rule": RouteRule.AGGREGATED_ONLY}, FixedSplitSizer(prefill_frac=0.0)
    ),
    "fixed-split": lambda: BaselinePolicy("fixed-split", _REMOTE, FixedSplitSizer(prefill_frac=0.5)),
    "vllm-proxy": lambda: BaselinePolicy("vllm-proxy", _REMOTE, HeldSizer()),
    "llmd-noncached": lambda: BaselinePolicy(
        "llmd-noncached",
        {"rule": RouteRule.LLMD_NONCACHED, "min_remote_input_tokens": 16, "max_local_input_tokens": 0},
        HeldSizer(),
    ),
    "dynamo-isl-bounding": lambda: BaselinePolicy(
        "dynamo-isl-bounding",
        {
            "rule": RouteRule.DYNAMO_ISL_BOUNDING,
            "min_remote_input_tokens": 2048,
            "max_local_input_tokens": 0,
            "uncached_ratio_threshold_frac": 0.7,
        },
        HeldSizer(),
    ),
    "dynamo-isl-or-load": lambda: BaselinePolicy(
        "dynamo-isl-or-load",
        {
            "rule": RouteRule.DYNAMO_ISL_OR_LOAD,
            "min_remote_input_tokens": 2048,
            "max_local_input_tokens": 0,
            "uncached_ratio_threshold_frac": 0.7,
            "prefill_busy_factor": 16.0,
            "decode_pressure_threshold_frac": 0.9,
        },
        HeldSizer(),
    ),
    "dynamo-legacy": lambda: BaselinePolicy(
        "dynamo-legacy",
        {
            "rule": RouteRule.DYNAMO_LEGACY,
            "max_local_input_tokens": 1000,
            "min_remote_input_tokens": 1000,
            "max_prefill_queue_requests": 2,
        },
        HeldSizer(),
    ),
    "dynamo-load": lambda: BaselinePolicy("dynamo-load", _REMOTE, LoadPlannerSizer()),
    "wva-saturation": lambda: BaselinePolicy("wva-saturation", _REMOTE, SaturationSizer()),
    "keda-queue": lambda: BaselinePolicy("keda-queue", _REMOTE, KedaQueueSizer()),
}
"""Baselines that need no parameters from the caller; ``dynamo-throughput`` needs profiled throughputs."""


def make_baseline(
    name: str, *, prefill_tokens_per_s: float | None = None, decode_tokens_per_s: float | None = None
) -> BaselinePolicy:
    """Build a baseline by name; ``dynamo-throughput`` needs the per-instance throughputs of the profile."""
    if name == "dynamo-throughput":
        if prefill_tokens_per_s is None or decode_tokens_per_s is None:
            raise ValueError("baseline dynamo-throughput needs prefill_tokens_per_s and decode_tokens_per_s")
        return BaselinePolicy(
            "dynamo-throughput", _REMOTE, ThroughputPlannerSizer(prefill_tokens_per_s, decode_tokens_per_s)
        )
    factory = BASELINES.get(name)
    if factory is None:
        known = ", ".join(sorted([*BASELINES, "dynamo-throughput"]))
        raise ValueError(f"unknown baseline {name!r}; known: {known}")
    return factory()
