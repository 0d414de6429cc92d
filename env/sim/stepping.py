"""Instance engines stepping in simulated time: general steps, closed-form decode runs, completions.

An instance steps while it has work: a closed-form decode run when the engine can plan one (several decode
steps at once, woken at the run's end or earlier when new work would change it), else one general step
(:mod:`env.sim.engine`). :meth:`InstanceStepping.view` is what an observer sees mid-run (the last completed
step boundary), so results do not depend on how runs are planned.
"""

from __future__ import annotations

import math

from env.sim.base import EVENT_WAKE, SimulatorBase
from env.sim.engine import EngineRequest, InstanceEngine
from env.sim.instances import InstanceState, SimInstance
from env.sim.records import SimRequest

__all__ = ["InstanceStepping"]


class InstanceStepping(SimulatorBase):
    """The simulator's part that steps instance engines and records completions."""

    def view(self, inst: SimInstance) -> tuple[int, int]:
        """``(running requests, KV tokens used)`` of an instance as an observer sees them now.

        In the middle of a closed-form decode run the engine's counters are those of the run's start; the view
        accounts for the steps completed by now, so what the router sees does not depend on how runs are planned.
        """
        engine = inst.engine
        run = inst.run
        if run is None:
            return len(engine._decoding) + len(engine._prefilling), engine.kv_used_tokens
        return engine.run_view(run, self.now_s - inst.run_start_s)

    def view_running(self, inst: SimInstance) -> int:
        """Running requests of an instance as an observer sees them now (the first half of :meth:`view`)."""
        engine = inst.engine
        run = inst.run
        if run is None:
            return len(engine._decoding) + len(engine._prefilling)
        return engine.run_running(run, self.now_s - inst.run_start_s)

    def _kick(self, inst: SimInstance) -> None:
        if not inst.busy:
            self._start_next(inst)
            return
        run = inst.run
        if run is not None and (len(run.end_steps) > 1 or inst.engine.can_admit_waiting()):
            steps = InstanceEngine.steps_covering(run, self.now_s - inst.run_start_s)
            if steps < inst.run_steps:
                inst.run_steps = steps
                inst.version += 1
                self._push(inst.run_start_s + run.time_after_s(steps), EVENT_WAKE, inst, inst.version)

    def _start_next(self, inst: SimInstance) -> None:
        engine = inst.engine
        run = engine.plan_decode_run(self.now_s, max_segments=self.max_run_segments)
        inst.version += 1
        if run is not None:
            inst.run = run
            inst.run_start_s = self.now_s
            inst.run_steps = run.num_steps
            inst.busy = True
            self._push(self.now_s + run.duration_s, EVENT_WAKE, inst, inst.version)
            return
        result = engine.step(self.now_s)
        if result is None:
            inst.busy = False
            if inst.state == InstanceState.DRAINING:
                self._maybe_drained(inst)
            return
        inst.result = result
        inst.busy = True
        self._push(result.start_s + result.duration_s, EVENT_WAKE, inst, inst.version)

    def _wake(self, inst: SimInstance) -> None:
        run = inst.run
        if run is not None:
            finished = inst.engine.commit_decode_run(run, inst.run_steps, inst.run_start_s)
            inst.run = None
        else:
            result = inst.result
            inst.result = None
            for er in result.prefill_done:
                self._prefill_done(inst, er)
            finished = result.finished
        for er in finished:
            self._finish(er)
        inst.busy = False
        self._start_next(inst)

    def _finish(self, er: EngineRequest) -> None:
        request: SimRequest = er.tag
        request.finished_s = er.finished_s
        request.first_token_s = er.first_token_s
        request.decode_scheduled_s = er.first_scheduled_s
        if not request.remote or not math.isnan(request.fallback_s):
            # prefilled on this (decode/aggregated) instance
            if math.isnan(request.queue_wait_s):
                request.queue_wait_s = er.first_scheduled_s - request.arrival_s
            request.prefill_compute_s += er.prefill_done_s - er.first_scheduled_s
        request.status = SimRequest.FINISHED
        self.num_finished += 1
        self.finished[request.tenant].append(request)
