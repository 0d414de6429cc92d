"""One emulated vLLM instance: an aiohttp server on 127.0.0.1 speaking vLLM's OpenAI API and P/D protocol.

Endpoints (``reference/vllm-interface.md`` §1): ``POST /v1/completions``, ``POST /v1/chat/completions``
(non-streaming and SSE), ``GET /health``, ``GET /v1/models``, ``POST /tokenize``, ``GET /metrics``,
``GET /version``.

NixlConnector with ``kv_role: kv_both`` (§2): a request whose ``kv_transfer_params.do_remote_decode`` is true
runs as a prefill leg and returns the transfer parameters at the top level of its response; a request carrying
``do_remote_prefill`` waits the modelled KV pull (as a *deferred* request), then joins the engine with the
prompt's KV already computed and produces the first token itself; a request with neither runs aggregated.
A failed pull follows ``kv_load_failure_policy: fail``: HTTP 500 (non-streaming) or an SSE error event then
``[DONE]`` (streaming), and ``vllm:request_success_total{finished_reason="error"}`` and
``vllm:nixl_num_failed_transfers_total`` increase.

Prefill-side KV blocks are pinned until the decode instance pulls them or the lease expires
(``kv_lease_duration_s``, 30 s): a pull from an instance of the same host releases them at once; otherwise
expiry increments ``vllm:nixl_num_kv_expired_reqs_total`` on the prefill instance. The pinned KV occupies the prefill
engine's capacity (``vllm:kv_cache_usage_perc`` includes it) until then.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from env.sim.engine import InstanceEngine
from livestack.emulator.driver import EngineDriver, RequestHandle
from livestack.emulator.engine import TransferModel
from livestack.emulator.faults import FaultConfig, FaultInjector
from livestack.emulator.metrics import VllmMetrics
from livestack.emulator.protocol import (
    ApiError,
    Kind,
    ParsedRequest,
    chat_prompt_text,
    completion_body,
    error_body,
    parse_request,
    sse_chunk,
    sse_done,
    sse_error,
    sse_usage_chunk,
)
from livestack.emulator.tokenizer import CHARS_PER_TOKEN, OutputText, generated_text, token_ids

__all__ = ["EmulatedInstance", "InstanceSettings", "RequestTracer", "block_hashes"]

NIXL_SIDE_CHANNEL_PORT = 5600
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass(frozen=True, slots=True)
class InstanceSettings:
    """Static settings of one emulated instance."""

    instance_id: str
    model_name: str = "meta-llama/Llama-3.1-8B-Instruct"
    host: str = "127.0.0.1"
    port: int = 0
    max_model_len: int = 131072
    block_size: int = 16
    tp_size: int = 1
    time_scale: float = 1.0
    kv_lease_duration_s: float = 30.0
    side_channel_port: int = NIXL_SIDE_CHANNEL_PORT
    seed: int = 0
    engine_id: str = ""


def block_hashes(request: ParsedRequest, block_size: int) -> list[int]:
    """Chained hashes of the prompt's full KV blocks (what a prefix cache matches on)."""
    text = request.prompt
    step = block_size * CHARS_PER_TOKEN
    out: list[int] = []
    running = 0
    for start in range(0, len(text) - step + 1, step):
        running = zlib.crc32(text[start : start + step].encode("utf-8", "surrogatepass"), running)
        out.append(running)
    return out


class RequestTracer(Protocol):
    """Receives per-request wall-clock instants (``loop.time()``) of an instance; used by benchmarks."""

    def on_arrival(self, request_id: str, time_s: float) -> None:
        """A generation request arrived (before its body is read); ``request_id`` is its X-Request-Id."""

    def on_write(self, request_id: str, time_s: float, num_events: int) -> None:
        """``num_events`` stream events of the request are about to be written."""


