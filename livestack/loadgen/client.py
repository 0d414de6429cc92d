"""Replay requests against an OpenAI-compatible endpoint and measure what a client sees.

Each :class:`~env.workloads.RequestSpec` becomes a streaming ``POST /v1/completions`` (or chat) sent at its arrival
time times ``time_scale``, with a prompt of exactly ``input_tokens`` tokens under the emulator's tokeniser
(:func:`livestack.emulator.tokenizer.prompt_text`, prefix blocks from ``hash_ids``), ``max_tokens = output_tokens`` and
``ignore_eos: true`` (so a real vLLM generates the full length too), the tenant in ``X-Tenant-Id`` and the request
id in ``X-Request-Id``.

Measured per request on the client's clock: TTFT (send → first event carrying text), the gaps between text
events (ITL), TPOT ((last − first) / (tokens − 1)) and end-to-end latency. With ``time_scale`` ≠ 1 every
duration is divided by it, so results are in the scenario's (emulated) seconds.

The replay is bounded: at most ``max_requests`` requests, at most ``max_in_flight`` at once, each cut off after
``request_timeout_s``, and the whole run after ``max_duration_s`` (unfinished requests are recorded as
cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from env.workloads import RequestSpec
from livestack.emulator.tokenizer import prompt_text

__all__ = ["LoadOptions", "RequestResult", "replay"]


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """How to replay."""

    url: str
    model: str = ""
    api: Literal["completions", "chat"] = "completions"
    time_scale: float = 1.0
    max_requests: int | None = None
    max_in_flight: int = 1024
    request_timeout_s: float = 600.0
    max_duration_s: float = 3600.0
    api_key: str | None = None
    send_tenant_header: bool = True


@dataclass(slots=True)
class RequestResult:
    """What the client saw of one request (durations in emulated seconds)."""

    request_id: str
    tenant: str
    arrival_s: float
    input_tokens: int
    requested_output_tokens: int
    status: int = 0
    error: str | None = None
    output_tokens: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Completed with status 200 and no error event."""
        return self.status == 200 and self.error is None


def _body(spec: RequestSpec, options: LoadOptions) -> dict[str, Any]:
    prompt = prompt_text(spec.input_tokens, spec.hash_ids, spec.hash_block_tokens, salt=spec.request_id)
    body: dict[str, Any] = {
        "max_tokens": max(spec.output_tokens, 1),
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    model = spec.model or options.model
    if model:
        body["model"] = model
    if options.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def _event_text(payload: dict[str, Any]) -> str:
    out = ""
    for choice in payload.get("choices") or ():
        text = choice.get("text")
        if text is None:
            text = (choice.get("delta") or {}).get("content")
        if text:
            out += text
    return out


async def _one(session: aiohttp.ClientSession, spec: RequestSpec, options: LoadOptions, result: RequestResult) -> None:
    path = "/v1/chat/completions" if options.api == "chat" else "/v1/completions"
    headers = {"X-Request-Id": spec.request_id}
    if options.send_tenant_header:
        headers["X-Tenant-Id"] = spec.tenant
    if options.api_key:
        headers["Authorization"] = f"Bearer {options.api_key}"
    scale = options.time_scale
    start = time.perf_counter()
    first: float | None = None
    last: float | None = None
    buffer = b""
    async with session.post(options.url.rstrip("/") + path, json=_body(spec, options), headers=headers) as resp:
        result.status = resp.status
        if resp.status != 200:
            result.error = (await resp.text())[:500]
            return
        async for chunk in resp.content.iter_any():
            now = time.perf_counter()
            buffer += chunk
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                data = event.strip().removeprefix(b"data: ")
                if not data or data == b"[DONE]":
                    continue
                payload = json.loads(data)
                if "error" in payload:
                    result.error = str(payload["error"].get("message", payload["error"]))
                    continue
                if not _event_text(payload):
                    continue
                result.output_tokens += 1
                if first is None:
                    first = now
                elif last is not None:
                    result.itl_s.append((now - last) / scale)
                last = now
    end = time.perf_counter()
    result.e2e_s = (end - start) / scale
    if first is not None:
        result.ttft_s = (first - start) / scale
        if last is not None and result.output_tokens > 1:
            result.tpot_s = (last - first) / scale / (result.output_tokens - 1)


async def replay(specs: Sequence[RequestSpec], options: LoadOptions) -> list[RequestResult]:
    """Send ``specs`` at their (scaled) arrival times; return one result per request sent, in spec order."""
    chosen = list(specs[: options.max_requests] if options.max_requests is not None else specs)
    results = [RequestResult(s.request_id, s.tenant, s.arrival_s, s.input_tokens, s.output_tokens) for s in chosen]
    limit = asyncio.Semaphore(options.max_in_flight)
    connector = aiohttp.TCPConnector(limit=options.max_in_flight)
    timeout = aiohttp.ClientTimeout(total=options.request_timeout_s)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def run(spec: RequestSpec, result: RequestResult) -> None:
        delay = start + spec.arrival_s * options.time_scale - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        async with limit:
            try:
                await _one(session, spec, options, result)
            except TimeoutError:
                result.error = "timeout"
            except (aiohttp.ClientError, OSError, ValueError) as exc:
                result.error = f"{type(exc).__name__}: {exc}"

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [asyncio.create_task(run(s, r)) for s, r in zip(chosen, results, strict=True)]
        _, pending = await asyncio.wait(tasks, timeout=options.max_duration_s) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    for result in results:
        if result.status == 0 and result.error is None:
            result.error = "cancelled"
    return results
