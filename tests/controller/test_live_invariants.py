"""Invariants the controller keeps whatever the policy says, from the live instance set.

Pool minimums and maximums, the last instance of a role kept while traffic needs it, and moves only among
instances that exist and are healthy: the guard (``policies/guard.py``, with the live capacity) and the router
actuator's ``role_changes`` each enforce them. Random policies × random instance failures, many ticks each,
plus the regression of the live run (2 prefill + 3 decode, p0 killed, queue_kv asking for more prefill: the
old ``role_changes`` flipped two decode instances, leaving 4P/1D below ``decode.min: 2``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime

from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.actuators.router import RouterActuator, role_changes
from controller.sources.base import InstanceInfo, Topology
from policies.base import PolicyContext
from policies.baselines import make_baseline
from policies.control import ControlInputs, ControlState, control_step
from policies.guard import ClampReason, GuardLimits, GuardState, SafetyGuard
from policies.pool_clamp import within_bounds
from policies.rules import QueueKvPolicy
from policies.schema import (
    ControlAction,
    GroupWindow,
    MetricWindow,
    PoolTargets,
    RoutingThresholds,
    Slo,
    Tenant,
    TenantGroup,
    TenantWindow,
)

TENANT = Tenant("a", "g", Slo(ttft_p95_s=1.0, tpot_p95_s=0.1))


def _window(pools: PoolTargets, *, rate_rps: float = 5.0, queue_wait_s: float | None = None) -> MetricWindow:
    group = GroupWindow(
        num_prefill=pools.num_prefill,
        num_decode=pools.num_decode,
        decode_kv_usage_frac=0.2,
        prefill_queue_wait_s=queue_wait_s,
    )
    tenant = TenantWindow(request_rate_rps=rate_rps)
    return MetricWindow(1000.0, 30.0, {"a": tenant}, {"g": group}, 0.0)


def _max(group: TenantGroup, role: str) -> int:
    bound = group.max_prefill if role == "prefill" else group.max_decode
    return group.max_instances if bound is None else bound


def _within(value: int, low: int, high: int) -> bool:
    return low <= value <= high


def _no_further_out(before: int, after: int, low: int, high: int) -> bool:
    """Inside stays inside; outside moves towards the bounds, never further away."""
    if _within(before, low, high):
        return _within(after, low, high)
    return after >= before if before < low else after <= before


# ----------------------------------------------------------------------------------------------- the regression


def _five_instances(dead: tuple[str, ...] = ()) -> Topology:
    roles = (("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"), ("d1", "decode"), ("d2", "decode"))
    return Topology.from_instances([InstanceInfo(i, "g", r, healthy=i not in dead) for i, r in roles])


REGRESSION_GROUP = TenantGroup("g", ("a",), gpu_budget=8, min_prefill=1, min_decode=2)


def test_prefill_death_under_queue_kv_keeps_the_decode_minimum() -> None:
    """The live run's scenario, tick after tick: decode never goes below its minimum of 2."""
    instances = {i.id: i for i in _five_instances(dead=("p0",)).instances}
    policy = QueueKvPolicy()
    guard = SafetyGuard(GuardLimits(max_step_per_tick=2, cooldown_s=0.0, hysteresis_ticks=1))
    state = ControlState.start({"a": RoutingThresholds()})
    moved: list[dict[str, str]] = []
    for tick in range(6):
        topology = Topology.from_instances(list(instances.values()))
        assert topology.capacity == {"g": 4}, "p0 is dead: four healthy instances"
        inputs = ControlInputs(
            window=_window(topology.pools["g"], queue_wait_s=10.0),  # prefill pressure, decode calm
            tenants=(TENANT,),
            groups=(REGRESSION_GROUP,),
            current_pools=topology.pools,
            base_thresholds={"a": RoutingThresholds()},
            now_s=1000.0 + 30.0 * tick,
            interval_s=30.0,
            now=datetime(2026, 1, 1, tzinfo=UTC),
            capacity=topology.capacity,
        )
        effects = control_step(policy, inputs, state, guard)
        state = effects.next_state(applied=True)
        target = effects.guarded.pools.get("g", topology.pools["g"])
        assert target.num_decode >= 2, (tick, target)
        assert target.num_instances <= 4, (tick, target)
        changes = role_changes(topology, {"g": target}, {"g": REGRESSION_GROUP})
        assert "p0" not in changes, "a dead instance never moves"
        moved.append(changes)
        for instance_id, role in changes.items():
            instances[instance_id] = replace(instances[instance_id], role=role)
        after = Topology.from_instances(list(instances.values())).pools["g"]
        assert after.num_decode >= REGRESSION_GROUP.min_decode, (tick, after, changes)
    final = Topology.from_instances(list(instances.values())).pools["g"]
    assert final == PoolTargets(2, 2), "the live prefill pool grew by shifting one decode instance, no more"
    assert sum(len(m) for m in moved) == 1


