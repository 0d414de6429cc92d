"""Small scenarios for the env and evaluation tests (seconds of simulated time, a few requests per second)."""

from __future__ import annotations

from typing import Any

from env.scenario import Scenario


def tiny_scenario(
    duration_s: float = 120.0, rate_rps: float = 2.0, groups: int = 1, name: str = "tiny", **cluster: Any
) -> Scenario:
    """A 70B TP2 cluster with 8 GPUs per group (2 prefill + 2 decode), a chat and a RAG tenant per group."""
    group_specs = []
    tenants = []
    for gi in range(groups):
        group = f"g{gi}"
        group_specs.append(
            {
                "name": group,
                "gpu_budget": 8,
                "prefill": 2,
                "decode": 2,
                "prefill_pool": {"min": 0, "max": 3},
                "decode_pool": {"min": 1, "max": 4},
            }
        )
        tenants.append(
            {
                "name": f"chat{gi}",
                "group": group,
                "priority": 2.0,
                "slo": {"ttft_p95_s": 1.0, "tpot_p95_s": 0.06},
                "workload": {
                    "kind": "poisson",
                    "rate_rps": rate_rps,
                    "input_tokens": {"kind": "lognormal", "median_tokens": 1000, "sigma": 0.7, "max_tokens": 8000},
                    "output_tokens": {"kind": "lognormal", "median_tokens": 120, "sigma": 0.8, "max_tokens": 1000},
                },
            }
        )
        tenants.append(
            {
                "name": f"rag{gi}",
                "group": group,
                "slo": {"ttft_p95_s": 4.0, "tpot_p95_s": 0.08},
                "workload": {
                    "kind": "poisson",
                    "rate_rps": rate_rps / 4,
                    "input_tokens": {"kind": "lognormal", "median_tokens": 6000, "sigma": 0.5, "max_tokens": 20000},
                    "output_tokens": {"kind": "lognormal", "median_tokens": 300, "sigma": 0.6, "max_tokens": 2000},
                },
            }
        )
    return Scenario.model_validate(
        {
            "name": name,
            "duration_s": duration_s,
            "control_interval_s": 10.0,
            "cluster": {"profile": "h200-llama3-70b", "tp": 2, **cluster},
            "tenant_groups": group_specs,
            "tenants": tenants,
        }
    )
