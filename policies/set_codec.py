"""Action codec of the set policy (action version 5): pool moves relative to the budget, shared route levels.

A ``MultiDiscrete`` vector padded like the observation (:class:`~policies.set_features.SetLayout`):

* per tenant-group slot, one dimension of three **pool moves**: 0 = one instance toward decode, 1 = hold,
  2 = one instance toward prefill. At a full budget a move flips one instance from the other pool (prefill share
  ±1/n); below it, the move adds an instance to the pool it names. No absolute count appears, so a move means
  the same on a 4-GPU group and on a 32-GPU one.
* per tenant slot, the six levels of the shared route grammar of action versions 3 and 4
  (:mod:`policies.action_codec`): remote-prefill threshold (… never remote), queue-wait bound, expected-output
  bound, decode-pressure and prefix-hit flags, and the per-request rule (pdctl or legacy Dynamo). They decode
  exactly as in version 3, so a tenant's thresholds mean the same under every codec.

:meth:`SetActionCodec.masks` marks what the guard would refuse (a move past a pool bound, a flip that would empty
the other pool below its minimum) and lets padded slots take only hold (groups) or their first index (tenants).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from gymnasium import spaces

from policies.action_codec import (
    MIN_EXPECTED_OUTPUT_LEVELS_TOKENS,
    MIN_REMOTE_LEVELS_TOKENS,
    QUEUE_WAIT_LEVELS_S,
    ActionCodec,
)
from policies.features import ObservationLayout
from policies.schema import ControlAction, PoolTargets, RoutingThresholds, Tenant, TenantGroup
from policies.set_features import SetLayout

__all__ = ["POOL_MOVES", "SET_ACTION_VERSION", "TENANT_DIMS", "SetActionCodec", "pool_move"]

SET_ACTION_VERSION = 5
POOL_MOVES: tuple[int, ...] = (-1, 0, 1)
"""Index → move of the prefill share (−1 toward decode, 0 hold, +1 toward prefill)."""
HOLD = 1
TENANT_DIMS: tuple[int, ...] = (
    len(MIN_REMOTE_LEVELS_TOKENS),
    len(QUEUE_WAIT_LEVELS_S),
    len(MIN_EXPECTED_OUTPUT_LEVELS_TOKENS),
    2,
    2,
    2,
)
"""Sizes of one tenant slot's dimensions (the route grammar of :mod:`policies.action_codec`)."""


def _bounds(group: TenantGroup) -> tuple[int, int]:
    max_prefill = group.max_prefill if group.max_prefill is not None else group.max_instances
    max_decode = group.max_decode if group.max_decode is not None else group.max_instances
    return max_prefill, max_decode


def pool_move(group: TenantGroup, current: PoolTargets, move: int) -> PoolTargets | None:
    """The pools after one move (−1, 0, +1), or ``None`` when the bounds or the budget refuse it."""
    if move == 0:
        return current
    max_prefill, max_decode = _bounds(group)
    full = current.num_instances >= group.max_instances
    p, d = current.num_prefill, current.num_decode
    if move > 0:
        target = PoolTargets(p + 1, d - 1) if full else PoolTargets(p + 1, d)
    else:
        target = PoolTargets(p - 1, d + 1) if full else PoolTargets(p, d + 1)
    ok = (
        group.min_prefill <= target.num_prefill <= max_prefill
        and group.min_decode <= target.num_decode <= max_decode
        and target.num_instances <= group.max_instances
    )
    return target if ok else None


