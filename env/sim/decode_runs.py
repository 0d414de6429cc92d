"""Closed-form runs of decode-only steps: the instance engine's fast path (simulator only).

When no prefill runs and the waiting queue cannot be admitted, the decode batch repeats one step with every
context one token longer; the step time is affine in the total context (``A + K C``), so ``n`` steps take
``n A + K (n C0 + B n (n - 1) / 2)``::

    run = engine.plan_decode_run(now_s)        # None -> call step(); else a DecodeRun of run.num_steps steps
    k = InstanceEngine.steps_covering(run, t - now_s)   # an arrival at t: the run stops at the next boundary
    finished = engine.commit_decode_run(run, k or run.num_steps, now_s)

A run is made of segments (a new one at each completion, when nothing waits) and ends at KV exhaustion; the
per-step ITL histogram is filled in closed form. A global step counter lets every decoding request's progress
be derived (``generated = generated_at_join + steps - join_step``), so a run costs O(segments) plus O(log B) per
completion, never O(tokens). Tests check that runs reproduce the step-by-step loop exactly.

:class:`DecodeRuns` is the part of :class:`env.sim.engine.InstanceEngine` that plans, views and commits runs; it
reads the engine's scheduler state, declared here, and calls back into the engine for the few scheduler steps a
run shares with a general step (admitting a transferred request, finishing one).
"""

from __future__ import annotations

import bisect
import heapq
import math
from abc import ABC, abstractmethod
from collections import deque

from env.perf.model import ExecutionTimeModel
from env.sim.engine_types import EngineConfig, EngineRequest, Phase
from env.sim.telemetry import InstanceCounters

__all__ = ["DecodeRun", "DecodeRuns"]


class DecodeRun:
    """A planned run of decode-only steps: one or more *segments* of identical composition.

    Inside a segment the batch is fixed and every context grows by one token per step, so segment ``i`` of
    ``m`` steps takes ``m a_i + k_i (m c_i + b_i m (m - 1) / 2)``; a segment ends at a completion (the batch
    shrinks) or where the run stops. ``finishers`` holds the finish-heap entries taken out while planning (all
    finish at segment ends); ``seg_finished[i]`` counts those finishing by the end of segment ``i``.
    """

    __slots__ = (
        "duration_s",
        "end_steps",
        "end_times_s",
        "finish_times_s",
        "finishers",
        "num_steps",
        "seg_a",
        "seg_after",
        "seg_b",
        "seg_c",
        "seg_finished",
        "seg_k",
    )

    def __init__(self) -> None:
        self.end_steps: list[int] = []
        self.end_times_s: list[float] = []
        self.seg_a: list[float] = []
        self.seg_k: list[float] = []
        self.seg_b: list[int] = []
        self.seg_c: list[int] = []
        self.seg_after: list[int] = []
        self.seg_finished: list[int] = []
        self.finish_times_s: list[float] = []
        self.finishers: list[tuple[int, int, EngineRequest]] = []
        self.num_steps = 0
        self.duration_s = 0.0

    @property
    def decode_batch(self) -> int:
        """Batch of the first segment."""
        return self.seg_b[0]

    def time_after_s(self, steps: int) -> float:
        """Duration of the first ``steps`` steps of the run."""
        i = bisect.bisect_left(self.end_steps, steps) if len(self.end_steps) > 1 else 0
        if i >= len(self.end_steps):
            i = len(self.end_steps) - 1
        base_steps = self.end_steps[i - 1] if i else 0
        base_s = self.end_times_s[i - 1] if i else 0.0
        return base_s + self.segment_time_s(i, steps - base_steps)

    def segment_time_s(self, i: int, m: int) -> float:
        """Duration of the first ``m`` steps of segment ``i``: ``m a + k (m c + b m (m - 1) / 2)``."""
        return m * self.seg_a[i] + self.seg_k[i] * (m * self.seg_c[i] + self.seg_b[i] * m * (m - 1) / 2.0)