def test_a_broken_transfer_path_rolls_the_live_pools_back_to_aggregated_in_one_tick() -> None:
    """The controller's step and the router actuator carry out the guard's rollback: two prefill instances flip at once.

    Under the guard's step limit (one instance per tick; hysteresis of one tick here) the aggregated rule's move is
    paced on a healthy path, and goes through in one tick once half the window's remote legs failed
    (``policies/transfer_fallback``).
    """
    group = TenantGroup("g", ("a",), gpu_budget=8, min_prefill=0, min_decode=1)
    topology = _five_instances()
    policy = make_baseline("aggregated")
    for failed, want, flipped in ((0.0, PoolTargets(1, 4), {"p1": "decode"}), (0.6, PoolTargets(0, 5), None)):
        window = replace(
            _window(topology.pools["g"]),
            groups={
                "g": GroupWindow(
                    num_prefill=2,
                    num_decode=3,
                    decode_kv_usage_frac=0.2,
                    kv_transfer_failure_frac=failed,
                    kv_transfer_time_p95_s=0.05,
                )
            },
            tenants={"a": TenantWindow(request_rate_rps=5.0, remote_prefill_frac=0.5)},
        )
        inputs = ControlInputs(
            window=window,
            tenants=(TENANT,),
            groups=(group,),
            current_pools=topology.pools,
            base_thresholds={"a": RoutingThresholds()},
            now_s=1000.0,
            interval_s=30.0,
            now=datetime(2026, 1, 1, tzinfo=UTC),
            capacity=topology.capacity,
        )
        guard = SafetyGuard(GuardLimits(hysteresis_ticks=1))
        effects = control_step(policy, inputs, ControlState.start({"a": RoutingThresholds()}), guard)
        target = effects.guarded.pools["g"]
        assert target == want, failed
        changes = role_changes(topology, {"g": target}, {"g": group})
        assert changes == (flipped or {"p0": "decode", "p1": "decode"}), failed
        assert (ClampReason.TRANSFER_ROLLBACK in [c.reason for c in effects.clamps]) is (failed > 0), failed


def test_role_changes_never_chase_one_pool_through_the_other() -> None:
    """The old bug directly: a target with more prefill and the same decode (more than exists) moves nothing."""
    topology = _five_instances(dead=("p0",))
    assert topology.pools["g"] == PoolTargets(1, 3)
    assert role_changes(topology, {"g": PoolTargets(3, 3)}, {"g": REGRESSION_GROUP}) == {}
    assert role_changes(topology, {"g": PoolTargets(4, 1)}, {"g": REGRESSION_GROUP}) == {"d2": "prefill"}
    # Without the group's bounds the actuator still keeps one decode instance.
    assert role_changes(topology, {"g": PoolTargets(4, 0)}) == {"d2": "prefill", "d1": "prefill"}


def test_guard_cuts_to_the_live_capacity() -> None:
    current = PoolTargets(1, 3)
    ctx = PolicyContext((TENANT,), (REGRESSION_GROUP,), {"g": current}, {"a": RoutingThresholds()}, capacity={"g": 4})
    guard = SafetyGuard(GuardLimits(max_step_per_tick=3, cooldown_s=0.0, hysteresis_ticks=1))
    out = guard.apply(ControlAction(pools={"g": PoolTargets(3, 3)}), ctx, _window(current), GuardState())
    assert out.action.pools["g"] == current
    assert ClampReason.LIVE_CAPACITY in [c.reason for c in out.clamps]
    out = guard.apply(ControlAction(pools={"g": PoolTargets(4, 0)}), ctx, _window(current), GuardState())
    assert out.action.pools["g"] == PoolTargets(2, 2), "decode kept at its minimum, the rest within capacity"


def test_decode_keeps_one_instance_and_prefill_its_minimum() -> None:
    group = TenantGroup("g", ("a",), gpu_budget=4, min_prefill=0, min_decode=1)
    current = PoolTargets(1, 3)
    guard = SafetyGuard(GuardLimits(max_step_per_tick=3, cooldown_s=0.0, hysteresis_ticks=1))
    ctx = PolicyContext((TENANT,), (group,), {"g": current}, {"a": RoutingThresholds()}, capacity={"g": 4})
    out = guard.apply(ControlAction(pools={"g": PoolTargets(4, 0)}), ctx, _window(current), GuardState())
    assert out.action.pools["g"] == PoolTargets(3, 1), "every request needs a decode instance"
    assert next(c.reason for c in out.clamps) is ClampReason.BELOW_MIN
    # An empty prefill pool fails no request (the router serves locally): min_prefill 0 allows it.
    out = guard.apply(ControlAction(pools={"g": PoolTargets(0, 4)}), ctx, _window(current), GuardState())
    assert out.action.pools["g"] == PoolTargets(0, 4)


