"""The dry-run actuator: records what it would do and keeps a simulated state so ticks follow on."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from controller.actuators.base import ActuationResult, Outcome, Plan
from controller.sources.base import Topology

__all__ = ["DryRunActuator", "Recorded"]

_log = logging.getLogger("pdctl.controller.actuators.dry_run")


@dataclass(frozen=True, slots=True)
class Recorded:
    """One plan the dry-run actuator received."""

    plan: Plan
    topology: Topology


class DryRunActuator:
    """Records plans; applies pool targets to its own simulated state only."""

    def __init__(self) -> None:
        self.records: list[Recorded] = []
        self._state: Topology | None = None

    @property
    def name(self) -> str:
        """``dry_run``."""
        return "dry_run"

    async def observe(self, topology: Topology) -> Topology | None:
        """The simulated state (pool counts it was asked to reach), else ``topology`` unchanged."""
        if self._state is None:
            return topology
        return replace(topology, pools=dict(self._state.pools), pending={})

    async def apply(self, plan: Plan, topology: Topology) -> ActuationResult:
        """Record ``plan`` and move the simulated pool counts."""
        self.records.append(Recorded(plan, topology))
        pools = dict(topology.pools)
        pools.update(plan.pools)
        self._state = replace(topology, pools=pools, pending={})
        _log.info(
            "dry run: would %s and set pools %s",
            "publish the policy document" if plan.policy_document is not None else "keep the policy",
            {g: (p.num_prefill, p.num_decode) for g, p in plan.pools.items()},
        )
        return ActuationResult(self.name, Outcome.APPLIED, "recorded")

    async def ready(self) -> bool:
        """Always ready."""
        return True

    async def close(self) -> None:
        """Nothing to release."""
