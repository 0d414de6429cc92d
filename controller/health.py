"""The daemon's HTTP endpoints: ``/healthz`` (loop heartbeat fresh), ``/readyz``, ``/metrics``.

``/readyz`` is 503 with the reasons (``{"status": "not ready", "reasons": [...]}``) until the first fresh
observation, while an actuator cannot read the cluster, while the metric source is stale or down, and from a
tick whose policy raised until the policy decides again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = ["HealthServer"]


class HealthServer:
    """Serves health, readiness and metrics on one address (127.0.0.1 by default)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        heartbeat_age_s: Callable[[], float | None],
        max_heartbeat_age_s: Callable[[], float],
        ready: Callable[[], bool],
        not_ready_reasons: Callable[[], Sequence[str]] = tuple,
    ) -> None:
        self._registry = registry
        self._age = heartbeat_age_s
        self._max_age = max_heartbeat_age_s
        self._ready = ready
        self._reasons = not_ready_reasons
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(client_max_size=64 * 1024)  # GET only: no request needs a body
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _healthz(self, request: web.Request) -> web.Response:
        del request
        age = self._age()
        if age is not None and age <= self._max_age():
            return web.json_response({"status": "ok", "heartbeat_age_s": round(age, 3)})
        return web.json_response({"status": "stale", "heartbeat_age_s": age}, status=503)

    async def _readyz(self, request: web.Request) -> web.Response:
        del request
        if self._ready():
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "not ready", "reasons": list(self._reasons())}, status=503)

    async def _metrics(self, request: web.Request) -> web.Response:
        del request
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 = any free port); returns the bound port."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        return self.port

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
