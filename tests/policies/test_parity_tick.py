"""Parity of the two adapters of :func:`policies.control.control_step`: the controller's tick and the gym env.

One simulated episode is driven by the gym env (``env.control(policy)``). In lockstep, a real
:class:`~controller.loop.ControlLoop` — built by :func:`controller.runtime.build_runtime` from a policy file
that describes the scenario's tenants and groups, on a :class:`~controller.clock.VirtualClock` that follows
the simulated clock, with the dry-run actuator (which records every plan and keeps its own pool counts) —
ticks on the same windows: its source hands it the window of the interval that just ended. Both sides get the
same policy spec (two instances, each built by ``build_runtime``), the same guard limits and the same
overrides, and must agree tick by tick on the action, the clamps, the flags, the pool changes actuated, the
threshold table published and the thresholds and pools then in force.

The controller always knows a ``default`` tenant (requests nobody claims); the simulator does not, so
thresholds and tenant clamps are compared on the scenario's tenants.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from controller.actuators.base import Outcome
from controller.actuators.dryrun import DryRunActuator
from controller.audit import AuditLog
from controller.clock import VirtualClock
from controller.config import ControllerConfig
from controller.loop import ControlLoop, TickRecord
from controller.overrides import OverrideWatcher
from controller.runtime import build_runtime
from controller.sources.base import Topology
from controller.sources.source import Observed
from controller.telemetry import Telemetry
from env.gym_env import ControlStep, PDClusterEnv
from env.scenario import Scenario
from policies.overrides import load_override
from policies.policy_file import DEFAULT_TENANT, PolicyFile, resolve_policy
from policies.schema import RoutingThresholds

from ..env.helpers import tiny_scenario

SEED = 3
GUARD = {"max_step_per_tick": 1, "cooldown_s": 30.0, "hysteresis_ticks": 1, "max_staleness_s": 30.0}
THROUGHPUT_PLANNER = {"prefill_tokens_per_s": 3000.0, "decode_tokens_per_s": 300.0}
# The override window must hold a tick where queue_kv moves only rag0 (nothing else to publish): on this scenario
# and step model (issue 20) that is tick 27, so the window is ticks 22-27.
OVERRIDE_FROM_TICK, OVERRIDE_TICKS = 22, 6


def surge_scenario() -> Scenario:
    """The tiny two-tenant scenario, 300 s, with the RAG tenant surging tenfold from 100 s to 200 s."""
    data = tiny_scenario(duration_s=300.0, rate_rps=2.0, name="parity-surge").model_dump()
    data["tenants"][1]["workload"] = {
        "kind": "step",
        "segments": [[0, 0.3], [100, 3.0], [200, 0.3]],
        "input_tokens": {"kind": "lognormal", "median_tokens": 6000, "sigma": 0.5, "max_tokens": 20000},
        "output_tokens": {"kind": "lognormal", "median_tokens": 300, "sigma": 0.6, "max_tokens": 2000},
    }
    return Scenario.model_validate(data)


def _ms(value_s: float | None) -> float | None:
    return None if value_s is None else value_s * 1000.0


def policy_file_of(scenario: Scenario) -> dict[str, Any]:
    """The policy file a person would write for the scenario's tenants, SLOs, priorities and pools."""
    groups: list[dict[str, Any]] = []
    for g in scenario.groups_schema().values():
        pools = {"prefill": {"min": g.min_prefill}, "decode": {"min": g.min_decode}}
        if g.max_prefill is not None:
            pools["prefill"]["max"] = g.max_prefill
        if g.max_decode is not None:
            pools["decode"]["max"] = g.max_decode
        groups.append(
            {"name": g.name, "gpu_budget": g.gpu_budget, "gpus_per_instance": g.gpus_per_instance, "pools": pools}
        )
    tenants = []
    for t in scenario.tenants_schema().values():
        slo = {"ttft_p95_ms": _ms(t.slo.ttft_p95_s), "tpot_p95_ms": _ms(t.slo.tpot_p95_s)}
        tenants.append({"name": t.name, "group": t.group, "priority": t.priority, "slo": slo})
    return {"version": 1, "tenant_groups": groups, "tenants": tenants}


def instances_of(scenario: Scenario) -> list[dict[str, str]]:
    """The controller's instance list for the scenario's initial deployment."""
    out = []
    for g in scenario.tenant_groups:
        out += [{"id": f"{g.name}-p{i}", "group": g.name, "role": "prefill"} for i in range(g.prefill)]
        out += [{"id": f"{g.name}-d{i}", "group": g.name, "role": "decode"} for i in range(g.decode)]
    return out