class DecodeRuns(ABC):
    """Planning, viewing and committing decode runs (the engine's fast path; see the module docstring)."""

    config: EngineConfig
    model: ExecutionTimeModel
    counters: InstanceCounters
    steps: int
    _waiting: deque[EngineRequest]
    _prefilling: list[EngineRequest]
    _decoding: dict[str, EngineRequest]
    _finish_heap: list[tuple[int, int, EngineRequest]]
    _awaiting_first: list[EngineRequest]
    _ctx_offset: int
    _kv_static: int
    _order: int
    _decode_tables: tuple[list[float], list[float]]

    @abstractmethod
    def can_admit_waiting(self) -> bool:
        """Whether the head of the waiting queue could be admitted now."""

    @abstractmethod
    def _insert_cache(self, request: EngineRequest) -> None:
        """Insert a computed prompt's blocks into the prefix cache."""

    @abstractmethod
    def _join_decode(self, request: EngineRequest, generated: int, ctx: int) -> None:
        """Move ``request`` into the decode batch."""

    @abstractmethod
    def _finish(self, request: EngineRequest, end_s: float) -> None:
        """Mark ``request`` finished at ``end_s``."""

    def plan_decode_run(  # noqa: C901
        self, now_s: float = math.nan, max_steps: int = 1 << 30, max_segments: int = 8
    ) -> DecodeRun | None:
        """The run of decode-only steps possible from now (``now_s``), or None when a general step is needed.

        Requests at the head of the waiting queue whose KV arrived by transfer (``kv_ready``) are admitted into
        the decode batch first, as a general step would (their first token is the run's first step). A run then
        needs a non-empty decode batch, no prefill in progress and a waiting queue that cannot be admitted now (it
        stays so while the batch does not change: free KV only shrinks). With an empty waiting queue the run
        continues through completions (a new segment per completion, up to ``max_segments``); otherwise it ends
        at the first completion. It also ends where the next step's KV would not fit.
        """
        if self._prefilling:
            return None
        decoding = self._decoding
        waiting = self._waiting
        if waiting:
            max_seqs = self.config.max_num_seqs
            while waiting and waiting[0].kv_ready and len(decoding) < max_seqs:
                head = waiting[0]
                batch = len(decoding)
                free = self.config.kv_capacity_tokens - self._kv_static - self._ctx_offset - batch * self.steps
                if free < head.prompt_tokens + 1 + batch:
                    break
                waiting.popleft()
                self._order += 1
                head._order = self._order
                head.first_scheduled_s = now_s
                head.num_computed = head.prompt_tokens
                if head.hash_ids:
                    self._insert_cache(head)
                self._join_decode(head, 0, head.prompt_tokens)
                self._awaiting_first.append(head)
            if waiting and self.can_admit_waiting():
                return None
        if not decoding:
            return None
        heap = self._finish_heap
        pop = heapq.heappop
        steps0 = self.steps
        batch = len(decoding)
        ctx = self._ctx_offset + batch * steps0
        free = self.config.kv_capacity_tokens - self._kv_static - ctx
        a_table, k_table = self._decode_tables
        end_steps: list[int] = []
        end_times: list[float] = []
        seg_a: list[float] = []
        seg_k: list[float] = []
        seg_b: list[int] = []
        seg_c: list[int] = []
        seg_after: list[int] = []
        seg_finished: list[int] = []
        finishers: list[tuple[int, int, EngineRequest]] = []
        finish_times: list[float] = []
        done = 0
        elapsed = 0.0
        while True:
            while heap and (
                heap[0][2].phase != Phase.DECODING
                or heap[0][2].finish_step != heap[0][0]
                or heap[0][2]._order != heap[0][1]
            ):
                pop(heap)
            to_finish = heap[0][0] - steps0 - done if heap else max_steps
            length = min(to_finish, free // batch, max_steps - done)
            if length <= 0:
                break
            if batch < len(a_table):
                a, k = a_table[batch], k_table[batch]
            else:
                a, k = self.model.decode_coefficients(batch)
            elapsed += length * a + k * (length * ctx + batch * length * (length - 1) / 2.0)
            done += length
            end_steps.append(done)
            end_times.append(elapsed)
            seg_a.append(a)
            seg_k.append(k)
            seg_b.append(batch)
            seg_c.append(ctx)
            ctx += batch * length
            free -= batch * length
            if length < to_finish:
                seg_after.append(ctx)
                seg_finished.append(len(finishers))
                break
            finish_step = steps0 + done
            while heap and heap[0][0] == finish_step:
                entry = pop(heap)
                request = entry[2]
                if request.phase != Phase.DECODING or request.finish_step != finish_step or request._order != entry[1]:
                    continue
                finishers.append(entry)
                finish_times.append(elapsed)
                batch -= 1
                held = request.ctx_at_join + finish_step - request.join_step
                ctx -= held
                free += held
            seg_after.append(ctx)
            seg_finished.append(len(finishers))
            if waiting or batch == 0 or len(end_steps) >= max_segments:
                break
        if done < 1:
            for entry in finishers:
                heapq.heappush(heap, entry)
            return None
        run = DecodeRun()
        run.end_steps = end_steps
        run.end_times_s = end_times
        run.seg_a = seg_a
        run.seg_k = seg_k
        run.seg_b = seg_b
        run.seg_c = seg_c
        run.finishers = finishers
        run.seg_after = seg_after
        run.seg_finished = seg_finished
        run.finish_times_s = finish_times
        run.num_steps = done
        run.duration_s = elapsed
        return run

    @staticmethod
    def steps_covering(run: DecodeRun, elapsed_s: float) -> int:
        """The number of steps of ``run`` that have started by ``elapsed_s`` (at least 1, at most the run)."""
        if elapsed_s <= 0:
            return 1
        times = run.end_times_s
        i = bisect.bisect_left(times, elapsed_s)
        if i >= len(times):
            return run.num_steps
        base_steps = run.end_steps[i - 1] if i else 0
        local = elapsed_s - (times[i - 1] if i else 0.0)
        k, b = run.seg_k[i], run.seg_b[i]
        qa = k * b / 2.0
        qb = run.seg_a[i] + k * run.seg_c[i] - qa
        root = (-qb + math.sqrt(qb * qb + 4.0 * qa * local)) / (2.0 * qa) if qa > 0 else local / qb
        n = min(max(base_steps + math.ceil(root - 1e-9), base_steps + 1), run.end_steps[i])
        while n > 1 and run.time_after_s(n - 1) >= elapsed_s:
            n -= 1
        while n < run.num_steps and run.time_after_s(n) < elapsed_s:
            n += 1
        return min(n, run.num_steps)

    @staticmethod
    def run_done_steps(run: DecodeRun, elapsed_s: float) -> int:
        """The number of steps of ``run`` completed by ``elapsed_s`` after its start (0 to the whole run)."""
        times = run.end_times_s
        i = bisect.bisect_right(times, elapsed_s) if len(times) > 1 else (1 if times[0] <= elapsed_s else 0)
        if i >= len(times):
            return run.num_steps
        # completed steps inside segment i: the largest m with m a + k (m c + b m (m - 1) / 2) <= local time
        base = run.end_steps[i - 1] if i else 0
        local = elapsed_s - (times[i - 1] if i else 0.0)
        a, k, b, c = run.seg_a[i], run.seg_k[i], run.seg_b[i], run.seg_c[i]
        qa = k * b / 2.0
        qb = a + k * c - qa
        m = int((-qb + math.sqrt(qb * qb + 4.0 * qa * local)) / (2.0 * qa)) if qa > 0 else int(local / qb)
        length = run.end_steps[i] - base
        m = min(max(m, 0), length)
        while m > 0 and run.segment_time_s(i, m) > local:
            m -= 1
        while m < length and run.segment_time_s(i, m + 1) <= local:
            m += 1
        return base + m

    def run_running(self, run: DecodeRun, elapsed_s: float) -> int:
        """Running requests after the steps of ``run`` completed by ``elapsed_s`` (the first half of :meth:`run_view`).

        Equal to ``run_view(run, elapsed_s)[0]`` without the exact step count: requests finish only at segment
        ends, so those of the segments whose end time has passed are finished and those of later segments are not.
        Those at the end of the current segment are finished when :meth:`run_done_steps` would count the whole
        segment, that is when its ``length`` steps fit in the time spent in it (the step-time formula is monotone
        in floating point too, so this one evaluation decides it).
        """
        running = len(self._decoding) + len(self._prefilling)
        if not run.finishers:  # none planned, or the run was committed
            return running
        finished = run.seg_finished
        times = run.end_times_s
        i = bisect.bisect_right(times, elapsed_s)
        if i >= len(times):
            return running - finished[-1]
        before = finished[i - 1] if i else 0
        if finished[i] > before:
            ends = run.end_steps
            length = ends[i] - (ends[i - 1] if i else 0)
            if run.segment_time_s(i, length) <= elapsed_s - (times[i - 1] if i else 0.0):
                return running - finished[i]
        return running - before

    @staticmethod
    def run_context_tokens(run: DecodeRun, elapsed_s: float) -> int:
        """Context tokens of the decode batch after the steps of ``run`` completed by ``elapsed_s``.

        It depends on the run alone (not on the engine's later state). The KV tokens an observer sees are the
        engine's static KV (prompts pinned for transfer, prefills) plus this.
        """
        done = DecodeRuns.run_done_steps(run, elapsed_s)
        if done <= 0:
            return run.seg_c[0]
        ends = run.end_steps
        i = bisect.bisect_left(ends, done)
        if i < len(ends) and ends[i] == done:
            return run.seg_after[i]
        base = ends[i - 1] if i else 0
        return run.seg_c[i] + run.seg_b[i] * (done - base)

    def run_view(self, run: DecodeRun, elapsed_s: float) -> tuple[int, int]:
        """``(running requests, KV tokens used)`` after the steps of ``run`` completed by ``elapsed_s``.

        The engine's own counters stay at the run's start until it is committed; this is what an observer (the
        router, a metrics scrape) sees in the middle of a run.
        """
        return self.run_running(run, elapsed_s), self._kv_static + self.run_context_tokens(run, elapsed_s)

    def commit_decode_run(self, run: DecodeRun, num_steps: int, start_s: float) -> list[EngineRequest]:
        """Apply the first ``num_steps`` steps of ``run`` (planned at ``start_s``); returns finished requests."""
        n = min(num_steps, run.num_steps)
        steps0 = self.steps
        counters = self.counters
        previous = 0
        for i, end in enumerate(run.end_steps):
            length = min(end, n) - previous
            if length <= 0:
                break
            b = run.seg_b[i]
            counters.observe_run(run.seg_a[i] + run.seg_k[i] * run.seg_c[i], run.seg_k[i] * b, length, b)
            previous = end
        self.steps = steps0 + n
        if self._awaiting_first:
            first_token_s = start_s + run.time_after_s(1)
            for request in self._awaiting_first:
                request.first_token_s = first_token_s
            self._awaiting_first.clear()
        finished: list[EngineRequest] = []
        heap = self._finish_heap
        for entry in run.finishers:
            request = entry[2]
            if entry[0] > steps0 + n:
                heapq.heappush(heap, entry)
                continue
            self._ctx_offset -= request.ctx_at_join - request.join_step
            del self._decoding[request.request_id]
            request.generated = request.output_tokens
            self._finish(request, start_s + run.time_after_s(entry[0] - steps0))
            finished.append(request)
        run.finishers = []
        return finished
