"""Bounded input: JSON depth and size limits, and every failure answered in JSON (router/limits.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from router.limits import BodyError, bounded_input, json_depth, parse_json


def _nested(depth: int, kind: str) -> str:
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


@given(depth=st.integers(1, 200), kind=st.sampled_from(["list", "dict"]))
def test_depth_is_measured_and_bounded(depth: int, kind: str) -> None:
    text = _nested(depth, kind)
    assert json_depth(json.loads(text)) == depth
    if depth <= 64:
        assert json_depth(parse_json(text.encode(), 64)) == depth
    else:
        with pytest.raises(BodyError, match="nested too deeply") as refused:
            parse_json(text.encode(), 64)
        assert refused.value.status == 400


def test_what_the_parser_cannot_nest_is_a_400_not_a_recursion_error() -> None:
    with pytest.raises(BodyError, match="nested too deeply"):
        parse_json(_nested(100_000, "list").encode(), 64)
    with pytest.raises(BodyError, match="not valid JSON"):
        parse_json(b"\xff{", 64)


@pytest.fixture
async def server() -> AsyncIterator[str]:
    async def echo(request: web.Request) -> web.Response:
        body = parse_json(await request.read(), 8)
        return web.json_response({"ok": body is not None})

    async def broken(request: web.Request) -> web.Response:
        raise ZeroDivisionError("secret detail")

    app = web.Application(client_max_size=4096, middlewares=[bounded_input(4096, 1024)])
    app.router.add_post("/v1/completions", echo)
    app.router.add_put("/admin/policy", echo)
    app.router.add_get("/v1/broken", broken)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _chunks(total_bytes: int) -> AsyncIterator[bytes]:
    yield b'{"a": "' + b"x" * (total_bytes - 10) + b'"}'


async def test_each_surface_has_its_own_size_limit_answered_in_json(server: str) -> None:
    async with aiohttp.ClientSession() as session:
        big = json.dumps({"a": "x" * 2000}).encode()
        async with session.post(server + "/v1/completions", data=big) as resp:
            assert resp.status == 200
        async with session.put(server + "/admin/policy", data=big) as resp:
            assert resp.status == 413
            assert (await resp.json())["error"]["field"] == "<body>"
        async with session.post(server + "/v1/completions", data=b"[" * 5000) as resp:
            assert resp.status == 413
            assert "exceeds the limit of 4096" in (await resp.json())["error"]["message"]
        # No Content-Length (chunked): the limit holds while reading.
        async with session.post(server + "/v1/completions", data=_chunks(6000)) as resp:
            assert resp.status == 413
            assert (await resp.json())["error"]["type"] == "RequestTooLargeError"
        async with session.post(server + "/v1/completions", data=_nested(20, "dict").encode()) as resp:
            assert resp.status == 400
            assert "nested too deeply" in (await resp.json())["error"]["message"]
        async with session.put(server + "/admin/policy", data=b"[" * 900 + b"]" * 90) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["field"] == "<body>"


async def test_an_unhandled_error_is_a_json_500_without_the_traceback(server: str) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(server + "/v1/broken", headers={"X-Request-Id": "r-1"}) as resp,
    ):
        assert resp.status == 500
        body = await resp.json()
    assert body["error"]["message"] == "internal error (request r-1)"
    assert "secret" not in json.dumps(body)
