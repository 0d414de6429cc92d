"""Request migration: a stream whose decode instance failed mid-way resumes on another decode instance.

Like Dynamo's ``--migration-limit``: when a decode instance dies (or stalls past ``timeouts.stream_idle_s``) after
the first bytes of a stream reached the client, the router re-submits the prompt plus the text already streamed
(:func:`router.resume.continuation_body`) to another decode instance taking requests, and relays the rest of
the stream to the same client response, rewritten so that the client sees one continuous stream
(:class:`router.resume.StreamTranscript`). A request is migrated at most ``migration_limit`` times; past that,
or with no decode instance left, or for a request that cannot be resumed, the stream ends as before: a vLLM-style
error event and ``[DONE]``. A continuation that fails (before or after its first byte) marks its instance failed
and counts one more migration.

Non-streaming requests need no migration: nothing reached the client before a failure, so the request flow
retries them whole on another decode instance (``max_decode_attempts``).

Each attempt counts in ``pdctl_router_migrations_total{outcome}``: ``completed`` (the continuation reached
``[DONE]``), ``error_event`` (it reached ``[DONE]`` after an error event of its own: the request failed),
``failed`` (the continuation's instance failed too), ``refused`` (it answered 4xx: the stream ends with an error
event), ``client_gone``; a cut stream that is not
resumed counts once as ``exhausted`` (limit reached), ``no_instance`` or ``unsupported``. Each attempt also
adds ``migration`` to the request record's ``fallback`` and is logged (``pdctl.router``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import aiohttp
from aiohttp import web

from router.config import RouterConfig
from router.decide import Planner
from router.pd import forwarded_headers
from router.registry import Instance, InstanceRegistry
from router.relay import (
    UPSTREAM_ERRORS,
    RelayResult,
    is_error_event,
    relay,
    sse_error_event,
    stream_client_timeout,
)
from router.request import FlowRequest
from router.resume import StreamTranscript, continuation_body, generation_over, stream_tail
from router.telemetry import RouterMetrics

__all__ = ["StreamMigrator"]

_log = logging.getLogger("pdctl.router")


class StreamMigrator:
    """Resumes cut streams on other decode instances, up to ``config.migration_limit`` times per request."""

    def __init__(
        self,
        config: RouterConfig,
        registry: InstanceRegistry,
        planner: Planner,
        metrics: RouterMetrics,
        session: Callable[[], aiohttp.ClientSession],
        now: Callable[[], float],
        mark_failed: Callable[[Instance, str], None],
        fallback: Callable[[FlowRequest, str], None],
    ) -> None:
        self.limit = config.migration_limit
        self.registry = registry
        self.planner = planner
        self.metrics = metrics
        self._session = session
        self._now = now
        self._mark_failed = mark_failed
        self._fallback = fallback
        self._timeout = stream_client_timeout(config.timeouts)
        self._first_token_s = config.timeouts.first_token_s

    @property
    def enabled(self) -> bool:
        """Whether cut streams are resumed at all (``migration_limit`` > 0)."""
        return self.limit > 0

    async def resume(
        self, req: FlowRequest, downstream: web.StreamResponse, transcript: StreamTranscript, failed: set[str]
    ) -> None:
        """Finish the cut stream of ``req`` on ``downstream``: the rest of it, or an error event and ``[DONE]``.

        ``failed``: ids of the decode instances that failed this request (never chosen again). Updates the
        request record (status, error, output tokens, decode instance); the caller writes the EOF.
        """
        rec = req.record
        chat = req.path.endswith("/chat/completions")
        migrations = 0
        while True:
            delivered = transcript.resume()
            if generation_over(req.body, delivered):
                await self._write(downstream, stream_tail(req.body, delivered, rec.input_tokens))
                self._succeeded(req, delivered.tokens, "completed")
                return
            body = continuation_body(req.body, chat, delivered)
            chosen = self.planner.choose_decode(req.plan.blocks, frozenset(failed))
            outcome = (
                "unsupported" if body is None
                else "exhausted" if migrations >= self.limit
                else "no_instance" if chosen is None
                else ""
            )  # fmt: skip
            if outcome or body is None or chosen is None:
                self.metrics.migrations.labels(outcome).inc()
                _log.warning("request %s: stream cut after %d tokens, not migrated (%s)", rec.request_id,
                             delivered.tokens, outcome)  # fmt: skip
                await self._write(downstream, sse_error_event(502, rec.error or "decode instance failed mid-stream"))
                return
            inst = chosen[0]
            migrations += 1
            self._fallback(req, "migration")
            _log.info("request %s: migrating to %s after %d tokens (migration %d of at most %d)", rec.request_id,
                      inst.id, delivered.tokens, migrations, self.limit)  # fmt: skip
            outcome = await self._attempt(req, inst, body, downstream, transcript)
            done = transcript.delivered() if outcome == "completed" else None
            if done is not None and done.error is not None:  # the continuation ended with its own error event
                outcome = "error_event"
            self.metrics.migrations.labels(outcome).inc()
            if done is not None:
                rec.decode_instance = inst.id
                if done.error is None:
                    self._succeeded(req, done.tokens, outcome)
                else:
                    rec.error, rec.status, rec.output_tokens = f"decode {inst.id}: {done.error}", 502, done.tokens
                return
            if outcome == "client_gone":
                rec.error, rec.status = "client disconnected", 499
                rec.output_tokens = transcript.delivered().tokens
                return
            if outcome == "refused":
                await self._write(downstream, sse_error_event(502, rec.error or "migration refused"))
                return
            failed.add(inst.id)

    def _succeeded(self, req: FlowRequest, tokens: int, outcome: str) -> None:
        rec = req.record
        rec.error = None
        rec.status = 200
        rec.output_tokens = tokens
        rec.e2e_s = self._now() - req.arrival
        req.delivered = True
        _log.info("request %s: migrated stream %s with %d tokens", rec.request_id, outcome, tokens)

    async def _write(self, downstream: web.StreamResponse, data: bytes) -> None:
        with contextlib.suppress(ConnectionError):
            await downstream.write(data)

    async def _attempt(
        self,
        req: FlowRequest,
        inst: Instance,
        body: bytes,
        downstream: web.StreamResponse,
        transcript: StreamTranscript,
    ) -> str:
        """One continuation on ``inst``: ``completed``, ``failed``, ``refused`` (HTTP 4xx) or ``client_gone``."""
        rec = req.record
        self.registry.acquire(inst)
        resp: aiohttp.ClientResponse | None = None
        result = RelayResult(0, self._now(), False)
        try:
            resp = await self._session().post(
                inst.url + req.path,
                data=body,
                headers=forwarded_headers(req.request_id, req.authorization),
                timeout=self._timeout,
            )
            if resp.status != 200:
                rec.error = f"decode {inst.id}: HTTP {resp.status} on migration"
                if resp.status < 500:  # the continuation itself was refused: another instance would refuse it too
                    self.metrics.upstream_errors.labels(inst.id, f"http_{resp.status}").inc()
                    return "refused"
                self._mark_failed(inst, "5xx")
                return "failed"
            async with asyncio.timeout(self._first_token_s):
                first = await resp.content.readany()
            if not first:
                self._mark_failed(inst, "disconnect")
                rec.error = f"decode {inst.id}: closed the stream on migration"
                return "failed"
            if is_error_event(first):
                self._mark_failed(inst, "error_event")
                rec.error = f"decode {inst.id}: error event on migration"
                return "failed"
            try:
                await relay(resp, downstream, first, self._now, result, transcript.feed)
            except asyncio.CancelledError:
                if result.delivered:
                    self._succeeded(req, transcript.delivered().tokens, "completed")
                    rec.decode_instance = inst.id
                raise
        except TimeoutError:
            self._mark_failed(inst, "timeout")
            rec.error = f"decode {inst.id}: timed out on migration"
            return "failed"
        except UPSTREAM_ERRORS as exc:
            self._mark_failed(inst, "connect")
            rec.error = f"decode {inst.id}: {type(exc).__name__} on migration"
            return "failed"
        finally:
            self.registry.release(inst)
            if resp is not None:
                if result.done and result.upstream_error is None and not result.client_gone:
                    resp.release()
                else:
                    resp.close()
        if result.client_gone and not result.delivered:
            return "client_gone"
        if result.upstream_error is not None:
            self._mark_failed(inst, "disconnect")
            rec.error = f"decode {inst.id} failed mid-stream: {result.upstream_error}"
            return "failed"
        return "completed"
