"""The control loop on virtual time: decisions, staleness, generations, advisory mode, overrides, audit, metrics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from controller.actuators.dryrun import DryRunActuator
from controller.audit import AuditLog
from controller.clock import VirtualClock
from controller.config import ControllerConfig
from controller.loop import ControlLoop, classify
from controller.overrides import OverrideWatcher
from controller.runtime import Runtime, build_runtime
from controller.sources.base import Query, Readout, Row, SourceUnavailableError, Topology
from controller.sources.source import MetricSource
from controller.sources.window import WindowBuilder, WindowQueries
from controller.telemetry import Telemetry
from policies.registry import remembering_policy
from policies.schema import PoolTargets

POLICY = """
pd_disaggregation_policy:
  remote_prefill: {min_input_tokens: 4096}
  local_prefill: {max_input_tokens: 2048}
tenant_groups:
  - {name: g, gpu_budget: 3, pools: {prefill: {min: 1, max: 2}, decode: {min: 1, max: 2}}}
tenants:
  - {name: chat, group: g, slo: {ttft_p95_ms: 5000, tpot_p95_ms: 1000}}
  - {name: rag, group: g, slo: {ttft_p95_ms: 20, tpot_p95_ms: 1000}}
"""
Q = WindowQueries()
R, INST = Q.router(), Q.instances()


class FakeReader:
    """Answers with a fixed readout, or fails; ``hook`` runs inside fetch (to interleave a swap)."""

    def __init__(self, readout: Readout) -> None:
        self.readout = readout
        self.fail = False
        self.hook: Callable[[], Awaitable[None]] | None = None

    async def fetch(self, queries: Sequence[Query], topology: Topology, now_s: float) -> Readout:
        del queries, topology
        if self.hook is not None:
            await self.hook()
        if self.fail:
            raise SourceUnavailableError("prometheus down")
        return replace(self.readout, newest_sample_s=now_s)

    async def close(self) -> None:
        return None


def surge(ttft_rag_s: float = 0.5, slo_met: float | None = None) -> Readout:
    results: dict[Query, list[Row]] = {
        R["requests"]: [
            ({"tenant": "chat", "route": "local_prefill", "outcome": "ok"}, 10.0),
            ({"tenant": "rag", "route": "local_prefill", "outcome": "ok"}, 10.0),
        ],
        R["prompt_sum"]: [({"tenant": "chat"}, 1000.0), ({"tenant": "rag"}, 30000.0)],
        R["ttft_0.95"]: [({"tenant": "chat"}, 0.1), ({"tenant": "rag"}, ttft_rag_s)],
        R["tpot_0.95"]: [({"tenant": "chat"}, 0.01), ({"tenant": "rag"}, 0.01)],
        INST["kv_usage"]: [({"instance_id": "d0"}, 0.2), ({"instance_id": "d1"}, 0.2)],
    }
    if slo_met is not None:
        results[R["slo_met"]] = [({"tenant": "chat"}, slo_met), ({"tenant": "rag"}, slo_met)]
    return Readout(results, 10.0, 0.0)


def make_config(tmp_path: Path, **overrides: Any) -> ControllerConfig:
    (tmp_path / "policy.yaml").write_text(POLICY)
    (tmp_path / "overrides").mkdir(exist_ok=True)
    data: dict[str, Any] = {
        "mode": "active",
        "interval_s": 1.0,
        "policy": "baseline:queue_kv",
        "policy_file": str(tmp_path / "policy.yaml"),
        "override_dir": str(tmp_path / "overrides"),
        "audit_log": str(tmp_path / "audit.jsonl"),
        "instances": [
            {"id": "p0", "group": "g", "role": "prefill"},
            {"id": "d0", "group": "g", "role": "decode"},
            {"id": "d1", "group": "g", "role": "decode"},
        ],
        "guard": {"hysteresis_ticks": 1, "cooldown_s": 5.0, "max_staleness_s": 3.0},
        **overrides,
    }
    return ControllerConfig(**data)


def make_runtime(config: ControllerConfig, reader: FakeReader, generation: int = 1) -> Runtime:
    runtime = build_runtime(config, generation=generation, started_s=0.0)
    return replace(runtime, source=MetricSource(reader, WindowBuilder(), 10.0, started_s=0.0))


def make_loop(tmp_path: Path, reader: FakeReader, **overrides: Any) -> tuple[ControlLoop, VirtualClock, Telemetry]:
    config = make_config(tmp_path, **overrides)
    clock = VirtualClock()
    telemetry = Telemetry(CollectorRegistry())
    loop = ControlLoop(
        make_runtime(config, reader), clock, telemetry, AuditLog(config.audit_log), OverrideWatcher(config.override_dir)
    )
    return loop, clock, telemetry


def dry_run(loop: ControlLoop) -> DryRunActuator:
    actuator = loop.runtime.actuators[0]
    assert isinstance(actuator, DryRunActuator)
    return actuator


def sample(telemetry: Telemetry, name: str, **labels: str) -> float | None:
    return telemetry.registry.get_sample_value(name, labels)


async def test_surge_moves_an_instance_and_lowers_the_threshold_then_cools_down(tmp_path: Path) -> None:
    loop, clock, telemetry = make_loop(tmp_path, FakeReader(surge()))
    first = await loop.tick()
    assert first.plan.pools == {"g": PoolTargets(2, 1)}
    assert first.plan.policy_document is not None
    rag = next(t for t in first.plan.policy_document["tenants"] if t["name"] == "rag")
    assert rag["pd_disaggregation_policy"]["remote_prefill"]["min_input_tokens"] == 3072
    assert [r.outcome.value for r in first.results] == ["applied"]
    assert first.record["guarded"]["summary"] == {"g": "rebalance"}
    assert sample(telemetry, "pdctl_controller_decisions_total", action="rebalance", reason="policy") == 1
    # The dry-run state now has 2 prefill; the next tick is inside the cooldown (pools and thresholds).
    await clock.advance(1.0)
    second = await loop.tick()
    assert second.plan.pools == {}
    assert second.plan.policy_document is None
    assert "rag:lower_remote_threshold 3072->2304" in second.record["decision"]["reason"]
    assert {c["reason"] for c in second.record["clamps"]} == {"threshold_cooldown"}
    assert len(dry_run(loop).records) == 1
    await clock.advance(5.0)
    third = await loop.tick()
    assert third.plan.policy_document is not None
    assert third.record["plan"]["thresholds"]["rag"]["min_remote_input_tokens"] == 2304
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert [json.loads(line)["tick"] for line in lines] == [1, 2, 3]


async def test_stale_source_holds_and_reports(tmp_path: Path) -> None:
    reader = FakeReader(surge())
    loop, clock, telemetry = make_loop(tmp_path, reader)
    await loop.tick()
    assert loop.ready
    reader.fail = True
    for _ in range(5):
        await clock.advance(1.0)
        record = await loop.tick()
        assert record.plan.pools == {}
        assert record.record["observation"]["source_error"] == "prometheus down"
    assert record.window.staleness_s == pytest.approx(5.0)
    assert sample(telemetry, "pdctl_controller_observation_stale") == 1
    assert sample(telemetry, "pdctl_controller_source_errors_total") == 5
    reader.fail = False
    await clock.advance(1.0)
    record = await loop.tick()
    assert record.window.staleness_s == 0.0
    assert sample(telemetry, "pdctl_controller_observation_stale") == 0


async def test_decision_from_an_old_generation_is_dropped(tmp_path: Path) -> None:
    reader = FakeReader(surge())
    loop, _, telemetry = make_loop(tmp_path, reader)
    newer = make_runtime(make_config(tmp_path), FakeReader(surge()), generation=2)

    async def swap_meanwhile() -> None:
        reader.hook = None
        loop.runtime = newer  # what Daemon.reload does first (the old runtime closes after the tick)

    reader.hook = swap_meanwhile
    record = await loop.tick()
    assert record.dropped
    assert record.results == ()
    assert dry_run(loop).records == []
    assert sample(telemetry, "pdctl_controller_decisions_dropped_total") == 1
    assert record.record["dropped"] is True


async def test_advisory_mode_computes_but_never_actuates(tmp_path: Path) -> None:
    loop, clock, _ = make_loop(tmp_path, FakeReader(surge()), mode="advisory")
    records = []
    for _ in range(7):
        records.append(await loop.tick())
        await clock.advance(1.0)
    # Same cadence as active mode (guard cooldown 5 s), nothing ever actuated, nothing running changes.
    assert [bool(r.plan.pools) for r in records] == [True, False, False, False, False, True, False]
    assert all(r.plan.pools in ({}, {"g": PoolTargets(2, 1)}) for r in records)
    assert all(r.results == () for r in records)
    assert dry_run(loop).records == []
    assert loop.state.published is None
    assert records[-1].record["mode"] == "advisory"


async def test_policy_error_holds(tmp_path: Path) -> None:
    loop, _, _ = make_loop(tmp_path, FakeReader(surge()))

    class Broken:
        policy_id = "broken"

        def decide(self, observation: object, context: object) -> object:
            raise ZeroDivisionError("boom")

    loop.runtime = replace(loop.runtime, policy=Broken())  # type: ignore[arg-type]
    record = await loop.tick()
    assert record.plan.pools == {}
    assert record.record["policy_error"] == "ZeroDivisionError: boom"


async def test_overrides_win_expire_and_invalid_ones_change_nothing(tmp_path: Path) -> None:
    loop, clock, telemetry = make_loop(tmp_path, FakeReader(surge(ttft_rag_s=0.001)))
    await loop.tick()
    published = loop.state.published
    assert published is not None
    assert published["rag"].min_remote_input_tokens == 4096
    expires = (clock.now().timestamp()) + 3
    override = {
        "expires_at": clock.now().fromtimestamp(expires, clock.now().tzinfo).isoformat(),
        "tenants": [{"name": "rag", "pd_disaggregation_policy": {"remote_prefill": {"min_input_tokens": 2500}}}],
    }
    (tmp_path / "overrides" / "o.yaml").write_text(yaml.safe_dump(override))
    (tmp_path / "overrides" / "bad.yaml").write_text("tenants: [{name: rag, pd_disaggregation_policy: 3}]\n")
    await clock.advance(1.0)
    record = await loop.tick()
    assert loop.state.published is not None
    assert loop.state.published["rag"].min_remote_input_tokens == 2500
    assert loop.state.published["chat"].min_remote_input_tokens == 4096
    assert record.record["overrides"]["active"] == ["o.yaml"]
    assert "bad.yaml" in record.record["overrides"]["refused"]
    assert sample(telemetry, "pdctl_controller_override_refused", file="bad.yaml") == 1
    assert sample(telemetry, "pdctl_controller_override_active") == 1
    await clock.advance(3.0)
    record = await loop.tick()
    assert loop.state.published["rag"].min_remote_input_tokens == 4096
    assert record.record["overrides"]["active"] == []
    assert sample(telemetry, "pdctl_controller_override_refusals_total") == 1


def test_classify() -> None:
    assert classify(PoolTargets(1, 2), PoolTargets(1, 2)) == "hold"
    assert classify(PoolTargets(1, 2), PoolTargets(2, 2)) == "scale_up"
    assert classify(PoolTargets(1, 2), PoolTargets(1, 1)) == "scale_down"
    assert classify(PoolTargets(1, 2), PoolTargets(2, 1)) == "rebalance"
    assert classify(None, PoolTargets(2, 1)) == "hold"


async def test_virtual_clock_wakes_sleepers_in_order() -> None:
    clock = VirtualClock()
    woke: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(name)

    tasks = [asyncio.create_task(sleeper("late", 5.0)), asyncio.create_task(sleeper("early", 1.0))]
    await asyncio.sleep(0)
    await clock.advance(2.0)
    assert woke == ["early"]
    await clock.advance(3.0)
    assert woke == ["early", "late"]
    assert clock.monotonic() == 5.0
    await asyncio.gather(*tasks)


async def test_swap_keeps_the_policy_state_unless_the_base_file_changed(tmp_path: Path) -> None:
    loop, _, _ = make_loop(tmp_path, FakeReader(surge()))
    await loop.tick()
    assert loop.state.policy_thresholds["rag"].min_remote_input_tokens == 3072
    same_base = make_runtime(make_config(tmp_path, mode="advisory"), FakeReader(surge()), generation=2)
    await loop.swap(same_base)
    assert loop.state.policy_thresholds["rag"].min_remote_input_tokens == 3072
    assert loop.state.published is not None
    config = make_config(tmp_path)
    (tmp_path / "policy.yaml").write_text(POLICY.replace("min_input_tokens: 4096", "min_input_tokens: 5000"))
    changed = build_runtime(config, generation=3, started_s=0.0)
    await loop.swap(changed)
    assert loop.state.policy_thresholds["rag"].min_remote_input_tokens == 5000
    assert loop.state.published is None


async def test_a_reload_hands_the_rule_selector_its_memory_unless_the_policy_changed(tmp_path: Path) -> None:
    loop, _, _ = make_loop(tmp_path, FakeReader(surge()), policy="learned:default")
    await loop.tick()
    before = remembering_policy(loop.runtime.policy)
    assert before is not None
    remembered = before.memory_document()
    assert remembered["groups"], "the first tick gave the selector something to remember"
    await loop.swap(make_runtime(make_config(tmp_path, policy="learned:default"), FakeReader(surge()), generation=2))
    after = remembering_policy(loop.runtime.policy)
    assert after is not None
    assert after is not before
    assert after.memory_document() == remembered
    other = make_runtime(make_config(tmp_path, policy="learned:admission"), FakeReader(surge()), generation=3)
    await loop.swap(other)
    fresh = remembering_policy(loop.runtime.policy)
    assert fresh is not None
    assert fresh.memory_document()["groups"] == {}, "another policy starts with no memory"


async def test_watchdog_hands_control_to_the_policy_file_while_objectives_are_missed(tmp_path: Path) -> None:
    reader = FakeReader(surge(slo_met=1.0))  # 1 of 10 requests per tenant met both objectives: attainment 0.1
    watchdog = {"fallback": "policy_file", "trigger_intervals": 2, "hold_intervals": 3}
    loop, clock, telemetry = make_loop(tmp_path, reader, watchdog=watchdog)
    assert loop.runtime.policy.policy_id == f"watchdog[file:{tmp_path / 'policy.yaml'}]:baseline:queue_kv"
    reasons = []
    for _ in range(4):
        tick = await loop.tick()
        reasons.append(tick.record["decision"]["reason"])
        await clock.advance(1.0)
    # Tick 1's window shows what ran before: not judged; ticks 2 and 3 fail under queue_kv; tick 3 trips.
    assert [r.startswith("watchdog") for r in reasons] == [False, False, True, True]
    assert reasons[2].startswith("watchdog: tripped (2 intervals below 0.5 SLO attainment, now 0.10)")
    assert reasons[3].startswith("watchdog: fallback file:")
    assert sample(telemetry, "pdctl_controller_watchdog_fallback") == 1
    assert sample(telemetry, "pdctl_controller_watchdog_trips_total") == 1
    assert sample(telemetry, "pdctl_controller_watchdog_slo_attainment_ratio") == pytest.approx(0.1)
    # Objectives met again: the hold runs out (tick 5), queue_kv decides again (tick 6 not judged, tick 7 passes).
    reader.readout = surge(slo_met=10.0)
    reasons = []
    for _ in range(3):
        tick = await loop.tick()
        reasons.append(tick.record["decision"]["reason"])
        await clock.advance(1.0)
    assert [r.startswith("watchdog") for r in reasons] == [True, False, False]
    assert sample(telemetry, "pdctl_controller_watchdog_fallback") == 0
    assert sample(telemetry, "pdctl_controller_watchdog_trips_total") == 1
