"""Discrete-event simulator of a prefill/decode-disaggregated vLLM cluster.

* :mod:`env.sim.engine` — one instance's vLLM-V1-like scheduler (shared with the emulator); its data types
  (:mod:`env.sim.engine_types`) and its closed-form decode runs (:mod:`env.sim.decode_runs`, simulator only).
* :mod:`env.sim.telemetry` — vLLM-named counters and histograms.
* :mod:`env.sim.simulator` — the cluster: construction, the event loop (``run_until``), arrivals and the router in
  the loop; its other parts (:mod:`env.sim.base`): :mod:`env.sim.stepping` (engines stepping),
  :mod:`env.sim.kv_transfers` (KV transfers), :mod:`env.sim.pools` (pool changes), :mod:`env.sim.snapshots`
  (observations, computed by :mod:`env.sim.windows`); :mod:`env.sim.instances` — instances and groups.
* :mod:`env.sim.build` — loading a scenario's profile and workloads (the I/O side); :mod:`env.sim.summary` — results.
"""

from env.sim.engine import DecodeRun, EngineConfig, EngineRequest, InstanceEngine, Phase, StepResult
from env.sim.simulator import ClusterSimulator, InstanceRole, InstanceState, kv_capacity_tokens
from env.sim.telemetry import Histogram, InstanceCounters

__all__ = [
    "ClusterSimulator",
    "DecodeRun",
    "EngineConfig",
    "EngineRequest",
    "Histogram",
    "InstanceCounters",
    "InstanceEngine",
    "InstanceRole",
    "InstanceState",
    "Phase",
    "StepResult",
    "kv_capacity_tokens",
]
