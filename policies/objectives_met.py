"""Whether a tenant group met its tenants' SLO objectives in one control window.

A control policy that changes how a group is served trades a known present for a predicted one. When the present
is a window in which every tenant of the group had its requests finish within its objectives, nothing in that
window can be served better: a change can only pay off through traffic still to come, and a prediction of it made
from a window that shows none of it is the least reliable kind. The rule selector's ``hold_while_objectives_met``
(:mod:`policies.rule_selector`) keeps its acting rule through such windows.

A group **met its objectives** in a window when at least one of its tenants had traffic there, and every tenant of
the group that had traffic finished at least :data:`MET_ATTAINMENT_FRAC` of its requests within both its TTFT and
its TPOT objective (``slo_attainment_frac``, the per-request measure goodput counts). The fraction is the
percentile the objectives are stated at (p95): a tenant at or above it kept its p95 objectives in that window.

Unknown values never make a group meet its objectives: a tenant with traffic whose attainment is unknown (no
request finished in the window) fails the judgment, and so does a group with no traffic.
"""

from __future__ import annotations

from policies.base import PolicyContext
from policies.schema import MetricWindow

__all__ = ["MET_ATTAINMENT_FRAC", "group_met_objectives"]

MET_ATTAINMENT_FRAC = 0.95
"""The share of a tenant's requests that must meet both objectives: the percentile of its p95 objectives."""


def group_met_objectives(
    window: MetricWindow, context: PolicyContext, group: str, *, attainment_frac: float = MET_ATTAINMENT_FRAC
) -> bool:
    """Whether every tenant of ``group`` with traffic in ``window`` met its objectives (module docstring).

    Args:
        window: the control window.
        context: the deployment (which tenants belong to ``group``).
        group: the tenant group's name.
        attainment_frac: the share of each tenant's requests that must meet both objectives.

    Returns:
        False when no tenant of the group had traffic, or one with traffic has an unknown or lower attainment.
    """
    seen = False
    for tenant in context.tenants_of(group):
        tw = window.tenants.get(tenant.name)
        if tw is None or not tw.request_rate_rps:
            continue
        if tw.slo_attainment_frac is None or tw.slo_attainment_frac < attainment_frac:
            return False
        seen = True
    return seen
