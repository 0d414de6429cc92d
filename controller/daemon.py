"""The daemon: named root tasks, signals, reload, graceful stop.

Root tasks: the tick loop and the reload handler; the health server runs beside them. SIGTERM/SIGINT set
the stop flag (the current tick finishes, then everything closes); SIGHUP asks for a reload: the config file
is read and the whole new runtime is built and validated first; only then is it swapped in (a bad config
keeps the old one, counted in ``pdctl_controller_config_reloads_total{result="error"}``). If a root task
ends unexpectedly, the daemon stops rather than limping on. An active controller that actuates holds its lease
file (:mod:`controller.lease`) from start to stop; a second one is refused at start (a reload that would need a
lease another process holds is refused too). Such a controller also keeps its control state in a file
(:mod:`controller.control_memory`), read back at start once the lease is held, so a restart carries on with the
thresholds in force and the guard's cooldowns and reversal holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from controller.audit import AuditLog
from controller.clock import Clock, WallClock
from controller.config import ConfigError, ControllerConfig, load_config
from controller.control_memory import ControlMemoryError, ControlMemoryFile, control_memory_path
from controller.health import HealthServer
from controller.lease import Lease, LeaseHeldError, lease_path
from controller.loop import ControlLoop
from controller.overrides import OverrideWatcher
from controller.runtime import RuntimeConfigError, build_runtime
from controller.telemetry import Telemetry
from policies.registry import remembering_policy

__all__ = ["Daemon", "DaemonSignals", "run"]

_log = logging.getLogger("pdctl.controller")


@dataclass(slots=True)
class DaemonSignals:
    """Flags the signal handlers (or a test) set."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    reload: asyncio.Event = field(default_factory=asyncio.Event)


