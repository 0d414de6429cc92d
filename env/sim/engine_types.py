"""The instance engine's data types: configuration, request phases, requests, step results.

Plain data for :class:`env.sim.engine.InstanceEngine` (which re-exports them as its API) and its callers: the
simulator and the emulator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EngineConfig", "EngineRequest", "Phase", "StepResult"]


class Phase:
    """Request phases inside an engine (small ints for speed)."""

    WAITING = 0
    PREFILLING = 1
    DECODING = 2
    PINNED = 3
    """Prefill-only request done; its KV is held until released."""
    FINISHED = 4
    ABORTED = 5


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Static configuration of one instance's engine.

    Attributes:
        kv_capacity_tokens: KV-cache capacity in tokens.
        max_num_seqs: maximum running requests (prefilling plus decoding).
        max_num_batched_tokens: token budget of one step.
        enable_prefix_caching: look up and insert prompt blocks.
        max_cached_blocks: cap on prefix-cache entries (bounds memory of the simulation itself).
    """

    kv_capacity_tokens: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    max_cached_blocks: int = 200_000

    def __post_init__(self) -> None:
        if self.kv_capacity_tokens < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("kv_capacity_tokens, max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs (every decode needs a token)")


class EngineRequest:
    """One request inside an engine, with its progress and timestamps (seconds).

    Construct with the request's shape; the engine fills the rest. ``tag`` is the caller's payload.
    """

    __slots__ = (
        "_order",
        "cached_tokens",
        "ctx_at_join",
        "finish_step",
        "finished_s",
        "first_scheduled_s",
        "first_token_s",
        "gen_at_join",
        "generated",
        "hash_block_tokens",
        "hash_ids",
        "join_step",
        "kv_ready",
        "num_computed",
        "num_preemptions",
        "output_tokens",
        "phase",
        "prefill_done_s",
        "prefill_only",
        "prompt_tokens",
        "queued_s",
        "request_id",
        "tag",
    )

    def __init__(
        self,
        request_id: str,
        prompt_tokens: int,
        output_tokens: int,
        hash_ids: Sequence[int] = (),
        hash_block_tokens: int = 512,
        prefill_only: bool = False,
        kv_ready: bool = False,
        tag: Any = None,
    ) -> None:
        if prompt_tokens < 1:
            raise ValueError(f"request {request_id}: prompt_tokens must be >= 1")
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.output_tokens = 1 if prefill_only else max(output_tokens, 1)
        self.hash_ids = hash_ids
        self.hash_block_tokens = hash_block_tokens
        self.prefill_only = prefill_only
        self.kv_ready = kv_ready
        self.tag = tag
        self.phase = Phase.WAITING
        self.num_computed = 0
        self.cached_tokens = -1
        self.generated = 0
        self.gen_at_join = 0
        self.ctx_at_join = 0
        self.join_step = 0
        self.finish_step = 0
        self.num_preemptions = 0
        self.queued_s = math.nan
        self.first_scheduled_s = math.nan
        self.prefill_done_s = math.nan
        self.first_token_s = math.nan
        self.finished_s = math.nan
        self._order = 0

    def __repr__(self) -> str:
        return (
            f"EngineRequest({self.request_id!r}, prompt={self.prompt_tokens}, out={self.output_tokens}, "
            f"phase={self.phase}, generated={self.generated})"
        )


@dataclass(slots=True)
class StepResult:
    """Outcome of one engine step.

    Attributes:
        start_s: when the step started.
        duration_s: its execution time.
        num_tokens: tokens scheduled.
        decode_batch: decoding sequences in the step.
        prefill_tokens: prefill-chunk tokens in the step.
        emitted: ids that received one output token (only with ``report_tokens``).
        first_token: ids whose first token was emitted in this step.
        prefill_done: prefill-only requests whose prefill completed (KV now pinned).
        finished: requests that completed.
        preempted: ids preempted before the step.
    """

    start_s: float
    duration_s: float
    num_tokens: int
    decode_batch: int
    prefill_tokens: int
    emitted: list[str] = field(default_factory=list)
    first_token: list[str] = field(default_factory=list)
    prefill_done: list[EngineRequest] = field(default_factory=list)
    finished: list[EngineRequest] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)

    @property
    def end_s(self) -> float:
        """When the step ends."""
        return self.start_s + self.duration_s
