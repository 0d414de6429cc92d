"""Placement parity: the router's and the simulator's adapters of :mod:`policies.placement` agree.

A real simulator serves a recorded (seeded) request stream with shared prefixes under a policy whose routes depend on
live state. At every arrival the test records what the simulator's adapter saw (each instance's load, legs in
flight, queued prompt tokens, KV usage, cached prefix blocks, the measured prefill rate) and what it decided (decode
and prefill instance, :class:`~policies.schema.RequestFeatures`, :class:`~policies.schema.LiveState`, route). The
router's adapter (:class:`router.decide.Planner`) is then given the same instance states through its own
bookkeeping (in-flight counts, prefix tracker fed with the prompt text, prefill-rate estimate) and the request as the
load generator sends it (prompt text, ``max_tokens``, tenant header); it must make identical decisions.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

import env.sim.simulator as simulator_module
from env.scenario import load_scenario
from env.sim.build import build_simulator
from env.sim.placement import SimInstanceView, decode_view, prefill_view
from env.sim.simulator import ClusterSimulator
from livestack.emulator.tokenizer import CHARS_PER_TOKEN, prompt_text
from policies.admission import AdmissionConfig
from policies.placement import PlacementConfig
from policies.policy_file import ResolvedPolicy, load_policy_text, resolve_policy
from policies.routing import decide_route
from policies.schema import LiveState, RequestFeatures, RouteDecision, RouteReason, RoutingThresholds
from router.config import EstimationConfig, InstanceConfig
from router.decide import Plan, Planner
from router.estimates import TransferHealth, prefix_blocks
from router.registry import InstanceRegistry

SCENARIO = """
name: placement-parity
duration_s: {duration_s}
seed: {seed}
cluster:
  profile: h200-llama3-8b
  tp: 1
  network: {{link_bandwidth_bytes_per_s: 4.5e+10, setup_latency_s: 0.001, failure_prob: 0.0, timeout_s: 30}}
tenant_groups:
  - {{name: g, gpu_budget: {gpus}, prefill: {prefill}, decode: {decode}}}
tenants:
  - name: chat
    group: g
    workload:
      kind: poisson
      rate_rps: {rate_rps}
      input_tokens: {{kind: lognormal, median_tokens: 2500, sigma: 0.7, min_tokens: 64, max_tokens: 8000}}
      output_tokens: {{kind: lognormal, median_tokens: 100, sigma: 0.5, min_tokens: 8, max_tokens: 400}}
      prefix: {{num_prefixes: 4, prefix_tokens: 1024, share_frac: 0.6}}
"""
POLICY = """
pd_disaggregation_policy:
  remote_prefill:
    min_input_tokens: 1536
    max_prefill_queue_wait_ms: 300
    min_expected_output_tokens: 150
    require_decode_pool_pressure: false
    decode_pressure_threshold_perc: 2
  local_prefill: {max_input_tokens: 1024, prefer_when_prefix_cache_hit: true}
tenants:
  - name: chat
"""
HASH_BLOCK_TOKENS = 512  # the synthetic workload's prefix-block size


@dataclass(frozen=True)
class Arrival:
    """What the simulator's adapter saw and decided for one request."""

    request_id: str
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    decode: list[SimInstanceView]
    cached_blocks: list[int]
    prefill: list[SimInstanceView]
    prefill_rates: list[float]
    features: RequestFeatures
    live: LiveState
    decision: RouteDecision
    local_queued: list[int]
    """Each decode instance's prompt tokens still to prefill (the admission stage's local queue)."""


def _cached_blocks(view: SimInstanceView, hash_ids: tuple[int, ...]) -> int:
    hit = view.instance.engine.prefix_hit_tokens(hash_ids, HASH_BLOCK_TOKENS, len(hash_ids) * HASH_BLOCK_TOKENS + 1)
    return hit // HASH_BLOCK_TOKENS


