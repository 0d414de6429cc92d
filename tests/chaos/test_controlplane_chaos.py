"""Chaos on the control plane, with traffic flowing: Prometheus down and back, the controller's policy file
flipped to invalid (and an invalid policy pushed to the router), the controller killed; and wall-clock jumps
under the controller's injected clock.

The live-stack cases share one stack (emulated instances + router in this process, a real Prometheus, the
controller daemon in its own process; ``tests/controller/stack.py``) and run as phases; each phase is one row
of the summary table.
"""

from __future__ import annotations

import asyncio
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.audit import AuditLog
from controller.clock import VirtualClock
from controller.loop import ControlLoop
from controller.overrides import OverrideWatcher
from controller.telemetry import Telemetry
from tests.chaos.common import Outcome, Tally, assert_records_match, body_for, load
from tests.chaos.conftest import ChaosRow, ChaosTable
from tests.controller.harness import role_map, wait_until
from tests.controller.stack import Stack, live_stack
from tests.controller.test_loop import FakeReader, make_config, make_runtime, surge
from tests.router.cluster import ADMIN_TOKEN

pytestmark = [pytest.mark.chaos]
INVALID_POLICY = "tenant_groups: [{name: interactive, gpu_budget: -3}]\ntenants: 7\n"


def _chat(rid: str, k: int) -> dict[str, Any]:
    return body_for(rid, 3000 if k % 4 == 0 else 200, 16, stream=k % 3 != 0)


async def _traffic(stack: Stack, prefix: str, n: int = 24) -> Tally:
    tally = Tally()
    c = stack.cluster
    tally.extend(await load(c.session, c.url, prefix, n, 3, _chat, headers={"X-Tenant-Id": "chat"}, gap_s=0.1))
    return tally


async def _metric(stack: Stack, name: str, **labels: str) -> float | None:
    return await asyncio.to_thread(stack.controller.metric, name, **labels)


def _add(table: ChaosTable, stack: Stack, case: str, faults: str, tally: Tally, base: Tally, notes: str) -> ChaosRow:
    stack.cluster.router.log.flush()  # type: ignore[union-attr]
    row = table.add(case, faults, tally, base, notes)
    row.lost += assert_records_match(tally.outcomes, stack.cluster.records())
    return row


@pytest.mark.timeout(240)
async def test_prometheus_outage_invalid_policy_and_killed_controller(tmp_path: Path, chaos_table: ChaosTable) -> None:
    async with live_stack(tmp_path, rules={"allow_scale_in": True}) as stack:
        ctl = stack.controller
        baseline = await _traffic(stack, "base")
        await stack.wait_for_data("chat")
        assert baseline.count("ok") == baseline.sent

        # -- Prometheus down, traffic on, Prometheus back
        roles = role_map(await stack.state())
        await asyncio.to_thread(stack.prometheus.stop)
        outage_start = len(stack.audit())
        during = await _traffic(stack, "prom-down")

        async def stale() -> bool:
            return await _metric(stack, "pdctl_controller_observation_stale") == 1

        await wait_until(stale, 20, what="the controller to report stale observations")
        blind = stack.audit()[outage_start:]
        held = all(not r["plan"]["pools"] for r in blind)
        same_roles = role_map(await stack.state()) == roles
        await asyncio.to_thread(stack.prometheus.start)

        async def fresh() -> bool:
            return await _metric(stack, "pdctl_controller_observation_stale") == 0

        await wait_until(fresh, 30, what="fresh observations after Prometheus returned")
        during.extend((await _traffic(stack, "prom-back", 12)).outcomes)
        row = _add(
            chaos_table, stack, "prometheus down and back", "Prometheus stopped (SIGTERM) then restarted, traffic on",
            during, baseline, f"{len(blind)} blind ticks held the pools; stale flag set then cleared",
        )  # fmt: skip
        assert row.lost == 0, during.lost_details()
        assert during.count("failed") == 0
        assert held, "a pool changed while the controller was blind"
        assert same_roles

        # -- the controller's policy file flipped to invalid (SIGHUP), and an invalid policy pushed to the router
        state = await stack.state()
        generation = state["generation"]
        policy_path = Path(stack.config["policy_file"])
        good_policy = await asyncio.to_thread(policy_path.read_text)
        await asyncio.to_thread(
            policy_path.write_text, "tenant_groups: [{name: interactive, gpu_budget: -3}]\ntenants: 7\n"
        )
        ctl.signal(signal.SIGHUP)

        async def refused() -> bool:
            return await _metric(stack, "pdctl_controller_config_reloads_total", result="error") == 1

        await wait_until(refused, 15, what="the reload with the invalid policy file to be refused")
        headers = stack.cluster.admin_headers()
        async with stack.cluster.session.put(
            stack.cluster.url + "/admin/policy", json={"policy": {"tenants": "not a list"}}, headers=headers
        ) as resp:
            push_status = resp.status
            push_error = (await resp.json())["error"]
        invalid = await _traffic(stack, "invalid-policy")
        after = await stack.state()
        ticks_ok = await _metric(stack, "pdctl_controller_ticks_total", result="ok")
        row = _add(
            chaos_table, stack, "policy file flipped to invalid",
            "controller policy file made invalid + SIGHUP; invalid policy PUT to the router",
            invalid, baseline, f"reload refused (old generation kept); router PUT answered {push_status}",
        )  # fmt: skip
        await asyncio.to_thread(policy_path.write_text, good_policy)
        assert row.lost == 0, invalid.lost_details()
        assert invalid.count("failed") == 0
        assert push_status == 400
        assert push_error["field"].startswith("policy")
        assert after["generation"] >= generation  # the controller kept publishing from its old, valid policy
        assert after["policy"]["tenants"], "the router's running policy was replaced by an invalid one"
        assert (ticks_ok or 0) > 0
        assert "reload refused" in ctl.log_text()

        # -- the controller killed: the router keeps the last policy, traffic unaffected
        await asyncio.sleep(1.5)
        before_kill = await stack.state()
        assert ctl.proc is not None
        ctl.proc.kill()
        await asyncio.to_thread(ctl.proc.wait, 10)
        killed = await _traffic(stack, "ctl-killed")
        after_kill = await stack.state()
        row = _add(
            chaos_table, stack, "controller killed", "SIGKILL of the controller daemon, traffic on",
            killed, baseline, f"router kept policy generation {after_kill['generation']} and the roles",
        )  # fmt: skip
        assert row.lost == 0, killed.lost_details()
        assert killed.count("failed") == 0
        assert after_kill["generation"] == before_kill["generation"]
        assert after_kill["policy"] == before_kill["policy"]
        assert role_map(after_kill) == role_map(before_kill)
        # the actuator's admin token never reaches the controller's log or audit trail
        assert ADMIN_TOKEN not in ctl.log_text()
        assert ADMIN_TOKEN not in stack.audit_path.read_text()