def test_kubernetes_bounds_clamp() -> None:
    group = TenantGroup("g", ("a",), gpu_budget=6, min_prefill=1, max_prefill=3, min_decode=2, max_decode=4)
    assert within_bounds(PoolTargets(0, 9), group) == PoolTargets(1, 4)
    assert within_bounds(PoolTargets(3, 4), group) == PoolTargets(2, 4)
    assert within_bounds(PoolTargets(2, 3), group) == PoolTargets(2, 3)


async def test_router_actuator_reads_health_and_capacity_from_the_router() -> None:
    """``GET /admin/state`` says p0 is unhealthy: it leaves the prefill pool and the capacity."""
    state = {
        "generation": 1,
        "policy": {},
        "instances": [
            {"id": i.id, "role": i.role, "pending_role": None, "healthy": i.id != "p0"}
            for i in _five_instances().instances
        ],
    }

    async def handle(request: web.Request) -> web.Response:
        return web.json_response(state)

    app = web.Application()
    app.router.add_get("/admin/state", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    actuator = RouterActuator(f"http://127.0.0.1:{port}", None, 2.0, (REGRESSION_GROUP,))
    try:
        observed = await actuator.observe(_five_instances())
    finally:
        await actuator.close()
        await runner.cleanup()
    assert observed is not None
    assert observed.pools["g"] == PoolTargets(1, 3)
    assert observed.capacity == {"g": 4}
    assert [i.id for i in observed.instances if not i.healthy] == ["p0"]


# ------------------------------------------------------------------------------------- random policies × failures


@dataclass
class _Cluster:
    instances: dict[str, InstanceInfo]

    def topology(self) -> Topology:
        return Topology.from_instances(list(self.instances.values()), ("g",))


@st.composite
def _groups(draw: st.DrawFn) -> TenantGroup:
    min_p, min_d = draw(st.integers(0, 2)), draw(st.integers(1, 3))
    budget = draw(st.integers(min_p + min_d, 10))
    max_p = draw(st.none() | st.integers(max(min_p, 1), budget))
    max_d = draw(st.none() | st.integers(min_d, budget))
    return TenantGroup(
        "g", ("a",), gpu_budget=budget, min_prefill=min_p, max_prefill=max_p, min_decode=min_d, max_decode=max_d
    )


@settings(max_examples=150, deadline=None)
@given(data=st.data(), group=_groups(), step=st.integers(1, 3), ticks=st.integers(1, 12))
def test_random_policies_and_failures_never_leave_the_bounds(
    data: st.DataObject, group: TenantGroup, step: int, ticks: int
) -> None:
    num = data.draw(st.integers(1, group.max_instances), label="instances")
    num_prefill = data.draw(st.integers(0, num - 1), label="prefill")
    cluster = _Cluster(
        {
            f"i{k}": InstanceInfo(f"i{k}", "g", "prefill" if k < num_prefill else "decode", healthy=True)
            for k in range(num)
        }
    )
    guard = SafetyGuard(GuardLimits(max_step_per_tick=step, cooldown_s=0.0, hysteresis_ticks=1))
    guard_state = GuardState()
    for tick in range(ticks):
        # Faults: any instance may die (or come back) before the tick reads the cluster.
        for instance_id in data.draw(st.lists(st.sampled_from(sorted(cluster.instances)), max_size=2), label="flip"):
            info = cluster.instances[instance_id]
            cluster.instances[instance_id] = replace(info, healthy=not info.healthy)
        topology = cluster.topology()
        before = topology.pools["g"]
        rate_rps = data.draw(st.sampled_from([0.0, 3.0]), label="rate")
        target = PoolTargets(data.draw(st.integers(0, 12), label="p"), data.draw(st.integers(0, 12), label="d"))
        ctx = PolicyContext(
            (TENANT,),
            (group,),
            topology.pools,
            {"a": RoutingThresholds()},
            now_s=30.0 * tick,
            capacity=topology.capacity,
        )
        out = guard.apply(ControlAction(pools={"g": target}), ctx, _window(before, rate_rps=rate_rps), guard_state)
        guard_state = out.state
        guarded = out.action.pools["g"]
        # The guard's target: within the bounds (or no further out), never more than exist healthy.
        if before.num_instances <= topology.capacity["g"]:
            assert guarded.num_instances <= topology.capacity["g"]
        changes = role_changes(topology, {"g": guarded}, {"g": group})
        healthy = {i.id for i in topology.instances if i.healthy}
        assert set(changes) <= healthy, "moves only among instances that exist and are healthy"
        for instance_id, role in changes.items():
            cluster.instances[instance_id] = replace(cluster.instances[instance_id], role=role)
        after = cluster.topology().pools["g"]
        assert after.num_instances == before.num_instances, "role flips neither add nor remove instances"
        assert _no_further_out(before.num_prefill, after.num_prefill, group.min_prefill, _max(group, "prefill"))
        assert _no_further_out(before.num_decode, after.num_decode, group.min_decode, _max(group, "decode"))
        if before.num_decode >= 1:
            assert after.num_decode >= 1, "the last decode instance stays"
