"""Relaying an upstream SSE stream to the client, and vLLM-style error events.

The relay copies bytes as they arrive (no re-framing); it only counts events (``data: `` prefixes) for the
output-token count and notes the time of the last chunk for TPOT. A failure after the stream began ends it with
``data: {"error": ...}`` and ``data: [DONE]`` (vLLM's mid-stream error shape), so a client never hangs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import ClientResponse, web

__all__ = ["RelayResult", "error_body", "is_error_event", "relay", "sse_error_event"]

_DATA = b"data: "
_ERROR_PREFIX = b'data: {"error"'
_DONE = b"data: [DONE]"


def error_body(status: int, message: str, kind: str = "InternalServerError") -> bytes:
    """The error JSON of vLLM."""
    return json.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, separators=(",", ":")
    ).encode()


def sse_error_event(status: int, message: str, kind: str = "InternalServerError") -> bytes:
    """A mid-stream error event followed by the terminator."""
    return b"data: " + error_body(status, message, kind) + b"\n\ndata: [DONE]\n\n"


def is_error_event(chunk: bytes) -> bool:
    """Whether a stream's first chunk is an error event (the upstream failed before producing a token)."""
    return chunk.lstrip().startswith(_ERROR_PREFIX)


@dataclass(slots=True)
class RelayResult:
    """How a relayed stream ended."""

    events: int
    last_chunk_s: float
    done: bool
    upstream_error: str | None = None
    client_gone: bool = False


async def relay(
    upstream: ClientResponse,
    downstream: web.StreamResponse,
    first_chunk: bytes,
    clock: Callable[[], float],
) -> RelayResult:
    """Copy ``first_chunk`` and the rest of ``upstream`` to ``downstream``.

    Args:
        upstream: the decode instance's streaming response (its first chunk already read).
        downstream: the prepared client response.
        first_chunk: the first chunk read from ``upstream``.
        clock: a zero-argument callable returning seconds (the event loop's ``time``).
    """
    now = clock  # local alias: called once per chunk
    events = first_chunk.count(_DATA)
    done = _DONE in first_chunk
    last_s: float = now()
    try:
        await downstream.write(first_chunk)
    except ConnectionError:
        return RelayResult(events, last_s, done, client_gone=True)
    content = upstream.content
    try:
        while True:
            chunk = await content.readany()
            if not chunk:
                break
            last_s = now()
            events += chunk.count(_DATA)
            if not done and _DONE in chunk:
                done = True
            try:
                await downstream.write(chunk)
            except ConnectionError:
                return RelayResult(events, last_s, done, client_gone=True)
    except Exception as exc:  # any upstream failure ends the stream with an error event
        return RelayResult(events, last_s, done, upstream_error=f"{type(exc).__name__}: {exc}")
    if not done:
        return RelayResult(events, last_s, done, upstream_error="upstream closed the stream before [DONE]")
    return RelayResult(events, last_s, done)
