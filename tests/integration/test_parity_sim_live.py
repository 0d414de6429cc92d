"""Sim-to-live parity under a policy whose routes depend on live state, not only on the prompt length.

The setup of :mod:`tests.integration.test_dataplane_fidelity` (one prefill and two decode emulated instances
behind the router on loopback, the same requests on both sides, the run slowed down by ``TIME_SCALE``), but with
shared prompt prefixes and a policy under which the prefix hit on the chosen decode instance
(``prefer_when_prefix_cache_hit``), the prefill queue wait (a 300 ms bound) and the decode pressure (the
1024-1536 token gap) change routes. That each of these rules changes routes is checked on the simulator's side,
which is deterministic; the live side is checked request by request against it. Only 2 of the gap's requests are
under the 2 % decode-pressure bound in the simulator, so a check that the live side also has one hung on a single
request's timing (a CI run saw none live while 143 of 145 routes agreed). Lowering the bound to 1.5 % split the gap
12 / 12 but put more requests near it, and a loaded CI run then agreed on only 140 of 145. Both sides place and
decide through :mod:`policies.placement`, so the remote share and the TTFT/TPOT p50/p95 must agree.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from env.scenario import load_scenario
from env.sim.build import build_simulator
from env.sim.summary import summarize as summarize_sim
from livestack.loadgen import LoadOptions, replay, requests_from_scenario, summarize
from policies.policy_file import load_policy_text, resolve_policy
from tests.integration.loop_lag import LoopLag
from tests.router.cluster import live_cluster

# Not marked slow: issue 19 asks for the three parity tests in CI's default run (about 60-90 s on 2 cores).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

TIME_SCALE = 5.0
"""Slower than the fidelity test's 3: the router's per-request HTTP cost (~10 ms wall on a loaded 2-core machine)
then adds ~2 ms of emulated time, well inside the 10 % bound at TTFT p50."""
SCENARIO = """
name: parity-1p2d-prefix
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
      rate_rps: 10
      input_tokens: {kind: lognormal, median_tokens: 2500, sigma: 0.7, min_tokens: 64, max_tokens: 8000}
      output_tokens: {kind: lognormal, median_tokens: 100, sigma: 0.5, min_tokens: 8, max_tokens: 400}
      prefix: {num_prefixes: 4, prefix_tokens: 1024, share_frac: 0.6}
"""
POLICY = """
pd_disaggregation_policy:
  remote_prefill:
    min_input_tokens: 1536
    max_prefill_queue_wait_ms: 300
    min_expected_output_tokens: 0
    require_decode_pool_pressure: false
    decode_pressure_threshold_perc: 2
  local_prefill: {max_input_tokens: 1024, prefer_when_prefix_cache_hit: true}
tenants:
  - name: chat
"""
INITIAL_PREFILL_TOKENS_PER_S = 20000.0
FIELDS = ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s")
LIVE_JITTER_S = 0.001
"""An absolute allowance for live latency quantiles, in emulated seconds: asyncio timer and scheduling jitter under
a full test run. Where the event loop was measured waking later than that (:class:`LoopLag`, its p95 over the live
run, scaled by ``TIME_SCALE`` into emulated time), the measured lag is the allowance instead: every emulated decode
step is a timer on that loop, so a request's time per output token grows by about the lag its steps saw."""


@dataclass(frozen=True)
class Side:
    """What one side (simulator or live) measured."""

    remote_frac: float
    remote: dict[str, bool]
    reasons: Counter[str]
    quantiles_s: dict[str, float]
    loop_lag_p95_s: float = 0.0
    """The p95 wake-up lag of the event loop during the run, in emulated seconds (0 for the simulator)."""
    loop_lag_max_s: float = 0.0
    """The longest wake-up lag of the event loop during the run, in emulated seconds (0 for the simulator)."""
    clock_resyncs: int = 0
    """How often an emulated instance's step clock restarted from now after a stall past its lag bound (each one
    stretched its running requests' decode by the stall: the latencies are then the host's, not the model's)."""