class EnvWindows:
    """The controller's metric source for this test: the window of the interval the env just simulated."""

    def __init__(self, env: PDClusterEnv) -> None:
        self.env = env

    async def observe(
        self, topology: Topology, tenants: Sequence[str], groups: Sequence[str], now_s: float
    ) -> Observed:
        del topology, tenants, groups, now_s
        return Observed(self.env.observation().window)

    async def close(self) -> None:
        return None


@dataclass
class Case:
    policy: str
    baseline_params: Mapping[str, float] = field(default_factory=dict)
    watchdog: Mapping[str, Any] | None = None
    override: Mapping[str, Any] | None = None
    guard: Mapping[str, Any] | None = None


@dataclass
class Run:
    ticks: list[TickRecord]
    steps: list[ControlStep]
    dry_run: DryRunActuator
    tenants: frozenset[str]
    base_thresholds: Mapping[str, RoutingThresholds]


async def run_both(case: Case, tmp_path: Path) -> Run:
    scenario = surge_scenario()
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy_file_of(scenario)))
    (tmp_path / "overrides").mkdir()
    config = ControllerConfig(
        mode="active",
        interval_s=scenario.control_interval_s,
        policy=case.policy,
        baseline_params=dict(case.baseline_params),
        policy_file=tmp_path / "policy.yaml",
        override_dir=tmp_path / "overrides",
        audit_log=tmp_path / "audit.jsonl",
        instances=instances_of(scenario),
        guard=case.guard or GUARD,
        watchdog=case.watchdog,
    )
    runtime = build_runtime(config, generation=1, started_s=0.0)
    base = runtime.base
    tenants = frozenset(t.name for t in scenario.tenants)
    # The policy file describes the scenario exactly (else the comparison below would prove nothing).
    env_groups = tuple(scenario.groups_schema().values())
    assert runtime.groups == env_groups
    assert tuple(t for t in runtime.tenants if t.name != DEFAULT_TENANT) == tuple(scenario.tenants_schema().values())
    base_thresholds = {name: tp.thresholds for name, tp in base.tenants.items()}
    env = PDClusterEnv(
        scenario,
        guard_limits=config.guard.limits(),
        base_thresholds={name: base_thresholds[name] for name in tenants},
    )
    env_policy = build_runtime(config, generation=1, started_s=0.0).policy  # a second, independent instance
    clock = VirtualClock(start=env.wall_start)
    loop = ControlLoop(
        replace(runtime, source=EnvWindows(env)),  # type: ignore[arg-type]  # a source of the same shape
        clock,
        Telemetry(CollectorRegistry()),
        AuditLog(config.audit_log),
        OverrideWatcher(config.override_dir),
    )
    dry_run = loop.runtime.actuators[0]
    assert isinstance(dry_run, DryRunActuator)
    env.reset(seed=SEED)
    await clock.advance(env.sim.now_s)
    ticks: list[TickRecord] = []
    steps: list[ControlStep] = []
    while env.sim.now_s < scenario.duration_s - 1e-9:
        if case.override is not None and len(ticks) == OVERRIDE_FROM_TICK:
            expires = clock.now() + timedelta(seconds=OVERRIDE_TICKS * scenario.control_interval_s)
            text = yaml.safe_dump({**case.override, "expires_at": expires.isoformat()})
            (tmp_path / "overrides" / "o.yaml").write_text(text)
            env.set_overrides([load_override(text, "o.yaml", base)])
        assert clock.monotonic() == pytest.approx(env.sim.now_s)
        assert clock.now() == env.now()
        ticks.append(await loop.tick())
        assert loop.state.topology.pools == env.current_pools()  # both read the same running pools
        steps.append(env.control(env_policy))
        await clock.advance(scenario.control_interval_s)
    return Run(ticks, steps, dry_run, tenants, base_thresholds)


def _on(tenants: frozenset[str], thresholds: Mapping[str, RoutingThresholds]) -> dict[str, RoutingThresholds]:
    return {name: value for name, value in thresholds.items() if name in tenants}


def _document_thresholds(document: Mapping[str, Any]) -> dict[str, RoutingThresholds]:
    resolved = resolve_policy(PolicyFile.model_validate(document), "published")
    return {name: tp.thresholds for name, tp in resolved.tenants.items()}


