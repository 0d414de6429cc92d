from __future__ import annotations

import pytest

from policies import (
    GroupWindow,
    MetricWindow,
    PoolTargets,
    RouteRule,
    RoutingThresholds,
    Slo,
    Tenant,
    TenantGroup,
    TenantWindow,
    build_observation,
)
from policies.base import PolicyContext
from policies.baselines import BASELINES, make_baseline

TENANTS = (Tenant("chat", "g", Slo(0.5, None, 0.05, None)), Tenant("rag", "g", Slo(3.0, None, 0.1, None)))
GROUP = TenantGroup("g", ("chat", "rag"), gpu_budget=8)


def ctx(pools: PoolTargets | None = None, now_s: float = 0.0) -> PolicyContext:
    pools = pools or PoolTargets(4, 4)
    th = {t.name: RoutingThresholds() for t in TENANTS}
    return PolicyContext(TENANTS, (GROUP,), {"g": pools}, th, th, now_s=now_s, interval_s=10.0)


def obs(group: GroupWindow | None, tenants: dict[str, TenantWindow] | None = None):  # type: ignore[no-untyped-def]
    window = MetricWindow(10.0, 10.0, tenants or {}, {"g": group} if group else {})
    return build_observation(window, ctx().observation_context())


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_every_baseline_decides_valid_targets(name: str) -> None:
    policy = make_baseline(name)
    gw = GroupWindow(
        4,
        4,
        prefill_queued_tokens=50_000,
        decode_kv_usage_frac=0.7,
        prefill_kv_usage_frac=0.2,
        prefill_queue_requests=12,
        decode_queue_requests=1,
    )
    action = policy.decide(obs(gw), ctx())
    assert policy.policy_id == f"baseline:{name}"
    assert set(action.thresholds) == {"chat", "rag"}
    for target in action.pools.values():
        assert target.num_instances <= GROUP.max_instances
        assert target.num_decode >= GROUP.min_decode


def test_aggregated_and_fixed_split() -> None:
    action = make_baseline("aggregated").decide(obs(None), ctx())
    assert action.pools["g"] == PoolTargets(0, 8)
    assert all(t.rule is RouteRule.AGGREGATED_ONLY for t in action.thresholds.values())
    action = make_baseline("fixed-split").decide(obs(None), ctx(PoolTargets(2, 6)))
    assert action.pools["g"] == PoolTargets(4, 4)


def test_throughput_planner_sizes_from_load() -> None:
    policy = make_baseline("dynamo-throughput", prefill_tokens_per_s=20_000, decode_tokens_per_s=2_000)
    tenants = {
        "chat": TenantWindow(request_rate_rps=10, mean_input_tokens=1000, mean_output_tokens=200),
        "rag": TenantWindow(request_rate_rps=5, mean_input_tokens=8000, mean_output_tokens=200),
    }
    action = policy.decide(obs(GroupWindow(4, 4), tenants), ctx())
    # prefill 10*1000 + 5*8000 = 50k tok/s -> 3; decode 15*200 = 3k tok/s -> 2
    assert action.pools["g"] == PoolTargets(3, 2)
    assert policy.decide(obs(GroupWindow(4, 4), {}), ctx()).pools == {}  # unknown rate: no opinion
    with pytest.raises(ValueError, match="needs"):
        make_baseline("dynamo-throughput")


def test_load_planner_steps_one_and_holds_while_pending() -> None:
    policy = make_baseline("dynamo-load")
    busy_prefill = GroupWindow(4, 4, prefill_queued_tokens=4 * 8192 * 2, decode_kv_usage_frac=0.7)
    assert policy.decide(obs(busy_prefill), ctx()).pools["g"] == PoolTargets(5, 3)  # budget: taken from decode
    pending = GroupWindow(4, 4, pending_prefill=1, prefill_queued_tokens=1e6, decode_kv_usage_frac=0.99)
    assert "g" not in policy.decide(obs(pending), ctx()).pools


def test_keda_scales_down_only_after_stabilisation() -> None:
    policy = make_baseline("keda-queue")
    high = GroupWindow(4, 4, prefill_queue_requests=30, decode_queue_requests=10)
    low = GroupWindow(4, 4, prefill_queue_requests=0, decode_queue_requests=0)
    assert policy.decide(obs(high), ctx(now_s=0)).pools["g"] == PoolTargets(6, 2)
    assert policy.decide(obs(low), ctx(PoolTargets(6, 2), now_s=10)).pools["g"] == PoolTargets(6, 2)
    assert policy.decide(obs(low), ctx(PoolTargets(6, 2), now_s=400)).pools["g"] == PoolTargets(1, 1)


def test_unknown_baseline_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="dynamo-legacy"):
        make_baseline("nope")
