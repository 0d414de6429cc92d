"""Sim-to-live fidelity: the load generator against the emulated cluster behind the router reproduces the
simulator's TTFT and TPOT p50/p95 for the same scenario within 10 %.

Both sides see the very same requests (``env.sim.build.generate_workloads``), the same engine model
(``env.sim.engine`` over ``env.perf``) and the same per-tenant thresholds (one policy file). The thresholds make the
route a function of the prompt length alone (no pressure, queue or prefix-cache condition), so that the two
routers' different live-state estimates cannot send a request different ways. The live run is slowed down
(``TIME_SCALE``) so that HTTP and event-loop costs, which the simulator does not model, are small in emulated
seconds.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from env.scenario import load_scenario
from env.sim.build import build_simulator
from env.sim.summary import summarize as summarize_sim
from livestack.loadgen import LoadOptions, replay, requests_from_scenario, summarize
from policies.policy_file import load_policy_text, resolve_policy
from tests.router.cluster import live_cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

TIME_SCALE = 3.0
SCENARIO = """
name: fidelity-1p2d
duration_s: 15
seed: 11
cluster:
  profile: h200-llama3-8b
  tp: 1
  network: {link_bandwidth_bytes_per_s: 4.5e+10, setup_latency_s: 0.001, failure_prob: 0.0, timeout_s: 30}
tenant_groups:
  - {name: g, gpu_budget: 3, prefill: 1, decode: 2}
tenants:
  - name: chat
    group: g
    workload:
      kind: poisson
      rate_rps: 6
      input_tokens: {kind: lognormal, median_tokens: 1500, sigma: 0.7, min_tokens: 64, max_tokens: 8000}
      output_tokens: {kind: lognormal, median_tokens: 100, sigma: 0.5, min_tokens: 8, max_tokens: 400}
"""
POLICY = """
pd_disaggregation_policy:
  remote_prefill:
    min_input_tokens: 1024
    max_prefill_queue_wait_ms: 1000000
    min_expected_output_tokens: 0
    require_decode_pool_pressure: false
  local_prefill: {max_input_tokens: 1023, prefer_when_prefix_cache_hit: false}
tenants:
  - name: chat
"""


async def test_loadgen_against_emulated_cluster_matches_the_simulator(tmp_path: Path) -> None:
    (tmp_path / "scenario.yaml").write_text(SCENARIO)
    scenario = load_scenario(tmp_path / "scenario.yaml")
    thresholds = {name: tp.thresholds for name, tp in resolve_policy(load_policy_text(POLICY)).tenants.items()}

    started = time.perf_counter()
    sim = build_simulator(scenario, thresholds)
    sim.run()
    sim_summary = {t.tenant: t for t in summarize_sim(sim, time.perf_counter() - started).tenants}["chat"]
    assert sim_summary.failed == 0

    specs = requests_from_scenario(scenario)
    assert len(specs) == sim_summary.arrived
    live_kwargs = {"policy_yaml": POLICY, "cluster": scenario.cluster, "time_scale": TIME_SCALE}
    async with live_cluster(tmp_path, 1, 2, **live_kwargs) as c:  # type: ignore[arg-type]
        options = LoadOptions(url=c.url, time_scale=TIME_SCALE, max_duration_s=300, request_timeout_s=120)
        results = await replay(specs, options)
        routes = [r["route"] for r in c.records()]
    assert 0.2 < routes.count("remote_prefill") / len(routes) < 0.95  # both paths are exercised
    assert sim_summary.remote_prefill_frac is not None
    assert abs(routes.count("remote_prefill") / len(routes) - sim_summary.remote_prefill_frac) < 0.02
    live = {s.tenant: s for s in summarize(results)}["chat"]
    assert live.num_errors == 0
    report = []
    for field in ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s"):
        sim_value, live_value = getattr(sim_summary, field), getattr(live, field)
        assert sim_value is not None
        assert live_value is not None
        report.append((field, sim_value, live_value, live_value / sim_value - 1.0))
    print("\n".join(f"{f}: sim {s * 1e3:.1f} ms, live {v * 1e3:.1f} ms ({d:+.1%})" for f, s, v, d in report))
    for field, _, _, deviation in report:
        assert abs(deviation) <= 0.10, f"{field} deviates {deviation:+.1%}"