class JumpingClock(VirtualClock):
    """A virtual clock whose wall time (``now``) can jump while its monotonic time runs on evenly."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = timedelta(0)

    def now(self) -> Any:
        return super().now() + self.offset


async def _run_loop(tmp_path: Path, jumps: dict[int, timedelta], ticks: int, outage: range) -> list[dict[str, Any]]:
    reader = FakeReader(surge())
    config = make_config(tmp_path, guard={"hysteresis_ticks": 2, "cooldown_s": 5.0, "max_staleness_s": 3.0})
    clock = JumpingClock()
    loop = ControlLoop(
        make_runtime(config, reader),
        clock,
        Telemetry(CollectorRegistry()),
        AuditLog(config.audit_log),
        OverrideWatcher(config.override_dir),
    )
    records = []
    for tick in range(ticks):
        if tick in jumps:
            clock.offset += jumps[tick]
        reader.fail = tick in outage
        await clock.advance(1.0)
        record = await loop.tick()
        records.append(record.record)
    return records


async def test_clock_jumps_change_no_decision(tmp_path: Path, chaos_table: ChaosTable) -> None:
    jumps = {8: timedelta(hours=1), 16: timedelta(hours=-3), 24: timedelta(days=1), 40: timedelta(minutes=-30)}
    outage = range(36, 46)  # the source fails across the backward jump at tick 40
    ticks = 60
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    steady = await _run_loop(tmp_path / "a", {}, ticks, outage)
    jumping = await _run_loop(tmp_path / "b", jumps, ticks, outage)

    def decisions(records: list[dict[str, Any]]) -> list[Any]:
        return [(r["plan"]["pools"], r["plan"]["thresholds"], r["guarded"]["pools"]) for r in records]

    changed = sum(1 for a, b in zip(decisions(steady), decisions(jumping), strict=True) if a != b)
    blind_held = all(not r["plan"]["pools"] for r in jumping[36:46])
    tally = Tally()
    for k, r in enumerate(jumping):
        tally.outcomes.append(Outcome(f"tick-{k}", "ok" if r["tick"] == k + 1 else "lost", 0.0))
    chaos_table.add(
        "clock jumps (controller)",
        "wall clock +1 h, −3 h, +1 day, −30 min (monotonic steady); source down for 10 ticks across the last jump",
        tally,
        None,
        notes=f"{changed} of {ticks} tick decisions differ from the same run without jumps; pools held while blind",
        unit="ticks",
    )
    assert [r["tick"] for r in jumping] == list(range(1, ticks + 1))
    assert changed == 0
    assert blind_held
    assert any(r["plan"]["pools"] for r in jumping), "the run made no decision at all: nothing was compared"