class EmulatedInstance:
    """One emulated vLLM server."""

    def __init__(
        self,
        settings: InstanceSettings,
        engine: InstanceEngine,
        transfer: TransferModel,
        faults: FaultConfig | None = None,
        on_crash: Callable[[EmulatedInstance], None] | None = None,
        peers: dict[str, EmulatedInstance] | None = None,
    ) -> None:
        self.settings = settings
        self.engine_id = settings.engine_id or str(uuid.UUID(int=zlib.crc32(settings.instance_id.encode()) << 96))
        self.registry = CollectorRegistry()
        self.num_gpu_blocks = max(engine.config.kv_capacity_tokens // settings.block_size, 1)
        self.metrics = VllmMetrics(
            self.registry,
            settings.model_name,
            settings.max_model_len,
            settings.block_size,
            self.num_gpu_blocks,
        )
        self.faults = FaultInjector(faults or FaultConfig(), np.random.default_rng(settings.seed))
        self.transfer = transfer
        self._engine = engine
        self._driver: EngineDriver | None = None
        self._runner: web.AppRunner | None = None
        self._on_crash = on_crash
        self._peers: dict[str, EmulatedInstance] = peers if peers is not None else {}
        """Instances sharing a host, by engine id: a pull from one of them releases its pinned blocks at once."""
        self._pinned: dict[str, asyncio.TimerHandle] = {}
        self._active: dict[asyncio.Task[Any], asyncio.Transport | None] = {}
        self._crash_timer: asyncio.TimerHandle | None = None
        self.port = settings.port
        self.crashed = False
        self.tracer: RequestTracer | None = None
        """Optional per-request timing hook (benchmarks); None in normal operation."""

    # ------------------------------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """Base URL of this instance."""
        return f"http://{self.settings.host}:{self.port}"

    @property
    def clock_resyncs(self) -> int:
        """How often this instance's step clock restarted from now (:data:`livestack.emulator.driver.MAX_LAG_S`)."""
        return self._driver.clock_resyncs if self._driver is not None else 0

    def app(self) -> web.Application:
        """The aiohttp application (routes of vLLM's OpenAI server)."""
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/version", self._version)
        return app

    async def start(self) -> None:
        """Bind 127.0.0.1 and serve."""
        self._driver = EngineDriver(self._engine, self.metrics, self.settings.time_scale, self._slow_factor())
        self._driver.start()
        self._runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port, reuse_address=True)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        self._peers[self.engine_id] = self
        crash_after = self.faults.config.crash_after_s
        if crash_after is not None:
            self._crash_timer = asyncio.get_running_loop().call_later(crash_after, self.crash)

    def _slow_factor(self) -> float:
        return self.faults.config.slow_factor

    async def stop(self) -> None:
        """Stop serving and release everything."""
        self._peers.pop(self.engine_id, None)
        if self._crash_timer is not None:
            self._crash_timer.cancel()
        for timer in self._pinned.values():
            timer.cancel()
        self._pinned.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._driver is not None:
            await self._driver.stop()

    def crash(self) -> None:
        """Stop answering at once: in-flight connections are reset, new connections refused."""
        if self.crashed:
            return
        self.crashed = True
        for task, transport in list(self._active.items()):
            if transport is not None:
                transport.abort()
            if task is not asyncio.current_task():
                task.cancel()
        if self._on_crash is not None:
            self._on_crash(self)
        else:
            asyncio.get_running_loop().create_task(self.stop())

    # ------------------------------------------------------------------------------------------- handlers

    async def _health(self, _: web.Request) -> web.Response:
        if self.faults.config.health_delay_s > 0:
            await asyncio.sleep(self.faults.config.health_delay_s)
        return web.Response(status=503 if self.crashed else 200)

    async def _version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": "0.22.0-pdctl-emulator"})

    async def _models(self, _: web.Request) -> web.Response:
        name = self.settings.model_name
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "vllm",
                        "root": name,
                        "parent": None,
                        "max_model_len": self.settings.max_model_len,
                        "permission": [],
                    }
                ],
            }
        )

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _tokenize(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
            if not isinstance(body, dict):
                raise ApiError(400, "the request body must be a JSON object")
            if "messages" in body:
                messages = body["messages"]
                if not isinstance(messages, list):
                    raise ApiError(400, "messages must be a list", "messages")
                text = chat_prompt_text(messages)
            elif isinstance(body.get("prompt"), str):
                text = body["prompt"]
            else:
                raise ApiError(400, "prompt or messages is required", "prompt")
        except ApiError as exc:
            return web.json_response(error_body(exc.status, exc.message, exc.param), status=exc.status)
        except ValueError as exc:
            return web.json_response(error_body(400, f"JSON decode error: {exc}"), status=400)
        ids = token_ids(text)
        out: dict[str, Any] = {"count": len(ids), "max_model_len": self.settings.max_model_len, "tokens": ids}
        if body.get("return_token_strs"):
            out["token_strs"] = [text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)]
        return web.json_response(out)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        task = asyncio.current_task()
        if task is not None:
            self._active[task] = request.transport
        try:
            return await self._serve(request, kind)
        finally:
            if task is not None:
                self._active.pop(task, None)

    async def _serve(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        if self.crashed or self.faults.count_request():
            self.crash()
            if request.transport is not None:
                request.transport.abort()  # reset the connection, as a dead process would
            raise asyncio.CancelledError
        tracer = self.tracer
        if tracer is not None:
            tracer.on_arrival(request.headers.get("X-Request-Id", ""), asyncio.get_running_loop().time())
        raw = await request.read()
        try:
            parsed = parse_request(kind, raw, self.settings.model_name, self.settings.max_model_len)
        except ApiError as exc:
            return web.json_response(error_body(exc.status, exc.message, exc.param), status=exc.status)
        base_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        response_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + base_id
        engine_request_id = f"{response_id}-0-{zlib.crc32(uuid.uuid4().bytes):08x}"
        self._observe_params(parsed)
        if parsed.stream:
            return await self._stream(request, parsed, base_id, response_id, engine_request_id)
        return await self._unary(parsed, base_id, response_id, engine_request_id)

    def _observe_params(self, parsed: ParsedRequest) -> None:
        m = self.metrics
        m.request_params_n.observe(1)
        m.request_params_max_tokens.observe(parsed.max_tokens)
        m.request_max_num_generation_tokens.observe(parsed.max_tokens)

    # ------------------------------------------------------------------------------------ request paths

    async def _admit(self, parsed: ParsedRequest, engine_request_id: str) -> RequestHandle | str:
        """Pull remote KV when asked, then queue the request; a string is a transfer error message."""
        assert self._driver is not None
        hashes = block_hashes(parsed, self.settings.block_size)
        external = 0
        deferred_s = 0.0
        if parsed.do_remote_prefill:
            params = parsed.kv_transfer_params or {}
            remote_tokens = _as_int(params.get("remote_num_tokens"), parsed.prompt_tokens)
            hit = self._driver.engine.prefix_hit_tokens(hashes, self.settings.block_size, parsed.prompt_tokens)
            pulled = max(min(remote_tokens, parsed.prompt_tokens) - hit - 1, 0)
            remote_tp = _as_int(params.get("tp_size"), self.settings.tp_size)
            pull_start_s = self._driver.emulated_now_s()
            wait_s = self.transfer.duration_s(pulled, remote_tp, pull_start_s) + self.faults.config.transfer_delay_s
            await self._driver.deferred(wait_s)
            deferred_s = wait_s
            self._release_remote(params)
            m = self.metrics
            m.external_prefix_cache_queries.inc(max(parsed.prompt_tokens - hit, 0))
            if self.faults.transfer_fails():
                m.nixl_num_failed_transfers.inc()
                m.request_success["error"].inc()
                return "KV transfer from the prefill instance failed (kv_load_failure_policy=fail)"
            # the read as modelled (policies.stages): its whole duration (pack, setup, flow, injected delay,
            # unpack), as the simulator observes it, and its post time, the pack (0 when both TP degrees match)
            m.nixl_xfer_time.observe(wait_s)
            m.nixl_post_time.observe(self.transfer.layout_s(pulled, remote_tp))
            m.nixl_bytes_transferred.observe(self.transfer.num_bytes(pulled))
            m.nixl_num_descriptors.observe(max(-(-pulled // self.settings.block_size), 1) * 2)
            m.external_prefix_cache_hits.inc(pulled)
            external = pulled
        handle = self._driver.submit(
            engine_request_id,
            parsed.prompt_tokens,
            parsed.max_tokens,
            hashes,
            self.settings.block_size,
            prefill_only=parsed.do_remote_decode,
            kv_ready=parsed.do_remote_prefill,
        )
        handle.external_tokens = external
        handle.deferred_s = deferred_s
        return handle

    async def _unary(
        self, parsed: ParsedRequest, base_id: str, response_id: str, engine_request_id: str
    ) -> web.StreamResponse:
        handle = await self._admit(parsed, engine_request_id)
        if isinstance(handle, str):
            return web.json_response(error_body(500, handle), status=500)
        try:
            while await handle.tokens.get() > 0:
                pass
        finally:
            self._abort_if_open(handle)
        if handle.error is not None:
            return web.json_response(error_body(500, handle.error), status=500)
        text = generated_text(parsed.prompt, handle.generated_tokens)
        params = self._finish(parsed, handle, engine_request_id)
        body = completion_body(parsed, response_id, text, handle.generated_tokens, "length", params)
        return web.Response(body=body, content_type="application/json")

    async def _stream(
        self, request: web.Request, parsed: ParsedRequest, base_id: str, response_id: str, engine_request_id: str
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        handle = await self._admit(parsed, engine_request_id)
        if isinstance(handle, str):
            await response.write(sse_error(500, handle) + sse_done())
            await response.write_eof()
            return response
        created = int(time.time())
        sent = 0
        output = OutputText(parsed.prompt)
        try:
            while (count := await handle.tokens.get()) > 0:
                parts: list[bytes] = []
                if sent == 0 and parsed.kind == "chat":
                    parts.append(sse_chunk(parsed, response_id, created, "", None, role_only=True))
                for _ in range(count):
                    last = sent + 1 == handle.request.output_tokens
                    usage = (parsed.prompt_tokens, sent + 1) if parsed.continuous_usage else None
                    text = output.next()
                    parts.append(sse_chunk(parsed, response_id, created, text, "length" if last else None, usage))
                    sent += 1
                if self.tracer is not None:
                    self.tracer.on_write(base_id, asyncio.get_running_loop().time(), len(parts))
                await response.write(b"".join(parts))
        finally:
            self._abort_if_open(handle)
        if handle.error is not None:
            await response.write(sse_error(500, handle.error) + sse_done())
            await response.write_eof()
            return response
        self._finish(parsed, handle, engine_request_id)
        tail = sse_usage_chunk(parsed, response_id, created, sent) if parsed.include_usage else b""
        await response.write(tail + sse_done())
        if self.faults.config.linger_after_done_s > 0:
            await asyncio.sleep(self.faults.config.linger_after_done_s)
        await response.write_eof()
        return response

    def _abort_if_open(self, handle: RequestHandle) -> None:
        if not handle.done and self._driver is not None:
            self._driver.abort(handle)
            self.metrics.request_success["abort"].inc()

    def _finish(self, parsed: ParsedRequest, handle: RequestHandle, engine_request_id: str) -> dict[str, Any] | None:
        """Record a finished request's metrics; return the KV transfer params of a prefill leg."""
        m = self.metrics
        scale = self.settings.time_scale
        req = handle.request
        end = handle.finished_s or handle.arrival_s
        first = handle.first_token_s or end
        local_hit = min(max(req.cached_tokens, 0), parsed.prompt_tokens)
        external = handle.external_tokens
        computed = max(parsed.prompt_tokens - local_hit - external, 0)
        # vLLM's queue time runs from arrival to first scheduling, so on a decode leg it includes the KV pull.
        queue_s = max(req.first_scheduled_s - req.queued_s, 0.0) + handle.deferred_s
        prefill_s = max(req.first_token_s - req.first_scheduled_s, 0.0)
        m.request_success["length"].inc()
        m.prompt_tokens.inc(parsed.prompt_tokens)
        m.prompt_tokens_by_source["local_compute"].inc(computed)
        m.prompt_tokens_by_source["local_cache_hit"].inc(local_hit)
        m.prompt_tokens_by_source["external_kv_transfer"].inc(external)
        m.prompt_tokens_cached.inc(local_hit + external)
        m.prefix_cache_queries.inc(parsed.prompt_tokens)
        m.prefix_cache_hits.inc(local_hit)
        m.generation_tokens.inc(handle.generated_tokens)
        m.request_prompt_tokens.observe(parsed.prompt_tokens)
        m.request_generation_tokens.observe(handle.generated_tokens)
        m.request_prefill_kv_computed_tokens.observe(computed)
        # vLLM times TTFT and latency from the request's arrival at this instance, before any KV pull
        m.time_to_first_token.observe((first - handle.arrival_s) / scale + handle.deferred_s)
        m.e2e_request_latency.observe((end - handle.arrival_s) / scale + handle.deferred_s)
        m.request_queue_time.observe(queue_s)
        m.request_prefill_time.observe(prefill_s)
        m.request_decode_time.observe((end - first) / scale)
        m.request_inference_time.observe(prefill_s + (end - first) / scale)
        if handle.generated_tokens > 1:
            m.request_time_per_output_token.observe((end - first) / scale / (handle.generated_tokens - 1))
        if not parsed.do_remote_decode:
            return None
        self._pin(engine_request_id)
        num_blocks = -(-parsed.prompt_tokens // self.settings.block_size)
        first_block = zlib.crc32(engine_request_id.encode()) % max(self.num_gpu_blocks - num_blocks, 1)
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [list(range(first_block, first_block + num_blocks))],
            "remote_engine_id": self.engine_id,
            "remote_request_id": engine_request_id,
            "remote_host": self.settings.host,
            "remote_port": self.settings.side_channel_port,
            "tp_size": self.settings.tp_size,
            "remote_num_tokens": parsed.prompt_tokens,
        }

    def _pin(self, engine_request_id: str) -> None:
        lease_s = self.settings.kv_lease_duration_s * self.settings.time_scale
        self._pinned[engine_request_id] = asyncio.get_running_loop().call_later(
            lease_s, self._expire, engine_request_id
        )

    def _expire(self, engine_request_id: str) -> None:
        if self._pinned.pop(engine_request_id, None) is not None:
            self.metrics.nixl_num_kv_expired_reqs.inc()
            if self._driver is not None:
                self._driver.release(engine_request_id)

    def _release_remote(self, params: dict[str, Any]) -> None:
        owner = self._peers.get(str(params.get("remote_engine_id")))
        if owner is not None:
            owner.release(str(params.get("remote_request_id")))

    def release(self, engine_request_id: str) -> None:
        """The decode instance pulled (or gave up on) the blocks of ``engine_request_id``: unpin them."""
        timer = self._pinned.pop(engine_request_id, None)
        if timer is not None:
            timer.cancel()
            if self._driver is not None:
                self._driver.release(engine_request_id)


def _as_int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
