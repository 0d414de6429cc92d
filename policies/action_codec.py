"""The compact action encoding of :class:`~policies.schema.ControlAction` for learned policies.

A ``MultiDiscrete`` vector, slot by slot like the observation (:class:`~policies.features.ObservationLayout`):

* per tenant-group slot, with ``layout.pool_actions == "delta"`` (action version 3): ``prefill_delta`` and
  ``decode_delta`` in {-1, 0, +1} (indices 0, 1, 2). When both increases would exceed the GPU budget, an
  increase of one pool takes the instance from the other (a *shift*); both increasing at a full budget keeps
  the counts. With ``"target"`` (action version 4): ``prefill_target`` and ``decode_target``, the instance count
  each pool should reach (0 … :data:`MAX_POOL_TARGET`); the running counts move one instance per pool per
  interval towards them, with the same shift rule. A target says where the split should *be*, so a teacher's
  labels are the same at every interval of a regime, where deltas label only the few intervals that move.
* per tenant slot: absolute levels (indices into the tables below) of ``min_remote_input_tokens``,
  ``max_prefill_queue_wait_s``, ``min_expected_output_tokens``, ``require_decode_pool_pressure`` and
  ``prefer_local_on_prefix_hit``, and the per-request rule (this project's, or legacy Dynamo's queue-aware
  rule with the remote level as its uncached-token bound). ``max_local_input_tokens`` follows as half the
  remote threshold (capped by the tenant's base value), so the gap of :mod:`policies.routing` keeps its
  meaning; the top level ("never remote") closes the gap too, so every request of the tenant is prefilled
  locally.

:meth:`ActionCodec.encode` is the inverse for pool deltas or targets and the nearest levels for thresholds: it turns a
:class:`ControlAction` (a baseline's decision, say) into the action a learned policy would have to take.

:meth:`ActionCodec.masks` marks what the guard would refuse: a pool delta (or target) beyond the pool bounds, an
increase with the budget full and nothing to shift from, and every index but the first of an unused slot.
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
    "MAX_POOL_TARGET",
    "MIN_EXPECTED_OUTPUT_LEVELS_TOKENS",
    "MIN_REMOTE_LEVELS_TOKENS",
    "QUEUE_WAIT_LEVELS_S",
    "ActionCodec",
]

ACTION_VERSION = 3
"""Version of the delta encoding; the target encoding is version 4 (:meth:`ActionCodec.version`)."""
MAX_POOL_TARGET = 16
"""Largest instance count a pool target can name."""
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
    def targets(self) -> bool:
        """Whether pool dimensions are absolute targets (else ±1 deltas)."""
        return self.layout.pool_actions == "target"

    @property
    def version(self) -> int:
        """3 for pool deltas, 4 for pool targets."""
        return 4 if self.targets else ACTION_VERSION

    @property
    def nvec(self) -> np.ndarray:
        """Sizes of every dimension."""
        group_dims = (MAX_POOL_TARGET + 1,) * 2 if self.targets else _GROUP_DIMS
        dims = list(group_dims) * self.layout.max_groups + list(_TENANT_DIMS) * self.layout.max_tenants
        return np.asarray(dims, dtype=np.int64)

    def action_space(self) -> spaces.MultiDiscrete:
        """The gymnasium space of encoded actions."""
        return spaces.MultiDiscrete(self.nvec)

    def codec_hash(self) -> str:
        """Hash of the encoding (levels and layout), stored in learned-policy manifests."""
        payload = [
            self.version,
            MIN_REMOTE_LEVELS_TOKENS,
            QUEUE_WAIT_LEVELS_S,
            MIN_EXPECTED_OUTPUT_LEVELS_TOKENS,
            self.layout.max_groups,
            self.layout.max_tenants,
        ]
        return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]

    def noop(
        self,
        tenants: tuple[Tenant, ...],
        thresholds: Mapping[str, RoutingThresholds],
        groups: tuple[TenantGroup, ...] = (),
        current_pools: Mapping[str, PoolTargets] | None = None,
    ) -> np.ndarray:
        """The action that changes nothing: zero deltas (or the current counts) and each tenant's current levels.

        Threshold levels are the nearest ones. Targets need ``groups`` and ``current_pools``; a group missing
        there gets 0.
        """
        action = np.zeros(len(self.nvec), dtype=np.int64)
        if self.targets:
            for slot, group in enumerate(groups[: self.layout.max_groups]):
                current = (current_pools or {}).get(group.name)
                if current is not None:
                    action[2 * slot] = min(current.num_prefill, MAX_POOL_TARGET)
                    action[2 * slot + 1] = min(current.num_decode, MAX_POOL_TARGET)
        else:
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
            if self.targets:
                d_prefill = int(np.sign(a[2 * slot] - current.num_prefill))
                d_decode = int(np.sign(a[2 * slot + 1] - current.num_decode))
            else:
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
        """The encoded action closest to ``action``: pool moves as ±1 steps or targets, thresholds as nearest levels.

        Targets are capped at :data:`MAX_POOL_TARGET`. A tenant the action has no opinion on keeps its current
        levels; a disaggregation-disabled or aggregated-only tenant maps to the "never remote" level, an
        always-remote one to the lowest levels.
        """
        out = self.noop(tenants, current_thresholds, groups, current_pools)
        for slot, group in enumerate(groups[: self.layout.max_groups]):
            target, current = action.pools.get(group.name), current_pools.get(group.name)
            if target is None or current is None:
                continue
            if self.targets:
                out[2 * slot] = min(target.num_prefill, MAX_POOL_TARGET)
                out[2 * slot + 1] = min(target.num_decode, MAX_POOL_TARGET)
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

    def moves_pools(
        self, action: np.ndarray, groups: tuple[TenantGroup, ...], current_pools: Mapping[str, PoolTargets]
    ) -> bool:
        """Whether ``action`` asks any group's pools to change (a delta other than 0, a target other than now)."""
        a = np.asarray(action, dtype=np.int64).reshape(-1)
        for slot, group in enumerate(groups[: self.layout.max_groups]):
            current = current_pools.get(group.name)
            if current is None:
                continue
            wanted = (current.num_prefill, current.num_decode) if self.targets else (1, 1)
            if (int(a[2 * slot]), int(a[2 * slot + 1])) != wanted:
                return True
        return False

    def masks(
        self, groups: tuple[TenantGroup, ...], current_pools: Mapping[str, PoolTargets], num_tenants: int
    ) -> np.ndarray:
        """Boolean mask over every dimension's values (concatenated), as sb3-contrib's ``MaskablePPO`` reads it."""
        out: list[bool] = []
        for slot in range(self.layout.max_groups):
            group = groups[slot] if slot < len(groups) else None
            current = current_pools.get(group.name) if group is not None else None
            if group is None or current is None:
                unused = [True] + [False] * MAX_POOL_TARGET if self.targets else [False, True, False]
                out.extend(unused * 2)
                continue
            full = current.num_instances >= group.max_instances
            max_prefill = group.max_prefill if group.max_prefill is not None else group.max_instances
            max_decode = group.max_decode if group.max_decode is not None else group.max_instances
            can_shift_to_prefill = current.num_decode > group.min_decode
            can_shift_to_decode = current.num_prefill > group.min_prefill
            if self.targets:
                out.extend(
                    _target_mask(current.num_prefill, group.min_prefill, max_prefill, not full or can_shift_to_prefill)
                )
                out.extend(
                    _target_mask(current.num_decode, group.min_decode, max_decode, not full or can_shift_to_decode)
                )
                continue
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


def _target_mask(current: int, low: int, high: int, can_grow: bool) -> list[bool]:
    """Targets a pool may be sent to: inside its bounds, above the current count only when it can grow."""
    return [
        value == current or (low <= value <= high and (value < current or can_grow))
        for value in range(MAX_POOL_TARGET + 1)
    ]


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
