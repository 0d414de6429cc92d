"""One HTTP call with its outcome classified: applied, refused, failed before sending, or unknown."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from controller.actuators.base import Outcome

__all__ = ["HttpReply", "call"]


@dataclass(frozen=True, slots=True)
class HttpReply:
    """What came back: the classified outcome, HTTP status (0 = none) and the decoded JSON body, if any."""

    outcome: Outcome
    status: int
    body: Any
    detail: str


async def call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    content_type: str = "application/json",
) -> HttpReply:
    """Send one request and classify its outcome.

    2xx → applied; 4xx → rejected (nothing changed); no connection → failed (nothing sent); timeout, dropped
    connection or 5xx → unknown (the request may have taken effect).
    """
    send_headers = dict(headers or {})
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        send_headers["Content-Type"] = content_type
    try:
        async with session.request(method, url, data=data, headers=send_headers) as response:
            text = await response.text()
            status = response.status
    except aiohttp.ClientConnectorError as exc:
        return HttpReply(Outcome.FAILED, 0, None, f"{method} {url}: cannot connect: {exc.os_error}")
    except (TimeoutError, aiohttp.ClientError) as exc:
        return HttpReply(Outcome.UNKNOWN, 0, None, f"{method} {url}: {type(exc).__name__}: outcome unknown")
    try:
        decoded = json.loads(text) if text else None
    except json.JSONDecodeError:
        decoded = None
    if 200 <= status < 300:
        return HttpReply(Outcome.APPLIED, status, decoded, f"{method} {url}: {status}")
    if 400 <= status < 500:
        return HttpReply(Outcome.REJECTED, status, decoded, f"{method} {url}: {status} {text[:200]}")
    return HttpReply(Outcome.UNKNOWN, status, decoded, f"{method} {url}: {status}: outcome unknown")
