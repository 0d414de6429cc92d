"""``policy.decide`` latency: the queue/KV rule policy and a learned policy, for 1 and 100 tenants.

The learned policy is a real artifact: an untrained MaskablePPO over the observation/action layout of the
tenant count, exported with :func:`agents.export.export_policy` and loaded with
:meth:`policies.learned.LearnedPolicy.load` (numpy forward pass, masks, decode to a ``ControlAction``, exactly as
the controller runs it). The inputs are a full metric window (every tenant and group feature known, values
drawn once from a seeded generator) and the controller's policy context. One sample = the median of one batch
of calls; the spread is over batches. ``build_observation`` (done once per tick before ``decide``) is measured
separately.

Run: ``PYTHONHASHSEED=0 python -m pytest benchmarks/policy -m benchmark -q -s -p no:randomly``
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import yaml
from harness import figure, write_fragment
from sb3_contrib import MaskablePPO

from agents.export import export_policy
from policies.action_codec import ActionCodec
from policies.base import PolicyContext
from policies.features import ObservationLayout, build_observation
from policies.learned import LearnedPolicy
from policies.policy_file import load_policy_text, resolve_policy
from policies.registry import load_policy
from policies.schema import GroupWindow, MetricWindow, PoolTargets, TenantWindow

pytestmark = pytest.mark.benchmark

COMMAND = "PYTHONHASHSEED=0 python -m pytest benchmarks/policy -m benchmark -q -s -p no:randomly"
BATCHES = 15
CALLS_PER_BATCH = {1: 200, 100: 20}
TENANTS_PER_GROUP = 10
_FIGURES: list[dict[str, Any]] = []


def _policy_text(num_tenants: int) -> str:
    num_groups = max(1, -(-num_tenants // TENANTS_PER_GROUP))
    groups = [
        {"name": f"g{g}", "gpu_budget": 8, "pools": {"prefill": {"min": 1, "max": 6}, "decode": {"min": 1, "max": 6}}}
        for g in range(num_groups)
    ]
    tenants = [
        {"name": f"t{t:03d}", "group": f"g{t // TENANTS_PER_GROUP}", "slo": {"ttft_p95_ms": 500, "tpot_p95_ms": 60}}
        for t in range(num_tenants)
    ]
    return yaml.safe_dump({"tenant_groups": groups, "tenants": tenants})


def _inputs(num_tenants: int) -> tuple[Any, PolicyContext, MetricWindow]:
    base = resolve_policy(load_policy_text(_policy_text(num_tenants), "bench.yaml"), "bench.yaml")
    rng = np.random.default_rng(num_tenants)
    tenants = tuple(tp.tenant for tp in base.tenants.values())
    groups = tuple(base.groups.values())
    thresholds = {n: tp.thresholds for n, tp in base.tenants.items()}
    context = PolicyContext(tenants, groups, {g.name: PoolTargets(3, 5) for g in groups}, thresholds, thresholds)
    window = MetricWindow(
        100.0,
        30.0,
        {
            t.name: TenantWindow(
                request_rate_rps=float(rng.uniform(0.5, 20)), mean_input_tokens=float(rng.uniform(200, 8000)),
                p95_input_tokens=float(rng.uniform(1000, 16000)), mean_output_tokens=float(rng.uniform(50, 500)),
                ttft_p50_s=0.2, ttft_p95_s=float(rng.uniform(0.1, 2.0)), ttft_p99_s=2.5, tpot_p50_s=0.02,
                tpot_p95_s=float(rng.uniform(0.01, 0.1)), tpot_p99_s=0.12, slo_attainment_frac=0.9,
                goodput_rps=5.0, remote_prefill_frac=0.4, prefix_cache_hit_frac=0.2, failed_rate_rps=0.0,
            )
            for t in tenants
        },
        {
            g.name: GroupWindow(
                num_prefill=3, num_decode=5, prefill_queue_wait_s=float(rng.uniform(0, 2)),
                prefill_queued_tokens=float(rng.uniform(0, 50000)), decode_active_seqs=float(rng.uniform(0, 200)),
                decode_kv_usage_frac=float(rng.uniform(0.1, 0.95)), prefill_kv_usage_frac=0.3,
                kv_transfer_time_p95_s=0.05, kv_transfer_failure_frac=0.0, prefix_cache_hit_frac=0.2,
            )
            for g in groups
        },
    )  # fmt: skip
    return base, context, window


class _SpacesOnly(gym.Env[np.ndarray, np.ndarray]):
    def __init__(self, layout: ObservationLayout) -> None:
        self.observation_space = layout.observation_space()
        self.action_space = ActionCodec(layout).action_space()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        raise NotImplementedError


def _learned(context: PolicyContext, out: Path) -> LearnedPolicy:
    layout = ObservationLayout(max_groups=len(context.groups), max_tenants=len(context.tenants))
    model = MaskablePPO("MlpPolicy", _SpacesOnly(layout), seed=0, device="cpu")  # SB3's default 64x64 MLP
    path = export_policy(
        model, out, layout, tenants=[t.name for t in context.tenants], groups=[g.name for g in context.groups]
    )
    return LearnedPolicy.load(path)


def _batches(call: Callable[[], object], calls: int) -> list[float]:
    call()  # warm-up
    samples = []
    for _ in range(BATCHES):
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        samples.append(statistics.median(times) * 1e6)
    return samples


@pytest.mark.parametrize("num_tenants", [1, 100])
def test_decide_latency(num_tenants: int, tmp_path: Path) -> None:
    base, context, window = _inputs(num_tenants)
    observation = build_observation(window, context.observation_context())
    rule = load_policy("baseline:queue_kv", base)
    learned = _learned(context, tmp_path / "artifact")
    calls = CALLS_PER_BATCH[num_tenants]
    groups = len(context.groups)
    config = (
        f"{num_tenants} tenant{'s' if num_tenants > 1 else ''} (+ default), {groups} group{'s' if groups > 1 else ''}"
    )
    results = {
        "rule (baseline:queue_kv)": _batches(lambda: rule.decide(observation, context), calls),
        "learned (MaskablePPO 64x64, numpy)": _batches(lambda: learned.decide(observation, context), calls),
        "build_observation (once per tick)": _batches(
            lambda: build_observation(window, context.observation_context()), calls
        ),
    }
    for name, samples in results.items():
        _FIGURES.append(
            figure("policy.decide latency" if "build" not in name else "observation build", f"{name}, {config}",
                   "µs", samples, repeat=f"median of {calls} calls", better="lower")
        )  # fmt: skip
        print(f"\n{config}: {name}: median {statistics.median(samples):.1f} µs")
    write_fragment(
        "policy_decide",
        "policy.decide latency (rule and learned policies)",
        COMMAND,
        _FIGURES,
        notes="Inputs: a full metric window and the controller's policy context; the learned policy is an exported "
        "untrained MaskablePPO (the forward pass costs the same trained or not).",
    )
    assert rule.decide(observation, context).pools
    assert set(learned.decide(observation, context).thresholds) == {t.name for t in context.tenants}
