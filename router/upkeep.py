"""The router's upkeep: health checks, KV-usage polling, request-log flushing and the instance gauges.

Background loops that keep the live state (:class:`router.registry.InstanceRegistry`) current between
requests; :class:`router.app.Router` starts them with the server and cancels them on stop. Roles and drains
change through the admin API (:mod:`router.admin`).
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from router.flow import UPSTREAM_ERRORS, prefill_client_timeout
from router.parts import RouterPart, RouterParts
from router.registry import Instance

__all__ = ["Upkeep"]

_LOG_FLUSH_INTERVAL_S = 1.0


class Upkeep(RouterPart):
    """Health checks, KV-usage polling and log flushing as background tasks, and the instance gauges."""

    def __init__(self, parts: RouterParts) -> None:
        super().__init__(parts)
        self._poll_timeout = prefill_client_timeout(parts.config)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start the background tasks (on the running loop)."""
        self._tasks = [asyncio.create_task(self._health_loop(), name="router-health")]
        if self.log is not None:
            self._tasks.append(asyncio.create_task(self._flush_loop(), name="router-log-flush"))
        if self.config.health.metrics_poll_s > 0:
            self._tasks.append(asyncio.create_task(self._metrics_poll_loop(), name="router-metrics-poll"))

    async def stop(self) -> None:
        """Cancel the background tasks and wait for them to end."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def publish_instances(self) -> None:
        """Set the per-instance gauges (health, in flight, role) and the transfer-health gauge."""
        m = self.metrics
        for inst in self.registry.instances.values():
            m.instance_healthy.labels(inst.id).set(1 if inst.healthy else 0)
            for role in ("prefill", "decode"):
                m.instance_in_flight.labels(inst.id, role).set(inst.in_flight if inst.role == role else 0)
                m.instance_role.labels(inst.id, role).set(1 if inst.role == role else 0)
        m.transfer_healthy.set(1 if self.transfer_health.healthy(self._now()) else 0)

    async def _health_loop(self) -> None:
        h = self.config.health
        timeout = aiohttp.ClientTimeout(total=h.timeout_s)
        while True:
            await asyncio.gather(*(self._check(inst, timeout) for inst in self.registry.instances.values()))
            self.publish_instances()
            await asyncio.sleep(h.interval_s)

    async def _check(self, inst: Instance, client_timeout: aiohttp.ClientTimeout) -> None:
        """One health probe of ``inst``.

        A refusal or a non-200 answer marks the instance down at once; a probe that times out does only after
        ``unhealthy_after_timeouts`` in a row (one slow answer from a busy host is not a dead instance).
        """
        timed_out = False
        try:
            async with self.session.get(inst.url + "/health", timeout=client_timeout) as resp:
                ok = resp.status == 200
        except TimeoutError:  # aiohttp's timeouts are TimeoutError too
            ok, timed_out = False, True
        except UPSTREAM_ERRORS:
            ok = False
        inst.probe_timeouts = inst.probe_timeouts + 1 if timed_out else 0
        if timed_out and inst.probe_timeouts < self.config.health.unhealthy_after_timeouts:
            return
        if ok and not inst.healthy:
            self.planner.tracker(inst).clear()  # back after a failure: assume it restarted with an empty cache
        inst.healthy = ok
        if ok:
            inst.consecutive_failures = 0

    async def _metrics_poll_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._poll_kv_usage(inst) for inst in self.registry.instances.values()))
            await asyncio.sleep(self.config.health.metrics_poll_s)

    async def _poll_kv_usage(self, inst: Instance) -> None:
        try:
            async with self.session.get(inst.url + "/metrics", timeout=self._poll_timeout) as resp:
                text = await resp.text()
        except UPSTREAM_ERRORS:
            inst.kv_usage_frac = None
            return
        values = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm:kv_cache_usage_perc{") and " " in line
        ]
        inst.kv_usage_frac = max(values) if values else None

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(_LOG_FLUSH_INTERVAL_S)
            if self.log is not None:
                self.log.flush()
