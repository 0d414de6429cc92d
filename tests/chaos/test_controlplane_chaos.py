"""Chaos on the control plane, with traffic flowing: Prometheus down and back, the controller's policy file
flipped to invalid (and an invalid policy pushed to the router), the controller killed, Prometheus down during a
surge (composite); and wall-clock jumps under the controller's injected clock.

The first three live-stack cases share one stack (emulated instances + router in this process, a real
Prometheus, the controller daemon in its own process; ``tests/controller/stack.py``) and run as phases; each
phase is one row of the summary table, with :data:`NUM_REQUESTS` requests at a concurrency of
:data:`CONCURRENCY`. The composite has a stack of its own.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Mapping
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
from tests.chaos.common import (
    CONCURRENCY,
    NUM_REQUESTS,
    Outcome,
    RouterCounts,
    Tally,
    assert_records_match,
    body_for,
    client_session,
    load,
    router_counts,
    settled_counts,
)
from tests.chaos.conftest import ChaosRow, ChaosTable
from tests.controller.harness import role_map, wait_until
from tests.controller.stack import Stack, live_stack
from tests.controller.test_loop import FakeReader, make_config, make_runtime, surge
from tests.router.cluster import ADMIN_TOKEN

pytestmark = [pytest.mark.chaos]
INVALID_POLICY = "tenant_groups: [{name: interactive, gpu_budget: -3}]\ntenants: 7\n"


def _chat(rid: str, k: int) -> dict[str, Any]:
    return body_for(rid, 600 if k % 4 == 0 else 200, 8, stream=k % 3 != 0)


async def _traffic(
    stack: Stack, prefix: str, n: int = NUM_REQUESTS, concurrency: int = CONCURRENCY, gap_s: float = 0.3
) -> tuple[Tally, RouterCounts]:
    """``n`` chat requests (``gap_s`` between one worker's requests: a few seconds of traffic), and the router's
    counters over them."""
    c = stack.cluster
    async with client_session() as session:
        before = await router_counts(session, c.url)
        tally = Tally()
        tally.add(await load(session, c.url, prefix, n, concurrency, _chat, {"X-Tenant-Id": "chat"}, gap_s))
        counts = await settled_counts(session, c.url, before, tally.sent)
    return tally, counts


async def _metric(stack: Stack, name: str, **labels: str) -> float | None:
    return await asyncio.to_thread(stack.controller.metric, name, **labels)


def _add(
    table: ChaosTable,
    stack: Stack,
    case: str,
    faults: str,
    traffic: tuple[Tally, RouterCounts],
    base: Tally,
    notes: str,
) -> ChaosRow:
    tally, counts = traffic
    stack.cluster.router.log.flush()  # type: ignore[union-attr]
    row = table.add(case, f"{faults} (instances at time scale 1)", tally, base, notes, router=counts)
    row.lost += assert_records_match(tally.outcomes, stack.cluster.records())
    return row


def _check(row: ChaosRow, traffic: tuple[Tally, RouterCounts]) -> None:
    """Nothing lost or failed, at the suite's scale, and the router counted what the client saw."""
    tally, counts = traffic
    assert row.lost == 0, tally.lost_details()
    assert tally.count("failed") == 0, [o.detail for o in tally.outcomes if o.kind == "failed"][:5]
    assert tally.sent >= NUM_REQUESTS
    assert tally.concurrency >= CONCURRENCY
    assert (counts.ok, counts.error) == (tally.count("ok"), 0), counts


@pytest.mark.timeout(240)
async def test_prometheus_outage_invalid_policy_and_killed_controller(tmp_path: Path, chaos_table: ChaosTable) -> None:
    async with live_stack(tmp_path, rules={"allow_scale_in": True}) as stack:
        ctl = stack.controller
        baseline, _ = await _traffic(stack, "base", 200)
        await stack.wait_for_data("chat")
        assert baseline.count("ok") == baseline.sent

        # -- Prometheus down, traffic on, Prometheus back
        roles = role_map(await stack.state())
        await asyncio.to_thread(stack.prometheus.stop)
        outage_start = len(stack.audit())
        traffic = asyncio.create_task(_traffic(stack, "prom-down"))

        async def stale() -> bool:
            return await _metric(stack, "pdctl_controller_observation_stale") == 1

        await wait_until(stale, 20, what="the controller to report stale observations")
        during = await traffic
        blind = stack.audit()[outage_start:]
        held = all(not r["plan"]["pools"] for r in blind)
        same_roles = role_map(await stack.state()) == roles
        await asyncio.to_thread(stack.prometheus.start)

        async def fresh() -> bool:
            return await _metric(stack, "pdctl_controller_observation_stale") == 0

        await wait_until(fresh, 30, what="fresh observations after Prometheus returned")
        row = _add(
            chaos_table, stack, "prometheus down and back", "Prometheus stopped (SIGTERM) then restarted, traffic on",
            during, baseline, f"{len(blind)} blind ticks held the pools; stale flag set then cleared",
        )  # fmt: skip
        _check(row, during)
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
        _check(row, invalid)
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
        _check(row, killed)
        assert after_kill["generation"] == before_kill["generation"]
        assert after_kill["policy"] == before_kill["policy"]
        assert role_map(after_kill) == role_map(before_kill)
        # the actuator's admin token never reaches the controller's log or audit trail
        assert ADMIN_TOKEN not in ctl.log_text()
        assert ADMIN_TOKEN not in stack.audit_path.read_text()


def _surge(rid: str, k: int) -> dict[str, Any]:
    """Both tenants: RAG (odd k) with 600-token prompts, chat with 200-token ones."""
    return body_for(rid, 600 if k % 2 else 200, 8, stream=k % 3 != 0)


def _surge_tenant(k: int) -> dict[str, str]:
    return {"X-Tenant-Id": "rag" if k % 2 else "chat"}


@pytest.mark.timeout(240)
async def test_composite_prometheus_down_during_a_surge(tmp_path: Path, chaos_table: ChaosTable) -> None:
    """Light traffic, then Prometheus stops and a surge of both tenants starts while the controller is blind;
    Prometheus returns while the surge still runs (the controller may then act on it)."""
    async with live_stack(tmp_path, rules={"allow_scale_in": True}) as stack:
        c = stack.cluster
        light, _ = await _traffic(stack, "light", 50, 2, 0.1)
        await stack.wait_for_data("chat")
        assert light.count("ok") == light.sent
        roles = role_map(await stack.state())
        await asyncio.to_thread(stack.prometheus.stop)
        outage_start = len(stack.audit())
        async with client_session() as session:
            before = await router_counts(session, c.url)
            surge_task = asyncio.create_task(
                load(session, c.url, "surge", NUM_REQUESTS, CONCURRENCY, _surge, _surge_tenant, gap_s=0.4)
            )

            async def stale() -> bool:
                return await _metric(stack, "pdctl_controller_observation_stale") == 1

            await wait_until(stale, 20, what="the controller to report stale observations")
            blind = stack.audit()[outage_start:]
            held = all(not r["plan"]["pools"] for r in blind)
            same_roles = role_map(await stack.state()) == roles
            surge_running = not surge_task.done()
            await asyncio.to_thread(stack.prometheus.start)

            async def fresh() -> bool:
                return await _metric(stack, "pdctl_controller_observation_stale") == 0

            await wait_until(fresh, 30, what="fresh observations after Prometheus returned")
            tally = Tally()
            tally.add(await surge_task)
            counts = await settled_counts(session, c.url, before, tally.sent)
        row = _add(
            chaos_table, stack, "composite: prometheus down during a surge",
            "Prometheus stopped, then a surge of both tenants (from 2 to 100 in flight); Prometheus restarted while "
            "the surge runs",
            (tally, counts), light,
            f"{len(blind)} blind ticks held the pools; stale flag set then cleared; baseline = the light traffic "
            "before",
        )  # fmt: skip
        _check(row, (tally, counts))
        assert held, "a pool changed while the controller was blind"
        assert same_roles
        assert surge_running, "the surge ended before the controller noticed the outage"


class JumpingClock(VirtualClock):
    """A virtual clock whose wall time (``now``) can jump while its monotonic time runs on evenly."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = timedelta(0)

    def now(self) -> Any:
        return super().now() + self.offset


async def _run_loop(
    tmp_path: Path, jumps: dict[int, timedelta], ticks: int, outage: set[int]
) -> list[Mapping[str, Any]]:
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
    records: list[Mapping[str, Any]] = []
    for tick in range(ticks):
        if tick in jumps:
            clock.offset += jumps[tick]
        reader.fail = tick in outage
        await clock.advance(1.0)
        record = await loop.tick()
        records.append(record.record)
    return records


async def test_clock_jumps_change_no_decision(tmp_path: Path, chaos_table: ChaosTable) -> None:
    jumps = {
        8: timedelta(hours=1), 16: timedelta(hours=-3), 24: timedelta(days=1), 40: timedelta(minutes=-30),
        300: timedelta(days=-2), 555: timedelta(seconds=-1), 800: timedelta(hours=7),
    }  # fmt: skip
    outage = set(range(36, 46)) | set(range(795, 810))  # the source fails across the jumps at ticks 40 and 800
    ticks = 1000
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    start = time.monotonic()
    steady = await _run_loop(tmp_path / "a", {}, ticks, outage)
    jumping = await _run_loop(tmp_path / "b", jumps, ticks, outage)
    wall_s = time.monotonic() - start

    def decisions(records: list[Mapping[str, Any]]) -> list[Any]:
        return [(r["plan"]["pools"], r["plan"]["thresholds"], r["guarded"]["pools"]) for r in records]

    changed = sum(1 for a, b in zip(decisions(steady), decisions(jumping), strict=True) if a != b)
    blind_held = all(not jumping[t]["plan"]["pools"] for t in sorted(outage))
    tally = Tally(wall_s=wall_s)
    for k, r in enumerate(jumping):
        tally.outcomes.append(Outcome(f"tick-{k}", "ok" if r["tick"] == k + 1 else "lost", 0.0))
    chaos_table.add(
        "clock jumps (controller)",
        "wall clock +1 h, −3 h, +1 day, −30 min, −2 days, −1 s, +7 h (monotonic steady); source down for 10 and 15 "
        "ticks across two of the jumps",
        tally,
        None,
        notes=f"controller only (virtual clock, no requests: concurrency n/a); {changed} of {ticks} tick decisions "
        "differ from the same run without jumps; pools held while blind",
        unit="ticks",
    )
    assert [r["tick"] for r in jumping] == list(range(1, ticks + 1))
    assert changed == 0
    assert blind_held
    assert any(r["plan"]["pools"] for r in jumping), "the run made no decision at all: nothing was compared"
