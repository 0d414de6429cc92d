"""The simulator's instances and tenant groups: roles, lifecycle states, KV capacity, per-instance bookkeeping.

Plain state, no behaviour beyond what one instance knows about itself; :class:`~env.sim.simulator.ClusterSimulator`
changes it (engine stepping in :mod:`env.sim.stepping`, transfers in :mod:`env.sim.kv_transfers`, pools in
:mod:`env.sim.pools`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from env.perf.profile import OperatorProfile
from env.sim.engine import InstanceEngine
from env.sim.transfer import Link
from policies.placement import PrefillRate
from policies.transfer_health import TransferBreaker

__all__ = ["GroupState", "InstanceRole", "InstanceState", "SimInstance", "kv_capacity_tokens"]


class InstanceRole:
    """Instance roles."""

    PREFILL = "prefill"
    DECODE = "decode"
    AGGREGATED = "aggregated"


class InstanceState:
    """Instance lifecycle."""

    STARTING = "starting"
    ACTIVE = "active"
    DRAINING = "draining"
    STOPPED = "stopped"


def kv_capacity_tokens(
    profile: OperatorProfile, tp: int, gpu_memory_utilization: float, activation_reserve_bytes: float
) -> int:
    """KV tokens one instance holds: (memory x utilisation - weights - activations) / KV bytes per token (per GPU)."""
    free = profile.gpu_memory_bytes * gpu_memory_utilization - profile.model.weight_bytes(tp) - activation_reserve_bytes
    return max(int(free // profile.model.kv_bytes_per_token(tp)), 1)


class SimInstance:
    """One simulated instance (engine plus lifecycle and run bookkeeping)."""

    __slots__ = (
        "assigned_prefill_tokens",
        "assigned_requests",
        "busy",
        "created_s",
        "engine",
        "group",
        "in_transfer",
        "incoming",
        "index",
        "link",
        "name",
        "next_role",
        "prefill_rate",
        "prefill_rate_tokens_per_s",
        "ready_s",
        "result",
        "role",
        "run",
        "run_start_s",
        "run_steps",
        "state",
        "stopped_s",
        "tp",
        "version",
    )

    def __init__(self, index: int, group: int, role: str, engine: InstanceEngine, link: Link, tp: int) -> None:
        self.index = index
        self.name = f"{role}-{index}"
        self.group = group
        self.role = role
        self.next_role: str | None = role
        self.state = InstanceState.ACTIVE
        self.engine = engine
        self.link = link
        self.tp = tp
        self.busy = False
        self.version = 0
        self.run: Any = None
        self.run_start_s = 0.0
        self.run_steps = 0
        self.result: Any = None
        self.incoming = 0
        """Remote requests placed on this decode instance and not yet handed to its engine."""
        self.in_transfer = 0
        """Of those, the ones whose prefill is done (KV on its way)."""
        self.assigned_requests = 0
        """Prefill legs placed on this prefill instance and not yet done."""
        self.assigned_prefill_tokens = 0
        """Their prompt tokens."""
        self.prefill_rate: PrefillRate | None = None
        """The router's measured prefill rate of this instance (set by the simulator)."""
        self.created_s = 0.0
        self.ready_s = 0.0
        self.stopped_s = math.nan
        self.prefill_rate_tokens_per_s = 1.0

    @property
    def serves_decode(self) -> bool:
        """Decode or aggregated role."""
        return self.role != InstanceRole.PREFILL

    def load(self) -> int:
        """Requests held or on their way (the router's load measure)."""
        engine = self.engine
        return len(engine._decoding) + len(engine._prefilling) + len(engine._waiting) + self.incoming


@dataclass(slots=True)
class GroupState:
    """One tenant group: its pools, bounds, targets and recent transfers."""

    name: str
    tenants: list[int]
    gpu_budget: int
    gpus_per_instance: int
    min_prefill: int
    max_prefill: int | None
    min_decode: int
    max_decode: int | None
    instances: list[SimInstance] = field(default_factory=list)
    prefill: list[SimInstance] = field(default_factory=list)
    decode: list[SimInstance] = field(default_factory=list)
    targets: tuple[int, int] | None = None
    retargeting: bool = False
    breaker: TransferBreaker = field(default_factory=TransferBreaker)
    """The router's KV-transfer breaker over this group's transfers (the scenario's network settings)."""
    transfer_log: list[tuple[float, float, bool]] = field(default_factory=list)