def record_placements(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Arrival], list[ClusterSimulator]]:
    """Record every placement of the simulator put in the returned box (the decision is called through)."""
    arrivals: list[Arrival] = []
    sim_box: list[ClusterSimulator] = []

    def recording(features: RequestFeatures, thresholds: RoutingThresholds, live: LiveState) -> RouteDecision:
        decision = decide_route(features, thresholds, live)
        sim = sim_box[0]
        request = sim.requests[sim._next]
        assert request is not None
        assert request.request_id == features.request_id
        group = sim.groups[0]
        decode = [decode_view(sim, inst) for inst in group.decode]
        arrivals.append(
            Arrival(
                request.request_id,
                request.input_tokens,
                request.output_tokens,
                request.hash_ids,
                decode,
                [_cached_blocks(v, request.hash_ids) for v in decode],
                [prefill_view(inst) for inst in group.prefill],
                [inst.prefill_rate.tokens_per_s if inst.prefill_rate else math.nan for inst in group.prefill],
                features,
                live,
                decision,
                [v.instance.engine.queued_prefill_tokens for v in decode],
            )
        )
        return decision

    monkeypatch.setattr(simulator_module, "decide_route", recording)
    return arrivals, sim_box


def _router_plan(
    arrival: Arrival, policy: ResolvedPolicy, slack: int, admission: AdmissionConfig | None = None
) -> Plan | None:
    decode_configs = [
        InstanceConfig(
            id=f"d{i}",
            url="http://127.0.0.1:9",
            role="decode",
            max_num_seqs=v.max_num_seqs,
            max_num_batched_tokens=v.max_num_batched_tokens,
        )
        for i, v in enumerate(arrival.decode)
    ]
    prefill_configs = [
        InstanceConfig(
            id=f"p{i}",
            url="http://127.0.0.1:9",
            role="prefill",
            max_num_seqs=v.max_num_seqs,
            max_num_batched_tokens=v.max_num_batched_tokens,
        )
        for i, v in enumerate(arrival.prefill)
    ]
    registry = InstanceRegistry(prefill_configs + decode_configs)
    estimation = EstimationConfig(affinity_slack_requests=slack)
    planner = Planner(registry, estimation, TransferHealth(30.0, 8, 0.5), admission)
    text = prompt_text(arrival.input_tokens, arrival.hash_ids, HASH_BLOCK_TOKENS, salt=arrival.request_id)
    block_chars = estimation.prefix_block_tokens * CHARS_PER_TOKEN
    for i, view in enumerate(arrival.decode):
        inst = registry.instances[f"d{i}"]
        inst.in_flight = view.active_requests
        inst.incoming = view.load_requests - view.active_requests
        inst.kv_usage_frac = view.kv_usage_frac
        inst.awaiting_first_token_tokens = arrival.local_queued[i]
        cached_chars = arrival.cached_blocks[i] * HASH_BLOCK_TOKENS * CHARS_PER_TOKEN
        planner.tracker(inst).record(prefix_blocks(text[:cached_chars], block_chars))
    for i, view in enumerate(arrival.prefill):
        inst = registry.instances[f"p{i}"]
        inst.in_flight = view.active_requests
        inst.in_flight_prefill_tokens = view.queued_prefill_tokens
        planner.rate(inst).tokens_per_s = arrival.prefill_rates[i]
    body = {"prompt": text, "max_tokens": arrival.output_tokens, "stream": True, "ignore_eos": True}
    return planner.plan(body, policy, arrival.request_id, "chat", None, 0.0)


