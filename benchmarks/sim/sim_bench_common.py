"""Shared helpers of the simulator benchmarks (kept apart from tests/ so benchmarks run on their own)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from env.scenario import Scenario, load_scenario
from env.sim.build import build_simulator, generate_workloads, load_profile
from env.sim.simulator import ClusterSimulator
from policies.schema import RoutingThresholds

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "experiments" / "scenarios"
DISAGGREGATE = RoutingThresholds(
    min_remote_input_tokens=1024,
    max_local_input_tokens=512,
    min_expected_output_tokens=16,
    require_decode_pool_pressure=False,
)
"""Speed runs exercise the remote path: prompts of 1024+ tokens prefill remotely whatever the decode pressure."""


def traces_dir() -> Path:
    path = Path(os.environ.get("PDCTL_TRACES", REPO.parent / "shared" / "traces"))
    if not path.is_dir():
        pytest.skip(f"trace folder {path} is absent (set PDCTL_TRACES)")
    return path


def prepared(
    scenario_file: str, policy: RoutingThresholds = DISAGGREGATE
) -> tuple[Scenario, Callable[[], ClusterSimulator], float]:
    """The scenario, a factory of fresh simulators (workloads loaded once) and the cold load time (s)."""
    scenario = load_scenario(SCENARIOS / scenario_file, traces_dir=traces_dir())
    thresholds = {t.name: policy for t in scenario.tenants}
    start = time.perf_counter()
    profile = load_profile(scenario)
    workloads = generate_workloads(scenario)
    load_s = time.perf_counter() - start

    def factory() -> ClusterSimulator:
        return build_simulator(scenario, thresholds, profile=profile, workloads=workloads)

    return scenario, factory, load_s


def timed_runs(factory: Callable[[], ClusterSimulator], rounds: int = 3) -> tuple[list[float], ClusterSimulator]:
    """Wall times of ``rounds`` complete runs (build + run), and the last simulator."""
    walls: list[float] = []
    sim: Any = None
    for _ in range(rounds):
        start = time.perf_counter()
        sim = factory()
        sim.run()
        walls.append(time.perf_counter() - start)
    return walls, sim


def best_run(factory: Callable[[], ClusterSimulator], rounds: int = 3) -> tuple[float, ClusterSimulator]:
    """Best wall time of ``rounds`` complete runs (build + run), and the last simulator."""
    walls, sim = timed_runs(factory, rounds)
    return min(walls), sim
