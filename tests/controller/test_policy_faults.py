"""Policy faults are visible: a policy that raises is counted, trips the watchdog's fallback, flips ``/readyz``;
readiness reflects a stale source; a learned policy that cannot hold the live tenants is refused at load time."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controller.health import HealthServer
from controller.runtime import RuntimeConfigError, build_runtime
from policies.base import PolicyContext
from policies.features import Observation
from policies.schema import ControlAction
from policies.watchdog import SloWatchdog
from tests.controller.test_loop import POLICY, FakeReader, make_config, make_loop, sample, surge
from tests.policies.test_learned import write_artifact


class Flaky:
    """Raises while ``broken``; otherwise holds."""

    policy_id = "flaky"

    def __init__(self) -> None:
        self.broken = True

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        if self.broken:
            raise ZeroDivisionError("boom")
        return ControlAction(reason="fine", policy_id=self.policy_id)


async def test_a_raising_policy_is_counted_and_flips_readiness(tmp_path: Path) -> None:
    loop, clock, telemetry = make_loop(tmp_path, FakeReader(surge()))
    await loop.tick()
    assert loop.ready
    flaky = Flaky()
    loop.runtime = replace(loop.runtime, policy=flaky)
    await clock.advance(1.0)
    record = await loop.tick()
    assert record.plan.pools == {}, "held"
    assert sample(telemetry, "pdctl_controller_policy_errors_total") == 1
    assert not loop.ready
    assert loop.not_ready_reasons == ["policy raised: ZeroDivisionError: boom"]
    flaky.broken = False
    await clock.advance(1.0)
    await loop.tick()
    assert loop.ready, loop.not_ready_reasons
    assert sample(telemetry, "pdctl_controller_policy_errors_total") == 1


async def test_a_raising_primary_trips_the_watchdog_at_once(tmp_path: Path) -> None:
    watchdog = {"fallback": "policy_file", "trigger_intervals": 4, "hold_intervals": 2}
    loop, clock, telemetry = make_loop(tmp_path, FakeReader(surge(slo_met=10.0)), watchdog=watchdog)
    policy = loop.runtime.policy
    assert isinstance(policy, SloWatchdog)
    flaky = Flaky()
    policy.primary = flaky
    record = await loop.tick()
    assert record.record["decision"]["reason"].startswith("watchdog: primary raised ZeroDivisionError: boom; fallback")
    assert sample(telemetry, "pdctl_controller_watchdog_fallback") == 1
    assert sample(telemetry, "pdctl_controller_watchdog_trips_total") == 1
    assert sample(telemetry, "pdctl_controller_policy_errors_total") == 1
    assert record.record["policy_error"] == "ZeroDivisionError: boom"
    assert not loop.ready
    flaky.broken = False
    await clock.advance(1.0)  # the fallback holds for two intervals, the trip's included
    assert (await loop.tick()).record["decision"]["reason"].startswith("watchdog: fallback")
    assert not loop.ready, "the primary has not decided again yet"
    await clock.advance(1.0)
    tick = await loop.tick()
    assert tick.record["decision"]["reason"] == "fine"
    assert loop.ready, loop.not_ready_reasons
    assert sample(telemetry, "pdctl_controller_policy_errors_total") == 1


async def test_readyz_reports_a_stale_source_and_its_reasons(tmp_path: Path) -> None:
    reader = FakeReader(surge())
    loop, clock, telemetry = make_loop(tmp_path, reader)
    server = HealthServer(
        telemetry.registry, lambda: 0.0, lambda: 10.0, lambda: loop.ready, lambda: loop.not_ready_reasons
    )
    port = await server.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:

            async def readyz() -> tuple[int, Any]:
                async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                    return resp.status, await resp.json()

            await loop.tick()
            assert await readyz() == (200, {"status": "ready"})
            reader.fail = True
            for _ in range(2):  # within max_staleness_s (3 s) the source error alone already counts
                await clock.advance(1.0)
                await loop.tick()
            status, body = await readyz()
            assert status == 503
            assert body["status"] == "not ready"
            assert any("stale" in r for r in body["reasons"])
            reader.fail = False
            await clock.advance(1.0)
            await loop.tick()
            assert (await readyz())[0] == 200
    finally:
        await server.stop()


def test_a_learned_policy_that_cannot_hold_the_tenants_is_refused_at_load(tmp_path: Path) -> None:
    artifact = tmp_path / "policy"
    write_artifact(artifact, tenants=["chat", "rag"])  # one group, two tenant slots
    config = make_config(tmp_path, policy=f"learned:{artifact}")  # chat, rag and the default tenant
    with pytest.raises(RuntimeConfigError) as refused:
        build_runtime(config, generation=1, started_s=0.0)
    message = str(refused.value)
    assert "\n" not in message
    assert message.endswith("its layout holds 1 groups / 2 tenants, the policy file has 1 / 3")
    two = POLICY.replace("  - {name: rag, group: g, slo: {ttft_p95_ms: 20, tpot_p95_ms: 1000}}\n", "")
    (tmp_path / "policy.yaml").write_text(two)  # chat and the default tenant
    write_artifact(artifact, tenants=["default", "chat"])
    with pytest.raises(
        RuntimeConfigError,
        match=r"trained on tenants default, chat \(in slot order\), the policy file has chat, default$",
    ):
        build_runtime(config, generation=1, started_s=0.0)
    write_artifact(artifact, tenants=["chat", "default"])
    assert build_runtime(config, generation=1, started_s=0.0).policy.policy_id.startswith("learned:")
