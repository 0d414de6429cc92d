"""The operator's rollback to aggregated serving, held by the router until lifted (``/admin/rollback``).

A policy write replaces the whole policy, so rolling back by writing an aggregated-only policy loses the tenants
(their requests are logged as ``default``) and the next controller write undoes it. This rollback instead sits on top
of whatever policy is in force: the tenants it names (or every tenant) are served with disaggregation disabled —
local prefill on the decode instance, route reason ``disaggregation_disabled`` — while their identification, SLOs
and metrics stay as the policy says. Policy writes do not lift it; only ``DELETE /admin/rollback`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from policies.schema import RoutingThresholds

__all__ = ["Rollback"]


@dataclass(slots=True)
class Rollback:
    """Which tenants are rolled back: none, the named ones, or all (``all_tenants``)."""

    tenants: frozenset[str] = frozenset()
    all_tenants: bool = False
    since_s: float | None = None
    """Wall time (Unix seconds) the rollback in force was set; ``None`` when none is."""

    @property
    def active(self) -> bool:
        """Whether any tenant is rolled back."""
        return self.all_tenants or bool(self.tenants)

    def covers(self, tenant: str) -> bool:
        """Whether ``tenant`` is rolled back."""
        return self.all_tenants or tenant in self.tenants

    def apply(self, tenant: str, thresholds: RoutingThresholds) -> RoutingThresholds:
        """``thresholds`` with disaggregation disabled when ``tenant`` is rolled back, else unchanged."""
        return replace(thresholds, disaggregation_enabled=False) if self.covers(tenant) else thresholds

    def set(self, tenants: frozenset[str] | None, now_s: float) -> None:
        """Roll back ``tenants`` (``None``: every tenant), in addition to any already rolled back."""
        if tenants is None:
            self.all_tenants = True
        else:
            self.tenants = self.tenants | tenants
        if self.since_s is None:
            self.since_s = now_s

    def lift(self) -> None:
        """End the rollback for every tenant."""
        self.tenants, self.all_tenants, self.since_s = frozenset(), False, None

    def state(self) -> dict[str, Any] | None:
        """The ``rollback`` entry of ``GET /admin/state``: ``None``, or ``{"tenants": [...] | "*", "since"}``."""
        if not self.active:
            return None
        return {"tenants": "*" if self.all_tenants else sorted(self.tenants), "since": self.since_s}
