"""Conservation properties of the simulator under random workloads, thresholds and pool changes (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from env.sim.simulator import InstanceState
from policies.schema import ControlAction, FallbackAction, PoolTargets, RoutingThresholds
from tests.sim.helpers import random_columns, scenario, simulator

thresholds_strategy = st.builds(
    RoutingThresholds,
    disaggregation_enabled=st.booleans(),
    min_remote_input_tokens=st.integers(1024, 4096),
    max_local_input_tokens=st.integers(0, 1024),
    require_decode_pool_pressure=st.booleans(),
    decode_pressure_threshold_frac=st.floats(0.0, 1.0),
    on_kv_transfer_timeout=st.sampled_from(list(FallbackAction)),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    rate=st.floats(5.0, 60.0),
    thresholds=thresholds_strategy,
    failure_prob=st.sampled_from([0.0, 0.3]),
    kv_capacity=st.sampled_from([12_000, 200_000]),
    targets=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4)), min_size=1, max_size=4),
)
def test_conservation_under_pool_changes(
    seed: int,
    rate: float,
    thresholds: RoutingThresholds,
    failure_prob: float,
    kv_capacity: int,
    targets: list[tuple[int, int]],
) -> None:
    rng = np.random.default_rng(seed)
    cluster = {
        "kv_capacity_tokens": kv_capacity,
        "startup_delay_s": 2.0,
        "role_switch_delay_s": 1.0,
        "network": {"failure_prob": failure_prob},
    }
    scn = scenario(2, 2, cluster=cluster, budget=5, prefill_pool={"min": 0, "max": 4}, decode_pool={"min": 1, "max": 4})
    n = 150
    sim = simulator(scn, {"t": random_columns(rng, n, rate, max_input=6000)}, thresholds, seed=seed)
    last_now = 0.0
    t = 0.0
    step = 0
    while sim.num_finished + sim.num_failed < n:
        t += 1.0
        sim.run_until(t)
        assert sim.now_s >= last_now
        last_now = sim.now_s
        assert sim.num_arrived == sim.num_finished + sim.num_in_flight + sim.num_failed
        for inst in sim.instances:
            assert 0.0 <= inst.engine.kv_usage_frac <= 1.0
            assert 0 <= inst.engine.kv_used_tokens <= inst.engine.config.kv_capacity_tokens
        window = sim.snapshot()
        group = window.groups["g"]
        assert group.num_prefill + group.num_decode + group.pending_prefill + group.pending_decode <= 5
        if step < len(targets):
            p, d = targets[step]
            sim.apply(ControlAction(pools={"g": PoolTargets(num_prefill=p, num_decode=d)}))
        step += 1
        assert t < 2000, "the simulation must finish"
    assert sim.num_arrived == n
    assert sim.num_finished + sim.num_failed == n  # nothing lost across role changes
    finished = [r for per in sim.finished for r in per]
    assert len({r.index for r in finished}) == len(finished)
    for r in finished:
        assert r.arrival_s <= r.first_token_s <= r.finished_s
    for inst in sim.instances:  # a drained instance has moved on (stopped or starting in its new role)
        assert not (
            inst.state == InstanceState.DRAINING and inst.engine.is_empty and not inst.busy and not inst.incoming
        )