@pytest.mark.parametrize(
    ("shape", "slack"),
    [
        ({"prefill": 1, "decode": 2, "gpus": 3, "rate_rps": 10, "duration_s": 12, "seed": 11}, 4),
        ({"prefill": 2, "decode": 3, "gpus": 5, "rate_rps": 18, "duration_s": 8, "seed": 5}, 1),
    ],
)
def test_parity_placement_router_and_simulator_adapters_agree(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, shape: dict[str, int], slack: int
) -> None:
    (tmp_path / "scenario.yaml").write_text(SCENARIO.format(**shape))
    scenario = load_scenario(tmp_path / "scenario.yaml")
    policy = resolve_policy(load_policy_text(POLICY))
    thresholds = {name: tp.thresholds for name, tp in policy.tenants.items()}
    arrivals, sim_box = record_placements(monkeypatch)
    sim = build_simulator(scenario, thresholds, placement=PlacementConfig(affinity_slack_requests=slack))
    sim_box.append(sim)
    sim.run()
    assert sim.num_failed == 0
    assert len(arrivals) == sim.num_arrived > 50

    requests = {r.request_id: r for rs in sim.arrived for r in rs}
    not_least_loaded = 0
    for arrival in arrivals:
        plan = _router_plan(arrival, policy, slack)
        assert plan is not None
        request = requests[arrival.request_id]
        where = f"request {arrival.request_id}"
        assert plan.features == arrival.features, where
        assert plan.live == arrival.live, where
        assert plan.decision == arrival.decision, where
        decode_ids = [f"d{i}" for i, v in enumerate(arrival.decode) if v.instance.index == request.decode_instance]
        assert [plan.decode.id] == decode_ids, where
        if plan.prefill is not None:
            prefill_ids = [
                f"p{i}" for i, v in enumerate(arrival.prefill) if v.instance.index == request.prefill_instance
            ]
            assert [plan.prefill.id] == prefill_ids, where
        else:
            assert request.prefill_instance == -1, where
        chosen = arrival.decode[int(plan.decode.id[1:])]
        not_least_loaded += chosen.load_requests > min(v.load_requests for v in arrival.decode)

    # the stream exercises the rules that read live state, and affinity within the slack
    reasons = Counter(a.decision.reason.value for a in arrivals)
    for reason in ("prefix_cache_hit", "short_output", "long_prompt", "gap_decode_pressure", "gap_no_pressure"):
        assert reasons[reason] > 0, (reason, reasons)
    assert reasons["prefill_queue_overload"] > 0 or max(a.live.prefill_queue_wait_s or 0 for a in arrivals) > 0.1
    assert not_least_loaded > 0


def test_parity_admission_router_and_simulator_refuse_the_same_requests(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Behind the admission stage, the router's adapter refuses exactly the requests the simulator's refused.

    The simulator's local queue is its decode engine's prompt tokens still to prefill; the router's is the
    uncached prompts of its local legs without a first byte, set here from the former (the documented mapping).
    """
    shape = {"prefill": 1, "decode": 2, "gpus": 3, "rate_rps": 30, "duration_s": 8, "seed": 3}
    text = SCENARIO.format(**shape).replace("    group: g\n", "    group: g\n    slo: {ttft_p95_s: 0.35}\n")
    (tmp_path / "scenario.yaml").write_text(text)
    scenario = load_scenario(tmp_path / "scenario.yaml")
    policy = resolve_policy(load_policy_text(POLICY + "    slo: {ttft_p95_ms: 350}\n"))
    thresholds = {name: tp.thresholds for name, tp in policy.tenants.items()}
    admission = AdmissionConfig(ttft_slack_frac=1.0)
    arrivals, sim_box = record_placements(monkeypatch)
    sim = build_simulator(scenario, thresholds, admission=admission)
    sim_box.append(sim)
    sim.run()
    requests = {r.request_id: r for rs in sim.arrived for r in rs}
    refused = 0
    for arrival in arrivals:
        plan = _router_plan(arrival, policy, 4, admission)
        assert plan is not None
        sim_refused = requests[arrival.request_id].reason is RouteReason.ADMISSION_REFUSED
        assert plan.refused == sim_refused, f"request {arrival.request_id}"
        refused += sim_refused
    assert 0 < refused == sim.num_refused < len(arrivals)  # the stream both admits and refuses
