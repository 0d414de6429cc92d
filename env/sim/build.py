"""Build a :class:`~env.sim.simulator.ClusterSimulator` from a scenario: load the profile, generate workloads.

This is the I/O side (profile CSVs, trace files); the simulator itself does none. Randomness: one
``numpy.random.SeedSequence`` from the seed, spawned into one child stream per tenant's workload and one for the
simulator (transfer failures), so adding a tenant does not move another tenant's requests.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from env.perf.profile import OperatorProfile, load_operator_profile
from env.scenario import Scenario
from env.sim.simulator import ClusterSimulator
from env.workloads.columns import RequestColumns
from env.workloads.generate import generate_columns
from policies.admission import AdmissionConfig
from policies.placement import PlacementConfig
from policies.schema import RoutingThresholds

__all__ = ["build_simulator", "generate_workloads", "load_profile"]


def load_profile(scenario: Scenario) -> OperatorProfile:
    """The operator profile a scenario names."""
    cluster = scenario.cluster
    return load_operator_profile(cluster.profile, cluster.profile_dir, model_config=cluster.hf_config)


def generate_workloads(scenario: Scenario, seed: int | None = None) -> dict[str, RequestColumns]:
    """Every tenant's requests over the scenario's duration (trace replays read their files)."""
    root = np.random.SeedSequence(scenario.seed if seed is None else seed)
    streams = root.spawn(len(scenario.tenants) + 1)
    out: dict[str, RequestColumns] = {}
    for tenant, stream in zip(scenario.tenants, streams, strict=False):
        out[tenant.name] = generate_columns(tenant.workload, np.random.default_rng(stream), scenario.duration_s)
    return out


def build_simulator(
    scenario: Scenario,
    thresholds: Mapping[str, RoutingThresholds],
    seed: int | None = None,
    profile: OperatorProfile | None = None,
    workloads: Mapping[str, RequestColumns] | None = None,
    placement: PlacementConfig | None = None,
    admission: AdmissionConfig | None = None,
) -> ClusterSimulator:
    """A ready-to-run simulator of ``scenario`` with per-tenant ``thresholds``.

    ``placement`` and ``admission`` are the router's settings (their defaults when None).
    """
    root = np.random.SeedSequence(scenario.seed if seed is None else seed)
    sim_stream = root.spawn(len(scenario.tenants) + 1)[-1]
    expected = {t.name: t.expected_output_tokens for t in scenario.tenants if t.expected_output_tokens is not None}
    return ClusterSimulator(
        scenario,
        profile if profile is not None else load_profile(scenario),
        workloads if workloads is not None else generate_workloads(scenario, seed),
        thresholds,
        np.random.default_rng(sim_stream),
        expected_output_tokens=expected,
        placement=placement,
        admission=admission,
    )
