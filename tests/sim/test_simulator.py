"""The cluster simulator: router in the loop, KV transfers, fallbacks, pools, snapshots, determinism."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import env.sim.simulator as simulator_module
from env.sim.placement import decode_view
from env.sim.records import STAGES, SimRequest
from env.sim.simulator import InstanceState
from policies.routing import decide_route
from policies.schema import (
    ControlAction,
    FallbackAction,
    MetricWindow,
    PoolTargets,
    Route,
    RouteReason,
    RoutingThresholds,
)
from tests.sim.helpers import LOCAL_ALWAYS, REMOTE_ALWAYS, columns, random_columns, scenario, simulator


def test_router_calls_the_shared_decision_once_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, Any]] = []

    def spy(features: Any, thresholds: Any, live: Any) -> Any:
        decision = decide_route(features, thresholds, live)
        calls.append((features, decision))
        return decision

    monkeypatch.setattr(simulator_module, "decide_route", spy)
    rng = np.random.default_rng(1)
    sim = simulator(scenario(2, 2), {"t": random_columns(rng, 200, 20.0)}, thresholds=RoutingThresholds())
    sim.run()
    assert len(calls) == 200
    for features, decision in calls:
        request = sim.requests[int(features.request_id.split("-")[1])]
        assert request is not None
        assert request.reason == decision.reason
        assert request.remote == (decision.route is Route.REMOTE_PREFILL)
    assert sim.num_finished == 200


def test_aggregated_only_never_transfers() -> None:
    rng = np.random.default_rng(2)
    sim = simulator(scenario(2, 2), {"t": random_columns(rng, 100, 10.0)}, LOCAL_ALWAYS)
    sim.run()
    assert sim.num_transfers == 0
    assert sim.num_finished == 100
    assert all(r is not None and r.reason is RouteReason.DISAGGREGATION_DISABLED for r in sim.requests)
    no_prefill = simulator(scenario(0, 2), {"t": random_columns(rng, 50, 10.0)}, REMOTE_ALWAYS)
    no_prefill.run()
    assert all(r is not None and r.reason is RouteReason.NO_PREFILL_INSTANCE for r in no_prefill.requests)


def test_transfer_bytes_and_time_follow_the_link_model() -> None:
    net = {"link_bandwidth_bytes_per_s": 1e9, "setup_latency_s": 0.002, "timeout_s": 100.0}
    sim = simulator(scenario(1, 1, cluster={"network": net}), {"t": columns([0.0], 4096, 10)})
    sim.run()
    request = sim.requests[0]
    assert request is not None
    assert request.remote
    assert request.status == SimRequest.FINISHED
    size = 4096 * 131_072
    assert request.transfer_bytes == size
    assert request.transfer_s == pytest.approx(0.002 + size / 1e9, rel=1e-6)
    stages = request.stages()
    assert set(stages) == set(STAGES)
    assert stages["kv_cache_transfer_time"] == pytest.approx(request.transfer_s)
    assert stages["kv_cache_pack_time"] == 0.0  # same TP on both sides: no layout conversion
    ttft = stages["request_queue_wait"] + stages["prefill_compute_time"] + request.transfer_s
    ttft += stages["decode_queue_wait"] + stages["first_token_emit_time"]
    assert request.ttft_s == pytest.approx(ttft, rel=1e-9)


def test_concurrent_transfers_share_the_link() -> None:
    net = {"link_bandwidth_bytes_per_s": 1e9, "setup_latency_s": 0.0, "timeout_s": 100.0}
    # the second prefill ends one step after the first: its flow overlaps the first one's and both slow down
    sim = simulator(scenario(1, 1, cluster={"network": net}), {"t": columns([0.0, 0.0], 2000, 5)})
    sim.run()
    first, second = sim.requests
    assert first is not None
    assert second is not None
    alone = 2000 * 131_072 / 1e9
    assert first.transfer_s > 1.5 * alone
    assert second.transfer_s > 1.5 * alone
    # work-conserving: the link is busy from the first start to the last end, sending both
    start = first.kv_ready_s - first.transfer_s
    assert second.kv_ready_s - start == pytest.approx(2 * alone, rel=1e-6)


def test_pack_and_unpack_when_tp_differs() -> None:
    cluster = {"tp": 1, "prefill_tp": 2, "network": {"layout_bandwidth_bytes_per_s": 1e11}}
    sim = simulator(scenario(1, 1, cluster=cluster, budget=3), {"t": columns([0.0], 3000, 5)})
    sim.run()
    request = sim.requests[0]
    assert request is not None
    assert request.pack_s == pytest.approx(3000 * 131_072 / 1e11)
    assert request.unpack_s == request.pack_s


@pytest.mark.parametrize(
    ("fallback", "retried"),
    [(FallbackAction.LOCAL_AGGREGATED_SERVING, False), (FallbackAction.RETRY_REMOTE_PREFILL, True)],
)
def test_failed_transfers_fall_back(fallback: FallbackAction, retried: bool) -> None:
    from dataclasses import replace

    thresholds = replace(REMOTE_ALWAYS, on_kv_transfer_timeout=fallback)
    sim = simulator(
        scenario(2, 1, cluster={"network": {"failure_prob": 1.0}}), {"t": columns([0.0, 0.5], 3000, 20)}, thresholds
    )
    sim.run()
    assert sim.num_finished == 2
    assert sim.transfer_failures == (4 if retried else 2)
    for request in sim.requests:
        assert request is not None
        assert request.reason is RouteReason.FALLBACK_TRANSFER_FAILED
        assert not request.remote
        assert request.retried == retried
    assert all(i.engine.kv_used_tokens == 0 for i in sim.instances)


def test_timeout_abandons_a_slow_transfer() -> None:
    net = {"link_bandwidth_bytes_per_s": 1e6, "timeout_s": 0.5}
    sim = simulator(scenario(1, 1, cluster={"network": net}), {"t": columns([0.0], 3000, 20)})
    sim.run()
    request = sim.requests[0]
    assert request is not None
    assert request.status == SimRequest.FINISHED
    assert request.transfer_failures == 1
    assert request.reason is RouteReason.FALLBACK_TRANSFER_FAILED
    assert request.transfer_s == pytest.approx(0.5 - request.pack_s, abs=1e-9)
    assert sim.instances[0].link.flows == []


def test_prefix_hits_on_the_decode_side_shrink_transfers() -> None:
    hashes = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]]
    sim = simulator(scenario(1, 1), {"t": columns([0.0, 5.0], 3100, 5, hash_ids=hashes)})
    sim.run()
    first, second = sim.requests
    assert first is not None
    assert second is not None
    assert first.transfer_bytes == 3100 * 131_072
    assert second.transfer_bytes == (3100 - 3072) * 131_072


def test_prefix_aware_decode_choice_and_local_on_hit() -> None:
    thresholds = RoutingThresholds(min_remote_input_tokens=2048, max_local_input_tokens=1024)
    hashes = [[7, 8, 9, 10, 11, 12]] * 3
    sim = simulator(scenario(1, 3), {"t": columns([0.0, 10.0, 20.0], 3000, 200, hash_ids=hashes)}, thresholds)
    sim.run()
    a, b, c = sim.requests
    assert a is not None
    assert b is not None
    assert c is not None
    assert b.decode_instance == a.decode_instance == c.decode_instance
    assert b.reason is RouteReason.PREFIX_CACHE_HIT
    assert not b.remote


def test_oversized_requests_fail_and_are_counted() -> None:
    sim = simulator(scenario(1, 1, cluster={"kv_capacity_tokens": 5000}), {"t": columns([0.0, 0.1], [4000, 6000], 10)})
    sim.run()
    assert sim.num_failed == 1
    assert sim.num_finished == 1
    assert sim.num_arrived == sim.num_finished + sim.num_failed + sim.num_in_flight


def test_pool_change_flips_a_decode_instance_without_losing_requests() -> None:
    rng = np.random.default_rng(4)
    cluster = {"startup_delay_s": 5.0, "role_switch_delay_s": 3.0}
    scn = scenario(1, 3, cluster=cluster, prefill_pool={"min": 0, "max": 4}, decode_pool={"min": 1, "max": 4})
    sim = simulator(scn, {"t": random_columns(rng, 600, 30.0)})
    sim.run_until(5.0)
    sim.apply(ControlAction(pools={"g": PoolTargets(num_prefill=2, num_decode=2)}))
    window = sim.snapshot()
    group = window.groups["g"]
    assert group.num_prefill == 1
    assert group.num_decode == 2
    assert group.pending_prefill == 1
    sim.run_until(30.0)
    group = sim.snapshot().groups["g"]
    assert group.num_prefill == 2
    assert group.num_decode == 2
    assert group.pending_prefill == 0
    sim.apply(ControlAction(pools={"g": PoolTargets(num_prefill=1, num_decode=2)}))
    sim.run()
    assert sim.num_finished == 600
    assert sim.num_failed == 0
    assert sim.num_in_flight == 0
    states = [i.state for i in sim.instances]
    assert states.count(InstanceState.STOPPED) == 1
    assert sim.gpu_seconds() == pytest.approx(4 * 30.0)  # everything had finished by t = 30
    sim.run_until(40.0)
    assert sim.gpu_seconds() == pytest.approx(4 * 30.0 + 3 * 10.0)  # the stopped instance costs nothing more


def test_scale_up_waits_for_startup_and_respects_budget() -> None:
    scn = scenario(1, 1, budget=3, cluster={"startup_delay_s": 10.0}, decode_pool={"min": 1, "max": 5})
    sim = simulator(scn, {"t": columns([0.0], 100, 5)})
    sim.apply(ControlAction(pools={"g": PoolTargets(num_prefill=1, num_decode=4)}))
    assert len(sim.instances) == 3  # the budget allows one more instance only
    assert sim.snapshot().groups["g"].pending_decode == 1
    sim.run_until(10.0)
    assert sim.snapshot().groups["g"].num_decode == 2


def test_thresholds_change_between_intervals() -> None:
    rng = np.random.default_rng(5)
    sim = simulator(scenario(1, 1), {"t": random_columns(rng, 400, 40.0)}, LOCAL_ALWAYS)
    sim.run_until(4.0)
    sim.apply(ControlAction(thresholds={"t": REMOTE_ALWAYS}))
    sim.run()
    early = [r for r in sim.requests if r is not None and r.arrival_s <= 4.0]
    late = [r for r in sim.requests if r is not None and r.arrival_s > 4.0]
    assert early
    assert late
    assert not any(r.remote for r in early)
    assert all(r.remote for r in late)


def test_snapshot_is_a_metric_window_with_unknowns_as_none() -> None:
    rng = np.random.default_rng(6)
    scn = scenario(1, 1, tenants=("busy", "idle"))
    sim = simulator(scn, {"busy": random_columns(rng, 300, 30.0)})
    sim.run_until(5.0)
    window = sim.snapshot()
    assert isinstance(window, MetricWindow)
    assert window.window_s == pytest.approx(5.0)
    busy, idle = window.tenants["busy"], window.tenants["idle"]
    assert busy.request_rate_rps is not None
    assert busy.request_rate_rps > 10
    assert busy.ttft_p50_s is not None
    assert busy.ttft_p95_s is not None
    assert busy.ttft_p99_s is not None
    assert busy.ttft_p50_s <= busy.ttft_p95_s <= busy.ttft_p99_s
    assert busy.slo_attainment_frac == 1.0  # no SLO set: every request meets it
    assert idle.ttft_p95_s is None
    assert idle.slo_attainment_frac is None
    group = window.groups["g"]
    assert group.kv_transfer_time_p95_s is not None
    assert group.kv_transfer_failure_frac == 0.0
    assert group.decode_kv_usage_frac is not None
    assert 0.0 <= group.decode_kv_usage_frac <= 1.0
    sim.run_until(5.0)
    assert sim.snapshot().tenants["busy"].ttft_p95_s is None  # an empty window: nothing finished


def test_run_until_in_steps_equals_one_run_and_is_deterministic() -> None:
    cols = random_columns(np.random.default_rng(7), 500, 25.0)
    net = {"failure_prob": 0.2}
    one = simulator(scenario(2, 2, cluster={"network": net}), {"t": cols}, seed=3)
    one.run()
    stepped = simulator(scenario(2, 2, cluster={"network": net}), {"t": cols}, seed=3)
    t = 0.0
    while stepped.num_finished + stepped.num_failed < 500:
        t += 1.0
        stepped.run_until(t)
        stepped.snapshot()
    finish_one = [(r.first_token_s, r.finished_s) for r in one.requests if r is not None]
    finish_two = [(r.first_token_s, r.finished_s) for r in stepped.requests if r is not None]
    # One float array per side (NaN where a request never got a token): correct on every supported pytest, whose
    # approx() refuses nested sequences from 9.1 on.
    one_s = np.array(finish_one, dtype=float)
    two_s = np.array(finish_two, dtype=float)
    assert one_s.shape == two_s.shape == (len(finish_one), 2)
    np.testing.assert_allclose(one_s, two_s, rtol=1e-6, equal_nan=True)
    assert one.transfer_failures == stepped.transfer_failures > 0
    with pytest.raises(ValueError, match="backwards"):
        stepped.run_until(0.0)


def test_instance_metrics_use_vllm_names() -> None:
    sim = simulator(scenario(1, 1), {"t": random_columns(np.random.default_rng(8), 50, 10.0)})
    sim.run()
    metrics = sim.instance_metrics()
    decode = next(v for k, v in metrics.items() if k.startswith("decode"))
    assert decode["vllm:generation_tokens_total"] == sum(r.output_tokens for r in sim.requests if r is not None)
    assert decode["vllm:inter_token_latency_seconds"].count > 0
    assert metrics["cluster"]["vllm:nixl_xfer_time_seconds"].count == 50
    records = sim.stage_records()
    assert len(records["ttft_s"]) == 50
    assert set(STAGES) <= set(records)
    assert not math.isnan(float(records["per_token_decode_time"].mean()))


def test_gpus_freed_by_a_drain_start_the_pending_instances() -> None:
    # prefill instances use TP2, decode TP1: no role flips; the drained prefill instance's 2 GPUs go to decode
    cluster = {"tp": 1, "prefill_tp": 2, "startup_delay_s": 5.0}
    scn = scenario(1, 2, budget=4, cluster=cluster, prefill_pool={"min": 0, "max": 2}, decode_pool={"min": 1, "max": 4})
    sim = simulator(scn, {"t": random_columns(np.random.default_rng(9), 200, 20.0)})
    sim.run_until(2.0)
    sim.apply(ControlAction(pools={"g": PoolTargets(num_prefill=0, num_decode=4)}))
    assert sim.snapshot().groups["g"].num_prefill == 0
    sim.run_until(30.0)
    group = sim.snapshot().groups["g"]
    assert group.num_decode == 4
    assert group.pending_decode == 0
    assert sum(i.tp for i in sim.instances if i.state != InstanceState.STOPPED) == 4
    sim.run()
    assert sim.num_finished == 200


def test_kv_capacity_from_memory_weights_and_kv_bytes() -> None:
    from env.sim.simulator import kv_capacity_tokens
    from tests.sim.helpers import profile

    p = profile()
    expected = (139.8e9 * 0.9 - p.model.weight_bytes(1) - 4e9) // 131_072
    assert kv_capacity_tokens(p, 1, 0.9, 4e9) == expected
    assert 800_000 < expected < 820_000  # ~806k tokens: Llama-3-8B on one H200 at 90 % utilisation
    # TP2 halves the KV bytes per token and the weights per GPU: more than twice the tokens per GPU pair
    assert kv_capacity_tokens(p, 2, 0.9, 4e9) > 2 * expected
    sim = simulator(scenario(1, 1), {"t": columns([0.0], 100, 5)})
    assert sim.instances[0].engine.config.kv_capacity_tokens == expected


@pytest.mark.parametrize("segments", [1, 64])
def test_results_do_not_depend_on_how_runs_are_planned(segments: int) -> None:
    from policies.schema import RoutingThresholds

    cols = random_columns(np.random.default_rng(10), 1500, 120.0, max_input=3000, max_output=400)
    thresholds = RoutingThresholds(min_remote_input_tokens=1500, max_local_input_tokens=700)
    runs = []
    for max_segments in (8, segments):
        sim = simulator(
            scenario(2, 2, cluster={"max_num_seqs": 48, "kv_capacity_tokens": 60_000}), {"t": cols}, thresholds
        )
        sim.max_run_segments = max_segments
        t = 0.0
        pressures = []
        while sim.num_finished + sim.num_failed < 1500:
            t += 0.5
            sim.run_until(t)
            pressures.append(sim.snapshot().groups["g"].decode_kv_usage_frac)
        runs.append((sim, pressures))
    (a, pa), (b, pb) = runs
    assert [r.reason for r in a.requests] == [r.reason for r in b.requests]  # type: ignore[union-attr]
    assert [r.finished_s for r in a.requests] == pytest.approx([r.finished_s for r in b.requests], abs=1e-9)  # type: ignore[union-attr]
    assert pa == pytest.approx(pb, abs=1e-12)
    assert sum(i.engine.counters.num_preemptions for i in a.instances) > 0  # the run exercised KV pressure


def test_decode_views_are_snapshots_even_when_kv_usage_is_read_later() -> None:
    """A decode view's KV usage (computed on first access inside a decode run) is the value at the view's time."""
    cols = columns(np.zeros(8), 200, 400)  # one burst, then a long decode-only run
    sim = simulator(scenario(prefill=0, decode=1), {"t": cols}, LOCAL_ALWAYS)
    sim.run_until(1.0)
    inst = sim.groups[0].decode[0]
    assert inst.run is not None  # mid-run: the view's KV usage is lazy
    running, kv_tokens = sim.view(inst)
    active = running + inst.engine.num_waiting + inst.in_transfer
    view = decode_view(sim, inst)
    sim.run_until(2.0)
    assert sim.view(inst)[1] != kv_tokens  # the instance moved on
    assert view.kv_usage_frac == min(kv_tokens / inst.engine.config.kv_capacity_tokens, 1.0)
    assert view.active_requests == active
