"""Simulator speed on real traces: simulated requests and simulated seconds per wall-clock second.

Run: ``PYTHONHASHSEED=0 python -m pytest benchmarks/sim/test_speed.py -m benchmark -s -p no:randomly``
"""

from __future__ import annotations

import pytest
from harness import figure, write_fragment
from sim_bench_common import prepared, timed_runs

pytestmark = pytest.mark.benchmark

TARGET_REQUESTS_PER_WALL_S = 50_000
COMMAND = "PYTHONHASHSEED=0 python -m pytest benchmarks/sim/test_speed.py -m benchmark -s -p no:randomly"
ROUNDS = 5


def _fragment(name: str, title: str, config: str, walls: list[float], sim: object, target: str) -> None:
    requests, simulated_s = sim.num_requests, sim.now_s  # type: ignore[attr-defined]
    write_fragment(
        name,
        title,
        COMMAND,
        [
            figure("simulated requests per wall second", config, "req/s", [requests / w for w in walls],
                   repeat="complete run (build + run)", target=target),
            figure("simulated seconds per wall second", config, "sim s / wall s", [simulated_s / w for w in walls],
                   repeat="complete run (build + run)"),
            figure("wall time of the whole trace", config, "s", walls, repeat="complete run (build + run)",
                   better="lower"),
        ],
        notes=f"{requests:,} requests, {simulated_s:,.0f} s simulated, "
        f"{100 * sim.num_transfers / requests:.0f} % remote prefill; see `benchmarks/results/sim.md` for method.",  # type: ignore[attr-defined]
    )  # fmt: skip


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
    walls, sim = timed_runs(factory, ROUNDS)
    wall_s = min(walls)
    _report(scenario.name, load_s, wall_s, sim)
    _fragment(
        "sim_azure", "Simulator speed: Azure LLM 2023 conversation hour, 8 instances (4P/4D)",
        "azure-conv-4p4d, 8 instances", walls, sim, f">= {TARGET_REQUESTS_PER_WALL_S:,} req/s; hour < 2 s",
    )  # fmt: skip
    assert sim.num_finished == sim.num_requests > 19_000
    assert sim.now_s > 3400  # the whole hour was simulated
    assert wall_s < 2.0  # the target: one hour of the Azure conversation trace in under 2 s


def test_mooncake_conversation_on_16_instances() -> None:
    scenario, factory, load_s = prepared("mooncake-conv-16.yaml")
    walls, sim = timed_runs(factory, ROUNDS)
    wall_s = min(walls)
    _report(scenario.name, load_s, wall_s, sim)
    _fragment(
        "sim_mooncake", "Simulator speed: Mooncake FAST'25 conversation trace, 16 instances (8P/8D)",
        "mooncake-conv-16, 16 instances", walls, sim, f">= {TARGET_REQUESTS_PER_WALL_S:,} req/s",
    )  # fmt: skip
    assert sim.num_finished + sim.num_failed == sim.num_requests > 12_000
    hits = sum(i.engine.counters.prefix_cache_hits for i in sim.instances)
    assert hits > 0  # the trace's hash_ids drive the prefix caches
