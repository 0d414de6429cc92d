"""A minimal pass-through proxy written with FastAPI + httpx: the reference the router is compared against.

Run: ``python benchmarks/router/reference_proxy.py UPSTREAM_URL PORT``. It forwards ``POST /v1/completions`` and
``/v1/chat/completions`` bodies unchanged and streams the upstream's bytes back, nothing else.
"""

from __future__ import annotations

import sys

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask


def make_app(upstream: str) -> FastAPI:
    app = FastAPI()
    client = httpx.AsyncClient(
        base_url=upstream,
        timeout=None,
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=2048),
    )

    async def forward(request: Request) -> StreamingResponse:
        body = await request.body()
        upstream_request = client.build_request(
            "POST",
            request.url.path,
            content=body,
            headers={
                k: v for k, v in request.headers.items() if k in ("content-type", "authorization", "x-request-id")
            },
        )
        response = await client.send(upstream_request, stream=True)
        return StreamingResponse(
            response.aiter_raw(),
            status_code=response.status_code,
            media_type=response.headers.get("content-type", "text/event-stream"),
            background=BackgroundTask(response.aclose),
        )

    app.add_api_route("/v1/completions", forward, methods=["POST"])
    app.add_api_route("/v1/chat/completions", forward, methods=["POST"])
    return app


if __name__ == "__main__":
    uvicorn.run(make_app(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
