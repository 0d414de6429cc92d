"""The request record every workload source produces and every consumer (simulator, emulator load) reads."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RequestSpec"]


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload, before it is served.

    Attributes:
        request_id: unique within the workload (stable across runs with the same seed).
        tenant: tenant name.
        arrival_s: arrival time, seconds from the start of the workload.
        input_tokens: prompt length in tokens.
        output_tokens: tokens to generate (the trace's output length or a sample).
        hash_ids: prefix-block hashes of the prompt (Mooncake style), or ``()`` when unknown.
        hash_block_tokens: tokens per entry of ``hash_ids`` (512 in the Mooncake trace).
        model: served model name the request asks for.
    """

    request_id: str
    tenant: str
    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    hash_block_tokens: int = 512
    model: str = ""
