"""Bounded input on every router HTTP surface: body size, JSON nesting, and no plain-text 500.

* **Body size.** :func:`bounded_input` (an aiohttp middleware) gives each request the limit of its surface —
  ``max_body_bytes`` for the data API, ``max_admin_body_bytes`` for ``/admin/…`` — and answers ``413`` with a
  JSON error when the declared ``Content-Length`` or the body actually read is larger.
* **Nesting.** :func:`parse_json` refuses JSON nested deeper than ``max_json_depth`` (and whatever the parser
  itself cannot nest) with a :class:`BodyError`, which handlers answer as ``400`` with a JSON error.
* **No traceback to the client.** Any other exception a handler lets out is logged with its traceback and
  answered ``500`` with a JSON error naming only the request id.
* **No request vanishes from the metrics.** A data-API request answered ``400`` or ``413`` here is passed to the
  ``on_rejected`` callback (the router counts it in ``pdctl_router_requests_total`` with ``route="rejected"``).

Error bodies have the shape of their surface: OpenAI's ``{"error": {"message", "type", "code"}}`` on the data
API, ``{"error": {"message", "field"}}`` on the admin API (``docs/admin-api.md``).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from router.relay import error_body

__all__ = ["BodyError", "bounded_input", "error_response", "json_depth", "parse_json"]

_log = logging.getLogger("pdctl.router")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BodyError(ValueError):
    """A request body that cannot be accepted (status 400 or 413, one-line message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0, ``[]`` and ``{}`` are 1); iterative."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            depth += 1
            stack.extend((child, depth) for child in item.values())
        elif isinstance(item, list):
            depth += 1
            stack.extend((child, depth) for child in item)
        deepest = max(deepest, depth)
    return deepest


def parse_json(raw: bytes, max_depth: int) -> Any:
    """Parse a request body; refuse malformed JSON and JSON nested deeper than ``max_depth``.

    Raises:
        BodyError: status 400, the reason in one line.
    """
    try:
        value = json.loads(raw)
    except RecursionError:
        raise BodyError(400, f"JSON nested too deeply (at most {max_depth} levels)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BodyError(400, f"body is not valid JSON: {exc}") from None
    if json_depth(value) > max_depth:
        raise BodyError(400, f"JSON nested too deeply (at most {max_depth} levels)")
    return value


def _is_admin(request: web.Request) -> bool:
    return request.path.startswith("/admin/")


def error_response(request: web.Request, status: int, message: str) -> web.Response:
    """A JSON error in the shape of the request's surface (admin or data API)."""
    if _is_admin(request):
        return web.json_response({"error": {"message": message, "field": "<body>"}}, status=status)
    kind = {413: "RequestTooLargeError", 500: "InternalServerError"}.get(status, "BadRequestError")
    return web.Response(body=error_body(status, message, kind), status=status, content_type="application/json")


def bounded_input(
    max_body_bytes: int, max_admin_body_bytes: int, on_rejected: Callable[[web.Request], None] | None = None
) -> Middleware:
    """The middleware enforcing each surface's body limit and answering every failure in JSON.

    ``on_rejected`` is called with every data-API request it answers ``400`` or ``413``.
    """

    def rejected(request: web.Request, status: int, message: str) -> web.Response:
        if on_rejected is not None and not _is_admin(request):
            on_rejected(request)
        return error_response(request, status, message)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        limit = max_admin_body_bytes if _is_admin(request) else max_body_bytes
        declared = request.content_length
        if declared is not None and declared > limit:
            return rejected(request, 413, f"request body of {declared} bytes exceeds the limit of {limit}")
        try:
            return await handler(request.clone(client_max_size=limit))
        except web.HTTPRequestEntityTooLarge:
            return rejected(request, 413, f"request body exceeds the limit of {limit} bytes")
        except BodyError as exc:
            return rejected(request, exc.status, exc.message)
        except web.HTTPException:
            raise
        except Exception:
            request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
            _log.exception("unhandled error serving %s %s (request %s)", request.method, request.path, request_id)
            return error_response(request, 500, f"internal error (request {request_id})")

    return middleware
