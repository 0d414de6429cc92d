"""Rule-based policies: fixed thresholds as a policy, and a queue/KV threshold rule for pool sizing.

:class:`FilePolicy` is the one "thresholds from a file" policy: it publishes a policy file's thresholds (or one
route level's, :mod:`policies.route_levels`) for every tenant and, for a static configuration (the grid
search's), fixed pool targets; otherwise it has no opinion on pool sizes.

:class:`QueueKvPolicy` sizes prefill and decode pools per tenant group from the window, and moves the
remote-prefill threshold of tenants whose TTFT objective is missed by long prompts:

* **prefill pressure** — some tenant of the group has p95 TTFT above ``ttft_high_ratio`` × its objective,
  or the group's mean prefill queue wait is above ``prefill_queue_wait_high_s``;
* **decode pressure** — some tenant has p95 TPOT above ``tpot_high_ratio`` × its objective, or the decode
  pool's KV usage is above ``kv_usage_high_frac``.

With pressure on one side only, one instance moves towards that side: added if the GPU budget has room,
otherwise taken from the other pool (if above its minimum). With pressure on both sides, the worse side
gains one instance if the budget has room. With no pressure and every signal below the low marks, and
``allow_scale_in`` set, the pool with more slack gives one back. A group whose signals are all unknown gets
no opinion (the guard then holds it).

Thresholds: a tenant whose p95 TTFT misses its objective while its p95 prompt (the mean when the p95 is
unknown) is longer than its local bound (``max_local_input_tokens``) gets ``min_remote_input_tokens``
lowered by ``threshold_step_frac`` (not below ``min_remote_floor_tokens``; the local bound follows down if
needed), so more long prompts leave the decode instances. A tenant comfortably inside both objectives drifts
back towards its file's thresholds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from policies.base import PolicyContext
from policies.features import Observation
from policies.schema import ControlAction, GroupWindow, PoolTargets, RoutingThresholds, Tenant, TenantGroup

__all__ = ["FilePolicy", "QueueKvParams", "QueueKvPolicy", "ThresholdTable"]


class ThresholdTable(Protocol):
    """Thresholds per tenant name (a resolved policy file, a planner's configuration)."""

    def thresholds_for(self, tenant: str) -> RoutingThresholds:
        """The thresholds of ``tenant`` (a table that does not name it answers with its default)."""
        ...


class FilePolicy:
    """Fixed thresholds (a policy file's, or one route level's for every tenant) and, optionally, fixed pools.

    Args:
        source: a threshold table — a resolved policy file: each tenant of the context gets the file's
            thresholds for its name, and a tenant the file does not name gets the file's default tenant's — or
            one :class:`~policies.schema.RoutingThresholds` for every tenant (a static configuration).
        policy_id: the spec this policy was loaded from.
        pools: pool targets per tenant group, asked for every interval (a static configuration); ``None``:
            no opinion on pool sizes (the guard holds them).
    """

    def __init__(
        self,
        source: ThresholdTable | RoutingThresholds,
        policy_id: str,
        pools: Mapping[str, PoolTargets] | None = None,
    ) -> None:
        self._source = source
        self._pools = dict(pools or {})
        self._policy_id = policy_id
        self._reason = "file_thresholds" if pools is None else "static"

    @property
    def policy_id(self) -> str:
        """The spec this policy was loaded from."""
        return self._policy_id

    def thresholds_for(self, tenant: str) -> RoutingThresholds:
        """The thresholds this policy publishes for ``tenant``."""
        if isinstance(self._source, RoutingThresholds):
            return self._source
        return self._source.thresholds_for(tenant)

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """The fixed thresholds for every tenant of the context, and the fixed pools (if any)."""
        del observation
        thresholds = {t.name: self.thresholds_for(t.name) for t in context.tenants}
        return ControlAction(
            thresholds=thresholds, pools=dict(self._pools), reason=self._reason, policy_id=self._policy_id
        )


@dataclass(frozen=True, slots=True)
class QueueKvParams:
    """Marks of :class:`QueueKvPolicy` (ratios are observed p95 / objective)."""

    ttft_high_ratio: float = 1.0
    tpot_high_ratio: float = 1.0
    prefill_queue_wait_high_s: float = 0.5
    kv_usage_high_frac: float = 0.85
    low_ratio: float = 0.5
    kv_usage_low_frac: float = 0.3
    allow_scale_in: bool = False
    threshold_step_frac: float = 0.25
    min_remote_floor_tokens: int = 256

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold_step_frac < 1.0:
            raise ValueError("threshold_step_frac must be within (0, 1)")
        if self.low_ratio >= min(self.ttft_high_ratio, self.tpot_high_ratio):
            raise ValueError("low_ratio must be below the high ratios")
        if self.kv_usage_low_frac >= self.kv_usage_high_frac:
            raise ValueError("kv_usage_low_frac must be below kv_usage_high_frac")


@dataclass(frozen=True, slots=True)
class _Pressure:
    prefill: float | None
    """Worst prefill signal as a ratio to its high mark (> 1 = pressure); ``None`` = all unknown."""
    decode: float | None


def _worst(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None and math.isfinite(v)]
    return max(known) if known else None


def _ratio(value: float | None, target: float) -> float | None:
    if value is None or not math.isfinite(target) or target <= 0:
        return None
    return value / target


class QueueKvPolicy:
    """Queue/KV threshold rules for pool sizing and the remote-prefill threshold (module docstring)."""

    def __init__(self, params: QueueKvParams | None = None, policy_id: str = "baseline:queue_kv") -> None:
        self.params = params or QueueKvParams()
        self._policy_id = policy_id

    @property
    def policy_id(self) -> str:
        """Spec of this policy."""
        return self._policy_id

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """Pool targets per group and lowered/relaxed remote thresholds per tenant."""
        window = observation.window
        pools: dict[str, PoolTargets] = {}
        reasons: list[str] = []
        for group in context.groups:
            current = context.current_pools.get(group.name)
            if current is None:
                continue
            pressure = self._pressure(group, window.groups.get(group.name), context, observation)
            target, why = self._size(group, current, pressure, context.max_instances(group))
            if target is not None:
                pools[group.name] = target
                reasons.append(f"{group.name}:{why}")
        thresholds: dict[str, RoutingThresholds] = {}
        for tenant in context.tenants:
            new, why = self._threshold(tenant, context, observation)
            if new is not None:
                thresholds[tenant.name] = new
                reasons.append(f"{tenant.name}:{why}")
        return ControlAction(thresholds, pools, reason=";".join(reasons) or "hold", policy_id=self._policy_id)

    def _tenant_ratio(self, observation: Observation, tenant: Tenant, feature: str) -> float | None:
        if tenant.name not in observation.tenant_names:
            return None
        return observation.value("tenant", tenant.name, feature)

    def _pressure(
        self, group: TenantGroup, window: GroupWindow | None, context: PolicyContext, observation: Observation
    ) -> _Pressure:
        p = self.params
        tenants = context.tenants_of(group.name)
        ttft = [_ratio(self._tenant_ratio(observation, t, "ttft_slo_ratio"), p.ttft_high_ratio) for t in tenants]
        tpot = [_ratio(self._tenant_ratio(observation, t, "tpot_slo_ratio"), p.tpot_high_ratio) for t in tenants]
        queue = None if window is None else _ratio(window.prefill_queue_wait_s, p.prefill_queue_wait_high_s)
        kv = None if window is None else _ratio(window.decode_kv_usage_frac, p.kv_usage_high_frac)
        return _Pressure(prefill=_worst([*ttft, queue]), decode=_worst([*tpot, kv]))

    def _size(
        self, group: TenantGroup, current: PoolTargets, pressure: _Pressure, max_instances: int
    ) -> tuple[PoolTargets | None, str]:
        p = self.params
        if pressure.prefill is None and pressure.decode is None:
            return None, "unknown"
        prefill_hot = pressure.prefill is not None and pressure.prefill > 1.0
        decode_hot = pressure.decode is not None and pressure.decode > 1.0
        room = current.num_instances < max_instances
        n_p, n_d = current.num_prefill, current.num_decode
        if prefill_hot and not decode_hot:
            if room:
                return PoolTargets(n_p + 1, n_d), "prefill_pressure_add"
            if n_d > group.min_decode:
                return PoolTargets(n_p + 1, n_d - 1), "prefill_pressure_shift"
            return current, "prefill_pressure_no_room"
        if decode_hot and not prefill_hot:
            if room:
                return PoolTargets(n_p, n_d + 1), "decode_pressure_add"
            if n_p > group.min_prefill:
                return PoolTargets(n_p - 1, n_d + 1), "decode_pressure_shift"
            return current, "decode_pressure_no_room"
        if prefill_hot and decode_hot:
            if not room:
                return current, "both_pressure_no_room"
            if (pressure.prefill or 0.0) >= (pressure.decode or 0.0):
                return PoolTargets(n_p + 1, n_d), "both_pressure_add_prefill"
            return PoolTargets(n_p, n_d + 1), "both_pressure_add_decode"
        low_mark = p.low_ratio / min(p.ttft_high_ratio, p.tpot_high_ratio)
        kv_low_mark = p.kv_usage_low_frac / p.kv_usage_high_frac
        slack = (
            p.allow_scale_in
            and pressure.prefill is not None
            and pressure.decode is not None
            and pressure.prefill < low_mark
            and pressure.decode < min(low_mark, kv_low_mark)
        )
        if slack and pressure.prefill is not None and pressure.decode is not None:
            if n_p > group.min_prefill and pressure.prefill <= pressure.decode:
                return PoolTargets(n_p - 1, n_d), "slack_scale_in_prefill"
            if n_d > group.min_decode:
                return PoolTargets(n_p, n_d - 1), "slack_scale_in_decode"
        return current, "within_marks"

    def _threshold(
        self, tenant: Tenant, context: PolicyContext, observation: Observation
    ) -> tuple[RoutingThresholds | None, str]:
        p = self.params
        current = context.current_thresholds.get(tenant.name)
        if current is None or not current.disaggregation_enabled:
            return None, ""
        ttft_ratio = self._tenant_ratio(observation, tenant, "ttft_slo_ratio")
        tpot_ratio = self._tenant_ratio(observation, tenant, "tpot_slo_ratio")
        p95_input = self._tenant_ratio(observation, tenant, "p95_input_tokens")
        if p95_input is None:  # no per-request length histogram: the mean stands in for the tail
            p95_input = self._tenant_ratio(observation, tenant, "mean_input_tokens")
        if ttft_ratio is None:
            return None, ""
        if ttft_ratio > p.ttft_high_ratio and p95_input is not None and p95_input > current.max_local_input_tokens:
            stepped = int(current.min_remote_input_tokens * (1.0 - p.threshold_step_frac))
            lowered = max(stepped, p.min_remote_floor_tokens)
            if lowered >= current.min_remote_input_tokens:
                return None, ""
            new = replace(
                current,
                min_remote_input_tokens=lowered,
                max_local_input_tokens=min(current.max_local_input_tokens, lowered),
            )
            return new, f"lower_remote_threshold {current.min_remote_input_tokens}->{lowered}"
        base = context.base_thresholds.get(tenant.name)
        relaxed_tpot = tpot_ratio is None or tpot_ratio < p.low_ratio
        below_base = base is not None and current.min_remote_input_tokens < base.min_remote_input_tokens
        if base is not None and below_base and ttft_ratio < p.low_ratio and relaxed_tpot:
            raised = min(
                math.ceil(current.min_remote_input_tokens / (1.0 - p.threshold_step_frac)),
                base.min_remote_input_tokens,
            )
            new = replace(
                current,
                min_remote_input_tokens=raised,
                max_local_input_tokens=min(base.max_local_input_tokens, raised),
            )
            return new, f"relax_remote_threshold {current.min_remote_input_tokens}->{raised}"
        return None, ""