async def measure(tmp_path: Path, scenario_text: str = SCENARIO, policy_text: str = POLICY) -> tuple[Side, Side]:
    """Run the scenario in the simulator and through the load generator against the live stack."""
    (tmp_path / "scenario.yaml").write_text(scenario_text)
    scenario = load_scenario(tmp_path / "scenario.yaml")
    thresholds = {name: tp.thresholds for name, tp in resolve_policy(load_policy_text(policy_text)).tenants.items()}

    started = time.perf_counter()
    sim = build_simulator(scenario, thresholds)
    sim.run()
    summary = {t.tenant: t for t in summarize_sim(sim, time.perf_counter() - started).tenants}["chat"]
    assert summary.failed == 0
    assert summary.remote_prefill_frac is not None
    sim_requests = [r for rs in sim.arrived for r in rs]
    sim_side = Side(
        summary.remote_prefill_frac,
        {r.request_id: r.remote for r in sim_requests},
        Counter(r.reason.value for r in sim_requests),
        {f: getattr(summary, f) for f in FIELDS},
    )

    specs = requests_from_scenario(scenario)
    assert len(specs) == summary.arrived
    live_kwargs = {
        "policy_yaml": _wall_clock_policy(policy_text),
        "cluster": scenario.cluster,
        "time_scale": TIME_SCALE,
        "router_overrides": {"estimation": {"prefill_tokens_per_s": INITIAL_PREFILL_TOKENS_PER_S / TIME_SCALE}},
    }
    async with live_cluster(tmp_path, 1, 2, **live_kwargs) as c:  # type: ignore[arg-type]
        options = LoadOptions(url=c.url, time_scale=TIME_SCALE, max_duration_s=300, request_timeout_s=120)
        async with LoopLag() as lag:
            results = await replay(specs, options)
        records = c.records()
        clock_resyncs = sum(i.clock_resyncs for i in c.host.instances)
        # every remote plan stopped counting as incoming on its decode instance once its prefill leg was over
        assert [i.incoming for i in c.router.registry.instances.values()] == [0, 0, 0]
    live = {s.tenant: s for s in summarize(results)}["chat"]
    assert live.num_errors == 0
    routes = [r["route"] for r in records]
    live_side = Side(
        routes.count("remote_prefill") / len(routes),
        {r["request_id"]: r["route"] == "remote_prefill" for r in records},
        Counter(r["reason"] for r in records),
        {f: getattr(live, f) for f in FIELDS},
        lag.quantile_s(0.95) / TIME_SCALE,
        lag.max_s() / TIME_SCALE,
        clock_resyncs,
    )
    return sim_side, live_side


def _wall_clock_policy(policy_text: str) -> str:
    """The policy for the slowed-down live run: the router measures wall-clock time, so its time bounds (and its
    initial prefill rate, above) are scaled by ``TIME_SCALE`` to mean the same emulated time."""
    scaled = policy_text.replace("max_prefill_queue_wait_ms: 300", f"max_prefill_queue_wait_ms: {300 * TIME_SCALE:g}")
    assert scaled != policy_text
    return scaled


def report(sim: Side, live: Side) -> str:
    """The figures of both sides, one line each."""
    same = sum(live.remote.get(rid) == remote for rid, remote in sim.remote.items())
    lines = [
        f"remote share: sim {sim.remote_frac:.1%}, live {live.remote_frac:.1%}; "
        f"same route for {same} of {len(sim.remote)} requests"
    ]
    for f in FIELDS:
        s, v = sim.quantiles_s[f], live.quantiles_s[f]
        lines.append(f"{f}: sim {s * 1e3:.1f} ms, live {v * 1e3:.1f} ms ({v / s - 1.0:+.1%})")
    lines.append(f"reasons: sim {dict(sim.reasons)}, live {dict(live.reasons)}")
    lines.append(
        f"event loop lag during the live run: p95 {live.loop_lag_p95_s * 1e3:.2f} ms, "
        f"max {live.loop_lag_max_s * 1e3:.1f} ms emulated; emulator clock restarts {live.clock_resyncs}"
    )
    return "\n".join(lines)


async def test_parity_sim_live_state_dependent_policy(tmp_path: Path) -> None:
    sim, live = await measure(tmp_path)
    print("\n" + report(sim, live))
    # the live-state rules do change routes in the (deterministic) simulator; the live side follows request by request
    for reason in ("prefix_cache_hit", "gap_decode_pressure", "gap_no_pressure", "prefill_queue_overload"):
        assert sim.reasons[reason] > 0, reason
    # the reasons with many requests show on the live side too
    for reason in ("prefix_cache_hit", "gap_no_pressure", "prefill_queue_overload"):
        assert live.reasons[reason] > 0, reason
    for side in (sim, live):
        assert 0.1 < side.remote_frac < 0.9
    assert sim.remote.keys() == live.remote.keys()
    same = sum(live.remote[rid] == remote for rid, remote in sim.remote.items())
    assert same >= 0.97 * len(sim.remote)  # request by request, not only in share
    assert abs(sim.remote_frac - live.remote_frac) < 0.03
    allowance_s = max(LIVE_JITTER_S, live.loop_lag_p95_s)
    for f in FIELDS:
        deviation = live.quantiles_s[f] / sim.quantiles_s[f] - 1.0
        # 10 %, or the event loop's scheduling delay on a busy 2-core machine. Full-suite CI runs measured TPOT p95
        # 7.9-8.2 ms live against 7.0 ms simulated (+12.6 % to +15.7 %) with the loop's p95 lag normal, as stalls
        # past the emulator's old 0.5 s lag bound would do: two 0.7 s stalls gave +7.8 % there. At the 5 s bound the
        # same stalls give +1.0 % (no clock restart), a run without them +0.4 % (alone or in a full run).
        within_jitter = abs(live.quantiles_s[f] - sim.quantiles_s[f]) <= allowance_s
        assert abs(deviation) <= 0.10 or within_jitter, (
            f"{f} deviates {deviation:+.1%} (allowance {allowance_s * 1e3:.2f} ms; loop lag p95 "
            f"{live.loop_lag_p95_s * 1e3:.2f} ms, max {live.loop_lag_max_s * 1e3:.1f} ms emulated; "
            f"emulator clock restarts {live.clock_resyncs})"
        )
