"""The router's P/D request flow: plan, prefill leg, decode leg, fallbacks, record.

Request flow (``POST /v1/completions``, ``POST /v1/chat/completions``):

1. parse the body, pick a request id (the client's ``X-Request-Id`` or a new uuid), plan the request
   (:mod:`router.decide`: tenant, estimates, instances, :func:`policies.routing.decide_route`);
2. remote route: prefill leg (:mod:`router.pd`). A prefill error or timeout falls back per the tenant's
   ``on_kv_transfer_timeout`` (``retry_remote_prefill``: one other prefill instance, then local; otherwise local
   at once). Returned params go to the decode leg verbatim;
3. decode leg. Remote: a first event that is an error (the KV pull failed) or no first byte within
   ``remote_first_token_s`` (transfer timeout) falls back to a local request on the same decode instance.
   Any route: a decode instance that cannot be reached, answers 5xx, or fails before its first byte is marked
   unhealthy and the request is retried on another decode instance (``max_decode_attempts``) with the same body
   (a remote request keeps its KV parameters: the prefill instance still holds the blocks). After the first byte
   went to the client, the stream is resumed on another decode instance (:mod:`router.migrate`, up to
   ``migration_limit`` times), else ended with a vLLM-style error event and ``[DONE]``;
4. record: metrics and one JSONL line (:mod:`router.telemetry`).

Client disconnects cancel the handler, which closes the upstream connection (the instance then aborts): the
request is recorded ``499``. A stream whose ``[DONE]`` reached the client is complete: the relay stops there
(it does not wait for the instance to close), and it is recorded as a success with its output tokens whatever
the client does next, even if the handler is cancelled while finishing.
The server and its lifecycle are :mod:`router.app`; the background upkeep is :mod:`router.upkeep`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from policies.admission import REFUSED_ROUTE
from policies.schema import FallbackAction, Route, Slo
from router.admin import PolicyState
from router.config import RouterConfig
from router.limits import BodyError, parse_json
from router.migrate import StreamMigrator
from router.parts import RouterPart, RouterParts
from router.pd import decode_body, forwarded_headers, local_body, prefill_body, prefill_params
from router.registry import Instance
from router.relay import (
    UPSTREAM_ERRORS,
    RelayResult,
    is_error_event,
    relay,
    sse_error_event,
    stream_client_timeout,
)
from router.request import FlowRequest, completion_tokens, first_token_seen, json_error
from router.resume import StreamTranscript
from router.telemetry import RequestRecord

__all__ = [
    "RECORD_KEY",
    "ROUTE_HEADER",
    "ROUTE_REASON_HEADER",
    "UPSTREAM_ERRORS",
    "RequestFlow",
    "add_route_headers",
    "prefill_client_timeout",
]

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
RECORD_KEY = web.RequestKey("pdctl_record", RequestRecord)
"""Where a generation request keeps its :class:`RequestRecord` (``request[RECORD_KEY]``)."""
ROUTE_HEADER = "X-Pdctl-Route"
ROUTE_REASON_HEADER = "X-Pdctl-Route-Reason"


def add_route_headers(response: web.StreamResponse, rec: RequestRecord) -> None:
    """Tell the client where its prompt was prefilled and why (``X-Pdctl-Route``, ``X-Pdctl-Route-Reason``).

    The values are the record's when the response starts: a remote decision that fell back to local prefill
    before the first byte reads ``local_prefill`` with the decision's reason (the request log's ``fallback``
    field names the fallback).
    """
    response.headers[ROUTE_HEADER] = rec.route
    response.headers[ROUTE_REASON_HEADER] = rec.reason


class _DecodeFailed(Exception):
    """The decode leg failed before anything was sent to the client.

    ``transfer`` is True when the instance is fine but the KV pull failed or timed out (serve locally on it);
    otherwise the instance itself failed (retry on another one, with the same KV parameters).
    """

    def __init__(self, transfer: bool = False) -> None:
        super().__init__("transfer failed" if transfer else "decode instance failed")
        self.transfer = transfer


def prefill_client_timeout(config: RouterConfig) -> aiohttp.ClientTimeout:
    """The client timeout of short upstream calls (prefill legs, ``/metrics``, ``/tokenize``, ``/v1/models``)."""
    t = config.timeouts
    return aiohttp.ClientTimeout(total=t.prefill_s, sock_connect=t.connect_s)


class RequestFlow(RouterPart):
    """Serves generation requests through the P/D legs, with fallbacks, and records them.

    :class:`router.app.Router` routes the generation endpoints to :meth:`generate` and shares its live state
    (:class:`router.parts.RouterParts`); ``session``, ``policy`` and ``now`` are read per request (the policy
    changes through the admin API).
    """

    def __init__(self, parts: RouterParts, policy: Callable[[], PolicyState]) -> None:
        super().__init__(parts)
        self._policy = policy
        config = parts.config
        t = config.timeouts
        self._stream_timeout = stream_client_timeout(t)
        self._prefill_timeout = prefill_client_timeout(config)
        self._unary_timeout = aiohttp.ClientTimeout(total=t.first_token_s, sock_connect=t.connect_s)
        self._tokenize_remotely = config.estimation.tokenizer == "instance"
        self._migrator = StreamMigrator(
            config, parts.registry, parts.planner, parts.metrics, parts.session, parts.now, self._mark_failed,
            lambda req, kind: self._fallback(req.record, kind),
        )  # fmt: skip

    async def _count_tokens(self, body: Mapping[str, Any]) -> int | None:
        """Prompt tokens counted by a decode instance's ``POST /tokenize`` (None: fall back to the estimate)."""
        serving = self.registry.serving("decode")
        if not serving:
            return None
        query: dict[str, Any] = {"model": body["model"]} if body.get("model") else {}
        if isinstance(body.get("messages"), list):
            query["messages"] = body["messages"]
        elif isinstance(body.get("prompt"), str):
            query["prompt"] = body["prompt"]
        else:
            return None
        try:
            async with self.session.post(serving[0].url + "/tokenize", json=query, timeout=self._prefill_timeout) as r:
                data = await r.json() if r.status == 200 else None
        except (*UPSTREAM_ERRORS, ValueError):
            return None
        count = data.get("count") if isinstance(data, dict) else None
        return count if isinstance(count, int) else None

    def count_rejected(self, request: web.Request) -> None:
        """Count a data-API request refused for its body (``400``/``413``, :func:`router.limits.bounded_input`)."""
        headers = request.headers
        tenant = self._policy().resolved.identify_tenant(headers.get("X-Tenant-Id"), _bearer_key(headers), "")
        self.metrics.rejected(tenant)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """Serve one ``/v1/completions`` or ``/v1/chat/completions`` request."""
        arrival = self._now()
        arrival_ts = time.time()
        raw = await request.read()
        body = parse_json(raw, self.config.limits.max_json_depth)  # a BodyError is answered 400 by the middleware
        if not isinstance(body, dict):  # answered 400 and counted as rejected by the middleware, as a parse error
            raise BodyError(400, "the request body must be a JSON object")
        headers = request.headers
        request_id = headers.get("X-Request-Id") or uuid.uuid4().hex
        authorization = headers.get("Authorization")
        api_key = _bearer_key(headers)
        counted = await self._count_tokens(body) if self._tokenize_remotely else None
        resolved = self._policy().resolved
        plan = self.planner.plan(body, resolved, request_id, headers.get("X-Tenant-Id"), api_key, arrival, counted)
        if plan is None:  # refused: still a finished request, so that the outcome counters match the clients
            tenant = resolved.identify_tenant(headers.get("X-Tenant-Id"), api_key, str(body.get("model") or ""))
            self.metrics.requests.labels(tenant, "none", "error").inc()
            return json_error(503, "no decode instance available", "ServiceUnavailableError")
        f = plan.features
        stream = bool(body.get("stream", False))
        rec = RequestRecord(
            request_id, arrival_ts, f.tenant, plan.decision.route.value, plan.decision.reason.value, stream,
            f.input_tokens, f.expected_output_tokens, plan.prefix_hit_tokens,
        )  # fmt: skip
        req = FlowRequest(request.path, raw, body, request_id, arrival, authorization, plan, rec)
        request[RECORD_KEY] = rec  # the route and its reason go out as response headers (router.app)
        tenant_policy = resolved.tenants.get(f.tenant)
        slo = tenant_policy.tenant.slo if tenant_policy is not None else None
        if plan.refused:
            return self._refuse(rec, slo, arrival)
        self.metrics.routed(rec)
        self.metrics.in_flight.inc()
        try:
            response = await self._serve(request, req)
            if not response.prepared:  # a stream was prepared with its headers (router.app's hook)
                add_route_headers(response, rec)
            if req.cut is not None:
                await self._resume(req)
            return response
        except asyncio.CancelledError:
            if not req.delivered:
                rec.error = rec.error or "client disconnected"
                rec.status = 499
            raise
        finally:
            self.metrics.in_flight.dec()
            if rec.e2e_s is None:
                rec.e2e_s = self._now() - arrival
            self.metrics.record(rec, slo)
            if self.log is not None:
                self.log.write(rec)

    def _refuse(self, rec: RequestRecord, slo: Slo | None, arrival: float) -> web.Response:
        """Answer a request the admission stage refused: 429 with ``Retry-After``, counted and logged as ``refused``."""
        retry_after_s = self.planner.admission.retry_after_s
        rec.route = REFUSED_ROUTE
        rec.status = 429
        rec.error = "refused by admission control: its first token would come after its tenant's TTFT objective"
        rec.e2e_s = self._now() - arrival
        self.metrics.routed(rec)
        self.metrics.record(rec, slo)
        if self.log is not None:
            self.log.write(rec)
        response = json_error(429, rec.error, "RateLimitError")
        response.headers["Retry-After"] = str(math.ceil(retry_after_s))
        add_route_headers(response, rec)
        return response

    async def _resume(self, req: FlowRequest) -> None:
        """Resume a stream cut mid-way on another decode instance (:mod:`router.migrate`), then end it."""
        assert req.cut is not None
        downstream, transcript = req.cut
        req.cut = None
        failed = {req.record.decode_instance} if req.record.decode_instance else set()
        await self._migrator.resume(req, downstream, transcript, failed)
        with contextlib.suppress(ConnectionError):
            await downstream.write_eof()

    async def _serve(self, request: web.Request, req: FlowRequest) -> web.StreamResponse:
        plan, rec = req.plan, req.record
        params: dict[str, Any] | None = None
        remote = plan.decision.is_remote and plan.prefill is not None
        if remote:
            try:
                params = await self._prefill_with_fallback(req)
            finally:
                self.planner.decode_leg_started(plan)
            remote = params is not None
        decode_bytes = decode_body(req.body, params) if remote else local_body(req.body, req.raw)
        tried: set[str] = set()
        inst: Instance | None = plan.decode
        if inst is not None and not inst.serves("decode"):
            # it started draining towards another role (or failed) while the prefill leg ran: it takes no new
            # decode legs, so choose again among the instances serving decode now
            chosen = self.planner.choose_decode(req.plan.blocks, frozenset())
            inst = chosen[0] if chosen else inst
        for attempt in range(self.config.max_decode_attempts):
            if inst is None:
                break
            tried.add(inst.id)
            if attempt > 0:
                self._fallback(rec, "decode_retry")
            try:
                return await self._decode_leg(request, req, inst, decode_bytes, remote)
            except _DecodeFailed as failure:
                if failure.transfer:
                    # the KV pull failed or timed out: serve locally, on the same decode instance first
                    remote = False
                    decode_bytes = local_body(req.body, req.raw)
                    try:
                        return await self._decode_leg(request, req, inst, decode_bytes, False)
                    except _DecodeFailed:
                        pass
            chosen = self.planner.choose_decode(req.plan.blocks, frozenset(tried))
            inst = chosen[0] if chosen else None
        rec.status = 502
        rec.error = rec.error or "no decode instance could serve the request"
        return json_error(502, rec.error, "InternalServerError")

    def _fallback(self, rec: RequestRecord, kind: str) -> None:
        rec.fallback = kind if rec.fallback is None else f"{rec.fallback},{kind}"
        self.metrics.fallbacks.labels(rec.tenant, kind).inc()

    def _mark_failed(self, inst: Instance, kind: str) -> None:
        inst.consecutive_failures += 1
        self.metrics.upstream_errors.labels(inst.id, kind).inc()
        if kind in ("connect", "disconnect", "5xx", "timeout"):
            inst.healthy = False

    # ----------------------------------------------------------------------------------------- prefill leg

    async def _prefill_with_fallback(self, req: FlowRequest) -> dict[str, Any] | None:
        """Run the prefill leg; None means "serve locally" (fallback recorded)."""
        plan, rec = req.plan, req.record
        body = prefill_body(req.body)
        inst: Instance | None = plan.prefill
        retry = plan.thresholds.on_kv_transfer_timeout is FallbackAction.RETRY_REMOTE_PREFILL
        tried: set[str] = set()
        while inst is not None:
            tried.add(inst.id)
            params, failure = await self._prefill_leg(req, inst, body)
            if params is not None:
                rec.prefill_instance = inst.id
                return params
            self.transfer_health.record(self._now(), False)
            self._fallback(rec, failure)
            inst = None
            if retry:
                retry = False
                others = [i for i in self.registry.serving("prefill") if i.id not in tried]
                if others:
                    inst = min(others, key=lambda i: i.in_flight_prefill_tokens)
                    self._fallback(rec, "prefill_retry")
        rec.route = Route.LOCAL_PREFILL.value
        return None

    async def _prefill_leg(self, req: FlowRequest, inst: Instance, body: bytes) -> tuple[dict[str, Any] | None, str]:
        tokens = req.record.input_tokens
        alone = inst.in_flight == 0
        self.registry.acquire(inst, tokens)
        start = self._now()
        if "request_queue_wait" not in req.record.stages:
            req.record.stages["request_queue_wait"] = start - req.arrival
        try:
            async with self.session.post(
                inst.url + req.path,
                data=body,
                headers=forwarded_headers(req.request_id, req.authorization),
                timeout=self._prefill_timeout,
            ) as resp:
                payload = await resp.read()
                status = resp.status
        except TimeoutError:
            self._mark_failed(inst, "prefill_timeout")
            return None, "prefill_timeout"
        except UPSTREAM_ERRORS:
            self._mark_failed(inst, "connect")
            return None, "prefill_error"
        finally:
            self.registry.release(inst, tokens)
        elapsed = self._now() - start
        if status != 200:
            self.metrics.upstream_errors.labels(inst.id, f"http_{status}").inc()
            return None, "prefill_error"
        params = prefill_params(payload)
        if params is None:
            return None, "prefill_error"
        if alone:
            self.planner.rate(inst).observe(tokens, elapsed)
        req.record.stages["prefill_compute_time"] = elapsed
        return params, ""

    # ------------------------------------------------------------------------------------------ decode leg

    async def _decode_leg(
        self, request: web.Request, req: FlowRequest, inst: Instance, body: bytes, remote: bool
    ) -> web.StreamResponse:
        """Serve the request from ``inst``; raise :class:`_DecodeFailed` if it failed before the first byte."""
        rec = req.record
        self.registry.acquire(inst)
        if not remote:  # the admission stage's view of this instance's own prefill queue
            req.awaiting_first = (inst, max(rec.input_tokens - req.plan.prefix_hit_tokens, 0))
            inst.awaiting_first_token_tokens += req.awaiting_first[1]
        try:
            start = self._now()
            rec.stages.setdefault("request_queue_wait", start - req.arrival)
            if req.stream:
                return await self._stream_leg(request, req, inst, body, remote, start)
            return await self._unary_leg(req, inst, body, remote, start)
        finally:
            first_token_seen(req)
            self.registry.release(inst)

    def _decode_timed_out(self, rec: RequestRecord, inst: Instance, remote: bool) -> _DecodeFailed:
        """A decode leg that did not answer in time: a stalled KV pull (remote) or a stalled instance."""
        if remote:
            self._transfer_failed(rec, "transfer_timeout")
            return _DecodeFailed(transfer=True)
        self._mark_failed(inst, "timeout")
        return _DecodeFailed()

    def _decode_unreachable(self, rec: RequestRecord, inst: Instance, kind: str, exc: BaseException) -> _DecodeFailed:
        """A decode instance that refused or dropped the connection."""
        self._mark_failed(inst, kind)
        rec.error = f"decode {inst.id}: {type(exc).__name__}"
        return _DecodeFailed()

    def _transfer_failed(self, rec: RequestRecord, kind: str) -> None:
        self.transfer_health.record(self._now(), False)
        self._fallback(rec, kind)
        rec.route = Route.LOCAL_PREFILL.value

    async def _stream_leg(
        self, request: web.Request, req: FlowRequest, inst: Instance, body: bytes, remote: bool, start: float
    ) -> web.StreamResponse:
        rec = req.record
        t = self.config.timeouts
        try:
            resp = await self.session.post(
                inst.url + req.path,
                data=body,
                headers=forwarded_headers(req.request_id, req.authorization),
                timeout=self._stream_timeout,
            )
        except UPSTREAM_ERRORS as exc:
            self._mark_failed(inst, "connect")
            rec.error = f"decode {inst.id}: {type(exc).__name__}"
            raise _DecodeFailed from exc
        reusable = False
        try:
            if resp.status != 200:
                return await self._non_200(req, inst, resp, remote)
            try:
                async with asyncio.timeout(t.remote_first_token_s if remote else t.first_token_s):
                    first = await resp.content.readany()
            except TimeoutError as exc:
                raise self._decode_timed_out(rec, inst, remote) from exc
            except UPSTREAM_ERRORS as exc:
                raise self._decode_unreachable(rec, inst, "disconnect", exc) from exc
            if not first:
                self._mark_failed(inst, "disconnect")
                raise _DecodeFailed
            if remote and is_error_event(first):
                self._transfer_failed(rec, "transfer_failed")
                raise _DecodeFailed(transfer=True)
            if remote:
                self.transfer_health.record(self._now(), True)
            first_s = self._now()
            first_token_seen(req)
            rec.error = None
            rec.decode_instance = inst.id
            self.planner.tracker(inst).record(req.plan.blocks)
            rec.stages["first_token_emit_time"] = first_s - start
            rec.ttft_s = first_s - req.arrival
            downstream = web.StreamResponse(headers=_SSE_HEADERS)
            await downstream.prepare(request)
            result = RelayResult(0, first_s, False)
            transcript = StreamTranscript() if self._migrator.enabled else None
            try:
                await relay(resp, downstream, first, self._now, result, transcript.feed if transcript else None)
            except asyncio.CancelledError:
                if result.delivered:  # the client had everything and left: a success, counted as one
                    self._delivered(req, inst, result, first_s, first)
                raise
            reusable = result.done and result.upstream_error is None and not result.client_gone
        finally:
            if reusable:
                resp.release()  # back to the pool if fully read, else dropped (aiohttp checks)
            else:
                resp.close()  # abandoned or broken: drop the connection (the instance then aborts the request)
        self._finish_stream(req, inst, result.events, result.last_chunk_s, first_s, is_error_event(first))
        req.delivered = result.delivered and rec.error is None
        if result.upstream_error is not None:
            self._mark_failed(inst, "disconnect")
            rec.error = f"decode {inst.id} failed mid-stream: {result.upstream_error}"
            rec.status = 502
            if transcript is not None:
                req.cut = (downstream, transcript)  # resumed (or ended with an error event) by generate()
                return downstream
            with contextlib.suppress(ConnectionError):
                await downstream.write(sse_error_event(502, rec.error))
        elif result.client_gone and not result.delivered:
            rec.error = "client disconnected"
            rec.status = 499
        with contextlib.suppress(ConnectionError):
            await downstream.write_eof()
        return downstream

    def _delivered(self, req: FlowRequest, inst: Instance, result: RelayResult, first_s: float, first: bytes) -> None:
        """Account a stream whose ``[DONE]`` reached the client before the handler was cancelled."""
        self._finish_stream(req, inst, result.events, result.last_chunk_s, first_s, is_error_event(first))
        req.delivered = req.record.error is None

    def _finish_stream(
        self, req: FlowRequest, inst: Instance, events: int, last_s: float, first_s: float, first_is_error: bool
    ) -> None:
        rec = req.record
        output = events - 1  # [DONE]
        if req.path.endswith("/chat/completions"):
            output -= 1  # the role-only first chunk
        options = req.body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            output -= 1
        rec.output_tokens = max(output, 0)
        if first_is_error:
            rec.error = "decode instance answered with an error event"
            rec.status = 500
        rec.e2e_s = last_s - req.arrival
        if rec.output_tokens > 1:
            rec.tpot_s = (last_s - first_s) / (rec.output_tokens - 1)
            rec.stages["per_token_decode_time"] = rec.tpot_s
        inst.consecutive_failures = 0

    async def _non_200(
        self, req: FlowRequest, inst: Instance, resp: aiohttp.ClientResponse, remote: bool
    ) -> web.StreamResponse:
        """A decode instance answered with an error status before streaming."""
        rec = req.record
        payload = await resp.read()
        if resp.status >= 500:
            if remote:
                self._transfer_failed(rec, "transfer_failed")
                raise _DecodeFailed(transfer=True)
            self._mark_failed(inst, "5xx")
            rec.error = f"decode {inst.id}: HTTP {resp.status}"
            raise _DecodeFailed
        rec.status = resp.status
        rec.error = f"HTTP {resp.status}"
        rec.decode_instance = inst.id
        return web.Response(body=payload, status=resp.status, content_type="application/json")

    async def _unary_leg(
        self, req: FlowRequest, inst: Instance, body: bytes, remote: bool, start: float
    ) -> web.StreamResponse:
        rec = req.record
        try:
            async with self.session.post(
                inst.url + req.path,
                data=body,
                headers=forwarded_headers(req.request_id, req.authorization),
                timeout=self._unary_timeout,
            ) as resp:
                payload = await resp.read()
                status = resp.status
        except TimeoutError as exc:
            raise self._decode_timed_out(rec, inst, remote) from exc
        except UPSTREAM_ERRORS as exc:
            raise self._decode_unreachable(rec, inst, "connect", exc) from exc
        if status >= 500:
            if remote:
                self._transfer_failed(rec, "transfer_failed")
                raise _DecodeFailed(transfer=True)
            self._mark_failed(inst, "5xx")
            raise _DecodeFailed
        if remote:
            self.transfer_health.record(self._now(), True)
        end = self._now()
        if req.plan is not None and status == 200:
            self.planner.tracker(inst).record(req.plan.blocks)
        rec.error = None if status == 200 else f"HTTP {status}"
        rec.status = status
        rec.decode_instance = inst.id
        rec.ttft_s = end - req.arrival
        rec.e2e_s = rec.ttft_s
        rec.stages["first_token_emit_time"] = end - start
        rec.output_tokens = completion_tokens(payload)
        return web.Response(body=payload, status=status, content_type="application/json")


def _bearer_key(headers: Mapping[str, str]) -> str | None:
    """The API key of an ``Authorization: Bearer KEY`` header (tenant identification), else ``None``."""
    authorization = headers.get("Authorization")
    return authorization[7:].strip() if authorization and authorization[:7].lower() == "bearer " else None
