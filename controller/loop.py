"""One control tick: observe → policy.decide → guard → overrides → actuate, and its record.

Each tick reads the real state through the actuators (roles, replica counts), polls the override
directory and reads a window from the source; the decision half — ask the policy, clamp with the guard, let
active overrides win for the tenants they name, work out the pool changes and the threshold document — is
:func:`policies.control.control_step`, the same step the gym env takes. In active mode the resulting plan goes
to every actuator. A decision computed while the configuration was swapped (a newer generation exists when it
is ready) is dropped. One JSON line is logged per tick and the same record is appended to the audit log.

A router found running another policy than the one last published to it (it restarted onto its own policy file,
or another writer changed it: :attr:`RouterActuator.policy_drift`) makes an active tick publish the whole table
again, as after a controller restart; otherwise a router restarted under a steady controller would run its file's
thresholds until the policy next changed one.

Advisory mode runs the same pipeline, guard state included, so its log shows what active mode would do and
at the same cadence (hysteresis, cooldown); it never calls an actuator, and the published thresholds and the
policy's view of them stay as they were.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from controller.actuators.base import ActuationResult, Outcome, Plan
from controller.actuators.router import RouterActuator, admission_mismatch
from controller.audit import AuditLog
from controller.clock import Clock
from controller.control_memory import ControlMemoryFile, base_digest
from controller.logs import TICK_LOGGER
from controller.overrides import OverridePoll, OverrideWatcher
from controller.policy_registry import RegistryPolicy
from controller.runtime import Runtime
from controller.sources.base import Topology
from controller.telemetry import Telemetry
from policies.control import ControlEffects, ControlInputs, ControlState, control_step
from policies.guard import Clamp
from policies.registry import fitted_admission_slack, hand_over_memory, remembering_policy
from policies.schema import ControlAction, MetricWindow, PoolTargets, RoutingThresholds
from policies.watchdog import SloWatchdog

__all__ = ["ControlLoop", "TickRecord", "classify"]

_log = logging.getLogger(TICK_LOGGER)


def classify(current: PoolTargets | None, target: PoolTargets) -> str:
    """``hold``, ``scale_up``, ``scale_down`` or ``rebalance`` for one group's change."""
    if current is None or current == target:
        return "hold"
    if target.num_instances > current.num_instances:
        return "scale_up"
    if target.num_instances < current.num_instances:
        return "scale_down"
    return "rebalance"


def _num(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, 6)


@dataclass(frozen=True, slots=True)
class TickRecord:
    """What one tick saw, decided and did (also the audit record)."""

    record: Mapping[str, Any]
    window: MetricWindow
    action: ControlAction
    plan: Plan
    results: tuple[ActuationResult, ...]
    dropped: bool = False


@dataclass(slots=True)
class _LoopState:
    control: ControlState
    topology: Topology = field(default_factory=Topology)
    ticks: int = 0
    last_tick_s: float | None = None
    first_observation: bool = False
    actuators_ready: bool = False
    stale: bool = False
    """The last tick's window was stale (older than ``max_staleness_s``) or its source failed."""
    policy_error: str | None = None
    """Set by a tick whose policy raised; cleared by the first tick the policy (not a fallback) decides again."""
    admission_mismatch: str | None = None
    """Why the router's admission stage does not suit the policy (:func:`admission_mismatch`); ``None``: it does."""
    policy_drift: tuple[str, ...] = ()
    """This tick's routers running another policy than the one last published to them (one line each)."""

    @property
    def policy_thresholds(self) -> Mapping[str, RoutingThresholds]:
        """The thresholds the policy sees as current (its own last decisions, overrides not included)."""
        return self.control.policy_thresholds

    @property
    def published(self) -> Mapping[str, RoutingThresholds] | None:
        """The threshold table last published (``None``: nothing yet under this base policy)."""
        return self.control.published


