"""Per-request records of the simulated cluster, with the stage names every part of pdctl uses.

A :class:`SimRequest` follows one request from arrival to completion. When it completes, its stages are
computed (seconds, docs/design.md names):

``request_queue_wait``
    arrival → first scheduled on the instance that prefills it.
``prefill_compute_time``
    first scheduled → prefill done (a re-prefill after a failed transfer adds its own compute).
``kv_cache_pack_time`` / ``kv_cache_transfer_time`` / ``kv_cache_unpack_time``
    the remote path's layout conversion, setup plus flow over the link, and unpack (0 for local prefill).
``decode_queue_wait``
    KV ready on the decode instance → scheduled there (remote path; 0 for local prefill); after a failed
    transfer, fallback → scheduled for the local re-prefill.
``first_token_emit_time``
    scheduled on the decode instance → first token (remote path: one forward pass; local: 0, the prefill step
    emits it).
``per_token_decode_time``
    (last token − first token) / (output tokens − 1); 0 for one-token outputs.
"""

from __future__ import annotations

import math
from typing import Any

from policies.schema import STAGES, RouteReason

__all__ = ["STAGES", "SimRequest"]


class SimRequest:
    """One request's journey through the simulated cluster (times in seconds of simulated time)."""

    __slots__ = (
        "arrival_s",
        "decode_instance",
        "decode_scheduled_s",
        "fallback_s",
        "finished_s",
        "first_token_s",
        "hash_ids",
        "index",
        "input_tokens",
        "kv_ready_s",
        "output_tokens",
        "pack_s",
        "prefill_alone",
        "prefill_compute_s",
        "prefill_instance",
        "prefill_sent_s",
        "queue_wait_s",
        "reason",
        "remote",
        "request_id",
        "retried",
        "status",
        "tenant",
        "transfer_bytes",
        "transfer_failures",
        "transfer_s",
        "unpack_s",
    )

    IN_FLIGHT = 0
    FINISHED = 1
    FAILED = 2

    def __init__(
        self,
        index: int,
        request_id: str,
        tenant: int,
        arrival_s: float,
        input_tokens: int,
        output_tokens: int,
        hash_ids: tuple[int, ...],
    ) -> None:
        self.index = index
        self.request_id = request_id
        self.tenant = tenant
        self.arrival_s = arrival_s
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.hash_ids = hash_ids
        self.remote = False
        self.reason: RouteReason = RouteReason.SHORT_PROMPT
        self.prefill_instance = -1
        self.decode_instance = -1
        self.status = SimRequest.IN_FLIGHT
        self.queue_wait_s = math.nan
        self.prefill_compute_s = 0.0
        self.pack_s = 0.0
        self.transfer_s = 0.0
        self.unpack_s = 0.0
        self.kv_ready_s = math.nan
        self.fallback_s = math.nan
        self.first_token_s = math.nan
        self.decode_scheduled_s = math.nan
        self.finished_s = math.nan
        self.transfer_bytes = 0.0
        self.transfer_failures = 0
        self.retried = False
        self.prefill_sent_s = math.nan
        self.prefill_alone = False

    @property
    def ttft_s(self) -> float:
        """Arrival → first token."""
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (0 for one-token outputs)."""
        if self.output_tokens <= 1:
            return 0.0
        return (self.finished_s - self.first_token_s) / (self.output_tokens - 1)

    def stages(self) -> dict[str, float]:
        """The docs/design.md stages of a finished request."""
        remote_decode = self.remote and not math.isnan(self.kv_ready_s)
        decode_queue = self.decode_scheduled_s - self.kv_ready_s if remote_decode else 0.0
        if not math.isnan(self.fallback_s):
            decode_queue = self.decode_scheduled_s - self.fallback_s
        emit = self.first_token_s - self.decode_scheduled_s if remote_decode else 0.0
        return {
            "request_queue_wait": self.queue_wait_s,
            "prefill_compute_time": self.prefill_compute_s,
            "kv_cache_pack_time": self.pack_s,
            "kv_cache_transfer_time": self.transfer_s,
            "kv_cache_unpack_time": self.unpack_s,
            "decode_queue_wait": max(decode_queue, 0.0),
            "first_token_emit_time": max(emit, 0.0),
            "per_token_decode_time": self.tpot_s,
        }

    def as_record(self, tenant_name: str) -> dict[str, Any]:
        """A flat JSON-friendly record."""
        record: dict[str, Any] = {
            "request_id": self.request_id,
            "tenant": tenant_name,
            "arrival_s": self.arrival_s,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "route": "remote_prefill" if self.remote else "local_prefill",
            "reason": self.reason.value,
            "prefill_worker": self.prefill_instance,
            "decode_worker": self.decode_instance,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "transfer_bytes": self.transfer_bytes,
            "transfer_failures": self.transfer_failures,
        }
        record.update(self.stages())
        return record
