"""Simulator speed on real traces: simulated requests and simulated seconds per wall-clock second.

Run: ``PYTHONHASHSEED=0 python -m pytest benchmarks/sim/test_speed.py -m benchmark -s -p no:randomly``
"""

from __future__ import annotations

import pytest
from sim_bench_common import best_run, prepared

pytestmark = pytest.mark.benchmark

TARGET_REQUESTS_PER_WALL_S = 50_000


def _report(name: str, load_s: float, wall_s: float, sim: object) -> tuple[float, float]:
    requests = sim.num_requests  # type: ignore[attr-defined]
    simulated_s = sim.now_s  # type: ignore[attr-defined]
    rate = requests / wall_s
    print(
        f"\n[{name}] {requests} requests ({100 * sim.num_transfers / requests:.0f} % remote), "  # type: ignore[attr-defined]
        f"{simulated_s:.0f} s simulated, {len(sim.instances)} instances: "  # type: ignore[attr-defined]
        f"best wall {wall_s:.3f} s (+ {load_s:.3f} s cold trace load) -> {rate:,.0f} requests/s, "
        f"{simulated_s / wall_s:,.0f} simulated s per wall s (target {TARGET_REQUESTS_PER_WALL_S:,} requests/s)"
    )
    return rate, simulated_s / wall_s


def test_azure_conversation_hour_on_4p4d() -> None:
    scenario, factory, load_s = prepared("azure-conv-4p4d.yaml")
    wall_s, sim = best_run(factory)
    _report(scenario.name, load_s, wall_s, sim)
    assert sim.num_finished == sim.num_requests > 19_000
    assert sim.now_s > 3400  # the whole hour was simulated
    assert wall_s < 2.0  # the target: one hour of the Azure conversation trace in under 2 s


def test_mooncake_conversation_on_16_instances() -> None:
    scenario, factory, load_s = prepared("mooncake-conv-16.yaml")
    wall_s, sim = best_run(factory)
    _report(scenario.name, load_s, wall_s, sim)
    assert sim.num_finished + sim.num_failed == sim.num_requests > 12_000
    hits = sum(i.engine.counters.prefix_cache_hits for i in sim.instances)
    assert hits > 0  # the trace's hash_ids drive the prefix caches