class ControlLoop:
    """Runs ticks against the current :class:`Runtime`; :meth:`swap` installs a newer generation."""

    def __init__(
        self, runtime: Runtime, clock: Clock, telemetry: Telemetry, audit: AuditLog, watcher: OverrideWatcher
    ) -> None:
        self.runtime = runtime
        self.clock = clock
        self.telemetry = telemetry
        self.audit = audit
        self.watcher = watcher
        self.state = _LoopState(
            control=ControlState.start({n: tp.thresholds for n, tp in runtime.base.tenants.items()}),
            topology=runtime.topology,
        )
        self.memory: ControlMemoryFile | None = None
        """Where the control state is kept across restarts (``None``: in the process only; the daemon sets it)."""
        self._memory_error: str | None = None
        self._base_digest: tuple[int, str] | None = None
        self._lock = asyncio.Lock()
        telemetry.set_policy(runtime.policy.policy_id, runtime.generation, runtime.config.mode)

    # --------------------------------------------------------------------------------------- lifecycle

    async def swap(self, runtime: Runtime) -> None:
        """Install ``runtime`` (a newer generation) now; close the old one once no tick uses it."""
        old = self.runtime
        self.runtime = runtime
        known = runtime.base.tenants
        control = self.state.control
        if runtime.base != old.base:  # a changed base file restarts from its thresholds
            control = replace(control, policy_thresholds={n: tp.thresholds for n, tp in known.items()}, published=None)
        else:
            kept = {name: control.policy_thresholds.get(name, tp.thresholds) for name, tp in known.items()}
            control = replace(control, policy_thresholds=kept)
        self.state.control = control
        self.state.topology = (
            runtime.topology if runtime.config.instances != old.config.instances else self.state.topology
        )
        self._hand_over_memory(old, runtime)
        self.telemetry.set_policy(runtime.policy.policy_id, runtime.generation, runtime.config.mode)
        async with self._lock:
            await old.close()

    @staticmethod
    def _hand_over_memory(old: Runtime, new: Runtime) -> None:
        """Give the new generation's policy the old one's memory when it is the same policy.

        A reload rebuilds every object, and a rule selector would otherwise start its choice afresh; a new policy
        (another ``policy_id``) starts with none.
        """
        try:
            hand_over_memory(old.policy, new.policy)
        except ValueError as exc:  # pragma: no cover - a policy's own document always reads back
            _log.error("reload: the policy's memory was not handed over: %s", exc)

    def restore(self, state: ControlState) -> None:
        """Start from ``state`` (read back from :attr:`memory` at the daemon's start)."""
        self.state.control = state

    def _remember(self, rt: Runtime) -> None:
        """Write the control state when this tick changed it; a failed write is logged once and retried next tick."""
        if self.memory is None:
            return
        if self._base_digest is None or self._base_digest[0] != rt.generation:
            self._base_digest = (rt.generation, base_digest({n: tp.thresholds for n, tp in rt.base.tenants.items()}))
        policy = remembering_policy(rt.policy)
        remembered = None if policy is None else (rt.policy.policy_id, policy.memory_document())
        try:
            self.memory.save(
                self.state.control,
                self._base_digest[1],
                self.clock.monotonic(),
                self.clock.now().timestamp(),
                remembered,
            )
        except OSError as exc:
            problem = f"cannot write the control memory {self.memory.path}: {exc}".splitlines()[0]
            if problem != self._memory_error:
                _log.error("%s (kept in the process; a restart would forget it)", problem)
            self._memory_error = problem
            self.telemetry.control_memory_unwritten.set(1)
            return
        if self._memory_error is not None:
            _log.info("control memory %s written again", self.memory.path)
        self._memory_error = None
        self.telemetry.control_memory_unwritten.set(0)

    @property
    def healthy_age_s(self) -> float | None:
        """Seconds since the last completed tick (``None`` before the first)."""
        if self.state.last_tick_s is None:
            return None
        return self.clock.monotonic() - self.state.last_tick_s

    @property
    def not_ready_reasons(self) -> list[str]:
        """Why the controller is not ready (empty: ready), one short line each."""
        s = self.state
        reasons: list[str] = []
        if not s.first_observation:
            reasons.append("no fresh observation yet")
        if not s.actuators_ready:
            reasons.append("an actuator could not read the cluster state at the last tick")
        if s.stale:
            reasons.append(f"metric source stale (older than {self.runtime.guard.limits.max_staleness_s:g} s) or down")
        if s.policy_error is not None:
            reasons.append(f"policy raised: {s.policy_error}")
        return reasons

    @property
    def ready(self) -> bool:
        """First observation done, actuators reachable, the window fresh and the policy not failing."""
        return not self.not_ready_reasons

    # ------------------------------------------------------------------------------------------- ticks

    async def tick(self) -> TickRecord:
        """Run one tick (serialised with swaps' cleanup)."""
        async with self._lock:
            started = self.clock.monotonic()
            try:
                record = await self._tick()
            except Exception:
                self.telemetry.ticks.labels(result="error").inc()
                raise
            finally:
                self.telemetry.tick_duration.observe(self.clock.monotonic() - started)
            self.telemetry.ticks.labels(result="dropped" if record.dropped else "ok").inc()
            self.state.last_tick_s = self.clock.monotonic()
            self.telemetry.last_tick.set(self.clock.now().timestamp())
            return record

    async def _observe_topology(self, rt: Runtime) -> bool:
        topology, ready = self.state.topology, True
        for actuator in rt.actuators:
            observed = await actuator.observe(topology)
            if observed is None:
                ready = False
            else:
                topology = observed
        self.state.topology = topology
        return ready

    def _inputs(self, rt: Runtime, window: MetricWindow, topology: Topology, polled: OverridePoll) -> ControlInputs:
        return ControlInputs(
            window=window,
            tenants=rt.tenants,
            groups=rt.groups,
            current_pools=topology.pools,
            base_thresholds={n: tp.thresholds for n, tp in rt.base.tenants.items()},
            now_s=self.clock.monotonic(),
            interval_s=rt.config.interval_s,
            now=self.clock.now(),
            overrides=polled.overrides,
            base_policy=rt.base,
            document_description="published by pdctl controller",
            capacity=topology.capacity,
        )

    async def _refresh_registry_policy(self, rt: Runtime) -> None:
        policy = rt.policy.primary if isinstance(rt.policy, SloWatchdog) else rt.policy
        if not isinstance(policy, RegistryPolicy):
            return
        before = policy.policy_id
        ok = await asyncio.to_thread(policy.refresh)
        if not ok:
            self.telemetry.policy_loads.labels(result="error").inc()
        elif policy.policy_id != before:
            self.telemetry.policy_loads.labels(result="ok").inc()
            self.telemetry.set_policy(rt.policy.policy_id, rt.generation, rt.config.mode)

    def _check_admission(self, rt: Runtime) -> None:
        """Warn (once per change) while the policy was fitted behind an admission stage the router does not run.

        Not a reason to stop or to be unready: the policy still decides, as it would in ``pdctl evaluate`` without
        ``--admission-slack``, only with less goodput than it was chosen for.
        """
        fitted = fitted_admission_slack(rt.policy)
        readings = [a.admission for a in rt.actuators if isinstance(a, RouterActuator)]
        problems = [p for p in (admission_mismatch(fitted, r) for r in readings) if p is not None]
        problem = problems[0] if problems else None
        if problem != self.state.admission_mismatch:
            if problem is not None:
                _log.warning("policy %s: %s", rt.policy.policy_id, problem)
            elif self.state.admission_mismatch is not None:
                _log.info("policy %s: the router's admission stage now suits it", rt.policy.policy_id)
        self.state.admission_mismatch = problem
        self.telemetry.admission_mismatch.set(0 if problem is None else 1)

    def _check_policy_drift(self, rt: Runtime) -> None:
        """Publish the whole table again when a router runs another policy than the one last published to it."""
        drifts = tuple(
            a.policy_drift for a in rt.actuators if isinstance(a, RouterActuator) and a.policy_drift is not None
        )
        self.state.policy_drift = drifts
        if not drifts or rt.config.mode != "active" or self.state.control.published is None:
            return
        for drift in drifts:
            _log.warning("%s; publishing the policy's whole table again", drift)
            self.telemetry.policy_drifts.inc()
        self.state.control = replace(self.state.control, published=None)

    async def _tick(self) -> TickRecord:
        rt = self.runtime
        generation = rt.generation
        self.state.ticks += 1
        await self._refresh_registry_policy(rt)
        self.state.actuators_ready = await self._observe_topology(rt)
        self._check_admission(rt)
        self._check_policy_drift(rt)
        topology = self.state.topology
        polled = self.watcher.poll(rt.base, generation, self.clock.now())
        observed = await rt.source.observe(
            topology, [t.name for t in rt.tenants], [g.name for g in rt.groups], self.clock.now().timestamp()
        )
        window = observed.window
        inputs = self._inputs(rt, window, topology, polled)
        effects = control_step(rt.policy, inputs, self.state.control, rt.guard, hold_on_policy_error=True)
        if effects.policy_exception is not None:  # a policy bug must not stop the daemon: held, and reported
            _log.error("policy %s failed; holding", rt.policy.policy_id, exc_info=effects.policy_exception)
        policy_error = effects.policy_error or (None if effects.watchdog is None else effects.watchdog.primary_error)
        if policy_error is not None:
            self.telemetry.policy_errors.inc()
            if effects.policy_exception is None:
                _log.error("policy %s raised; the watchdog's fallback decides: %s", rt.policy.policy_id, policy_error)
            self.state.policy_error = policy_error
        elif not effects.in_fallback:
            self.state.policy_error = None
        self.state.stale = effects.stale or observed.error is not None
        plan = Plan(generation, effects.policy_document, effects.pool_changes)
        if observed.error is None and not effects.stale:
            self.state.first_observation = True
        if self.runtime.generation != generation:
            self.telemetry.dropped.inc()
            record = self._record(rt, window, observed.error, effects, polled, plan, (), True)
            self._emit(record)
            return TickRecord(record, window, effects.action, plan, (), dropped=True)
        results: tuple[ActuationResult, ...] = ()
        applied = False
        if rt.config.mode == "active":
            if not plan.empty:
                results = tuple([await a.apply(plan, topology) for a in rt.actuators])
            applied = all(r.outcome in (Outcome.APPLIED, Outcome.UNCHANGED) for r in results)
        self.state.control = effects.next_state(applied=applied)
        self._remember(rt)
        self._metrics(rt, window, observed.error, effects, polled, plan, topology, results)
        record = self._record(rt, window, observed.error, effects, polled, plan, results, False)
        if policy_error is not None:
            record = {**record, "policy_error": policy_error}
        if self.state.admission_mismatch is not None:
            record = {**record, "admission_mismatch": self.state.admission_mismatch}
        if self.state.policy_drift:
            record = {**record, "policy_drift": list(self.state.policy_drift)}
        self._emit(record)
        return TickRecord(record, window, effects.action, plan, results)

    # ----------------------------------------------------------------------------------- reporting

    def _metrics(
        self,
        rt: Runtime,
        window: MetricWindow,
        source_error: str | None,
        effects: ControlEffects,
        polled: OverridePoll,
        plan: Plan,
        topology: Topology,
        results: tuple[ActuationResult, ...],
    ) -> None:
        t = self.telemetry
        t.staleness.set(window.staleness_s)
        t.stale.set(1 if effects.stale or source_error else 0)
        if source_error is not None:
            t.source_errors.inc()
        now = self.clock.now()
        t.override_active.set(sum(1 for o in polled.overrides if o.is_active(now)))
        t.rollback_active.set(1 if effects.rollback else 0)
        state = effects.watchdog
        if state is not None:
            t.watchdog_fallback.set(1 if state.in_fallback else 0)
            if state.tripped:
                t.watchdog_trips.inc()
            if state.attainment_frac is not None:
                t.watchdog_attainment.set(state.attainment_frac)
        t.override_refused.clear()
        for name in polled.refused:
            t.override_refused.labels(file=name).set(1)
        for _ in polled.newly_refused:
            t.override_refusals.inc()
        clamps_by_group: dict[str, Clamp] = {}
        for clamp in effects.clamps:
            if clamp.scope == "group":
                clamps_by_group.setdefault(clamp.name, clamp)
        for group in rt.groups:
            target = effects.guarded.pools.get(group.name)
            if target is None:
                continue
            kind = classify(topology.pools.get(group.name), target)
            first = clamps_by_group.get(group.name)
            t.decisions.labels(action=kind, reason=first.reason.value if first is not None else "policy").inc()
        if plan.policy_document is not None:
            t.decisions.labels(action="thresholds", reason="rollback" if effects.rollback else "policy").inc()
        for result in results:
            t.actuations.labels(actuator=result.actuator, outcome=result.outcome.value).inc()
            if result.outcome not in (Outcome.APPLIED, Outcome.UNCHANGED):
                t.actuation_errors.labels(actuator=result.actuator, outcome=result.outcome.value).inc()

    def _record(
        self,
        rt: Runtime,
        window: MetricWindow,
        source_error: str | None,
        effects: ControlEffects,
        polled: OverridePoll,
        plan: Plan,
        results: tuple[ActuationResult, ...],
        dropped: bool,
    ) -> dict[str, Any]:
        topology = self.state.topology
        groups = {
            name: {
                "num_prefill": g.num_prefill,
                "num_decode": g.num_decode,
                "prefill_queue_wait_s": _num(g.prefill_queue_wait_s),
                "decode_kv_usage_frac": _num(g.decode_kv_usage_frac),
                "kv_transfer_time_p95_s": _num(g.kv_transfer_time_p95_s),
                "kv_transfer_failure_frac": _num(g.kv_transfer_failure_frac),
            }
            for name, g in window.groups.items()
        }
        tenants = {
            name: {
                "request_rate_rps": _num(w.request_rate_rps),
                "ttft_p95_s": _num(w.ttft_p95_s),
                "tpot_p95_s": _num(w.tpot_p95_s),
                "p95_input_tokens": _num(w.p95_input_tokens),
                "remote_prefill_frac": _num(w.remote_prefill_frac),
                "slo_attainment_frac": _num(w.slo_attainment_frac),
            }
            for name, w in window.tenants.items()
        }
        summary = {
            g: classify(topology.pools.get(g), t) for g, t in effects.guarded.pools.items() if g in topology.pools
        }
        action = effects.decision
        now = self.clock.now()
        return {
            "ts": now.isoformat(),
            "tick": self.state.ticks,
            "generation": plan.generation,
            "policy_id": rt.policy.policy_id,
            "mode": rt.config.mode,
            "dropped": dropped,
            "observation": {
                "window_s": _num(window.window_s),
                "staleness_s": _num(window.staleness_s),
                "source_error": source_error,
                "groups": groups,
                "tenants": tenants,
            },
            "decision": {
                "reason": action.reason,
                "pools": {g: [p.num_prefill, p.num_decode] for g, p in action.pools.items()},
                "thresholds": sorted(action.thresholds),
            },
            "guarded": {
                "summary": summary,
                "pools": {g: [p.num_prefill, p.num_decode] for g, p in effects.guarded.pools.items()},
            },
            "clamps": [c.as_dict() for c in effects.clamps],
            "overrides": {
                "active": [o.name for o in polled.overrides if o.is_active(now)],
                "refused": dict(polled.refused),
                "rollback": effects.rollback,
            },
            "plan": {
                "publish_policy": plan.policy_document is not None,
                "pools": {g: [p.num_prefill, p.num_decode] for g, p in plan.pools.items()},
                "thresholds": _threshold_summary(plan),
            },
            "actuation": [r.as_dict() for r in results],
        }

    def _emit(self, record: Mapping[str, Any]) -> None:
        _log.info(json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False))
        self.audit.append(record)


def _threshold_summary(plan: Plan) -> dict[str, Any]:
    if plan.policy_document is None:
        return {}
    out: dict[str, Any] = {}
    for block in plan.policy_document.get("tenants", []):
        remote = block["pd_disaggregation_policy"]["remote_prefill"]
        local = block["pd_disaggregation_policy"]["local_prefill"]
        out[block["name"]] = {
            "mode": block["mode"],
            "min_remote_input_tokens": remote["min_input_tokens"],
            "max_local_input_tokens": local["max_input_tokens"],
        }
    return out
