"""A forecast of the future for a copy of the simulator: what a model-predictive controller may assume.

:func:`apply_persistence_forecast` turns a *copy* of a running :class:`~env.sim.simulator.ClusterSimulator` into
one that knows nothing the router has not seen:

* **Arrivals.** Every future arrival of the copy is dropped and replaced by the requests that arrived in the last
  ``window_s`` seconds, repeated back to back (a persistence forecast: the next minute looks like the last one).
  A repeated request keeps its tenant, prompt length, prefix-block hashes and ``max_tokens`` (the router sees all
  of them on arrival; the load generator sends ``max_tokens = output_tokens``, see the simulator's docstring).
* **Network.** Scheduled changes of the network (incident starts and ends) are dropped: the settings in effect now
  persist.
* **Randomness.** The copy's random stream is replaced by a fresh one from ``seed``, so transfer failures in the
  copy are samples, not the draws the real run will make.

In-flight requests keep their state (queues, KV, streamed tokens): the router knows them. The copy forgets the
run's history before the window in progress (finished requests, transfers), which only the final summary reads.

Repeated requests reuse their prompts' prefix hashes, so a forecast sees the prefix-cache hits of repeated
prompts; for tenants whose traffic has no hashes it makes no difference.
"""

from __future__ import annotations

import bisect
import heapq
import math

import numpy as np

from env.sim.base import EVENT_NETWORK
from env.sim.simulator import ClusterSimulator

__all__ = ["apply_persistence_forecast"]


def apply_persistence_forecast(sim: ClusterSimulator, window_s: float, horizon_s: float, seed: int) -> int:
    """Replace ``sim``'s future by a persistence forecast (module docstring); return the forecast's request count.

    Args:
        sim: a copy of the running simulator (it is changed in place; never pass the real one).
        window_s: how far back the observed arrivals are taken from (> 0).
        horizon_s: how far ahead they are repeated (>= 0).
        seed: seed of the copy's new random stream.

    Raises:
        ValueError: a window that is not positive or a negative horizon.
    """
    if not window_s > 0 or not math.isfinite(window_s):
        raise ValueError(f"window_s must be positive and finite, got {window_s}")
    if not horizon_s >= 0:
        raise ValueError(f"horizon_s must be >= 0, got {horizon_s}")
    now_s = sim.now_s
    arrived = sim._next
    past_arrival_s = sim._arrival_s[:arrived]
    start_s = max(now_s - window_s, 0.0)
    first = bisect.bisect_left(past_arrival_s, start_s)
    observed = range(first, arrived)
    span_s = now_s - start_s
    arrival_s: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    tenants: list[int] = []
    rows: list[int] = []
    if span_s > 0 and len(observed) > 0:
        repeats = math.ceil(horizon_s / span_s)
        for k in range(1, repeats + 1):
            for i in observed:
                t_s = past_arrival_s[i] + k * span_s
                if t_s <= now_s + horizon_s:
                    arrival_s.append(t_s)
                    inputs.append(sim._input[i])
                    outputs.append(sim._output[i])
                    tenants.append(sim._tenant_of[i])
                    rows.append(sim._row_of[i])
    order = sorted(range(len(arrival_s)), key=arrival_s.__getitem__)
    sim._arrival_s = past_arrival_s + [arrival_s[j] for j in order]
    sim._input = sim._input[:arrived] + [inputs[j] for j in order]
    sim._output = sim._output[:arrived] + [outputs[j] for j in order]
    sim._tenant_of = sim._tenant_of[:arrived] + [tenants[j] for j in order]
    sim._row_of = sim._row_of[:arrived] + [rows[j] for j in order]
    sim.num_requests = len(sim._arrival_s)
    sim.requests = sim.requests[:arrived] + [None] * len(order)
    sim.forecast_from = arrived
    kept = [entry for entry in sim._heap if entry[2] != EVENT_NETWORK]
    heapq.heapify(kept)
    sim._heap = kept
    sim.rng = np.random.default_rng(seed)
    _drop_history(sim)
    return len(order)


def _drop_history(sim: ClusterSimulator) -> None:
    """Forget what the copy does not need: requests and transfers before the window in progress.

    The window's statistics (and so the reward) read only what came after the window marks; in-flight requests
    stay referenced by their instances. Copies of the copy are then cheap.
    """
    for ti in range(len(sim.tenant_names)):
        sim.arrived[ti] = sim.arrived[ti][sim._window_marks_arrived[ti] :]
        sim.finished[ti] = sim.finished[ti][sim._window_marks_finished[ti] :]
        sim._window_marks_arrived[ti] = 0
        sim._window_marks_finished[ti] = 0
    for gi, group in enumerate(sim.groups):
        group.transfer_log = group.transfer_log[sim._window_marks_transfers[gi] :]
        sim._window_marks_transfers[gi] = 0
    sim.requests = [None] * len(sim.requests)
