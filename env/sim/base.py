"""The state every part of :class:`~env.sim.simulator.ClusterSimulator` shares, and its event queue.

The simulator is one object assembled from parts of one job each, all subclasses of :class:`SimulatorBase`:

* :mod:`env.sim.simulator` — construction, the event loop (``run_until``), arrivals and the router in the loop;
* :mod:`env.sim.stepping` — instance engines stepping (general steps and closed-form decode runs), completions;
* :mod:`env.sim.kv_transfers` — prefill completions, KV transfers over links, timeouts, failures, fallbacks;
* :mod:`env.sim.pools` — instance start-up, drains, role flips and stops toward a policy's pool targets;
* :mod:`env.sim.snapshots` — metric windows, vLLM metrics, stage records, GPU-seconds.

This base declares the shared state (set by :meth:`ClusterSimulator.__init__ <env.sim.simulator.ClusterSimulator>`),
the event queue and, as abstract methods, the few calls one part makes into another, so each part type-checks on
its own and the assembled class provides them all.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from env.perf.model import InterpolatedExecutionTimeModel
from env.scenario import NetworkConfig, Scenario
from env.sim.engine import EngineConfig, EngineRequest
from env.sim.instances import GroupState, SimInstance
from env.sim.records import SimRequest
from env.sim.telemetry import Histogram
from policies.placement import PlacementConfig
from policies.schema import RoutingThresholds

__all__ = [
    "EVENT_INSTANCE_READY",
    "EVENT_LINK",
    "EVENT_NETWORK",
    "EVENT_TRANSFER_READY",
    "EVENT_TRANSFER_START",
    "EVENT_TRANSFER_TIMEOUT",
    "EVENT_WAKE",
    "SimulatorBase",
]

# Event kinds on the heap (plain ints: the event loop compares them on every event).
EVENT_WAKE = 0
EVENT_TRANSFER_START = 1
EVENT_LINK = 2
EVENT_TRANSFER_READY = 3
EVENT_TRANSFER_TIMEOUT = 4
EVENT_INSTANCE_READY = 5
EVENT_NETWORK = 6


class SimulatorBase(ABC):
    """Shared state, the event queue, and the calls between the simulator's parts (see the module docstring)."""

    scenario: Scenario
    placement: PlacementConfig
    rng: np.random.Generator
    now_s: float
    max_run_segments: int
    tenant_names: list[str]
    slo_ttft_s: list[float]
    slo_tpot_s: list[float]
    thresholds: list[RoutingThresholds]
    groups: list[GroupState]
    instances: list[SimInstance]
    finished: list[list[SimRequest]]
    arrived: list[list[SimRequest]]
    num_finished: int
    kv_bytes_per_token: int
    transfer_bytes: float
    transfer_failures: int
    num_transfers: int
    xfer_time_hist: Histogram
    xfer_bytes_hist: Histogram
    window_counters: dict[int, tuple[int, int]]
    _models: dict[int, InterpolatedExecutionTimeModel]
    _engine_configs: dict[int, EngineConfig]
    _prefill_tp: int
    _net: NetworkConfig
    _layout_s_per_byte: float
    _tenant_index: dict[str, int]
    _heap: list[tuple[float, int, int, Any, int]]
    _seq: int
    _window_start_s: float
    _window_marks_finished: list[int]
    _window_marks_arrived: list[int]
    _window_marks_transfers: list[int]

    def _push(self, time_s: float, kind: int, obj: Any, version: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time_s, self._seq, kind, obj, version))

    @abstractmethod
    def view(self, inst: SimInstance) -> tuple[int, int]:
        """``(running requests, KV tokens used)`` of an instance as an observer sees them now."""

    @abstractmethod
    def _kick(self, inst: SimInstance) -> None:
        """Let ``inst`` take up new work now (start a step, or shorten a decode run that new work interrupts)."""

    @abstractmethod
    def _send_prefill(self, prefill: SimInstance, request: SimRequest, er: EngineRequest) -> None:
        """Start a prefill leg on ``prefill``."""

    @abstractmethod
    def _prefill_done(self, prefill: SimInstance, er: EngineRequest) -> None:
        """A prefill leg finished on ``prefill``: start its KV transfer."""

    @abstractmethod
    def _maybe_drained(self, inst: SimInstance) -> None:
        """Stop or flip a draining instance once it holds nothing."""
