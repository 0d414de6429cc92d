from __future__ import annotations

import math

import pytest

from env.reward import REWARD_TERMS, RewardWeights, instance_changes, reward_terms, total
from policies.schema import GroupWindow, MetricWindow, PoolTargets, Slo, Tenant, TenantWindow

TENANTS = (Tenant("chat", "g", Slo(ttft_p95_s=1.0), priority=2.0), Tenant("batch", "g", Slo(), priority=0.5))


def _window(**tenants: TenantWindow) -> MetricWindow:
    return MetricWindow(end_s=10.0, window_s=10.0, tenants=tenants, groups={"g": GroupWindow(2, 2)})


def test_terms_are_priority_weighted_counts_and_signed_costs() -> None:
    window = _window(
        chat=TenantWindow(request_rate_rps=3.0, goodput_rps=2.5, failed_rate_rps=0.1),
        batch=TenantWindow(request_rate_rps=1.0, goodput_rps=1.0, failed_rate_rps=0.0),
    )
    weights = RewardWeights(goodput_weight=1.0, gpu_cost_per_gpu_s=0.5, churn_cost_per_change=3.0)
    terms = reward_terms(window, TENANTS, gpu_seconds=80.0, changes=2, weights=weights)
    assert tuple(terms) == REWARD_TERMS
    assert terms["goodput"] == pytest.approx(2.0 * 25 + 0.5 * 10)
    assert terms["gpu_cost"] == pytest.approx(-40.0)
    assert terms["churn"] == pytest.approx(-6.0)
    assert terms["failures"] == pytest.approx(-10.0)
    assert total(terms) == pytest.approx(55.0 - 40.0 - 6.0 - 10.0)


def test_unknown_rates_contribute_nothing() -> None:
    terms = reward_terms(_window(chat=TenantWindow()), TENANTS, 0.0, 0, RewardWeights())
    assert terms == {"goodput": 0.0, "gpu_cost": -0.0, "churn": -0.0, "failures": -0.0}


def test_instance_changes_counts_both_pools_of_known_groups() -> None:
    current = {"a": PoolTargets(2, 2), "b": PoolTargets(1, 3)}
    targets = {"a": PoolTargets(1, 3), "b": PoolTargets(1, 3), "unknown": PoolTargets(4, 4)}
    assert instance_changes(current, targets) == 2


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_weights_must_be_finite_and_non_negative(bad: float) -> None:
    with pytest.raises(ValueError, match="reward weight"):
        RewardWeights(churn_cost_per_change=bad)
