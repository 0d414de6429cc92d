"""Where a load comes from: a scenario file (every tenant's workload) or one workload configuration.

Both go through :func:`env.workloads.generate_requests`, the same generator the simulator uses, with the same
seeding (one child generator per tenant spawned from the scenario seed), so the emulated cluster sees the very
requests the simulator saw.
"""

from __future__ import annotations

import numpy as np

from env.scenario import Scenario
from env.workloads import RequestSpec, WorkloadConfig, generate_requests

__all__ = ["requests_from_scenario", "requests_from_workload"]


def requests_from_scenario(
    scenario: Scenario, duration_s: float | None = None, seed: int | None = None
) -> list[RequestSpec]:
    """All tenants' requests of ``scenario`` over ``duration_s`` (default the scenario's), sorted by arrival."""
    duration = scenario.duration_s if duration_s is None else duration_s
    rng = np.random.default_rng(scenario.seed if seed is None else seed)
    children = rng.spawn(len(scenario.tenants))
    out: list[RequestSpec] = []
    for tenant, child in zip(scenario.tenants, children, strict=True):
        out.extend(generate_requests(tenant.workload, child, duration, tenant.name))
    out.sort(key=lambda r: (r.arrival_s, r.request_id))
    return out


def requests_from_workload(
    config: WorkloadConfig, duration_s: float, tenant: str = "default", seed: int = 0
) -> list[RequestSpec]:
    """One workload's requests over ``duration_s``."""
    return generate_requests(config, np.random.default_rng(seed), duration_s, tenant)
