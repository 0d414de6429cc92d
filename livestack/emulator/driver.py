"""Drives one instance's engine model (:class:`env.sim.engine.InstanceEngine`) in scaled real time.

The scheduling (continuous batching, chunked prefill, KV capacity, prefix cache, preemption) is the simulator's
engine, the single copy of that logic; this module only

* adds, releases and aborts requests,
* steps the engine whenever it has work, sleeps the step's modelled duration (times the time scale and the slow
  factor) and then releases the step's tokens, so a client sees each token at its modelled instant,
* holds *deferred* requests (a KV pull in flight) outside the engine for the modelled transfer time,
* updates the engine-level vLLM gauges and counters after every step.

Emulated time is ``(loop.time() - start) / time_scale``; the engine is stepped with it. Handles keep wall-clock
times (``loop.time()``); metrics divide by the time scale.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from env.sim.engine import EngineRequest, InstanceEngine, StepResult
from livestack.emulator.metrics import VllmMetrics

__all__ = ["MAX_LAG_S", "EngineDriver", "RequestHandle"]

MAX_LAG_S = 5.0
"""Wall seconds the step clock may run behind its model before it gives up catching up and restarts from now.

Within it, the steps after an event-loop stall (a GC pause, a busy neighbour process, VM steal time) run back to
back until the clock is on the model's timeline again, so the stall delays tokens but does not stretch the decode:
TPOT stays the model's. Catching up costs only the steps' bookkeeping (well under a millisecond of CPU per step of
several modelled milliseconds). At 50 ms, stalls of 100 ms on a busy CI machine stretched every running request and
the sim-live parity test measured TPOT p95 +16 %. At 0.5 s, CI runs still measured +13 % to +16 % while the loop's
p95 wake-up lag was normal, as a few longer stalls would do: two 0.7 s stalls put into that test's live run gave
+7.8 % at 0.5 s and +1.0 % at this bound (a CI host has put 0.7 s of lag into one run's TTFTs). Beyond the bound the
process is not keeping up, and the clock restarts from now rather than replaying a backlog of old steps; each such
restart counts in :data:`livestack.emulator.metrics.EMULATOR_CLOCK_RESYNCS_METRIC`."""


@dataclass(slots=True)
class RequestHandle:
    """One request's progress, shared by the driver (producer) and its HTTP handler (consumer)."""

    request: EngineRequest
    arrival_s: float
    tokens: asyncio.Queue[int] = field(default_factory=asyncio.Queue)
    """Receives the number of new tokens after each step; ``0`` marks the end (finished or failed)."""
    generated_tokens: int = 0
    first_token_s: float | None = None
    last_token_s: float | None = None
    finished_s: float | None = None
    external_tokens: int = 0
    deferred_s: float = 0.0
    error: str | None = None
    done: bool = False

    @property
    def request_id(self) -> str:
        """The engine request id."""
        return self.request.request_id


class EngineDriver:
    """Runs one engine in time; one asyncio task per instance."""

    def __init__(
        self,
        engine: InstanceEngine,
        metrics: VllmMetrics,
        time_scale: float,
        slow_factor: float = 1.0,
        max_lag_s: float = MAX_LAG_S,
    ) -> None:
        if max_lag_s <= 0:
            raise ValueError(f"max_lag_s must be positive, got {max_lag_s}")
        self.engine = engine
        self.metrics = metrics
        self.time_scale = time_scale
        self.slow_factor = slow_factor
        self.max_lag_s = max_lag_s
        """Wall seconds the step clock may run behind before it restarts from now (:data:`MAX_LAG_S`)."""
        self.clock_resyncs = 0
        """How often the clock restarted from now after running more than ``max_lag_s`` behind."""
        self._handles: dict[str, RequestHandle] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._num_deferred = 0
        self._loop = asyncio.get_running_loop()
        self._start_s = self._loop.time()

    def start(self) -> None:
        """Start the step loop."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="emulator-engine")

    async def stop(self) -> None:
        """Stop the step loop and end every open request."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for handle in list(self._handles.values()):
            self._end(handle, "engine stopped")

    def now(self) -> float:
        """Wall-clock seconds of the event loop."""
        return self._loop.time()

    def emulated_now_s(self) -> float:
        """Emulated seconds since the driver started."""
        return (self._loop.time() - self._start_s) / self.time_scale

    def submit(
        self,
        request_id: str,
        prompt_tokens: int,
        max_tokens: int,
        hash_ids: Sequence[int],
        hash_block_tokens: int,
        prefill_only: bool = False,
        kv_ready: bool = False,
    ) -> RequestHandle:
        """Queue a request in the engine now."""
        request = EngineRequest(
            request_id, max(prompt_tokens, 1), max_tokens, hash_ids, hash_block_tokens, prefill_only, kv_ready
        )
        handle = RequestHandle(request, self.now())
        self._handles[request_id] = handle
        self.engine.add_request(request, self.emulated_now_s())
        self._wake.set()
        return handle

    async def deferred(self, wait_s: float) -> None:
        """Wait ``wait_s`` emulated seconds as a *deferred* request (a KV pull in flight)."""
        self._num_deferred += 1
        self._publish_queue_gauges()
        try:
            await asyncio.sleep(wait_s * self.time_scale)
        finally:
            self._num_deferred -= 1
            self._publish_queue_gauges()

    def release(self, request_id: str) -> None:
        """Free the pinned KV of a finished prefill-only request."""
        self.engine.release(request_id)
        self._wake.set()

    def abort(self, handle: RequestHandle) -> None:
        """Drop a request (its client went away)."""
        if not handle.done:
            self.engine.abort(handle.request_id)
            self._end(handle, "aborted")
            self._wake.set()

    def _end(self, handle: RequestHandle, error: str | None) -> None:
        handle.done = True
        handle.error = error
        handle.finished_s = self.now()
        self._handles.pop(handle.request_id, None)
        handle.tokens.put_nowait(0)

    def _publish_queue_gauges(self) -> None:
        waiting = self.engine.num_waiting
        m = self.metrics
        m.waiting_capacity.set(waiting)
        m.waiting_deferred.set(self._num_deferred)
        m.num_requests_waiting.set(waiting + self._num_deferred)

    async def _run(self) -> None:
        scale = self.time_scale * self.slow_factor
        deadline_s: float | None = None  # wall time at which the previous step ended, while steps run back to back
        while True:
            now = self.now()
            # Back-to-back steps start at the previous step's modelled end, not when this loop got the CPU back,
            # so event-loop latency does not accumulate step after step (up to max_lag_s, then the clock resyncs).
            if deadline_s is None:
                start = now
            elif now - deadline_s > self.max_lag_s:
                start = now
                self.clock_resyncs += 1
                self.metrics.clock_resyncs.inc()
            else:
                start = deadline_s
            result = self.engine.step((start - self._start_s) / self.time_scale, report_tokens=True)
            if result is None:
                deadline_s = None
                self._wake.clear()
                self._publish()
                await self._wake.wait()
                continue
            deadline_s = start + result.duration_s * scale
            await asyncio.sleep(max(deadline_s - self.now(), 0.0))
            self._deliver(result, deadline_s)

    def _deliver(self, result: StepResult, modelled_end_s: float) -> None:
        """Release a step's tokens; ``modelled_end_s`` is the wall time at which the model says the step ended."""
        now = self.now()
        m = self.metrics
        delay_s = max(now - modelled_end_s, 0.0) / self.time_scale
        handles = self._handles
        itl = m.inter_token_latency
        scale = self.time_scale
        for request_id in result.emitted:
            handle = handles.get(request_id)
            if handle is None:
                continue
            if handle.first_token_s is None:
                handle.first_token_s = now
                m.first_token_delay.observe(delay_s)
            elif handle.last_token_s is not None:
                itl.observe((now - handle.last_token_s) / scale)
            handle.last_token_s = now
            handle.generated_tokens += 1
            handle.tokens.put_nowait(1)
        for request in result.prefill_done:
            handle = handles.get(request.request_id)
            if handle is not None:
                self._end(handle, None)
        for request in result.finished:
            handle = handles.get(request.request_id)
            if handle is not None:
                self._end(handle, None)
        m.iteration_tokens.observe(result.num_tokens)
        if result.preempted:
            m.num_preemptions.inc(len(result.preempted))
        self._publish()

    def _publish(self) -> None:
        m = self.metrics
        m.num_requests_running.set(self.engine.num_running)
        m.kv_cache_usage_perc.set(self.engine.kv_usage_frac)
        self._publish_queue_gauges()
