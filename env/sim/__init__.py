"""Discrete-event simulator of a prefill/decode-disaggregated vLLM cluster.

* :mod:`env.sim.engine` — one instance's vLLM-V1-like scheduler (shared with the emulator).
* :mod:`env.sim.telemetry` — vLLM-named counters and histograms.
* :mod:`env.sim.simulator` — the cluster: router in the loop, KV transfers, pool changes, ``run_until``.
"""

from env.sim.engine import DecodeRun, EngineConfig, EngineRequest, InstanceEngine, Phase, StepResult
from env.sim.telemetry import Histogram, InstanceCounters

__all__ = [
    "DecodeRun",
    "EngineConfig",
    "EngineRequest",
    "Histogram",
    "InstanceCounters",
    "InstanceEngine",
    "Phase",
    "StepResult",
]
