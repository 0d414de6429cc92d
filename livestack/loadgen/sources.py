"""Where a load comes from: a scenario file (every tenant's workload) or one workload configuration.

A scenario goes through :func:`env.sim.build.generate_workloads`, the simulator's own workload generation and
seeding, so the emulated cluster sees the very requests the simulator saw.
"""

from __future__ import annotations

import numpy as np

from env.scenario import Scenario
from env.sim.build import generate_workloads
from env.workloads import RequestSpec, WorkloadConfig, generate_requests

__all__ = ["requests_from_scenario", "requests_from_workload"]


def requests_from_scenario(
    scenario: Scenario, duration_s: float | None = None, seed: int | None = None
) -> list[RequestSpec]:
    """All tenants' requests of ``scenario`` over ``duration_s`` (default the scenario's), sorted by arrival."""
    if duration_s is not None:
        scenario = scenario.model_copy(update={"duration_s": duration_s})
    out: list[RequestSpec] = []
    for tenant, columns in generate_workloads(scenario, seed).items():
        out.extend(columns.to_specs(tenant))
    out.sort(key=lambda r: (r.arrival_s, r.request_id))
    return out


def requests_from_workload(
    config: WorkloadConfig, duration_s: float, tenant: str = "default", seed: int = 0
) -> list[RequestSpec]:
    """One workload's requests over ``duration_s``."""
    return generate_requests(config, np.random.default_rng(seed), duration_s, tenant)