@dataclass(frozen=True, slots=True)
class SetActionCodec:
    """Encodes and decodes control actions for a set layout (any groups and tenants up to its maximum)."""

    layout: SetLayout = field(default_factory=SetLayout)

    @property
    def version(self) -> int:
        """Action version (5)."""
        return SET_ACTION_VERSION

    @property
    def nvec(self) -> np.ndarray:
        """Sizes of every dimension: group slots, then tenant slots."""
        dims = [len(POOL_MOVES)] * self.layout.max_groups + list(TENANT_DIMS) * self.layout.max_tenants
        return np.asarray(dims, dtype=np.int64)

    def action_space(self) -> spaces.MultiDiscrete:
        """The gymnasium space of encoded actions."""
        return spaces.MultiDiscrete(self.nvec)

    def codec_hash(self) -> str:
        """Hash of the encoding (moves, levels and padding), stored in set-policy manifests."""
        payload = [
            self.version,
            POOL_MOVES,
            MIN_REMOTE_LEVELS_TOKENS,
            QUEUE_WAIT_LEVELS_S,
            MIN_EXPECTED_OUTPUT_LEVELS_TOKENS,
            self.layout.max_groups,
            self.layout.max_tenants,
        ]
        return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]

    def _route_codec(self) -> ActionCodec:
        # tenant dimensions decode exactly as action version 3's (the pool part of that codec is not used)
        return ActionCodec(ObservationLayout(max_groups=1, max_tenants=self.layout.max_tenants))

    def decode(
        self,
        action: np.ndarray,
        tenants: tuple[Tenant, ...],
        groups: tuple[TenantGroup, ...],
        current_pools: Mapping[str, PoolTargets],
        base_thresholds: Mapping[str, RoutingThresholds],
        policy_id: str = "learned",
    ) -> ControlAction:
        """Turn an encoded action into a :class:`ControlAction` against the running state.

        A pool move the bounds refuse holds the group.

        Raises:
            ValueError: the action is outside the action space, or the scenario exceeds the layout (one line).
        """
        self.layout.check_fits(len(groups), len(tenants))
        a = np.asarray(action, dtype=np.int64).reshape(-1)
        if a.shape != self.nvec.shape or np.any(a < 0) or np.any(a >= self.nvec):
            raise ValueError(f"action {a.tolist()} is outside the action space {self.nvec.tolist()}")
        pools: dict[str, PoolTargets] = {}
        for slot, group in enumerate(groups):
            current = current_pools.get(group.name)
            if current is None:
                continue
            pools[group.name] = pool_move(group, current, POOL_MOVES[a[slot]]) or current
        route = self._route_codec()
        legacy = np.concatenate([[1, 1], a[self.layout.max_groups :]])
        thresholds = route.decode(legacy, tenants, (), {}, base_thresholds, policy_id).thresholds
        return ControlAction(thresholds=thresholds, pools=pools, reason="learned", policy_id=policy_id)

    def encode(
        self,
        action: ControlAction,
        tenants: tuple[Tenant, ...],
        groups: tuple[TenantGroup, ...],
        current_pools: Mapping[str, PoolTargets],
        current_thresholds: Mapping[str, RoutingThresholds],
    ) -> np.ndarray:
        """The encoded action closest to ``action``: the sign of its prefill change, the nearest route levels.

        A group or tenant the action has no opinion on holds (its current levels).
        """
        self.layout.check_fits(len(groups), len(tenants))
        out = np.zeros(len(self.nvec), dtype=np.int64)
        out[: self.layout.max_groups] = HOLD
        for slot, group in enumerate(groups):
            target, current = action.pools.get(group.name), current_pools.get(group.name)
            if target is not None and current is not None:
                out[slot] = HOLD + int(np.sign(target.num_prefill - current.num_prefill))
        route = self._route_codec()
        levels = route.encode(action, tenants, (), {}, current_thresholds)
        out[self.layout.max_groups :] = levels[2:]
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
                out.extend(index == HOLD for index in range(len(POOL_MOVES)))
                continue
            out.extend(move == 0 or pool_move(group, current, move) is not None for move in POOL_MOVES)
        for slot in range(self.layout.max_tenants):
            used = slot < num_tenants
            for size in TENANT_DIMS:
                out.extend(used or i == 0 for i in range(size))
        return np.asarray(out, dtype=bool)
