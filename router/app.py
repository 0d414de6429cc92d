"""The router's HTTP server: OpenAI-compatible endpoints, health, admin, metrics, and its lifecycle.

:class:`Router` owns the server, the upstream client pool and the live state (instances, estimates, transfer
health, the policy). Generation requests go through the P/D request flow (:mod:`router.flow`); health checks,
KV-usage polling and log flushing run as background upkeep (:mod:`router.upkeep`); roles, drains and the policy
change through the admin API (:mod:`router.admin`).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from policies.policy_file import PolicyFile, load_policy_file
from router.admin import AdminApi, PolicyState, policy_state_from
from router.config import RouterConfig
from router.decide import Planner
from router.estimates import TransferHealth
from router.flow import RECORD_KEY, UPSTREAM_ERRORS, RequestFlow, add_route_headers, prefill_client_timeout
from router.limits import bounded_input
from router.parts import RouterParts
from router.registry import InstanceRegistry
from router.relay import error_body
from router.telemetry import RequestLog, RouterMetrics
from router.upkeep import Upkeep

__all__ = ["Router"]


class Router:
    """The P/D router: owns the HTTP server, the upstream client pool and the live state."""

    def __init__(self, config: RouterConfig, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.registry = InstanceRegistry(config.instances)
        h = config.health
        self.transfer_health = TransferHealth(
            h.transfer_window_s, h.transfer_min_samples, h.transfer_unhealthy_frac, h.transfer_probe_requests
        )
        self.planner = Planner(self.registry, config.estimation, self.transfer_health, config.admission.to_config())
        self.metrics_registry = registry or CollectorRegistry()
        self.metrics = RouterMetrics(self.metrics_registry)
        policy = load_policy_file(config.policy_file) if config.policy_file else PolicyFile()
        self.policy = policy_state_from(policy, 0, str(config.policy_file or "<defaults>"))
        self.metrics.policy_generation.set(0)
        self.metrics.admission_slack.set(config.admission.ttft_slack_frac or 0.0)
        self.log = RequestLog(config.request_log) if config.request_log else None
        parts = RouterParts(
            config, self.registry, self.planner, self.transfer_health, self.metrics, self.log,
            lambda: self.session, self._now,
        )  # fmt: skip
        self._flow = RequestFlow(parts, lambda: self.policy)
        self._upkeep = Upkeep(parts)
        self.admin = AdminApi(
            config.resolved_admin_token(),
            lambda: self.policy,
            self._set_policy,
            self.registry,
            lambda: self.transfer_health.healthy(self._now()),
            self._upkeep.publish_instances,
            config.limits.max_json_depth,
            self.planner.rollback,
            config.admission.ttft_slack_frac,
        )
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port = config.listen.port
        self._models_timeout = prefill_client_timeout(config)

    @property
    def url(self) -> str:
        """Base URL of the router."""
        return f"http://{self.config.listen.host}:{self.port}"

    @property
    def session(self) -> aiohttp.ClientSession:
        """The upstream client pool (open between :meth:`start` and :meth:`stop`)."""
        if self._session is None:
            raise RuntimeError("router is not started")
        return self._session

    def _now(self) -> float:
        return self._loop.time() if self._loop is not None else time.monotonic()

    def app(self) -> web.Application:
        """The aiohttp application."""
        limits = self.config.limits
        app = web.Application(
            client_max_size=max(limits.max_body_bytes, limits.max_admin_body_bytes),
            middlewares=[bounded_input(limits.max_body_bytes, limits.max_admin_body_bytes, self._flow.count_rejected)],
        )
        app.on_response_prepare.append(_route_headers)
        app.router.add_post("/v1/completions", self._flow.generate)
        app.router.add_post("/v1/chat/completions", self._flow.generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        self.admin.add_routes(app)
        return app

    async def start(self) -> None:
        """Open the client pool, start background tasks and listen."""
        self._loop = asyncio.get_running_loop()
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60, ttl_dns_cache=None)
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
        )
        self._runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.listen.host, self.config.listen.port, reuse_address=True)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        self._upkeep.start()
        self._upkeep.publish_instances()

    async def stop(self) -> None:
        """Stop listening, cancel background tasks, close the pool and the log."""
        await self._upkeep.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self.session.close()
            self._session = None
        if self.log is not None:
            self.log.close()

    def _set_policy(self, state: PolicyState) -> None:
        self.policy = state
        self.metrics.policy_generation.set(state.generation)

    async def _health(self, _: web.Request) -> web.Response:
        ok = bool(self.registry.serving("decode"))
        return web.Response(status=200 if ok else 503)

    async def _metrics(self, _: web.Request) -> web.Response:
        self._upkeep.publish_instances()
        return web.Response(body=generate_latest(self.metrics_registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _models(self, _: web.Request) -> web.StreamResponse:
        for inst in self.registry.serving("decode"):
            try:
                async with self.session.get(inst.url + "/v1/models", timeout=self._models_timeout) as resp:
                    return web.Response(body=await resp.read(), status=resp.status, content_type="application/json")
            except UPSTREAM_ERRORS:
                continue
        return web.Response(body=error_body(503, "no decode instance available", "ServiceUnavailableError"), status=503)


async def _route_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Add the route headers to a stream prepared by the request flow (it prepares with its own request)."""
    rec = request.get(RECORD_KEY)
    if rec is not None:
        add_route_headers(response, rec)
