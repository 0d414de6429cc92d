"""Faithfulness of the simulator: step times, queueing, interference.

Run: ``PYTHONHASHSEED=0 python -m pytest benchmarks/sim/test_faithfulness.py -m benchmark -s -p no:randomly``

(i) **Step time.** Whole Llama-3-8B engine steps measured on one H200 (``env/profiles/h200-llama3/e2e_*.csv``:
eager prefills of 512-16384 tokens, CUDA-graphed decode at batch 1-256, graphed prefill chunks co-batched with
16-128 decodes) against what the simulator computes for the same step through its own entry points
(``step_time_s``; decode-only steps through the closed-form ``decode_step_time_s``). The profile README states
how the three composition constants were fitted on these points; ``tests/perf/test_fidelity.py`` holds the
held-out checks.

(ii) **Queueing.** One instance, Poisson arrivals of fixed 2048-token prefills (one token out, token budget 2048 so
one prefill per step): mean wait vs M/D/1 ``rho D / (2 (1 - rho))`` at loads 0.3-0.9.

(iii) **Interference.** 32 long decodes with 12k-token prefills every 0.4 s: TPOT rises when colocated on an
aggregated instance and does not on a disaggregated decode instance.
"""

from __future__ import annotations

import numpy as np
import pytest

from env.perf.fidelity import load_e2e_points
from env.perf.model import InterpolatedExecutionTimeModel
from env.perf.profile import load_operator_profile
from env.scenario import Scenario
from env.sim.simulator import ClusterSimulator
from env.workloads.columns import RequestColumns
from policies.schema import RoutingThresholds

pytestmark = pytest.mark.benchmark


def test_step_time_against_measured_whole_steps() -> None:
    profile = load_operator_profile("h200-llama3-8b")
    model = InterpolatedExecutionTimeModel(profile, 1)
    errors = []
    print(f"\n{'step':<36} {'measured ms':>12} {'predicted ms':>13} {'error %':>8}")
    for point in load_e2e_points(profile.source, "llama3-8b"):
        batch, each = point.decode_batch, point.decode_context_tokens_each
        if point.prefill_tokens:
            chunks = [(point.prefill_tokens, 0)] * point.prefill_sequences
            tokens = point.prefill_tokens * point.prefill_sequences + batch
            predicted = model.step_time_s(tokens, batch + len(chunks), batch, batch * each, chunks)
        else:
            predicted = model.decode_step_time_s(batch, batch * each)  # the closed-form runs' affine model
        error = predicted / point.measured_s - 1
        errors.append(abs(error))
        print(f"{point.label:<36} {point.measured_s * 1e3:12.2f} {predicted * 1e3:13.2f} {100 * error:+8.2f}")
    median = float(np.median(errors))
    print(f"median |error| {100 * median:.2f} %, max {100 * max(errors):.2f} % over {len(errors)} steps")
    assert median <= 0.03
    assert max(errors) <= 0.08


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
