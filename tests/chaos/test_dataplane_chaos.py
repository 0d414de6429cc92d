"""Chaos on the data plane: KV transfer failures and delays, killed prefill/decode instances, a killed router,
role flips under load. Emulated instances and the router run on loopback; killed ones in their own process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import yaml

from env.scenario import ClusterConfig
from livestack.emulator import EmulatorHost, FaultConfig, InstanceSpec
from livestack.emulator.faults import FaultInjector
from tests.chaos.common import REQUEST_BOUND_S, Tally, assert_records_match, body_for, load
from tests.chaos.conftest import ChaosTable
from tests.controller.harness import free_port
from tests.router.cluster import ADMIN_TOKEN, REPO_ROOT, emulator_process, live_cluster

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]

REMOTE_POLICY = """
pd_disaggregation_policy:
  remote_prefill:
    min_input_tokens: 2048
    min_expected_output_tokens: 1
    require_decode_pool_pressure: false
    max_prefill_queue_wait_ms: 600000
  local_prefill: {max_input_tokens: 1024}
"""
ALWAYS_TRY_REMOTE = {"health": {"interval_s": 0.2, "timeout_s": 0.5, "transfer_min_samples": 100000}}
"""A health window that never declares the transfer path unhealthy: every long prompt is tried remotely."""


def _set_faults(host: EmulatorHost, faults: FaultConfig, seed: int) -> None:
    for k, inst in enumerate(host.instances):
        inst.faults = FaultInjector(faults, np.random.default_rng(seed + k))


def _failed_pulls(host: EmulatorHost) -> float:
    return float(sum(i.metrics.nixl_num_failed_transfers._value.get() for i in host.instances))


def _long(rid: str, k: int) -> dict[str, Any]:
    return body_for(rid, 2500, 8, stream=k % 4 != 0)  # a quarter non-streaming


@pytest.mark.parametrize("failure_frac", [0.0, 0.1, 0.25, 0.5])
async def test_transfer_failures_complete_through_fallback(
    tmp_path: Path, chaos_table: ChaosTable, failure_frac: float
) -> None:
    async with live_cluster(tmp_path, 1, 2, policy_yaml=REMOTE_POLICY, router_overrides=ALWAYS_TRY_REMOTE) as c:
        baseline = Tally()
        baseline.extend(await load(c.session, c.url, "base", 20, 6, _long))
        _set_faults(c.host, FaultConfig(transfer_failure_frac=failure_frac), seed=7)
        pulls_before = _failed_pulls(c.host)
        fault = Tally()
        fault.extend(await load(c.session, c.url, "fault", 40, 6, _long))
        c.router.log.flush()  # type: ignore[union-attr]
        records = [r for r in c.records() if r["request_id"].startswith("fault-")]
        missing = assert_records_match(fault.outcomes, records)
        fell_back = [r for r in records if r["fallback"] == "transfer_failed"]
        pulls = _failed_pulls(c.host) - pulls_before
        row = chaos_table.add(
            f"transfer failures {failure_frac:.0%}",
            f"KV pull fails with p={failure_frac} on every instance",
            fault,
            baseline,
            notes=f"{len(fell_back)} served by local fallback (record: fallback=transfer_failed)",
        )
        row.lost += missing
        assert fault.lost_details() == []
        assert missing == 0
        assert fault.count("failed") == 0, [o.detail for o in fault.outcomes if o.kind == "failed"]
        assert len(records) == 40
        assert all(r["fallback"] in (None, "transfer_failed") for r in records)
        assert all(r["route"] == "local_prefill" for r in fell_back)
        assert all(r["route"] == "remote_prefill" for r in records if r["fallback"] is None)
        assert len(fell_back) == pulls  # one fallback per failed pull, no more, no less
        if failure_frac >= 0.25:
            assert fell_back
        if failure_frac == 0.0:
            assert not fell_back


@pytest.mark.parametrize("delay_s", [0.2, 0.6, 2.0])
async def test_transfer_delays_up_to_and_past_the_timeout(
    tmp_path: Path, chaos_table: ChaosTable, delay_s: float
) -> None:
    timeout_s = 1.0
    overrides = {**ALWAYS_TRY_REMOTE, "timeouts": {"remote_first_token_s": timeout_s}}
    async with live_cluster(tmp_path, 1, 2, policy_yaml=REMOTE_POLICY, router_overrides=overrides) as c:
        baseline = Tally()
        baseline.extend(await load(c.session, c.url, "base", 12, 6, _long))
        _set_faults(c.host, FaultConfig(transfer_delay_s=delay_s), seed=3)
        fault = Tally()
        fault.extend(await load(c.session, c.url, "fault", 24, 6, _long))
        c.router.log.flush()  # type: ignore[union-attr]
        records = [r for r in c.records() if r["request_id"].startswith("fault-")]
        missing = assert_records_match(fault.outcomes, records)
        timed_out = [r for r in records if r["fallback"] == "transfer_timeout"]
        row = chaos_table.add(
            f"transfer delay {delay_s:g} s",
            f"+{delay_s:g} s per KV pull (remote first-token timeout {timeout_s:g} s)",
            fault,
            baseline,
            notes=f"{len(timed_out)} fell back on transfer_timeout",
        )
        row.lost += missing
        assert fault.lost_details() == []
        assert missing == 0
        assert fault.count("failed") == 0
        assert all(r["fallback"] in (None, "transfer_timeout") for r in records)
        if delay_s >= timeout_s:
            # past the timeout every stream is served locally; a non-streaming request has no first token to
            # time, so it waits for its pull under the whole-request timeout (timeouts.first_token_s)
            assert {r["request_id"] for r in timed_out} == {r["request_id"] for r in records if r["stream"]}
            # the timeout bounds the wait: TTFT ≈ timeout + a local prefill, never the full delay
            assert max(r["ttft_s"] for r in records if r["stream"]) < delay_s + 1.0
        if delay_s <= 0.25 * timeout_s:
            assert not timed_out


async def test_prefill_instance_killed_mid_prefill(tmp_path: Path, chaos_table: ChaosTable) -> None:
    # a slowed prefill instance (2500-token prefills take seconds), killed while it holds requests
    args = ["--prefill", "1", "--decode", "0", "--id-offset", "9", "--slow-factor", "40"]
    async with emulator_process(args) as (proc, urls):
        extra = [{"id": "p9", "url": urls["p9"], "role": "prefill"}]
        async with live_cluster(tmp_path, 0, 2, policy_yaml=REMOTE_POLICY, extra_instances=extra) as c:
            baseline = Tally()
            baseline.extend(await load(c.session, c.url, "base", 8, 4, lambda rid, k: body_for(rid, 500, 8)))
            p9 = c.router.registry.instances["p9"]
            task = asyncio.create_task(load(c.session, c.url, "fault", 8, 8, _long))
            for _ in range(200):
                if p9.in_flight >= 4:
                    break
                await asyncio.sleep(0.02)
            assert p9.in_flight >= 4, "the prefill instance never held the requests"
            os.kill(proc.pid, signal.SIGKILL)
            fault = Tally()
            fault.extend(await asyncio.wait_for(task, REQUEST_BOUND_S))
            after = await load(c.session, c.url, "after", 8, 4, _long)
            fault.extend(after)
            c.router.log.flush()  # type: ignore[union-attr]
            records = c.records()
            missing = assert_records_match(fault.outcomes, records)
            by_id = {r["request_id"]: r for r in records}
            row = chaos_table.add(
                "prefill instance killed mid-prefill",
                "SIGKILL of the only prefill instance with 8 prefills in flight; 8 more requests after",
                fault,
                None,
                notes="in flight: fallback=prefill_error, served locally; after: local at once",
            )
            row.lost += missing
            assert fault.lost_details() == []
            assert missing == 0
            assert fault.count("failed") == 0
            killed = [by_id[f"fault-{k}"] for k in range(8)]
            assert all(r["route"] == "local_prefill" and "prefill_error" in (r["fallback"] or "") for r in killed)
            # afterwards the router knows: local at once (no prefill instance, or the transfer path is unhealthy)
            later = [by_id[f"after-{k}"] for k in range(4, 8)]
            assert all(r["route"] == "local_prefill" and r["fallback"] is None for r in later)
            assert {r["reason"] for r in later} <= {"no_prefill_instance", "kv_transfer_unhealthy"}


async def test_decode_instance_killed_mid_stream(tmp_path: Path, chaos_table: ChaosTable) -> None:
    async with emulator_process(["--prefill", "0", "--decode", "1", "--id-offset", "9"]) as (proc, urls):
        extra = [{"id": "d9", "url": urls["d9"], "role": "decode"}]
        async with live_cluster(tmp_path, 0, 1, extra_instances=extra) as c:

            def long_stream(rid: str, k: int) -> dict[str, Any]:
                return body_for(rid, 200, 150)

            baseline = Tally()
            baseline.extend(await load(c.session, c.url, "base", 12, 12, long_stream))
            d9 = c.router.registry.instances["d9"]
            task = asyncio.create_task(load(c.session, c.url, "fault", 16, 16, long_stream))
            for _ in range(200):
                if d9.in_flight >= 4:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # streams are under way
            on_d9 = d9.in_flight
            os.kill(proc.pid, signal.SIGKILL)
            fault = Tally()
            fault.extend(await asyncio.wait_for(task, REQUEST_BOUND_S))
            fault.extend(await load(c.session, c.url, "after", 8, 4, long_stream))
            c.router.log.flush()  # type: ignore[union-attr]
            records = c.records()
            missing = assert_records_match(fault.outcomes, records)
            by_id = {r["request_id"]: r for r in records}
            row = chaos_table.add(
                "decode instance killed mid-stream",
                f"SIGKILL of one of two decode instances with {on_d9} of 16 streams on it; 8 more requests after",
                fault,
                baseline,
                notes="only its streams failed (error event + [DONE]); p99 counts ok streams",
            )
            row.lost += missing
            assert fault.lost_details() == []
            assert missing == 0
            failed = [o for o in fault.outcomes if o.kind == "failed"]
            assert on_d9 >= 1
            assert failed, "no stream was on the killed instance"
            for o in failed:  # only the streams of the killed instance failed
                assert by_id[o.request_id]["decode_instance"] == "d9", o
                assert "stream error" in o.detail
            assert max(o.latency_s for o in fault.outcomes) < 20.0  # no hang
            assert all(by_id[f"after-{k}"]["decode_instance"] == "d0" for k in range(8))


async def _spawn_router(config_path: Path, port: int) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pdctl", "router", "--config", str(config_path), "--log-level", "WARNING",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=str(REPO_ROOT),
    )  # fmt: skip
    assert proc.stdout is not None
    async with asyncio.timeout(30):
        while True:
            line = (await proc.stdout.readline()).decode()
            if not line:
                raise RuntimeError("router exited before it was ready")
            if f"router listening on http://127.0.0.1:{port}" in line:
                return proc


async def test_router_killed_and_restarted(tmp_path: Path, chaos_table: ChaosTable) -> None:
    host = EmulatorHost(ClusterConfig(), [InstanceSpec("p0"), InstanceSpec("d0"), InstanceSpec("d1")])
    await host.start()
    port = free_port()
    log = tmp_path / "requests.jsonl"
    config = tmp_path / "router.yaml"
    (tmp_path / "policy.yaml").write_text(REMOTE_POLICY)
    config.write_text(
        yaml.safe_dump(
            {
                "listen": {"host": "127.0.0.1", "port": port},
                "instances": [
                    {"id": i, "url": u, "role": "prefill" if i.startswith("p") else "decode"}
                    for i, u in host.urls.items()
                ],
                "policy_file": str(tmp_path / "policy.yaml"),
                "admin_token": ADMIN_TOKEN,
                "request_log": str(log),
                "health": {"interval_s": 0.2, "timeout_s": 0.5},
            }
        )
    )
    url = f"http://127.0.0.1:{port}"
    procs: list[asyncio.subprocess.Process] = []
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_BOUND_S))
    try:
        procs.append(await _spawn_router(config, port))

        def mixed(rid: str, k: int) -> dict[str, Any]:
            return body_for(rid, 2500 if k % 2 else 300, 200)

        baseline = Tally()
        baseline.extend(await load(session, url, "base", 12, 12, mixed))
        task = asyncio.create_task(load(session, url, "inflight", 12, 12, mixed))
        await asyncio.sleep(1.0)  # streams under way
        os.kill(procs[0].pid, signal.SIGKILL)
        await procs[0].wait()
        inflight = await asyncio.wait_for(task, REQUEST_BOUND_S)
        procs.append(await _spawn_router(config, port))
        after = await load(session, url, "after", 12, 12, mixed)
        fault = Tally()
        fault.extend(inflight)
        fault.extend(after)
        assert procs[1].returncode is None
        procs[1].send_signal(signal.SIGTERM)  # graceful stop flushes the new router's request log
        await asyncio.wait_for(procs[1].wait(), 30)

        records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        missing = assert_records_match(after, records)
        row = chaos_table.add(
            "router killed and restarted",
            "SIGKILL of the router with 12 streams in flight, restart on the same port, 12 new requests",
            fault,
            baseline,
            notes=f"in flight: {sum(o.kind == 'failed' for o in inflight)} failed cleanly (connection closed), "
            f"{sum(o.kind == 'ok' for o in inflight)} finished before the kill; new: all ok",
        )
        row.lost += missing
        assert fault.lost_details() == []
        assert missing == 0
        assert all(o.kind == "ok" for o in after), [o.detail for o in after if o.kind != "ok"]
        assert any(o.kind == "failed" for o in inflight)
        assert all(o.latency_s < 10 for o in inflight)  # told at once, not after a timeout
    finally:
        await session.close()
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await host.stop()


async def test_role_flip_under_load_fails_nothing(tmp_path: Path, chaos_table: ChaosTable) -> None:
    async with live_cluster(tmp_path, 1, 2, policy_yaml=REMOTE_POLICY) as c:

        def mixed(rid: str, k: int) -> dict[str, Any]:
            return body_for(rid, 2500 if k % 3 == 0 else 400, 40, stream=k % 5 != 0)

        baseline = Tally()
        baseline.extend(await load(c.session, c.url, "base", 30, 8, mixed))
        task = asyncio.create_task(load(c.session, c.url, "fault", 80, 8, mixed, gap_s=0.02))
        flips = 0
        for roles in ({"d1": "prefill"}, {"d1": "decode"}, {"p0": "decode"}, {"p0": "prefill"}):
            await asyncio.sleep(0.6)
            async with c.session.put(c.url + "/admin/roles", json={"roles": roles}, headers=c.admin_headers()) as resp:
                assert resp.status == 200, await resp.text()
                flips += 1
        fault = Tally()
        fault.extend(await asyncio.wait_for(task, 4 * REQUEST_BOUND_S))
        c.router.log.flush()  # type: ignore[union-attr]
        missing = assert_records_match(fault.outcomes, c.records())
        row = chaos_table.add(
            "role flip under load",
            f"{flips} role changes through the admin API (d1 decode→prefill→decode, p0 prefill→decode→prefill)",
            fault,
            baseline,
            notes="each flip drains the instance first",
        )
        row.lost += missing
        assert fault.lost_details() == []
        assert missing == 0
        assert fault.count("failed") == 0, [o.detail for o in fault.outcomes if o.kind == "failed"]
