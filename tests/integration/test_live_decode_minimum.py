"""The live run's regression, live: 2 prefill + 3 decode behind the real router, p0 crashes, ``queue_kv`` asks for
more prefill every tick; the controller (its real loop and router actuator) keeps decode at its minimum of 2.

Before the fix the guard checked only the policy file's budget (8) and ``role_changes`` chased the prefill count
through the decode pool: two decode instances flipped, leaving 4 prefill / 1 decode.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.audit import AuditLog
from controller.clock import VirtualClock
from controller.config import ControllerConfig
from controller.loop import ControlLoop
from controller.overrides import OverrideWatcher
from controller.runtime import build_runtime
from controller.sources.source import MetricSource
from controller.sources.window import WindowBuilder
from controller.telemetry import Telemetry
from tests.controller.test_loop import FakeReader, surge
from tests.router.cluster import ADMIN_TOKEN, LiveCluster, live_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

POLICY = """
slo: {ttft_p95_ms: 5000, tpot_p95_ms: 1000}
tenant_groups:
  - {name: g, gpu_budget: 8, pools: {prefill: {min: 1}, decode: {min: 2}}}
tenants:
  - {name: chat, group: g}
  - {name: rag, group: g, slo: {ttft_p95_ms: 20, tpot_p95_ms: 1000}}
"""
"""The RAG tenant's 20 ms TTFT objective is missed in every window: queue_kv sees prefill pressure, decode calm."""


async def _roles(c: LiveCluster) -> list[dict[str, Any]]:
    async with c.session.get(c.url + "/admin/state", headers=c.admin_headers()) as resp:
        return list((await resp.json())["instances"])


async def test_a_dead_prefill_instance_under_queue_kv_keeps_the_decode_minimum(tmp_path: Path) -> None:
    async with live_cluster(tmp_path, 2, 3) as c:
        c.host.instances[0].crash()  # p0
        for _ in range(100):
            if not next(i for i in await _roles(c) if i["id"] == "p0")["healthy"]:
                break
            await asyncio.sleep(0.05)
        (tmp_path / "policy.yaml").write_text(POLICY)
        config = ControllerConfig(
            mode="active",
            interval_s=1.0,
            policy="baseline:queue_kv",
            policy_file=tmp_path / "policy.yaml",
            lease_file=tmp_path / "controller.lease",
            instances=[{"id": i, "group": "g", "role": "prefill" if i[0] == "p" else "decode"} for i in c.host.urls],
            actuators=[{"kind": "router", "url": c.url, "token": ADMIN_TOKEN, "timeout_s": 2.0}],
            guard={"max_step_per_tick": 2, "cooldown_s": 0.0, "hysteresis_ticks": 1, "max_staleness_s": 30.0},
        )
        runtime = build_runtime(config, generation=1, started_s=0.0)
        source = MetricSource(FakeReader(surge(ttft_rag_s=0.5)), WindowBuilder(), 10.0, started_s=0.0)
        clock = VirtualClock()
        loop = ControlLoop(
            replace(runtime, source=source),
            clock,
            Telemetry(CollectorRegistry()),
            AuditLog(None),
            OverrideWatcher(None),
        )
        try:
            for _ in range(6):
                record = await loop.tick()
                await clock.advance(1.0)
                live = [i for i in await _roles(c) if i["healthy"]]
                decode = [i["id"] for i in live if (i["pending_role"] or i["role"]) == "decode"]
                assert len(decode) >= 2, (record.record["guarded"], record.record["actuation"], await _roles(c))
            prefill = [i["id"] for i in await _roles(c) if i["healthy"] and i["role"] == "prefill"]
            assert sorted(prefill) == ["d2", "p1"], "one decode instance shifted to prefill, no more"
            assert not next(i for i in await _roles(c) if i["id"] == "p0")["healthy"]
        finally:
            await runtime.close()
