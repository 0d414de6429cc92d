"""Trace-driven scenarios in the simulator (Azure CSV, Mooncake JSONL with hash_ids, ServeGen), short windows."""

from __future__ import annotations

from pathlib import Path

from env.scenario import parse_scenario
from env.sim.build import build_simulator, generate_workloads
from env.sim.simulator import ClusterSimulator
from policies.schema import RoutingThresholds

TEMPLATE = """\
name: trace
duration_s: {duration}
cluster: {{profile: h200-llama3-8b}}
tenant_groups:
  - {{name: g, gpu_budget: 4, prefill: 2, decode: 2}}
tenants:
  - name: t
    group: g
    workload: {workload}
"""

REMOTE = RoutingThresholds(min_remote_input_tokens=1024, max_local_input_tokens=512, require_decode_pool_pressure=False)


def _run(traces_dir: Path, workload: str, duration: float = 120.0) -> ClusterSimulator:
    scenario = parse_scenario(TEMPLATE.format(duration=duration, workload=workload.format(traces=traces_dir)))
    sim = build_simulator(scenario, {"t": REMOTE}, workloads=generate_workloads(scenario))
    sim.run()
    return sim


def test_azure_window_with_rate_scale(traces_dir: Path) -> None:
    workload = "{{kind: trace_azure, path: {traces}/azure_llm_2023/AzureLLMInferenceTrace_conv.csv, rate_scale: 2.0}}"
    sim = _run(traces_dir, workload)
    assert sim.num_requests > 100
    assert sim.num_finished == sim.num_requests
    assert sim.num_transfers > 0


def test_mooncake_hash_ids_reach_the_prefix_caches(traces_dir: Path) -> None:
    workload = "{{kind: trace_mooncake, path: {traces}/mooncake_fast25/conversation_trace.jsonl, duration_s: 300}}"
    sim = _run(traces_dir, workload, duration=300.0)
    assert sim.num_finished + sim.num_failed == sim.num_requests > 500
    hits = sum(i.engine.counters.prefix_cache_hits for i in sim.instances)
    assert hits > 0
    window = sim.snapshot()
    assert window.groups["g"].prefix_cache_hit_frac is not None
    assert window.groups["g"].prefix_cache_hit_frac > 0


def test_servegen_clients(traces_dir: Path) -> None:
    workload = "{{kind: servegen, path: {traces}/servegen_deepseek_r1, duration_s: 600, rate_scale: 5.0}}"
    sim = _run(traces_dir, workload, duration=60.0)
    assert sim.num_requests > 10
    assert sim.num_finished + sim.num_failed == sim.num_requests
