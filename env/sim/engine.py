"""One inference instance's engine: a vLLM-V1-like scheduler over a performance model.

This is the single copy of the per-instance scheduling logic. The discrete-event simulator
(:mod:`env.sim.simulator`) drives it in simulated time; the emulator drives it from a real-time loop. Both use
the same calls, so a policy sees the same engine behaviour in training, evaluation and emulation.

Scheduling (one *step* = one forward pass), following vLLM V1:

* **Continuous batching.** Every step first gives one token to each decoding sequence (decode first), then
  continues running prefills in admission order (chunked prefill within ``max_num_batched_tokens``), then admits
  waiting requests first-come-first-served while the token budget, ``max_num_seqs`` and KV capacity allow.
* **Prefix cache.** On first admission a request's prompt block hashes are looked up in an LRU cache of blocks
  (``hash_ids`` with ``hash_block_tokens`` tokens each); the longest cached prefix is skipped (at least the last
  prompt token is always computed). Finished prompts insert their blocks. Cached blocks live in free KV space
  and are evicted LRU-first when running requests need it.
* **KV accounting** in tokens: a prefilling request holds its computed tokens, a decoding request its context,
  a *prefill-only* request (remote prefill) holds its prompt until :meth:`InstanceEngine.release`.
* **Preemption by recompute.** When the next step's KV does not fit, the most recently admitted running request
  is preempted: its KV is freed and it goes back to the front of the waiting queue; when rescheduled it
  recomputes its prompt plus the tokens it had generated, then continues. A step that preempted admits no waiting
  request. The victim's full blocks stay in the prefix cache (its last block evicted first), so its recompute
  skips what is still cached, as vLLM's block-hash cache does for a preempted request.
* **Request kinds.** ``prefill_only`` (on a prefill instance: finishes after its prefill, emitting its one
  token, KV pinned for the transfer); ``kv_ready`` (on a decode instance: KV arrived by transfer, joins the decode
  batch directly and emits its first token in that step); otherwise aggregated (local prefill then decode).

Emulator-facing API (step at a time)::

    engine = InstanceEngine(config, model)            # model: env.perf ExecutionTimeModel
    engine.add_request(EngineRequest(...), now_s)     # queue a request
    result = engine.step(now_s, report_tokens=True)   # None when idle; else StepResult
    #   result.duration_s: the step's execution time; the step ends at result.end_s
    #   result.emitted: request ids that received one token in this step
    #   result.first_token: ids whose first token this is; result.prefill_done: prefill-only ids now pinned
    #   result.finished: EngineRequest objects that completed (timestamps filled)
    engine.release(request_id)                        # free a prefill-only request's pinned KV
    engine.abort(request_id)                          # drop a request wherever it is
    engine.prefix_hit_tokens(hash_ids, block_tokens, prompt_tokens)  # cache query without side effects
    engine.kv_usage_frac, engine.num_running, engine.num_waiting, engine.queued_prefill_tokens

Fast path (simulator only): closed-form runs of decode-only steps, :mod:`env.sim.decode_runs`. The engine's
data types (configuration, requests, step results) are :mod:`env.sim.engine_types`.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Sequence

from env.perf.model import ExecutionTimeModel
from env.sim.decode_runs import DecodeRun, DecodeRuns
from env.sim.engine_types import EngineConfig, EngineRequest, Phase, StepResult
from env.sim.telemetry import InstanceCounters

__all__ = [
    "DecodeRun",
    "EngineConfig",
    "EngineRequest",
    "InstanceEngine",
    "Phase",
    "StepResult",
]


class InstanceEngine(DecodeRuns):
    """Scheduler state of one instance (see the module docstring for the rules and the API)."""

    def __init__(self, config: EngineConfig, model: ExecutionTimeModel, counters: InstanceCounters | None = None):
        self.config = config
        self.model = model
        self.counters = counters if counters is not None else InstanceCounters()
        self.steps = 0
        self._waiting: deque[EngineRequest] = deque()
        self._prefilling: list[EngineRequest] = []
        self._decoding: dict[str, EngineRequest] = {}
        self._pinned: dict[str, EngineRequest] = {}
        self._finish_heap: list[tuple[int, int, EngineRequest]] = []
        self._awaiting_first: list[EngineRequest] = []
        self._ctx_offset = 0
        self._kv_static = 0
        self._queued_prefill = 0
        self._order = 0
        # prefix-cache blocks in free KV space, LRU first: a workload's shared-prefix hash ids (int), and the blocks
        # a preempted request had computed beyond them, keyed (request id, block index)
        self._cache: OrderedDict[int | tuple[str, int], int] = OrderedDict()
        self._cache_tokens = 0
        self._by_id: dict[str, EngineRequest] = {}
        coefficients = [model.decode_coefficients(b) for b in range(config.max_num_seqs + 1)]
        self._decode_tables = ([a for a, _ in coefficients], [k for _, k in coefficients])

    # ------------------------------------------------------------------------------------------------ queries

    @property
    def num_decoding(self) -> int:
        """Requests in the decode batch."""
        return len(self._decoding)

    @property
    def num_running(self) -> int:
        """Running requests (prefilling plus decoding), as ``vllm:num_requests_running``."""
        return len(self._decoding) + len(self._prefilling)

    @property
    def num_waiting(self) -> int:
        """Waiting requests, as ``vllm:num_requests_waiting``."""
        return len(self._waiting)

    @property
    def num_pinned(self) -> int:
        """Prefill-only requests holding KV for a transfer."""
        return len(self._pinned)

    @property
    def queued_prefill_tokens(self) -> int:
        """Prompt tokens still to compute (waiting plus running prefills)."""
        return self._queued_prefill

    @property
    def context_tokens(self) -> int:
        """Total context of the decode batch."""
        return self._ctx_offset + len(self._decoding) * self.steps

    @property
    def kv_used_tokens(self) -> int:
        """KV tokens held by running and pinned requests."""
        return self._kv_static + self.context_tokens

    @property
    def kv_usage_frac(self) -> float:
        """KV usage 0-1, as ``vllm:kv_cache_usage_perc``."""
        return min(self.kv_used_tokens / self.config.kv_capacity_tokens, 1.0)

    @property
    def is_idle(self) -> bool:
        """No work to schedule (pinned KV may remain)."""
        return not (self._waiting or self._prefilling or self._decoding)

    @property
    def is_empty(self) -> bool:
        """Nothing held at all: safe to stop or change role."""
        return self.is_idle and not self._pinned

    def generated_tokens(self, request: EngineRequest) -> int:
        """Output tokens emitted so far by ``request``."""
        if request.phase == Phase.DECODING:
            return request.gen_at_join + self.steps - request.join_step
        return request.generated

    def prefix_hit_tokens(self, hash_ids: Sequence[int], block_tokens: int, prompt_tokens: int) -> int:
        """Prompt tokens this instance's prefix cache would supply (no side effects)."""
        if not hash_ids or not self.config.enable_prefix_caching:
            return 0
        cache = self._cache
        hits = 0
        for h in hash_ids:
            if h not in cache:
                break
            hits += 1
        return min(hits * block_tokens, prompt_tokens - 1)

    def get(self, request_id: str) -> EngineRequest | None:
        """The request with this id, if the engine holds it."""
        return self._by_id.get(request_id)

    # ------------------------------------------------------------------------------------------------ changes

    def add_request(self, request: EngineRequest, now_s: float) -> None:
        """Queue a request (it is considered from the next step on)."""
        if request.request_id in self._by_id:
            raise ValueError(f"request {request.request_id} is already in this engine")
        request.phase = Phase.WAITING
        request.queued_s = now_s
        self._order += 1
        request._order = self._order
        self._waiting.append(request)
        self._by_id[request.request_id] = request
        if not request.kv_ready:
            self._queued_prefill += request.prompt_tokens

    def release(self, request_id: str) -> None:
        """Free the pinned KV of a prefill-only request (after its transfer, or when abandoned)."""
        request = self._pinned.pop(request_id, None)
        if request is None:
            return
        self._kv_static -= request.num_computed
        request.phase = Phase.FINISHED
        del self._by_id[request_id]

    def abort(self, request_id: str) -> EngineRequest | None:
        """Remove a request wherever it is; returns it (or None when unknown)."""
        request = self._by_id.pop(request_id, None)
        if request is None:
            return None
        phase = request.phase
        if phase == Phase.WAITING:
            self._waiting.remove(request)
            if not request.kv_ready:
                self._queued_prefill -= request.prompt_tokens + request.generated - request.num_computed
        elif phase == Phase.PREFILLING:
            self._prefilling.remove(request)
            self._kv_static -= request.num_computed
            self._queued_prefill -= self._prefill_target(request) - request.num_computed
        elif phase == Phase.DECODING:
            self._leave_decode(request)
        elif phase == Phase.PINNED:
            self._pinned.pop(request_id, None)
            self._kv_static -= request.num_computed
        request.phase = Phase.ABORTED
        return request

    # ------------------------------------------------------------------------------------------------ internals

    @staticmethod
    def _prefill_target(request: EngineRequest) -> int:
        # After a preemption the request recomputes its prompt plus what it had generated.
        return request.prompt_tokens + request.generated

    def _join_decode(self, request: EngineRequest, generated: int, ctx: int) -> None:
        request.phase = Phase.DECODING
        request.gen_at_join = generated
        request.ctx_at_join = ctx
        request.join_step = self.steps
        request.finish_step = self.steps + request.output_tokens - generated
        self._ctx_offset += ctx - self.steps
        self._decoding[request.request_id] = request
        heapq.heappush(self._finish_heap, (request.finish_step, request._order, request))

    def _leave_decode(self, request: EngineRequest) -> None:
        request.generated = request.gen_at_join + self.steps - request.join_step
        self._ctx_offset -= request.ctx_at_join - request.join_step
        del self._decoding[request.request_id]
        # heap entry removed lazily

    def _preempt_one(self, result: StepResult | None) -> bool:
        """Preempt the most recently admitted running request; False when none."""
        victim: EngineRequest | None = None
        for request in self._prefilling:
            if victim is None or request._order > victim._order:
                victim = request
        for request in self._decoding.values():
            if victim is None or request._order > victim._order:
                victim = request
        if victim is None:
            return False
        computed_tokens = victim.num_computed
        if victim.phase == Phase.PREFILLING:
            self._prefilling.remove(victim)
            self._kv_static -= victim.num_computed
            self._queued_prefill -= self._prefill_target(victim) - victim.num_computed
        else:
            self._leave_decode(victim)
            computed_tokens = victim.prompt_tokens + victim.generated
        self._cache_preempted(victim, computed_tokens)
        victim.phase = Phase.WAITING
        victim.kv_ready = False
        victim.num_computed = 0
        victim.num_preemptions += 1
        self._queued_prefill += self._prefill_target(victim)
        self._waiting.appendleft(victim)
        self.counters.num_preemptions += 1
        if result is not None:
            result.preempted.append(victim.request_id)
        return True

    def _free_tokens(self) -> int:
        return self.config.kv_capacity_tokens - self._kv_static - self.context_tokens

    def _evict_cache(self, free_tokens: int) -> None:
        cache = self._cache
        while cache and (self._cache_tokens > free_tokens or len(cache) > self.config.max_cached_blocks):
            _, tokens = cache.popitem(last=False)
            self._cache_tokens -= tokens

    def _lookup_cache(self, request: EngineRequest) -> int:
        """Tokens of ``request``'s prefill the cache supplies (at least the last token is always computed).

        First its shared prefix; after a preemption, then the blocks it had computed itself.
        """
        if not self.config.enable_prefix_caching:
            return 0
        cache = self._cache
        hits = 0
        for h in request.hash_ids:
            if h not in cache:
                break
            cache.move_to_end(h)
            hits += 1
        if not request.num_preemptions or hits < self._shared_blocks(request):
            return min(hits * request.hash_block_tokens, request.prompt_tokens - 1)
        own = 0
        while (request.request_id, hits + own) in cache:
            own += 1
        return min((hits + own) * request.hash_block_tokens, request.prompt_tokens + request.generated - 1)

    @staticmethod
    def _shared_blocks(request: EngineRequest) -> int:
        """The prompt's full blocks that the workload's shared-prefix hash ids name."""
        if not request.hash_ids:
            return 0
        return min(len(request.hash_ids), request.prompt_tokens // request.hash_block_tokens)

    def _cache_preempted(self, victim: EngineRequest, computed_tokens: int) -> None:
        """Keep the full blocks a preempted request had computed as cached blocks in free KV space.

        As vLLM's prefix cache keeps freed blocks until their space is reused, the request's recompute after
        readmission starts from whatever of them is still cached. Its last block is the first evicted.
        """
        if not self.config.enable_prefix_caching:
            return
        block = victim.hash_block_tokens
        full = computed_tokens // block
        shared = min(self._shared_blocks(victim), full)
        cache = self._cache
        for k in range(full - 1, shared - 1, -1):
            key = (victim.request_id, k)
            if key not in cache:
                cache[key] = block
                self._cache_tokens += block
        for h in reversed(victim.hash_ids[:shared]):
            if h in cache:
                cache.move_to_end(h)
            else:
                cache[h] = block
                self._cache_tokens += block

    def _claim_own_blocks(self, request: EngineRequest, hit_tokens: int) -> None:
        """Drop from the cache the blocks a readmitted request computed itself: they are its KV again."""
        cache = self._cache
        block = request.hash_block_tokens
        for k in range(self._shared_blocks(request), hit_tokens // block + 1):
            tokens = cache.pop((request.request_id, k), None)
            if tokens is not None:
                self._cache_tokens -= tokens

    def _insert_cache(self, request: EngineRequest) -> None:
        if not request.hash_ids or not self.config.enable_prefix_caching:
            return
        cache = self._cache
        full_blocks = min(len(request.hash_ids), request.prompt_tokens // request.hash_block_tokens)
        for h in request.hash_ids[:full_blocks]:
            if h in cache:
                cache.move_to_end(h)
            else:
                cache[h] = request.hash_block_tokens
                self._cache_tokens += request.hash_block_tokens

    def can_admit_waiting(self) -> bool:
        """Whether the head of the waiting queue could be admitted at the next step."""
        waiting = self._waiting
        if not waiting or len(self._decoding) + len(self._prefilling) >= self.config.max_num_seqs:
            return False
        head = waiting[0]
        need = head.prompt_tokens if head.kv_ready else 1
        batch = len(self._decoding)
        free = self.config.kv_capacity_tokens - self._kv_static - self._ctx_offset - batch * self.steps
        return free >= need + batch

    # ------------------------------------------------------------------------------------------------ stepping

    def step(self, now_s: float, report_tokens: bool = False) -> StepResult | None:  # noqa: C901
        """Schedule and execute one step starting at ``now_s``; None when there is nothing to run.

        The engine's state is advanced to the end of the step at once; timestamps are the step's end.
        """
        decoding = self._decoding
        prefilling = self._prefilling
        waiting = self._waiting
        if not (waiting or prefilling or decoding):
            return None
        cfg = self.config
        capacity = cfg.kv_capacity_tokens
        result = StepResult(now_s, 0.0, 0, 0, 0)
        if self._cache:
            self._evict_cache(max(self._free_tokens(), 0))
        # 1. Decodes first: each needs one more KV slot.
        while decoding and self._free_tokens() < len(decoding):
            if not self._preempt_one(result):
                break
        batch = len(decoding)
        budget = cfg.max_num_batched_tokens - batch
        # free KV after this step's decode tokens; kept up to date locally below
        free = capacity - self._kv_static - self._ctx_offset - batch * self.steps - batch
        chunks: list[tuple[EngineRequest, int]] = []
        completing: list[EngineRequest] = []
        prefill_tokens = 0
        # 2. Running prefills continue (chunked within the budget), in admission order.
        index = 0
        while index < len(prefilling) and budget > 0:
            request = prefilling[index]
            target = request.prompt_tokens + request.generated
            need = target - request.num_computed
            if need > budget:
                need = budget
            if free < need:
                while self._free_tokens() - len(decoding) - prefill_tokens < need:
                    if not self._preempt_one(result) or request.phase != Phase.PREFILLING:
                        break
                batch = len(decoding)
                budget = cfg.max_num_batched_tokens - batch - prefill_tokens
                free = self._free_tokens() - batch - prefill_tokens
                if request.phase != Phase.PREFILLING:
                    continue  # it was the most recent and preempted itself; the list shrank
                need = min(need, free, budget)
                if need <= 0:
                    break
            chunks.append((request, need))
            if request.num_computed + need >= target:
                completing.append(request)
            budget -= need
            free -= need
            prefill_tokens += need
            index += 1
        # 3. Admit waiting requests first-come-first-served (never preempting for them), and none in a step that
        # has preempted (vLLM V1 does the same): the victim went back to the head of the queue, and admitting it in
        # the step that freed its KV would only have it preempt again.
        joined: list[EngineRequest] | None = None
        running = batch + len(prefilling)
        max_seqs = cfg.max_num_seqs
        while waiting and budget > 0 and running < max_seqs and not result.preempted:
            head = waiting[0]
            if head.kv_ready:
                if free < head.prompt_tokens + 1:
                    break
                waiting.popleft()
                self._order += 1
                head._order = self._order
                head.first_scheduled_s = now_s
                head.num_computed = head.prompt_tokens
                if head.hash_ids:
                    self._insert_cache(head)
                if joined is None:
                    joined = []
                joined.append(head)
                budget -= 1
                free -= head.prompt_tokens + 1
                running += 1
                continue
            hit = self._lookup_cache(head) if head.hash_ids or head.num_preemptions else 0
            target = head.prompt_tokens + head.generated
            need = target - hit
            if need > budget:
                need = budget
            if need > free - hit:
                need = free - hit
            if need <= 0:
                break
            waiting.popleft()
            if head.num_preemptions:
                self._claim_own_blocks(head, hit)
            self._order += 1
            head._order = self._order
            if head.cached_tokens < 0:
                head.cached_tokens = hit
                counters = self.counters
                counters.prefix_cache_queries += head.prompt_tokens
                counters.prefix_cache_hits += hit
            head.num_computed = hit
            self._kv_static += hit
            self._queued_prefill -= hit
            head.phase = Phase.PREFILLING
            if head.first_scheduled_s != head.first_scheduled_s:  # NaN: first time
                head.first_scheduled_s = now_s
            prefilling.append(head)
            chunks.append((head, need))
            if hit + need >= target:
                completing.append(head)
            budget -= need
            free -= need + hit
            prefill_tokens += need
            running += 1
        if joined is not None:
            for request in joined:
                self._join_decode(request, 0, request.prompt_tokens)
                self._awaiting_first.append(request)
            batch = len(decoding)

        num_tokens = batch + prefill_tokens
        if num_tokens == 0:
            return None
        duration = self.model.step_time_s(
            num_tokens,
            batch + len(completing),
            batch,
            self._ctx_offset + batch * self.steps,
            [(n, r.num_computed) for r, n in chunks],
        )
        end_s = now_s + duration
        result.duration_s = duration
        result.num_tokens = num_tokens
        result.decode_batch = batch
        result.prefill_tokens = prefill_tokens
        if report_tokens:
            result.emitted.extend(decoding)

        # Apply: prefill progress.
        for request, n in chunks:
            request.num_computed += n
        self._kv_static += prefill_tokens
        self._queued_prefill -= prefill_tokens
        self.steps += 1
        counters = self.counters
        counters.observe_step(duration, batch, num_tokens)
        if self._awaiting_first:
            for request in self._awaiting_first:
                request.first_token_s = end_s
                result.first_token.append(request.request_id)
            self._awaiting_first.clear()
        for request in completing:
            prefilling.remove(request)
            self._kv_static -= request.num_computed
            request.prefill_done_s = end_s
            counters.prompt_tokens += request.prompt_tokens
            counters.prompt_tokens_computed += request.prompt_tokens - max(request.cached_tokens, 0)
            if request.hash_ids:
                self._insert_cache(request)
            if report_tokens:
                result.emitted.append(request.request_id)
            if request.first_token_s != request.first_token_s:  # NaN: first token now
                request.first_token_s = end_s
                result.first_token.append(request.request_id)
            if request.prefill_only:
                request.phase = Phase.PINNED
                request.generated = 1
                self._kv_static += request.num_computed
                self._pinned[request.request_id] = request
                counters.generation_tokens += 1
                result.prefill_done.append(request)
                continue
            generated = request.generated + 1
            if generated >= request.output_tokens:
                request.generated = generated
                self._finish(request, end_s)
                result.finished.append(request)
            else:
                self._join_decode(request, generated, request.num_computed)
        if self._finish_heap and self._finish_heap[0][0] <= self.steps:
            self._pop_finished(end_s, result.finished)
        return result

    def _finish(self, request: EngineRequest, end_s: float) -> None:
        request.phase = Phase.FINISHED
        request.finished_s = end_s
        self.counters.generation_tokens += request.output_tokens
        self.counters.request_success += 1
        self._by_id.pop(request.request_id, None)

    def _pop_finished(self, end_s: float, out: list[EngineRequest]) -> None:
        heap = self._finish_heap
        steps = self.steps
        while heap and heap[0][0] <= steps:
            finish_step, order, request = heapq.heappop(heap)
            if request.phase != Phase.DECODING or request.finish_step != finish_step or request._order != order:
                continue  # stale entry (preempted or aborted; a re-admitted request has a new order)
            self._leave_decode(request)
            self._finish(request, end_s)
            out.append(request)
