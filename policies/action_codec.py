"""The compact action encoding of :class:`~policies.schema.ControlAction` for learned policies.

A ``MultiDiscrete`` vector, slot by slot like the observation (:class:`~policies.features.ObservationLayout`):

* per tenant-group slot: ``prefill_delta`` and ``decode_delta`` in {-1, 0, +1} (indices 0, 1, 2). When both
  increases would exceed the GPU budget, an increase of one pool takes the instance from the other (a *shift*);
  both increasing at a full budget keeps the counts.
* per tenant slot: absolute levels (indices into the tables below) of ``min_remote_input_tokens``,
  ``max_prefill_queue_wait_s``, ``min_expected_output_tokens``, ``require_decode_pool_pressure`` and
  ``prefer_local_on_prefix_hit``, and the per-request rule (this project's, or legacy Dynamo's queue-aware
  rule with the remote level as its uncached-token bound). ``max_local_input_tokens`` follows as half the
  remote threshold (capped by the tenant's base value), so the gap of :mod:`policies.routing` keeps its
  meaning; the top level ("never remote") closes the gap too, so every request of the tenant is prefilled
  locally.

:meth:`ActionCodec.encode` is the inverse for pool deltas and the nearest levels for thresholds: it turns a
:class:`ControlAction` (a baseline's decision, say) into the action a learned policy would have to take.

:meth:`ActionCodec.masks` marks what the guard would refuse: a pool delta beyond the pool bounds, an increase
with the budget full and nothing to shift from, and every index but "no change" of an unused slot.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
from gymnasium import spaces

from policies.features import ObservationLayout
from policies.schema import ControlAction, PoolTargets, RouteRule, RoutingThresholds, Tenant, TenantGroup

__all__ = [
    "ACTION_VERSION",
    "MIN_EXPECTED_OUTPUT_LEVELS_TOKENS",
    "MIN_REMOTE_LEVELS_TOKENS",
    "QUEUE_WAIT_LEVELS_S",
    "ActionCodec",
]

ACTION_VERSION = 3
MIN_REMOTE_LEVELS_TOKENS: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384, 10**9)
"""The last level (10⁹ tokens) means "never remote"."""
QUEUE_WAIT_LEVELS_S: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0)
MIN_EXPECTED_OUTPUT_LEVELS_TOKENS: tuple[int, ...] = (0, 32, 128, 512)
_DELTAS = (-1, 0, 1)
_GROUP_DIMS = (3, 3)
_TENANT_DIMS = (
    len(MIN_REMOTE_LEVELS_TOKENS),
    len(QUEUE_WAIT_LEVELS_S),
    len(MIN_EXPECTED_OUTPUT_LEVELS_TOKENS),
    2,
    2,
    2,
)


def _nearest(levels: tuple[float, ...] | tuple[int, ...], value: float) -> int:
    return int(np.argmin([abs(float(level) - value) for level in levels]))


@dataclass(frozen=True, slots=True)
class ActionCodec:
    """Encodes and decodes control actions for a fixed slot layout."""

    layout: ObservationLayout

    @property
    def nvec(self) -> np.ndarray:
        """Sizes of every dimension."""
        dims = list(_GROUP_DIMS) * self.layout.max_groups + list(_TENANT_DIMS) * self.layout.max_tenants
        return np.asarray(dims, dtype=np.int64)

    def action_space(self) -> spaces.MultiDiscrete:
        """The gymnasium space of encoded actions."""
        return spaces.MultiDiscrete(self.nvec)

    def codec_hash(self) -> str:
        """Hash of the encoding (levels and layout), stored in learned-policy manifests."""
        payload = [
            ACTION_VERSION,
            MIN_REMOTE_LEVELS_TOKENS,
            QUEUE_WAIT_LEVELS_S,
            MIN_EXPECTED_OUTPUT_LEVELS_TOKENS,
            self.layout.max_groups,
            self.layout.max_tenants,
        ]
        return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]

    def noop(self, tenants: tuple[Tenant, ...], thresholds: Mapping[str, RoutingThresholds]) -> np.ndarray:
        """The action that changes nothing: zero deltas and each tenant's current levels (nearest)."""
        action = np.zeros(len(self.nvec), dtype=np.int64)
        action[: 2 * self.layout.max_groups] = 1
        offset = 2 * self.layout.max_groups
        for slot, tenant in enumerate(tenants[: self.layout.max_tenants]):
            t = thresholds.get(tenant.name, RoutingThresholds())
            base = offset + slot * len(_TENANT_DIMS)
            action[base : base + len(_TENANT_DIMS)] = self._levels(t)
        return action

    @staticmethod
    def _levels(t: RoutingThresholds) -> list[int]:
        legacy = t.rule is RouteRule.DYNAMO_LEGACY
        return [
            _nearest(MIN_REMOTE_LEVELS_TOKENS, t.max_local_input_tokens if legacy else t.min_remote_input_tokens),
            _nearest(QUEUE_WAIT_LEVELS_S, t.max_prefill_queue_wait_s),
            _nearest(MIN_EXPECTED_OUTPUT_LEVELS_TOKENS, t.min_expected_output_tokens),
            int(t.require_decode_pool_pressure),
            int(t.prefer_local_on_prefix_hit),
            int(legacy),
        ]

    def decode(
        self,
        action: np.ndarray,
        tenants: tuple[Tenant, ...],
        groups: tuple[TenantGroup, ...],
        current_pools: Mapping[str, PoolTargets],
        base_thresholds: Mapping[str, RoutingThresholds],
        policy_id: str = "learned",
    ) -> ControlAction:
        """Turn an encoded action into a :class:`ControlAction` against the running state."""
        a = np.asarray(action, dtype=np.int64).reshape(-1)
        if a.shape != self.nvec.shape or np.any(a < 0) or np.any(a >= self.nvec):
            raise ValueError(f"action {a.tolist()} is outside the action space {self.nvec.tolist()}")
        pools: dict[str, PoolTargets] = {}
        for slot, group in enumerate(groups[: self.layout.max_groups]):
            current = current_pools.get(group.name)
            if current is None:
                continue
            d_prefill, d_decode = _DELTAS[a[2 * slot]], _DELTAS[a[2 * slot + 1]]
            pools[group.name] = _apply_deltas(group, current, d_prefill, d_decode)
        thresholds: dict[str, RoutingThresholds] = {}
        offset = 2 * self.layout.max_groups
        for slot, tenant in enumerate(tenants[: self.layout.max_tenants]):
            levels = a[offset + slot * len(_TENANT_DIMS) : offset + (slot + 1) * len(_TENANT_DIMS)]
            base = base_thresholds.get(tenant.name, RoutingThresholds())
            min_remote = MIN_REMOTE_LEVELS_TOKENS[levels[0]]
            never = levels[0] == len(MIN_REMOTE_LEVELS_TOKENS) - 1
            legacy = bool(levels[5])
            thresholds[tenant.name] = replace(
                base,
                rule=RouteRule.DYNAMO_LEGACY if legacy else RouteRule.PDCTL,
                min_remote_input_tokens=min_remote,
                max_local_input_tokens=min_remote
                if never or legacy
                else min(base.max_local_input_tokens, min_remote // 2),
                max_prefill_queue_wait_s=QUEUE_WAIT_LEVELS_S[levels[1]],
                min_expected_output_tokens=MIN_EXPECTED_OUTPUT_LEVELS_TOKENS[levels[2]],
                require_decode_pool_pressure=bool(levels[3]),
                prefer_local_on_prefix_hit=bool(levels[4]),
            )
        return ControlAction(thresholds=thresholds, pools=pools, reason="learned", policy_id=policy_id)

    def encode(
        self,
        action: ControlAction,
        tenants: tuple[Tenant, ...],
        groups: tuple[TenantGroup, ...],
        current_pools: Mapping[str, PoolTargets],
        current_thresholds: Mapping[str, RoutingThresholds],
    ) -> np.ndarray:
        """The encoded action closest to ``action``: pool moves as ±1 steps, thresholds as nearest levels.

        A tenant the action has no opinion on keeps its current levels; a disaggregation-disabled or
        aggregated-only tenant maps to the "never remote" level, an always-remote one to the lowest levels.
        """
        out = self.noop(tenants, current_thresholds)
        for slot, group in enumerate(groups[: self.layout.max_groups]):
            target, current = action.pools.get(group.name), current_pools.get(group.name)
            if target is None or current is None:
                continue
            out[2 * slot] = 1 + int(np.sign(target.num_prefill - current.num_prefill))
            out[2 * slot + 1] = 1 + int(np.sign(target.num_decode - current.num_decode))
        offset = 2 * self.layout.max_groups
        for slot, tenant in enumerate(tenants[: self.layout.max_tenants]):
            t = action.thresholds.get(tenant.name)
            if t is None:
                continue
            levels = self._levels(t)
            if not t.disaggregation_enabled or t.rule == "aggregated_only":
                levels[0] = len(MIN_REMOTE_LEVELS_TOKENS) - 1
            elif t.rule == "always_remote":
                levels[0], levels[2], levels[3] = 0, 0, 0
            base = offset + slot * len(_TENANT_DIMS)
            out[base : base + len(_TENANT_DIMS)] = levels
        return out

    def masks(
        self, groups: tuple[TenantGroup, ...], current_pools: Mapping[str, PoolTargets], num_tenants: int
    ) -> np.ndarray:
        """Boolean mask over every dimension's values (concatenated), as sb3-contrib's ``MaskablePPO`` reads it."""
        out: list[bool] = []
        for slot in range(self.layout.max_groups):
            group = groups[slot] if slot < len(groups) else None
            current = current_pools.get(group.name) if group is not None else None
            if group is None or current is None:
                out.extend([False, True, False] * 2)
                continue
            full = current.num_instances >= group.max_instances
            max_prefill = group.max_prefill if group.max_prefill is not None else group.max_instances
            max_decode = group.max_decode if group.max_decode is not None else group.max_instances
            can_shift_to_prefill = current.num_decode > group.min_decode
            can_shift_to_decode = current.num_prefill > group.min_prefill
            out.extend(
                [
                    current.num_prefill > group.min_prefill,
                    True,
                    current.num_prefill < max_prefill and (not full or can_shift_to_prefill),
                ]
            )
            out.extend(
                [
                    current.num_decode > group.min_decode,
                    True,
                    current.num_decode < max_decode and (not full or can_shift_to_decode),
                ]
            )
        for slot in range(self.layout.max_tenants):
            used = slot < num_tenants
            for size in _TENANT_DIMS:
                out.extend([used or i == 0 for i in range(size)])
        return np.asarray(out, dtype=bool)


def _apply_deltas(group: TenantGroup, current: PoolTargets, d_prefill: int, d_decode: int) -> PoolTargets:
    num_prefill = current.num_prefill + d_prefill
    num_decode = current.num_decode + d_decode
    if num_prefill + num_decode > group.max_instances:
        if d_prefill > 0 and d_decode > 0:
            return current
        if d_prefill > 0:
            num_decode = min(num_decode, current.num_decode - 1)
        elif d_decode > 0:
            num_prefill = min(num_prefill, current.num_prefill - 1)
    return PoolTargets(num_prefill, num_decode)
