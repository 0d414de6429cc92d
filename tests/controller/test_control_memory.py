"""The control state kept across controller restarts: the file format, the clock shift, the base file binding,
refusals, and restarts that would have undone the policy's thresholds or given back a pool it had just grown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from controller.audit import AuditLog
from controller.clock import VirtualClock
from controller.config import ControllerConfig
from controller.control_memory import (
    ControlMemoryError,
    ControlMemoryFile,
    base_digest,
    control_memory_path,
    decode_control_memory,
    encode_control_memory,
    encode_thresholds,
)
from controller.daemon import Daemon
from controller.lease import lease_path
from controller.loop import ControlLoop
from controller.overrides import OverrideWatcher
from controller.telemetry import Telemetry
from policies.base import PolicyContext
from policies.control import ControlState
from policies.features import Observation
from policies.guard import GroupGuardState, GuardState, ThresholdMove
from policies.registry import inner_rule_selector
from policies.schema import (
    ControlAction,
    FallbackAction,
    LengthBucket,
    PoolTargets,
    Route,
    RouteRule,
    RoutingThresholds,
)
from policies.watchdog import SloWatchdog
from tests.controller.harness import controller, controller_once
from tests.controller.test_config_daemon import write_config
from tests.controller.test_loop import FakeReader, make_config, make_runtime, surge
from tests.controller.test_one_writer import writer_config

BASE = {"chat": RoutingThresholds(), "rag": RoutingThresholds(min_remote_input_tokens=4096)}
MOVED = replace(
    BASE["rag"],
    min_remote_input_tokens=3072,
    max_prefill_queue_wait_s=0.07,
    rule=RouteRule.DYNAMO_ISL_OR_LOAD,
    on_prefill_queue_overload=FallbackAction.RETRY_REMOTE_PREFILL,
    enabled_models=frozenset({"m1", "m0"}),
    buckets=(LengthBucket(Route.LOCAL_PREFILL, 0, 512), LengthBucket(Route.REMOTE_PREFILL, 513, None)),
)
GUARD = GuardState(
    groups={
        "g": GroupGuardState(
            last_change_s=900.0, streak_direction=(1, -1), streak_ticks=1, last_move=(1, -1), last_move_policy_id="p"
        ),
        "h": GroupGuardState(),
    },
    tenants={"rag": 950.0},
    threshold_moves={"rag": {"min_remote_input_tokens": ThresholdMove(-1, 950.0, "p")}},
)
STATE = ControlState(policy_thresholds={**BASE, "rag": MOVED}, published={**BASE, "rag": MOVED}, guard=GUARD)
DIGEST = base_digest(BASE)
GAP_S = 30.0


def test_a_round_trip_keeps_what_a_restart_keeps_and_moves_every_time_onto_the_new_clock() -> None:
    doc = encode_control_memory(STATE, DIGEST, now_s=1000.0, wall_s=5000.0)
    assert doc["guard"]["groups"]["g"]["last_change_at"] == 4900.0
    read = decode_control_memory(json.loads(json.dumps(doc)), "m.json", BASE, 1000.0, 5000.0, GAP_S)
    assert read.thresholds_kept
    same_clock = read.state
    assert same_clock == STATE.after_restart(keep_streaks=True), "exactly what ControlState.after_restart keeps"
    assert same_clock.policy_thresholds["rag"] == MOVED, "every field, enums, sets and buckets included"
    # A new process: its monotonic clock starts near 0, and 100 s of wall time have passed.
    moved = decode_control_memory(doc, "m.json", BASE, now_s=10.0, wall_s=5100.0, max_gap_s=GAP_S).state
    shift = 10.0 - 1000.0 - 100.0
    assert moved.guard.groups["g"] == GroupGuardState(900.0 + shift, last_move=(1, -1), last_move_policy_id="p"), (
        "written 100 s ago, more than the staleness limit: the hysteresis streak starts again"
    )
    quick = decode_control_memory(doc, "m.json", BASE, now_s=10.0, wall_s=5020.0, max_gap_s=GAP_S).state
    assert quick.guard.groups["g"].streak_ticks == 1, "a quick restart continues the streak"
    assert quick.guard.groups["g"].streak_direction == (1, -1)
    assert moved.guard.tenants == {"rag": 950.0 + shift}
    assert moved.guard.threshold_moves["rag"]["min_remote_input_tokens"].at_s == 950.0 + shift


def test_under_a_changed_base_file_the_thresholds_restart_from_it_and_the_guard_is_kept() -> None:
    doc = encode_control_memory(STATE, DIGEST, now_s=1000.0, wall_s=5000.0)
    new_base = {**BASE, "chat": RoutingThresholds(min_remote_input_tokens=8192)}
    read = decode_control_memory(doc, "m.json", new_base, 1000.0, 5000.0, GAP_S)
    assert not read.thresholds_kept
    state = read.state
    assert state.policy_thresholds == new_base
    assert state.guard == GUARD


def test_a_time_in_the_future_is_read_as_now() -> None:
    doc = encode_control_memory(STATE, DIGEST, now_s=1000.0, wall_s=5000.0)
    back = decode_control_memory(doc, "m.json", BASE, 3.0, 4000.0, GAP_S).state  # the wall clock went back
    assert back.guard.groups["g"].last_change_s == 3.0
    assert back.guard.tenants["rag"] == 3.0


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d.update(format="other"), "format"),
        (lambda d: d.update(version=2), "version"),
        (lambda d: d.update(base_digest=None), "base_digest"),
        (lambda d: d["guard"]["groups"]["g"].update(last_move=[2, 0]), "guard.groups.g.last_move[0]"),
        (lambda d: d["guard"]["groups"]["g"].update(last_move=[1]), "guard.groups.g.last_move"),
        (lambda d: d["guard"]["groups"]["g"].update(speed=1), "guard.groups.g: unknown field speed"),
        (lambda d: d["guard"]["groups"]["g"].update(streak_ticks=-1), "guard.groups.g.streak_ticks"),
        (lambda d: d["guard"]["groups"]["g"].update(streak_direction=[0, 3]), "guard.groups.g.streak_direction[1]"),
        (lambda d: d.update(written_at="now"), "written_at"),
        (lambda d: d["guard"]["groups"]["g"].update(last_change_at="soon"), "guard.groups.g.last_change_at"),
        (lambda d: d["guard"]["tenants"].update(rag=float("nan")), "guard.tenants.rag"),
        (lambda d: d["guard"]["threshold_moves"]["rag"]["min_remote_input_tokens"].pop("at"), "tokens.at: missing"),
        (lambda d: d["guard"]["threshold_moves"]["rag"]["min_remote_input_tokens"].update(direction=0), "direction"),
        (lambda d: d["guard"]["threshold_moves"]["rag"].update(mode={"direction": 1, "at": 1.0}), "rag.mode"),
        (lambda d: d["guard"].update(groups=[]), "guard.groups: expected a mapping"),
        (lambda d: d["policy_thresholds"]["rag"].pop("rule"), "policy_thresholds.rag.rule: missing"),
        (lambda d: d["policy_thresholds"]["rag"].update(speed=1), "policy_thresholds.rag.speed: unknown field"),
        (lambda d: d["policy_thresholds"]["rag"].update(rule="fastest"), "policy_thresholds.rag.rule: not readable"),
        (
            lambda d: d["policy_thresholds"]["rag"].update(min_remote_input_tokens=1.5),
            "policy_thresholds.rag.min_remote_input_tokens",
        ),
        (
            lambda d: d["policy_thresholds"]["rag"].update(disaggregation_enabled=1),
            "policy_thresholds.rag.disaggregation_enabled",
        ),
        (lambda d: d["policy_thresholds"]["rag"].update(buckets=[{"route": "x"}]), "rag.buckets: not readable"),
        (lambda d: d["policy_thresholds"]["rag"].update(traffic_percent=250.0), "policy_thresholds.rag: "),
    ],
)
def test_a_malformed_document_is_refused_with_one_line_naming_the_field(edit: Any, field: str) -> None:
    doc = json.loads(json.dumps(encode_control_memory(STATE, DIGEST, now_s=1000.0, wall_s=5000.0)))
    edit(doc)
    with pytest.raises(ControlMemoryError) as info:
        decode_control_memory(doc, "/x/m.json", BASE, now_s=0.0, wall_s=5000.0, max_gap_s=GAP_S)
    message = str(info.value)
    assert message.startswith("/x/m.json: ")
    assert field in message
    assert "\n" not in message


def test_the_file_is_written_atomically_and_only_when_what_it_keeps_changed(tmp_path: Path) -> None:
    memory = ControlMemoryFile(tmp_path / "sub" / "m.json")
    assert memory.load(BASE, 0.0, 100.0, GAP_S) is None, "no file yet"
    assert memory.save(STATE, DIGEST, 1000.0, 5000.0)
    assert not memory.save(STATE, DIGEST, 1001.0, 5001.0), "nothing kept changed"
    streak_only = replace(GUARD, groups={**GUARD.groups, "g": replace(GUARD.groups["g"], streak_ticks=2)})
    assert memory.save(replace(STATE, guard=streak_only), DIGEST, 1002.0, 5002.0), "the streaks are kept"
    published = replace(STATE, guard=streak_only, published=BASE)
    assert not memory.save(published, DIGEST, 1003.0, 5003.0), "the published table is not"
    assert memory.save(replace(STATE, policy_thresholds=BASE), DIGEST, 1003.0, 5003.0)
    assert [p.name for p in memory.path.parent.iterdir()] == ["m.json"], "no temporary file left"
    read = ControlMemoryFile(memory.path).load(BASE, 1003.0, 5003.0, GAP_S)
    assert read is not None
    assert read.state.policy_thresholds == BASE
    assert read.state.published is None, (
        "a restart publishes the whole table (the router actuator skips it if in force)"
    )
    memory.path.write_text("{not json")
    with pytest.raises(ControlMemoryError, match=r"m\.json: not JSON"):
        ControlMemoryFile(memory.path).load(BASE, 0.0, 0.0, GAP_S)


def test_every_threshold_field_is_written() -> None:
    assert set(encode_thresholds(MOVED)) == set(RoutingThresholds.__dataclass_fields__)


def test_where_the_memory_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDCTL_DATA_DIR", str(tmp_path / "data"))
    dry = make_config(tmp_path)
    assert control_memory_path(dry) is None, "the dry-run actuator alone changes nothing that outlives it"
    assert control_memory_path(replace_config(dry, control_memory_file=tmp_path / "m.json")) == tmp_path / "m.json"
    router = replace_config(dry, actuators=[{"kind": "router", "url": "http://127.0.0.1:9"}])
    lease = lease_path(router)
    assert lease is not None
    assert control_memory_path(router) == lease.with_name(lease.stem + ".memory.json")
    assert control_memory_path(replace_config(router, mode="advisory")) is None


def replace_config(config: ControllerConfig, **changes: Any) -> ControllerConfig:
    return ControllerConfig(**{**config.model_dump(), **changes})


# ---------------------------------------------------------------------------------------- restarts of the loop


@dataclass
class Scripted:
    """A policy that asks for the given pools of group ``g`` (its id stays the same across a restart)."""

    pools: list[PoolTargets]
    asked: list[PoolTargets] = field(default_factory=list)

    @property
    def policy_id(self) -> str:
        return "test:scripted"

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        del observation, context
        target = self.pools[min(len(self.asked), len(self.pools) - 1)]
        self.asked.append(target)
        return ControlAction({}, {"g": target}, policy_id=self.policy_id)


def new_loop(config: ControllerConfig, clock: VirtualClock, policy: Any = None) -> ControlLoop:
    runtime = make_runtime(config, FakeReader(surge()))
    if policy is not None:
        runtime = replace(runtime, policy=policy)
    return ControlLoop(
        runtime, clock, Telemetry(CollectorRegistry()), AuditLog(None), OverrideWatcher(config.override_dir)
    )


def restart(tmp_path: Path, clock: VirtualClock, after_s: float, *, keep: bool, policy: Any = None) -> ControlLoop:
    """A new controller process ``after_s`` later, on the cluster as the first one left it (2 prefill, 1 decode)."""
    instances = [
        {"id": "p0", "group": "g", "role": "prefill"},
        {"id": "p1", "group": "g", "role": "prefill"},
        {"id": "d0", "group": "g", "role": "decode"},
    ]
    loop = new_loop(
        make_config(tmp_path, instances=instances), VirtualClock(start=clock.now() + timedelta(seconds=after_s)), policy
    )
    memory = ControlMemoryFile(tmp_path / "memory.json")
    base = {n: tp.thresholds for n, tp in loop.runtime.base.tenants.items()}
    read = memory.load(base, loop.clock.monotonic(), loop.clock.now().timestamp(), GAP_S)
    if keep and read is not None:
        loop.restore(read.state)
    return loop


async def test_a_restarted_controller_holds_the_give_back_of_a_pool_it_had_just_grown(tmp_path: Path) -> None:
    clock = VirtualClock()
    first = new_loop(make_config(tmp_path), clock, Scripted([PoolTargets(2, 1)]))
    first.memory = ControlMemoryFile(tmp_path / "memory.json")
    grown = await first.tick()
    assert grown.plan.pools == {"g": PoolTargets(2, 1)}
    written = json.loads((tmp_path / "memory.json").read_text())
    assert written["guard"]["groups"]["g"]["last_move"] == [1, -1]
    assert written["guard"]["groups"]["g"]["last_move_policy_id"] == "test:scripted"

    held = await restart(tmp_path, clock, 30.0, keep=True, policy=Scripted([PoolTargets(1, 2)])).tick()
    assert held.plan.pools == {}, "the prefill instance grown 30 s before the restart is not given back"
    assert {c["reason"] for c in held.record["clamps"]} == {"pool_reversal"}

    forgetful = await restart(tmp_path, clock, 30.0, keep=False, policy=Scripted([PoolTargets(1, 2)])).tick()
    assert forgetful.plan.pools == {"g": PoolTargets(1, 2)}, "without the memory the restart undoes the move"

    later = restart(tmp_path, clock, 30.0, keep=True, policy=Scripted([PoolTargets(1, 2)]))
    assert isinstance(later.clock, VirtualClock)
    await later.clock.advance(600.0)
    assert (await later.tick()).plan.pools == {"g": PoolTargets(1, 2)}, "the hold ends 600 s after the move"


async def test_a_restarted_controller_keeps_the_thresholds_in_force(tmp_path: Path) -> None:
    clock = VirtualClock()
    first = new_loop(make_config(tmp_path), clock)  # baseline:queue_kv: lowers rag's remote threshold on a surge
    first.memory = ControlMemoryFile(tmp_path / "memory.json")
    moved = await first.tick()
    assert moved.record["plan"]["thresholds"]["rag"]["min_remote_input_tokens"] == 3072

    kept = restart(tmp_path, clock, 2.0, keep=True)
    assert kept.state.policy_thresholds["rag"].min_remote_input_tokens == 3072
    held = await kept.tick()  # inside the threshold cooldown the memory kept: the table in force, published again
    assert "threshold_cooldown" in {c["reason"] for c in held.record["clamps"]}
    assert held.plan.policy_document is not None, "a router restarted meanwhile gets it back"
    assert held.record["plan"]["thresholds"]["rag"]["min_remote_input_tokens"] == 3072

    carried_on = await restart(tmp_path, clock, 6.0, keep=True).tick()
    assert carried_on.record["plan"]["thresholds"]["rag"]["min_remote_input_tokens"] == 2304, "the next step"
    reset = await restart(tmp_path, clock, 6.0, keep=False).tick()
    assert reset.record["plan"]["thresholds"]["rag"]["min_remote_input_tokens"] == 3072, "from the base file again"


@contextlib.asynccontextmanager
async def first_tick(daemon: Daemon) -> AsyncIterator[None]:
    """Run ``daemon`` until its first tick is done, then stop it when the block ends."""
    task = asyncio.create_task(daemon.run(install_signals=False))
    try:
        for _ in range(200):
            if daemon.loop.state.ticks >= 1:
                break
            await asyncio.sleep(0.01)
        yield
    finally:
        daemon.signals.stop.set()
        await asyncio.wait_for(task, 15.0)


async def test_the_daemon_reads_the_memory_back_at_start(tmp_path: Path) -> None:
    memory_path = tmp_path / "memory.json"
    path = write_config(tmp_path, control_memory_file=str(memory_path))
    clock = VirtualClock()
    daemon = Daemon(path, clock, allow_virtual_clock=True)
    assert daemon.loop.memory is not None
    assert daemon.loop.memory.path == memory_path
    base = {n: tp.thresholds for n, tp in daemon.loop.runtime.base.tenants.items()}
    tenant = next(iter(base))
    state = ControlState({tenant: replace(base[tenant], rule=RouteRule.DYNAMO_LEGACY)}, None, GUARD)
    ControlMemoryFile(memory_path).save(state, base_digest(base), 1000.0, clock.now().timestamp() - 50.0)
    async with first_tick(daemon):
        control = daemon.loop.state.control
        assert control.guard.groups["g"].last_move == (1, -1)
        assert control.guard.groups["g"].last_change_s == pytest.approx(-150.0), "written 50 s ago, 100 s older"
        assert control.policy_thresholds[tenant].rule is RouteRule.DYNAMO_LEGACY


async def test_a_malformed_memory_stops_the_daemon_at_start_with_one_line(tmp_path: Path) -> None:
    memory_path = tmp_path / "memory.json"
    doc = {"format": "pdctl-control-memory", "version": 1, "written_at": 0.0, "guard": {"tenants": {"rag": "x"}}}
    memory_path.write_text(json.dumps(doc))
    path = write_config(tmp_path, control_memory_file=str(memory_path))
    daemon = Daemon(path, VirtualClock(), allow_virtual_clock=True)
    with pytest.raises(ControlMemoryError, match=r"memory\.json: guard\.tenants\.rag: expected epoch seconds"):
        await daemon.run(install_signals=False)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_controller_process_keeps_its_memory_beside_its_lease_and_refuses_a_malformed_one(tmp_path: Path) -> None:
    config = writer_config(tmp_path, interval_s=0.5, lease_file=str(tmp_path / "controller.lease"))
    memory_path = tmp_path / "controller.memory.json"
    with controller(config, tmp_path, name="first"):
        deadline = time.monotonic() + 30.0
        while not memory_path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert json.loads(memory_path.read_text())["format"] == "pdctl-control-memory", "written after a tick"
    memory_path.write_text('{"format": "pdctl-control-memory", "version": 7}')
    restart_path = tmp_path / "restart.yaml"
    restart_path.write_text(yaml.safe_dump(config))
    refused = controller_once(restart_path)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"{memory_path}: version: expected 1, got 7 (written by another build?)"
    ]


def test_the_policy_memory_goes_with_the_file_and_moves_onto_the_new_clock() -> None:
    memory = {"rules": ["dynamo-legacy"], "groups": {}}
    doc = encode_control_memory(STATE, DIGEST, 1000.0, 5000.0, ("learned:x", memory))
    read = decode_control_memory(
        json.loads(json.dumps(doc)), "m.json", BASE, now_s=10.0, wall_s=5100.0, max_gap_s=GAP_S
    )
    assert read.policy_id == "learned:x"
    assert read.policy_memory == memory
    assert read.policy_shift_s == pytest.approx(10.0 - 100.0 - 1000.0), "the writer's 1000 s is this clock's -1090 s"
    doc["policy"]["clock_s"] = "x"
    with pytest.raises(ControlMemoryError, match=r"m\.json: policy\.clock_s: expected seconds"):
        decode_control_memory(doc, "m.json", BASE, now_s=10.0, wall_s=5100.0, max_gap_s=GAP_S)


async def test_a_restarted_daemon_gives_the_learned_selector_its_memory_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    memory_path = tmp_path / "memory.json"
    config = make_config(tmp_path, policy="learned:default", control_memory_file=str(memory_path))
    first = new_loop(config, VirtualClock())
    first.memory = ControlMemoryFile(memory_path)
    await first.tick()
    written = json.loads(memory_path.read_text())
    assert written["policy"]["policy_id"] == first.runtime.policy.policy_id
    assert written["policy"]["memory"]["groups"]["g"]["rule"] == "dynamo-legacy"
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    daemon = Daemon(path, VirtualClock(), allow_virtual_clock=True)
    selector = inner_rule_selector(daemon.loop.runtime.policy)
    assert selector is not None
    assert selector.chosen_rules() == {}
    caplog.set_level(logging.INFO, logger="pdctl.controller")
    async with first_tick(daemon):
        assert f"the memory of {first.runtime.policy.policy_id}" in caplog.text
    written["policy"]["memory"]["groups"]["g"]["rule"] = "fastest"
    memory_path.write_text(json.dumps(written))
    refused = Daemon(path, VirtualClock(), allow_virtual_clock=True)
    with pytest.raises(ControlMemoryError, match=r"memory\.json: policy\.memory\.groups\.g\.rule: 'fastest'"):
        await refused.run(install_signals=False)


async def test_a_restarted_daemon_goes_on_with_the_watchdogs_hold(tmp_path: Path) -> None:
    """Before the watchdog remembered, a controller restarted during a hold handed control back to the failing
    primary at once and counted its next trip as the first (the hold not doubled)."""
    memory_path = tmp_path / "memory.json"
    watchdog = {"fallback": "policy_file", "trigger_intervals": 2, "hold_intervals": 6}
    config = make_config(tmp_path, watchdog=watchdog, control_memory_file=str(memory_path))
    clock = VirtualClock()
    first = ControlLoop(
        make_runtime(config, FakeReader(surge(slo_met=1.0))),  # attainment 0.1: the primary fails
        clock,
        Telemetry(CollectorRegistry()),
        AuditLog(None),
        OverrideWatcher(config.override_dir),
    )
    first.memory = ControlMemoryFile(memory_path)
    reasons = []
    for _ in range(4):
        reasons.append((await first.tick()).record["decision"]["reason"])
        await clock.advance(1.0)
    assert reasons[2].startswith("watchdog: tripped"), reasons
    written = json.loads(memory_path.read_text())
    assert written["policy"]["policy_id"] == first.runtime.policy.policy_id
    assert written["policy"]["memory"]["state"]["trips"] == 1
    assert written["policy"]["memory"]["state"]["hold_left_intervals"] == 4
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    daemon = Daemon(path, VirtualClock(start=clock.now()), allow_virtual_clock=True)
    async with first_tick(daemon):
        policy = daemon.loop.runtime.policy
        assert isinstance(policy, SloWatchdog)
        assert policy.state.trips == 1
        assert policy.state.in_fallback, "the hold goes on"
        assert policy.state.hold_left_intervals == 3


async def test_a_memory_that_cannot_be_written_is_logged_once_and_shown_until_it_is_written_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the memory's folder should be")
    config = make_config(tmp_path)
    loop = new_loop(config, VirtualClock(), Scripted([PoolTargets(2, 1), PoolTargets(2, 1), PoolTargets(1, 2)]))
    loop.memory = ControlMemoryFile(blocked / "memory.json")
    caplog.set_level(logging.INFO, logger="pdctl.controller.ticks")
    await loop.tick()
    await loop.tick()
    gauge = "pdctl_controller_control_memory_unwritten"
    assert loop.telemetry.registry.get_sample_value(gauge) == 1
    assert caplog.text.count("cannot write the control memory") == 1, "logged once, not at every tick"
    blocked.unlink()
    assert isinstance(loop.clock, VirtualClock)
    await loop.clock.advance(700.0)
    await loop.tick()
    assert loop.telemetry.registry.get_sample_value(gauge) == 0
    assert (blocked / "memory.json").is_file()
