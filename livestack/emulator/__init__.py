"""The vLLM emulator: real HTTP servers on 127.0.0.1 that answer like vLLM with NixlConnector (``kv_both``).

Timing comes from the simulator's engine model (:mod:`env.sim.engine`) over the calibrated performance model
(:mod:`env.perf`), stepped in real or scaled time. See :mod:`livestack.emulator.server` for the protocol,
:mod:`livestack.emulator.tokenizer` for token counting and :mod:`livestack.emulator.host` for hosting several instances.
"""

from livestack.emulator.faults import FaultConfig
from livestack.emulator.host import EmulatorHost, InstanceSpec
from livestack.emulator.server import EmulatedInstance, InstanceSettings

__all__ = ["EmulatedInstance", "EmulatorHost", "FaultConfig", "InstanceSettings", "InstanceSpec"]
