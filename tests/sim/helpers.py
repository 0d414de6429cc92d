"""Builders shared by the simulator tests: small scenarios and hand-made request columns."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import numpy as np

from env.perf.model import InterpolatedExecutionTimeModel
from env.perf.profile import OperatorProfile, load_operator_profile
from env.scenario import Scenario
from env.sim.simulator import ClusterSimulator
from env.workloads.columns import RequestColumns
from policies.admission import AdmissionConfig
from policies.schema import RoutingThresholds

POISSON = {
    "kind": "poisson",
    "rate_rps": 1.0,
    "input_tokens": {"kind": "fixed", "tokens": 100},
    "output_tokens": {"kind": "fixed", "tokens": 10},
}

REMOTE_ALWAYS = RoutingThresholds(
    min_remote_input_tokens=0,
    max_local_input_tokens=0,
    min_expected_output_tokens=0,
    require_decode_pool_pressure=False,
    max_prefill_queue_wait_s=1e9,
    prefer_local_on_prefix_hit=False,
)
LOCAL_ALWAYS = RoutingThresholds(disaggregation_enabled=False)


@cache
def profile() -> OperatorProfile:
    return load_operator_profile("h200-llama3-8b")


@cache
def model(tp: int = 1) -> InterpolatedExecutionTimeModel:
    return InterpolatedExecutionTimeModel(profile(), tp)


def scenario(
    prefill: int = 1,
    decode: int = 1,
    aggregated: int = 0,
    tenants: tuple[str, ...] = ("t",),
    cluster: Mapping[str, Any] | None = None,
    budget: int | None = None,
    **group: Any,
) -> Scenario:
    n = prefill + decode + aggregated
    return Scenario.model_validate(
        {
            "name": "test",
            "duration_s": 100.0,
            "cluster": dict(cluster or {}),
            "tenant_groups": [
                {
                    "name": "g",
                    "gpu_budget": budget or n,
                    "prefill": prefill,
                    "decode": decode,
                    "aggregated": aggregated,
                    **group,
                }
            ],
            "tenants": [{"name": t, "group": "g", "workload": POISSON} for t in tenants],
        }
    )


def columns(
    arrival_s: Any, input_tokens: Any, output_tokens: Any, hash_ids: list[list[int]] | None = None, block: int = 512
) -> RequestColumns:
    arrival = np.asarray(arrival_s, dtype=np.float64)
    n = len(arrival)
    inputs = np.broadcast_to(np.asarray(input_tokens, dtype=np.int64), (n,)).copy()
    outputs = np.broadcast_to(np.asarray(output_tokens, dtype=np.int64), (n,)).copy()
    if hash_ids is None:
        return RequestColumns.from_arrays(arrival, inputs, outputs)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(h) for h in hash_ids], out=offsets[1:])
    flat = np.asarray([x for h in hash_ids for x in h], dtype=np.int64)
    return RequestColumns.from_arrays(
        arrival, inputs, outputs, hash_ids=flat, hash_offsets=offsets, hash_block_tokens=block
    )


def random_columns(
    rng: np.random.Generator, n: int, rate_rps: float, max_input: int = 4000, max_output: int = 300
) -> RequestColumns:
    arrival = np.cumsum(rng.exponential(1.0 / rate_rps, n))
    return columns(arrival, rng.integers(16, max_input, n), rng.integers(1, max_output, n))


def simulator(
    scn: Scenario,
    workloads: Mapping[str, RequestColumns],
    thresholds: RoutingThresholds | Mapping[str, RoutingThresholds] = REMOTE_ALWAYS,
    seed: int = 0,
    admission: AdmissionConfig | None = None,
) -> ClusterSimulator:
    if isinstance(thresholds, RoutingThresholds):
        thresholds = {t.name: thresholds for t in scn.tenants}
    return ClusterSimulator(scn, profile(), workloads, thresholds, np.random.default_rng(seed), admission=admission)