def assert_same(run: Run) -> collections.Counter[str]:
    """Tick-by-tick equality of the two adapters; returns what happened (to check the case was exercised)."""
    seen: collections.Counter[str] = collections.Counter()
    assert len(run.ticks) == len(run.steps) > 20
    for i, (tick, step) in enumerate(zip(run.ticks, run.steps, strict=True)):
        at = f"tick {i + 1}"
        effects = step.effects
        record = tick.record
        # The decision, the guard and the flags.
        assert record["decision"]["reason"] == effects.decision.reason, at
        assert tick.action.reason == step.action.reason, at
        assert tick.action.policy_id == step.action.policy_id, at
        assert tick.action.pools == step.action.pools, at
        assert _on(run.tenants, tick.action.thresholds) == step.action.thresholds, at
        assert set(tick.action.thresholds) - run.tenants <= {DEFAULT_TENANT}, at
        # The env's guard drops the default tenant a policy built on the base file may name (unknown there).
        clamps = [c.as_dict() for c in step.clamps]
        assert [c for c in record["clamps"] if c["name"] != DEFAULT_TENANT] == [
            c for c in clamps if c["name"] != DEFAULT_TENANT
        ], at
        assert record["overrides"]["active"] == list(effects.overrides_active), at
        assert record["overrides"]["rollback"] == effects.rollback, at
        assert record["decision"]["reason"].startswith("watchdog") == effects.in_fallback, at
        # The actuation: pool changes, the threshold table, and what is in force afterwards.
        assert tick.plan.pools == effects.pool_changes, at
        assert (tick.plan.policy_document is not None) == effects.publish, at
        if tick.plan.policy_document is not None:
            published = _document_thresholds(tick.plan.policy_document)
            assert _on(run.tenants, published) == dict(effects.thresholds), at
        seen.update(c.reason.value for c in step.clamps)
        seen["pool_moves"] += bool(effects.pool_changes)
        seen["publications"] += effects.publish
        seen["override_ticks"] += effects.override_active
        seen["fallback_ticks"] += effects.in_fallback
    # Every non-empty plan reached the actuator, in order, and was applied; empty ones were not sent.
    assert [r.plan for r in run.dry_run.records] == [t.plan for t in run.ticks if not t.plan.empty]
    assert all([r.outcome for r in t.results] == ([] if t.plan.empty else [Outcome.APPLIED]) for t in run.ticks)
    return seen


async def test_parity_tick_rule_policy(tmp_path: Path) -> None:
    run = await run_both(Case("baseline:queue_kv"), tmp_path)
    seen = assert_same(run)
    assert seen["pool_moves"] >= 1
    assert seen["publications"] >= 5
    assert seen["threshold_cooldown"] >= 5


async def test_parity_tick_pool_moves_under_max_step_and_cooldown(tmp_path: Path) -> None:
    """Without the pool reversal hold, so that the planner's moves back and forth exercise many pool moves."""
    no_hold = {**GUARD, "pool_reversal_hold_s": 0.0}
    run = await run_both(Case("baseline:dynamo-throughput", THROUGHPUT_PLANNER, guard=no_hold), tmp_path)
    seen = assert_same(run)
    assert seen["pool_moves"] >= 3
    assert seen["max_step"] >= 1
    assert seen["cooldown"] >= 1


async def test_parity_tick_pool_reversal_hold(tmp_path: Path) -> None:
    """Under the default hold the same planner's moves back are held, alike in both adapters."""
    run = await run_both(Case("baseline:dynamo-throughput", THROUGHPUT_PLANNER), tmp_path)
    seen = assert_same(run)
    assert seen["pool_moves"] >= 1
    assert seen["pool_reversal"] >= 1


async def test_parity_tick_with_an_override_active(tmp_path: Path) -> None:
    override = {
        "tenants": [{"name": "rag0", "pd_disaggregation_policy": {"remote_prefill": {"min_input_tokens": 9000}}}]
    }
    run = await run_both(Case("baseline:queue_kv", override=override), tmp_path)
    seen = assert_same(run)
    assert seen["override_ticks"] == OVERRIDE_TICKS
    in_force = [s.effects.thresholds["rag0"].min_remote_input_tokens for s in run.steps]
    during = slice(OVERRIDE_FROM_TICK, OVERRIDE_FROM_TICK + OVERRIDE_TICKS)
    assert set(in_force[during]) == {9000}
    assert 9000 not in in_force[:OVERRIDE_FROM_TICK] + in_force[during.stop :]
    # Where the two copies used to disagree: under the override the policy moved rag0 on a tick with nothing to
    # publish; the policy keeps its move, and the expired override hands rag0 back to the policy's latest value.
    masked = [s for s in run.steps[during] if "rag0" in s.effects.guarded.thresholds and s.effects.empty]
    assert masked
    after = run.steps[during.stop].effects
    assert after.thresholds["rag0"] == after.applied_state.policy_thresholds["rag0"]


async def test_parity_tick_under_the_slo_watchdog(tmp_path: Path) -> None:
    # No dwell after the throughput planner's moves, so that its windows are judged within this short run.
    watchdog = {
        "fallback": "policy_file",
        "min_attainment_frac": 0.99,
        "trigger_intervals": 2,
        "hold_intervals": 3,
        "move_dwell_s": 0.0,
    }
    run = await run_both(Case("baseline:dynamo-throughput", THROUGHPUT_PLANNER, watchdog=watchdog), tmp_path)
    seen = assert_same(run)
    assert seen["fallback_ticks"] >= 3
