"""Small versions of the faithfulness checks (the full sweeps are in benchmarks/sim): queueing and interference."""

from __future__ import annotations

import numpy as np
import pytest

from env.sim.simulator import ClusterSimulator
from tests.sim.helpers import LOCAL_ALWAYS, REMOTE_ALWAYS, columns, model, scenario, simulator

PROMPT = 2048


def md1_run(load: float, n: int, seed: int) -> tuple[float, float]:
    """Mean wait of a single instance serving fixed 2048-token prefills at Poisson arrivals: (simulated, M/D/1)."""
    waits, service_s = md1_waits(load, n, seed)
    return float(waits.mean()), load * service_s / (2 * (1 - load))


def md1_waits(load: float, n: int, seed: int) -> tuple[np.ndarray, float]:
    """Per-request waits of the M/D/1 run, and the service time."""
    service_s = model().step_time_s(PROMPT, 1, 0, 0, [(PROMPT, 0)])
    rate = load / service_s
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    cluster = {"max_num_batched_tokens": PROMPT, "enable_prefix_caching": False}
    sim = simulator(scenario(0, 0, aggregated=1, cluster=cluster), {"t": columns(arrival, PROMPT, 1)}, LOCAL_ALWAYS)
    sim.run()
    return np.array([r.queue_wait_s for r in sim.finished[0]]), service_s


def test_single_instance_matches_md1_mean_wait() -> None:
    simulated, theory = md1_run(0.5, 20_000, seed=11)
    assert simulated == pytest.approx(theory, rel=0.06)


def test_single_instance_follows_lindleys_recursion_exactly() -> None:
    waits, service_s = md1_waits(0.8, 3000, seed=5)
    rng = np.random.default_rng(5)
    arrival = np.cumsum(rng.exponential(1.0 / (0.8 / service_s), 3000))
    expected = np.zeros(3000)
    for i in range(1, 3000):
        expected[i] = max(0.0, expected[i - 1] + service_s - (arrival[i] - arrival[i - 1]))
    np.testing.assert_allclose(waits, expected, atol=1e-9)


def interference_run(disaggregated: bool, with_long_prefills: bool) -> float:
    """Mean TPOT of 32 steady decoders, with or without 12k-token prefills arriving every 0.4 s."""
    decoders = columns(np.linspace(0.0, 0.5, 32), 512, 1500)
    long_arrivals = np.arange(1.0, 15.0, 0.4) if with_long_prefills else np.zeros(0)
    long = columns(long_arrivals, 12_000, 1)
    if disaggregated:
        scn = scenario(1, 1, tenants=("decoders", "long"))
    else:
        scn = scenario(0, 0, aggregated=1, tenants=("decoders", "long"), budget=2)
    sim: ClusterSimulator = simulator(
        scn, {"decoders": decoders, "long": long}, {"decoders": LOCAL_ALWAYS, "long": REMOTE_ALWAYS}
    )
    sim.run()
    return float(np.mean([r.tpot_s for r in sim.finished[0]]))


def test_long_prefills_slow_decodes_only_when_colocated() -> None:
    quiet = interference_run(disaggregated=False, with_long_prefills=False)
    colocated = interference_run(disaggregated=False, with_long_prefills=True)
    split_quiet = interference_run(disaggregated=True, with_long_prefills=False)
    split = interference_run(disaggregated=True, with_long_prefills=True)
    assert colocated > 1.5 * quiet
    assert split == pytest.approx(split_quiet, rel=0.05)