class Daemon:
    """Owns the loop, the health server and the signal wiring for one config file."""

    def __init__(
        self,
        config_path: Path,
        clock: Clock | None = None,
        *,
        registry: CollectorRegistry | None = None,
        allow_virtual_clock: bool = False,
    ) -> None:
        self.config_path = config_path
        self.clock: Clock = clock or WallClock()
        if not self.clock.production_safe and not allow_virtual_clock:
            raise RuntimeError("a virtual clock is for tests only; the daemon refuses it in production")
        self.registry = registry or CollectorRegistry()
        self.telemetry = Telemetry(self.registry)
        self.signals = DaemonSignals()
        config = load_config(config_path)
        runtime = build_runtime(config, generation=1, started_s=self.clock.now().timestamp())
        self.loop = ControlLoop(
            runtime, self.clock, self.telemetry, AuditLog(config.audit_log), OverrideWatcher(config.override_dir)
        )
        path = lease_path(config)
        self.lease: Lease | None = None if path is None else Lease(path)
        memory = control_memory_path(config)
        self.loop.memory = None if memory is None else ControlMemoryFile(memory)
        self.health = HealthServer(
            self.registry,
            lambda: self.loop.healthy_age_s,
            lambda: self.loop.runtime.config.interval_s * self.loop.runtime.config.heartbeat_timeout_intervals,
            lambda: self.loop.ready,
            lambda: self.loop.not_ready_reasons,
        )

    async def reload(self) -> bool:
        """Validate the config file and swap it in; keep the running one if anything is wrong."""
        old = self.loop.runtime
        try:
            config = load_config(self.config_path)
            runtime = build_runtime(config, generation=old.generation + 1, started_s=self.clock.now().timestamp())
        except (ConfigError, RuntimeConfigError) as exc:
            self.telemetry.reloads.labels(result="error").inc()
            _log.error("reload refused, keeping generation %d: %s", old.generation, "; ".join(str(exc).splitlines()))
            return False
        try:
            lease = self._lease_for(config)
        except LeaseHeldError as exc:
            self.telemetry.reloads.labels(result="error").inc()
            _log.error("reload refused, keeping generation %d: %s", old.generation, exc)
            return False
        if config.listen != old.config.listen:
            _log.warning("reload: listen address changes take effect after a restart")
        if config.audit_log != old.config.audit_log:
            self.loop.audit = AuditLog(config.audit_log)
        if config.override_dir != old.config.override_dir:
            self.loop.watcher = OverrideWatcher(config.override_dir)
        await self.loop.swap(runtime)
        memory = control_memory_path(config)
        if memory is None:
            self.loop.memory = None
        elif self.loop.memory is None or self.loop.memory.path != memory:
            self.loop.memory = ControlMemoryFile(memory)  # written at the next tick from the state in the process
        if lease is not self.lease and self.lease is not None:
            self.lease.release()
        self.lease = lease
        self.telemetry.reloads.labels(result="ok").inc()
        _log.info(
            "reloaded: generation %d, policy %s, mode %s", runtime.generation, runtime.policy.policy_id, config.mode
        )
        return True

    def _lease_for(self, config: ControllerConfig) -> Lease | None:
        """The lease ``config`` needs, taken (the current one if it is the same path).

        Raises:
            LeaseHeldError: another process holds it.
        """
        path = lease_path(config)
        if path is None:
            return None
        if self.lease is not None and self.lease.path == path:
            return self.lease
        lease = Lease(path)
        lease.acquire()
        return lease

    def _restore_memory(self) -> None:
        """Read the control state back (after the lease is taken: one writer per memory file).

        Raises:
            ControlMemoryError: the file is malformed (one line naming it and the field).
        """
        memory = self.loop.memory
        if memory is None:
            return
        base = {name: tp.thresholds for name, tp in self.loop.runtime.base.tenants.items()}
        limits = self.loop.runtime.guard.limits
        read = memory.load(base, self.clock.monotonic(), self.clock.now().timestamp(), limits.max_staleness_s)
        if read is None:
            return
        self.loop.restore(read.state)
        policy = remembering_policy(self.loop.runtime.policy)
        resumed = False
        same = self.loop.runtime.policy.policy_id == read.policy_id
        if read.policy_memory is not None and policy is not None and same:
            try:
                policy.restore_memory(read.policy_memory, read.policy_shift_s)
            except ValueError as exc:
                raise ControlMemoryError(f"{memory.path}: policy.memory.{exc}".splitlines()[0]) from None
            resumed = True
        _log.info(
            "control memory restored from %s: %s; the guard's memory of %d group(s) and %d tenant(s); %s",
            memory.path,
            "the thresholds in force"
            if read.thresholds_kept
            else "the base policy changed since, so the thresholds restart from it",
            len(read.state.guard.groups),
            len(read.state.guard.tenants),
            f"the memory of {read.policy_id}" if resumed else "no policy memory for this policy",
        )

    async def _ticks(self) -> None:
        while not self.signals.stop.is_set():
            started = self.clock.monotonic()
            try:
                await self.loop.tick()
            except Exception:  # one bad tick is logged and counted; the next one runs
                _log.exception("tick failed")
            interval = self.loop.runtime.config.interval_s
            await self.clock.sleep(max(interval - (self.clock.monotonic() - started), 0.0))

    async def _reloads(self) -> None:
        while True:
            await self.signals.reload.wait()
            self.signals.reload.clear()
            await self.reload()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT → stop, SIGHUP → reload (main thread only; otherwise logged and skipped)."""
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGTERM, self.signals.stop.set)
            loop.add_signal_handler(signal.SIGINT, self.signals.stop.set)
            loop.add_signal_handler(signal.SIGHUP, self.signals.reload.set)
        except (RuntimeError, ValueError, NotImplementedError) as exc:
            _log.warning("signal handlers not installed: %s", exc)

    async def run(self, *, install_signals: bool = True) -> None:
        """Run until stopped; always closes what it opened."""
        config = self.loop.runtime.config
        if self.lease is not None:
            self.lease.acquire()  # LeaseHeldError: another controller writes to these targets
        try:
            self._restore_memory()
        except BaseException:
            if self.lease is not None:
                self.lease.release()
            raise
        if install_signals:
            self.install_signal_handlers()
        port = await self.health.start(config.listen.host, config.listen.port)
        _log.info(
            "controller started: generation %d, policy %s, mode %s, http://%s:%d",
            self.loop.runtime.generation,
            self.loop.runtime.policy.policy_id,
            config.mode,
            config.listen.host,
            port,
        )
        tasks = {
            asyncio.create_task(self._ticks(), name="pdctl-controller-ticks"),
            asyncio.create_task(self._reloads(), name="pdctl-controller-reloads"),
            asyncio.create_task(self.signals.stop.wait(), name="pdctl-controller-stop"),
        }
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.get_name() != "pdctl-controller-stop" and task.exception() is not None:
                    _log.error("root task %s failed: %r", task.get_name(), task.exception())
        finally:
            self.signals.stop.set()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(task, timeout=10.0)
            await self.health.stop()
            await self.loop.runtime.close()
            if self.lease is not None:
                self.lease.release()
            _log.info("controller stopped")


def run(config_path: Path) -> None:
    """Run the daemon on the wall clock until SIGTERM/SIGINT."""
    asyncio.run(Daemon(config_path).run())
