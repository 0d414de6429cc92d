"""Host several emulated instances in one process (one asyncio loop, one port each), or one per process.

A crash of an instance hosted alone exits the process (status 70), like a crashed vLLM server; in a shared
process only that instance stops answering.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field

from env.scenario import ClusterConfig
from livestack.emulator.engine import TransferModel, build_engine
from livestack.emulator.faults import FaultConfig
from livestack.emulator.server import EmulatedInstance, InstanceSettings

__all__ = ["CRASH_EXIT_CODE", "EmulatorHost", "InstanceSpec"]

CRASH_EXIT_CODE = 70


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One instance to host."""

    instance_id: str
    port: int = 0
    faults: FaultConfig = field(default_factory=FaultConfig)
    tp: int | None = None


class EmulatorHost:
    """Starts and stops a set of emulated instances sharing one cluster configuration."""

    def __init__(
        self,
        cluster: ClusterConfig,
        specs: list[InstanceSpec],
        model_name: str = "meta-llama/Llama-3.1-8B-Instruct",
        time_scale: float = 1.0,
        max_model_len: int = 131072,
        seed: int = 0,
        exit_on_crash: bool = False,
    ) -> None:
        self.cluster = cluster
        self.specs = specs
        self.model_name = model_name
        self.time_scale = time_scale
        self.max_model_len = max_model_len
        self.seed = seed
        self.exit_on_crash = exit_on_crash
        self.instances: list[EmulatedInstance] = []
        self._peers: dict[str, EmulatedInstance] = {}

    async def start(self) -> None:
        """Start every instance (ports 0 pick free ports; see :attr:`urls`)."""
        for index, spec in enumerate(self.specs):
            tp = spec.tp or self.cluster.tp
            settings = InstanceSettings(
                instance_id=spec.instance_id,
                model_name=self.model_name,
                port=spec.port,
                max_model_len=self.max_model_len,
                tp_size=tp,
                time_scale=self.time_scale,
                side_channel_port=5600 + index,
                seed=self.seed + index,
            )
            instance = EmulatedInstance(
                settings,
                build_engine(self.cluster, tp),
                TransferModel.for_cluster(self.cluster, tp),
                spec.faults,
                on_crash=self._crashed,
                peers=self._peers,
            )
            await instance.start()
            self.instances.append(instance)

    def _crashed(self, instance: EmulatedInstance) -> None:
        if self.exit_on_crash and len(self.instances) == 1:
            os._exit(CRASH_EXIT_CODE)
        asyncio.get_running_loop().create_task(instance.stop())

    @property
    def urls(self) -> dict[str, str]:
        """Instance id → base URL."""
        return {i.settings.instance_id: i.url for i in self.instances}

    async def stop(self) -> None:
        """Stop every instance."""
        for instance in self.instances:
            await instance.stop()
        self.instances = []
