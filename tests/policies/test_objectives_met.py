"""Whether a tenant group met its tenants' objectives in one control window (policies.objectives_met)."""

from __future__ import annotations

import pytest

from policies.base import PolicyContext
from policies.objectives_met import MET_ATTAINMENT_FRAC, group_met_objectives
from policies.schema import (
    GroupWindow,
    MetricWindow,
    PoolTargets,
    RoutingThresholds,
    Slo,
    Tenant,
    TenantGroup,
    TenantWindow,
)

GROUPS = (TenantGroup("g", ("chat", "rag"), gpu_budget=8), TenantGroup("other", ("batch",), gpu_budget=4))
TENANTS = (
    Tenant("chat", "g", Slo(ttft_p95_s=0.5, tpot_p95_s=0.05)),
    Tenant("rag", "g", Slo(ttft_p95_s=2.0)),
    Tenant("batch", "other", Slo(ttft_p95_s=10.0)),
)
CONTEXT = PolicyContext(
    tenants=TENANTS,
    groups=GROUPS,
    current_pools={"g": PoolTargets(4, 4), "other": PoolTargets(2, 2)},
    current_thresholds={t.name: RoutingThresholds() for t in TENANTS},
)


def _window(**tenants: tuple[float | None, float | None]) -> MetricWindow:
    """A window of the given tenants' (request rate, SLO attainment)."""
    tw = {name: TenantWindow(request_rate_rps=rate, slo_attainment_frac=att) for name, (rate, att) in tenants.items()}
    groups = {"g": GroupWindow(num_prefill=4, num_decode=4), "other": GroupWindow(num_prefill=2, num_decode=2)}
    return MetricWindow(end_s=60.0, window_s=15.0, tenants=tw, groups=groups)


@pytest.mark.parametrize(
    ("chat", "rag", "met"),
    [
        ((10.0, 1.0), (2.0, 0.97), True),
        ((10.0, MET_ATTAINMENT_FRAC), (2.0, 1.0), True),  # at the objectives' percentile
        ((10.0, 0.94), (2.0, 1.0), False),  # one tenant short: the group fell short
        ((10.0, 1.0), (2.0, 0.2), False),  # however small its share of the traffic
        ((10.0, 1.0), (0.0, None), True),  # a tenant without traffic has nothing to judge
        ((10.0, 1.0), (None, None), True),
        ((10.0, None), (2.0, 1.0), False),  # traffic but no attainment known (nothing finished): not met
        ((0.0, None), (0.0, None), False),  # no traffic in the group: no evidence either way
    ],
)
def test_a_group_met_its_objectives_when_every_tenant_with_traffic_reached_the_percentile(
    chat: tuple[float | None, float | None], rag: tuple[float | None, float | None], met: bool
) -> None:
    assert group_met_objectives(_window(chat=chat, rag=rag, batch=(1.0, 0.0)), CONTEXT, "g") is met


def test_the_judgment_reads_only_the_groups_own_tenants_and_an_unseen_group_never_met_them() -> None:
    window = _window(chat=(10.0, 1.0), rag=(2.0, 1.0), batch=(1.0, 0.1))
    assert group_met_objectives(window, CONTEXT, "g")
    assert not group_met_objectives(window, CONTEXT, "other")
    assert not group_met_objectives(window, CONTEXT, "unknown")
    assert group_met_objectives(window, CONTEXT, "other", attainment_frac=0.1)
