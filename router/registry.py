"""Instances, their roles and health, in-flight accounting and role changes with drain.

An instance serves one role at a time. A role change (admin API) marks the instance *draining*: it takes no new
request of its old role and none of its new role until every in-flight request has finished, then it switches.
In-flight counts cover both legs (prefill and decode) of requests on an instance; ``incoming`` counts remote
requests placed on a decode instance whose decode leg has not started yet (their prefill leg is running), so
placement (:mod:`policies.placement`) sees every request it placed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from policies.placement import choose_prefill
from router.config import InstanceConfig

__all__ = ["Instance", "InstanceRegistry", "Role"]

Role = Literal["prefill", "decode"]


@dataclass(slots=True)
class Instance:
    """Live state of one instance."""

    id: str
    url: str
    role: Role
    max_num_seqs: int
    max_num_batched_tokens: int
    pending_role: Role | None = None
    healthy: bool = True
    in_flight: int = 0
    in_flight_prefill_tokens: int = 0
    incoming: int = 0
    awaiting_first_token_tokens: int = 0
    """Uncached prompt tokens of the local legs on the instance that have not sent their first byte (what the
    admission stage reads as the instance's own prefill queue)."""
    kv_usage_frac: float | None = None
    consecutive_failures: int = 0
    probe_timeouts: int = 0
    """Health probes in a row that timed out (reset by any probe that answers or is refused)."""
    _order: int = field(default=0, repr=False)

    @property
    def load_requests(self) -> int:
        """Requests placed here and not finished: legs in flight plus remote requests still prefilling elsewhere."""
        return self.in_flight + self.incoming

    @property
    def active_requests(self) -> int:
        """Legs in flight on the instance."""
        return self.in_flight

    @property
    def queued_prefill_tokens(self) -> int:
        """Prompt tokens of the prefill legs in flight on the instance."""
        return self.in_flight_prefill_tokens

    @property
    def draining(self) -> bool:
        """Whether the instance is finishing in-flight requests before taking ``pending_role``."""
        return self.pending_role is not None

    def serves(self, role: Role) -> bool:
        """Whether the instance takes new requests of ``role`` now."""
        return self.healthy and self.pending_role is None and self.role == role

    def state(self) -> dict[str, Any]:
        """The instance as the admin API reports it."""
        return {
            "id": self.id,
            "url": self.url,
            "role": self.role,
            "pending_role": self.pending_role,
            "healthy": self.healthy,
            "in_flight": self.in_flight,
            "draining": self.draining,
        }


class InstanceRegistry:
    """All instances known to the router."""

    def __init__(self, configs: Iterable[InstanceConfig]) -> None:
        self.instances: dict[str, Instance] = {}
        for order, cfg in enumerate(configs):
            self.instances[cfg.id] = Instance(
                cfg.id, cfg.url.rstrip("/"), cfg.role, cfg.max_num_seqs, cfg.max_num_batched_tokens, _order=order
            )

    def serving(self, role: Role) -> list[Instance]:
        """Healthy instances taking new requests of ``role``."""
        return [i for i in self.instances.values() if i.serves(role)]

    def least_loaded_prefill(self) -> Instance | None:
        """The prefill instance with the fewest in-flight prompt tokens (:func:`policies.placement.choose_prefill`)."""
        return choose_prefill(self.serving("prefill"))

    def acquire(self, inst: Instance, prefill_tokens: int = 0) -> None:
        """Count a request starting on ``inst``."""
        inst.in_flight += 1
        inst.in_flight_prefill_tokens += prefill_tokens

    def release(self, inst: Instance, prefill_tokens: int = 0) -> None:
        """Count a request ending on ``inst``; completes a pending role change when it was the last."""
        inst.in_flight -= 1
        inst.in_flight_prefill_tokens -= prefill_tokens
        if inst.in_flight <= 0 and inst.pending_role is not None:
            inst.role, inst.pending_role = inst.pending_role, None

    def validate_roles(self, roles: dict[str, Any]) -> tuple[str, str] | None:
        """Check a role change; return ``(field, message)`` of the first problem, or None."""
        for instance_id, role in roles.items():
            if instance_id not in self.instances:
                return f"roles.{instance_id}", f"unknown instance {instance_id!r}"
            if role not in ("prefill", "decode"):
                return f"roles.{instance_id}", f"role must be 'prefill' or 'decode', got {role!r}"
        final = {i.id: (roles.get(i.id) or i.pending_role or i.role) for i in self.instances.values()}
        if "decode" not in final.values():
            return "roles", "the change would leave no decode instance"
        return None

    def change_roles(self, roles: dict[str, Role]) -> None:
        """Apply validated role changes: idle instances switch now, busy ones drain first."""
        for instance_id, role in roles.items():
            inst = self.instances[instance_id]
            if role == inst.role:
                inst.pending_role = None
            elif inst.in_flight <= 0:
                inst.role, inst.pending_role = role, None
            else:
                inst.pending_role = role

    def state(self) -> list[dict[str, Any]]:
        """All instances as the admin API reports them."""
        return [i.state() for i in sorted(self.instances.values(), key=lambda i: i._order)]
