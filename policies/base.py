"""The policy port: what every policy (file, rule, baseline, learned) is given and must return.

A policy is pure: :meth:`Policy.decide` reads an :class:`~policies.features.Observation` and a
:class:`PolicyContext` and returns a :class:`~policies.schema.ControlAction`. It does no I/O and reads no
clock; time arrives as ``context.now_s``. Whatever it returns then passes through
:class:`policies.guard.SafetyGuard` before anything is actuated.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from policies.features import Observation, ObservationContext
from policies.schema import ControlAction, PoolTargets, RoutingThresholds, Tenant, TenantGroup

__all__ = ["Policy", "PolicyContext"]


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """Static and slowly-changing facts a policy decides against.

    Attributes:
        tenants: tenants in a fixed order (their SLOs and priorities).
        groups: tenant groups with their pool bounds and GPU budgets.
        current_pools: running prefill/decode counts per tenant group.
        current_thresholds: routing thresholds in force per tenant.
        base_thresholds: the thresholds of the policy file the controller was started with (what a rule policy
            relaxes back towards).
        now_s: decision time in seconds (wall or virtual, as the caller's clock says).
        interval_s: control interval in seconds.
        capacity: per tenant group, the most instances it can run now when its instance set is fixed (the
            router actuator moves existing instances between roles and cannot add any): its healthy instances.
            A group not listed is bounded by its GPU budget alone.
    """

    tenants: tuple[Tenant, ...]
    groups: tuple[TenantGroup, ...]
    current_pools: Mapping[str, PoolTargets]
    current_thresholds: Mapping[str, RoutingThresholds]
    base_thresholds: Mapping[str, RoutingThresholds] = field(default_factory=dict)
    now_s: float = 0.0
    interval_s: float = 10.0
    capacity: Mapping[str, int] = field(default_factory=dict)

    def max_instances(self, group: TenantGroup) -> int:
        """Instances ``group`` may run now: its GPU budget, capped by its live :attr:`capacity` when known."""
        live = self.capacity.get(group.name)
        return group.max_instances if live is None else min(group.max_instances, max(live, 0))

    def observation_context(self) -> ObservationContext:
        """The subset :func:`policies.features.build_observation` needs."""
        return ObservationContext(tenants=self.tenants, groups=self.groups, thresholds=self.current_thresholds)

    def grouped(self) -> PolicyContext:
        """This context without the tenants of no listed group (``self`` when every tenant has one).

        A live policy file always carries the implicit ``default`` tenant (requests no tenant matches) in a group
        named ``default``, which exists only when the file declares it. A policy that decides per tenant group has
        no pools to size for such a tenant, and leaves its thresholds as they are.
        """
        names = {g.name for g in self.groups}
        kept = tuple(t for t in self.tenants if t.group in names)
        return self if len(kept) == len(self.tenants) else replace(self, tenants=kept)

    def group_of(self, tenant: str) -> str | None:
        """Name of the tenant group ``tenant`` belongs to, if any."""
        for t in self.tenants:
            if t.name == tenant:
                return t.group
        return None

    def tenants_of(self, group: str) -> tuple[Tenant, ...]:
        """Tenants of one tenant group, in context order."""
        return tuple(t for t in self.tenants if t.group == group)


@runtime_checkable
class Policy(Protocol):
    """Anything that turns an observation into a control action."""

    @property
    def policy_id(self) -> str:
        """Stable identifier (spec and version), recorded with every decision."""
        ...

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """Decide thresholds and pool targets for the next interval (pure, deterministic)."""
        ...


@runtime_checkable
class RemembersState(Protocol):
    """A policy whose decisions depend on what it remembered over earlier ticks, and that can hand it over.

    A restarted controller keeps this memory in its control memory file (``controller.control_memory``) and gives
    it back to the new process's policy of the same ``policy_id``, so the restart does not change what it decides.
    """

    def memory_document(self) -> dict[str, Any]:
        """The memory as JSON values; its times are on the control clock (``PolicyContext.now_s``)."""
        ...

    def restore_memory(self, document: Mapping[str, Any], shift_s: float) -> None:
        """Take over ``document`` (from :meth:`memory_document`), its times moved by ``shift_s`` onto this clock.

        Raises:
            ValueError: the document is malformed or from another policy (one line naming the field).
        """
        ...


def policy_layers(policy: object) -> Iterator[object]:
    """``policy`` and the policies it wraps, outermost first.

    Through an SLO watchdog's ``primary`` (its fallback is a rule) and through any wrapper that exposes the policy it
    delegates to as ``inner`` (relabelling, the controller's registry policy).
    """
    seen: object = policy
    for _ in range(8):  # wrappers nest a few deep at most; a cycle would be a bug, not a reason to hang
        yield seen
        seen = getattr(seen, "primary", None) or getattr(seen, "inner", None)
        if seen is None:
            return


def remembering_layer(policy: object) -> RemembersState | None:
    """The outermost of ``policy`` and the policies it wraps (:func:`policy_layers`) that remembers between ticks."""
    return next((layer for layer in policy_layers(policy) if isinstance(layer, RemembersState)), None)
