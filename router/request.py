"""Per-request working state of the request flow, and the small JSON helpers it answers with."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from router.decide import Plan
from router.registry import Instance
from router.relay import error_body
from router.resume import StreamTranscript
from router.telemetry import RequestRecord

__all__ = ["FlowRequest", "completion_tokens", "first_token_seen", "json_error"]


class FlowRequest:
    """Per-request working state of :class:`router.flow.RequestFlow`."""

    __slots__ = (
        "arrival", "authorization", "awaiting_first", "body", "cut", "delivered", "path", "plan", "raw", "record",
        "request_id", "stream",
    )  # fmt: skip

    def __init__(
        self,
        path: str,
        raw: bytes,
        body: dict[str, Any],
        request_id: str,
        arrival: float,
        authorization: str | None,
        plan: Plan,
        record: RequestRecord,
    ) -> None:
        self.path = path
        self.raw = raw
        self.body = body
        self.request_id = request_id
        self.arrival = arrival
        self.stream = bool(body.get("stream", False))
        self.authorization = authorization
        self.plan = plan
        self.record = record
        self.delivered = False
        """The whole stream, ``[DONE]`` included, reached the client: a success whatever the client does next."""
        self.awaiting_first: tuple[Instance, int] | None = None
        """The local leg still waiting for its first byte and its uncached prompt tokens, counted in the
        instance's ``awaiting_first_token_tokens`` until :func:`first_token_seen`."""
        self.cut: tuple[web.StreamResponse, StreamTranscript] | None = None
        """A stream cut mid-way by its decode instance, to resume (:mod:`router.migrate`): the client response
        and what reached it."""


def first_token_seen(req: FlowRequest) -> None:
    """The local leg of ``req`` sent its first byte (or ended without): its prompt leaves the instance's queue."""
    if req.awaiting_first is not None:
        inst, tokens = req.awaiting_first
        inst.awaiting_first_token_tokens -= tokens
        req.awaiting_first = None


def completion_tokens(payload: bytes) -> int:
    """``usage.completion_tokens`` of a non-streamed completion body (0 when absent or unreadable)."""
    try:
        usage = json.loads(payload).get("usage") or {}
    except (ValueError, AttributeError):
        return 0
    value = usage.get("completion_tokens", 0) if isinstance(usage, Mapping) else 0
    return int(value) if isinstance(value, int) else 0


def json_error(status: int, message: str, kind: str) -> web.Response:
    """An OpenAI-style JSON error response."""
    return web.Response(body=error_body(status, message, kind), status=status, content_type="application/json")
