"""The actuator port, actuation outcomes, and the unknown-outcome latch.

An actuation either applied, changed nothing, was refused (nothing changed), failed before anything was sent
(nothing changed), or has an **unknown** outcome (a timeout or a server error after the request was sent).
An unknown outcome is never retried blindly: the actuator is latched and refuses to act until it has read
the real state back (:meth:`Actuator.observe` succeeded); the next decision is then computed from that state.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.sources.base import Topology
from policies.schema import PoolTargets

__all__ = ["ActuationResult", "Actuator", "Outcome", "Plan", "UnknownOutcomeLatch"]


class Outcome(enum.StrEnum):
    """How an actuation ended. Append-only: values are metric labels."""

    APPLIED = "applied"
    UNCHANGED = "unchanged"
    REJECTED = "rejected"
    FAILED = "failed"
    UNKNOWN = "unknown"
    HELD = "held"


@dataclass(frozen=True, slots=True)
class Plan:
    """What the loop asks actuators to do this tick.

    Attributes:
        generation: config/policy generation the decision was computed under.
        policy_document: the policy-file document to publish, ``None`` = thresholds unchanged.
        pools: new pool targets per tenant group (only groups that change).
    """

    generation: int
    policy_document: Mapping[str, Any] | None = None
    pools: Mapping[str, PoolTargets] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Nothing to do."""
        return self.policy_document is None and not self.pools


@dataclass(frozen=True, slots=True)
class ActuationResult:
    """One actuator's result for one plan."""

    actuator: str
    outcome: Outcome
    detail: str = ""

    def as_dict(self) -> dict[str, str]:
        """JSON-friendly form."""
        return {"actuator": self.actuator, "outcome": self.outcome.value, "detail": self.detail}


class Actuator(Protocol):
    """Applies plans to something real (the router, Kubernetes) or records them (dry run)."""

    @property
    def name(self) -> str:
        """Short name used in logs and metric labels."""
        ...

    async def observe(self, topology: Topology) -> Topology | None:
        """Read the actual state and return ``topology`` updated with it (``None`` = could not read)."""
        ...

    async def apply(self, plan: Plan, topology: Topology) -> ActuationResult:
        """Apply ``plan`` to the state described by ``topology``."""
        ...

    async def ready(self) -> bool:
        """Whether the target is reachable."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


class UnknownOutcomeLatch:
    """Set on an unknown outcome; cleared only by a successful read of the real state."""

    def __init__(self) -> None:
        self.reason: str | None = None

    @property
    def set(self) -> bool:
        """Whether an earlier outcome is still unknown."""
        return self.reason is not None

    def trip(self, reason: str) -> None:
        """Record an unknown outcome."""
        self.reason = reason

    def clear(self) -> None:
        """The real state was read back."""
        self.reason = None

    def held(self, actuator: str) -> ActuationResult:
        """The result of an actuation refused because of the latch."""
        return ActuationResult(actuator, Outcome.HELD, f"earlier outcome unknown ({self.reason}); state not re-read")
