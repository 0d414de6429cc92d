"""Faithfulness of the simulator: step times, queueing, interference.

Run: ``PYTHONHASHSEED=0 python -m pytest benchmarks/sim/test_faithfulness.py -m benchmark -s -p no:randomly``

(i) **Step time.** Whole Llama-3-8B forward passes (prefill 512-16384 tokens; decode batch 1-256 at contexts
2048 and 8192; a 2048-token chunk co-batched with 64 decodes at 2048). *Reference*: our own composition of the
measured operator rows at exactly the measured shapes, with the GEMM rows taken from ``gemm_repeat.csv`` (a second,
independent measurement run on another H200 of the same type), the attention rows from ``attn_prefill.csv`` /
``attn_decode.csv`` directly, plus the same unmeasured terms (element-wise traffic, all-reduce, per-step overhead).
*Prediction*: what the simulator uses, the :class:`InterpolatedExecutionTimeModel` built from ``gemm.csv``
(interpolated tables; decode attention as the fitted affine function of total context used by the closed-form
runs; prefill attention via the equivalent-length rule). The error therefore measures interpolation, fitting and
run-to-run measurement noise; it cannot measure what neither side models (there is no whole-model GPU timing in
the profile: that is the calibration left to a GPU run).

(ii) **Queueing.** One instance, Poisson arrivals of fixed 2048-token prefills (one token out, token budget 2048 so
one prefill per step): mean wait vs M/D/1 ``rho D / (2 (1 - rho))`` at loads 0.3-0.9.

(iii) **Interference.** 32 long decodes with 12k-token prefills every 0.4 s: TPOT rises when colocated on an
aggregated instance and does not on a disaggregated decode instance.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from env.perf.model import InterpolatedExecutionTimeModel
from env.perf.profile import load_operator_profile
from env.scenario import Scenario
from env.sim.simulator import ClusterSimulator
from env.workloads.columns import RequestColumns
from policies.schema import RoutingThresholds

pytestmark = pytest.mark.benchmark

PROFILE_DIR = Path(__file__).resolve().parents[2] / "env" / "profiles" / "h200-llama3"
LAYERS = 32


def _rows(name: str) -> list[dict[str, str]]:
    with (PROFILE_DIR / name).open() as handle:
        return [r for r in csv.DictReader(handle) if r["model"] == "llama3-8b" and r["tp"] == "1"]


def _reference_step_s(model: InterpolatedExecutionTimeModel, prefill: int, batch: int, ctx: int) -> float:
    """Composition of raw measured rows (GEMMs from the repeat run) at one measured shape."""
    gemm = {(r["op"], int(r["m"])): float(r["ms"]) / 1000 for r in _rows("gemm_repeat.csv")}
    tokens = prefill + batch
    measured_m = sorted({m for _, m in gemm})
    lo = max(m for m in measured_m if m <= tokens)
    hi = min(m for m in measured_m if m >= tokens)

    def at(op: str) -> float:
        if lo == hi:
            return gemm[(op, lo)]
        w = (tokens - lo) / (hi - lo)
        return (1 - w) * gemm[(op, lo)] + w * gemm[(op, hi)]

    total = LAYERS * sum(at(op) for op in ("qkv", "o", "gate_up", "down"))
    sampled = batch + (1 if prefill else 0)
    lm = sorted((int(r["m"]), float(r["ms"]) / 1000) for r in _rows("gemm_repeat.csv") if r["op"] == "lm_head")
    total += float(np.interp(sampled, [m for m, _ in lm], [t for _, t in lm]))
    if prefill:
        attn = {int(r["seq"]): float(r["ms"]) / 1000 for r in _rows("attn_prefill.csv")}
        total += LAYERS * attn[prefill]
    if batch:
        attn_d = {(int(r["batch"]), int(r["ctx"])): float(r["ms"]) / 1000 for r in _rows("attn_decode.csv")}
        total += LAYERS * attn_d[(batch, ctx)]
    b = model.breakdown(prefill, 0, batch, ctx)
    return total + b.elementwise_s + b.tp_allreduce_s + b.overhead_s


def test_step_time_against_composed_measurements() -> None:
    model = InterpolatedExecutionTimeModel(load_operator_profile("h200-llama3-8b"), 1)
    cases: list[tuple[str, int, int, int]] = [(f"prefill {n}", n, 0, 0) for n in (512, 1024, 2048, 4096, 8192, 16384)]
    cases += [(f"decode B={b} ctx={c}", 0, b, c) for b in (1, 4, 16, 64, 256) for c in (2048, 8192) if b * c <= 2**21]
    cases.append(("chunk 2048 + 64 decodes @2048", 2048, 64, 2048))
    errors = []
    print(f"\n{'case':<32} {'reference ms':>13} {'predicted ms':>13} {'error %':>8}")
    for name, prefill, batch, ctx in cases:
        reference = _reference_step_s(model, prefill, batch, ctx)
        if prefill and batch:
            predicted = model.step_time_s(prefill + batch, batch + 1, batch, batch * ctx, [(prefill, 0)])
        elif prefill:
            predicted = model.step_time_s(prefill, 1, 0, 0, [(prefill, 0)])
        else:
            predicted = model.decode_step_time_s(batch, batch * ctx)  # the closed-form runs' affine model
        error = abs(predicted - reference) / reference
        errors.append(error)
        print(f"{name:<32} {reference * 1e3:13.3f} {predicted * 1e3:13.3f} {100 * error:8.2f}")
    median = float(np.median(errors))
    print(f"median error {100 * median:.2f} %, max {100 * max(errors):.2f} % over {len(errors)} cases")
    assert median <= 0.05


def _single_instance(load: float, n: int, seed: int) -> tuple[float, float]:
    profile = load_operator_profile("h200-llama3-8b")
    model = InterpolatedExecutionTimeModel(profile, 1)
    service_s = model.step_time_s(2048, 1, 0, 0, [(2048, 0)])
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(service_s / load, n))
    columns = RequestColumns.from_arrays(arrival, np.full(n, 2048), np.ones(n, dtype=np.int64))
    scenario = Scenario.model_validate(
        {
            "name": "md1",
            "duration_s": float(arrival[-1]),
            "cluster": {"max_num_batched_tokens": 2048, "enable_prefix_caching": False},
            "tenant_groups": [{"name": "g", "gpu_budget": 1, "aggregated": 1}],
            "tenants": [{"name": "t", "group": "g", "workload": {"kind": "poisson", "rate_rps": 1,
                         "input_tokens": {"kind": "fixed", "tokens": 1},
                         "output_tokens": {"kind": "fixed", "tokens": 1}}}],
        }
    )  # fmt: skip
    thresholds = {"t": RoutingThresholds(disaggregation_enabled=False)}
    sim = ClusterSimulator(scenario, profile, {"t": columns}, thresholds, np.random.default_rng(seed))
    sim.run()
    waits = np.array([r.queue_wait_s for r in sim.finished[0]])
    warm = n // 20  # drop the empty-system start
    return float(waits[warm:].mean()), load * service_s / (2 * (1 - load))


@pytest.mark.parametrize(("load", "n"), [(0.3, 100_000), (0.5, 100_000), (0.7, 200_000), (0.9, 400_000)])
def test_md1_mean_wait(load: float, n: int) -> None:
    simulated, theory = _single_instance(load, n, seed=2026)
    error = abs(simulated - theory) / theory
    print(
        f"\nM/D/1 load {load}: simulated {simulated * 1e3:.3f} ms, theory {theory * 1e3:.3f} ms, "
        f"error {100 * error:.2f} %"
    )
    assert error <= 0.05


def test_interference_colocated_vs_disaggregated() -> None:
    from tests.sim.test_faithfulness import interference_run

    quiet = interference_run(disaggregated=False, with_long_prefills=False)
    colocated = interference_run(disaggregated=False, with_long_prefills=True)
    split_quiet = interference_run(disaggregated=True, with_long_prefills=False)
    split = interference_run(disaggregated=True, with_long_prefills=True)
    print(
        f"\nTPOT of 32 decodes: aggregated {quiet * 1e3:.2f} ms -> {colocated * 1e3:.2f} ms with 12k-token prefills "
        f"(+{100 * (colocated / quiet - 1):.0f} %); disaggregated decode instance {split_quiet * 1e3:.2f} ms -> "
        f"{split * 1e3:.2f} ms ({100 * (split / split_quiet - 1):+.1f} %)"
    )
    assert colocated > 1.5 * quiet
    assert split == pytest.approx(split_quiet, rel=0.05)
