"""Relaying an upstream SSE stream to the client, and vLLM-style error events.

The relay copies bytes as they arrive (no re-framing); it only counts events (``data: `` prefixes) for the
output-token count and notes the time of the last chunk for TPOT. A failure after the stream began ends it with
``data: {"error": ...}`` and ``data: [DONE]`` (vLLM's mid-stream error shape), so a client never hangs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import ClientError, ClientResponse, ClientTimeout, web

from router.config import TimeoutsConfig

__all__ = [
    "UPSTREAM_ERRORS",
    "RelayResult",
    "error_body",
    "is_error_event",
    "relay",
    "sse_error_event",
    "stream_client_timeout",
]

UPSTREAM_ERRORS = (ClientError, OSError, TimeoutError)
"""What a call to an instance raises when the instance cannot be reached or does not answer in time."""


def stream_client_timeout(timeouts: TimeoutsConfig) -> ClientTimeout:
    """The client timeout of a relayed stream: no total, a connect bound and the longest gap between chunks."""
    return ClientTimeout(total=None, sock_connect=timeouts.connect_s, sock_read=timeouts.stream_idle_s)


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
    """How a relayed stream ended (or, while it runs, how far it got).

    ``done``: ``[DONE]`` was read from the upstream; ``delivered``: it was also written to the client, so the
    client has the whole stream and whatever happens next (the client goes away, the handler is cancelled)
    the request succeeded.
    """

    events: int
    last_chunk_s: float
    done: bool
    upstream_error: str | None = None
    client_gone: bool = False
    delivered: bool = False


async def relay(
    upstream: ClientResponse,
    downstream: web.StreamResponse,
    first_chunk: bytes,
    clock: Callable[[], float],
    progress: RelayResult | None = None,
    frame: Callable[[bytes], bytes] | None = None,
) -> RelayResult:
    """Copy ``first_chunk`` and the rest of ``upstream`` to ``downstream``, up to and including ``[DONE]``.

    Once ``[DONE]`` has reached the client nothing more is read: the stream is complete, and waiting for the
    upstream to close would only leave a window in which a client that has everything it asked for goes away.

    Args:
        upstream: the decode instance's streaming response (its first chunk already read).
        downstream: the prepared client response.
        first_chunk: the first chunk read from ``upstream``.
        clock: a zero-argument callable returning seconds (the event loop's ``time``).
        progress: updated in place as the stream goes (so that a caller cancelled mid-relay knows how far it
            got); a fresh one when ``None``. The same object is returned.
        frame: maps each upstream chunk to the bytes to write now (:meth:`router.resume.StreamTranscript.feed`:
            whole events only, remembered for a resume); ``None`` copies chunks as they are.
    """
    now = clock  # local alias: called once per chunk
    result = progress if progress is not None else RelayResult(0, now(), False)
    if frame is not None:
        first_chunk = frame(first_chunk)
    result.events = first_chunk.count(_DATA)
    result.done = _DONE in first_chunk
    result.last_chunk_s = now()
    try:
        await downstream.write(first_chunk)
    except ConnectionError:
        result.client_gone = True
        return result
    result.delivered = result.done
    content = upstream.content
    try:
        while not result.delivered:
            chunk = await content.readany()
            if not chunk:
                break
            if frame is not None and not (chunk := frame(chunk)):
                continue
            result.last_chunk_s = now()
            result.events += chunk.count(_DATA)
            done = result.done or _DONE in chunk
            result.done = done
            try:
                await downstream.write(chunk)
            except ConnectionError:
                result.client_gone = True
                return result
            result.delivered = done
    except Exception as exc:  # any upstream failure ends the stream with an error event
        result.upstream_error = f"{type(exc).__name__}: {exc}"
        return result
    if not result.done:
        result.upstream_error = "upstream closed the stream before [DONE]"
    return result
