"""Chaos on the data plane: KV transfer failures and delays, killed prefill/decode instances, a killed router,
role flips under load, and a composite (a transfer-failure storm while a decode instance dies during a role
flip). Emulated instances and the router run on loopback; killed ones in their own process. Each case's fault
phase is :data:`NUM_REQUESTS` requests at a concurrency of :data:`CONCURRENCY`, on instances time-scaled by
:data:`TIME_SCALE` unless the case says otherwise."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from env.scenario import ClusterConfig
from livestack.emulator import EmulatorHost, FaultConfig, InstanceSpec
from livestack.emulator.faults import FaultInjector
from tests.chaos.common import (
    CONCURRENCY,
    NUM_REQUESTS,
    REQUEST_BOUND_S,
    TIME_SCALE,
    LoadRun,
    RouterCounts,
    Tally,
    assert_records_match,
    body_for,
    client_session,
    load,
    router_counts,
    settled_counts,
)
from tests.chaos.conftest import ChaosTable
from tests.controller.harness import free_port, wait_until
from tests.router.cluster import ADMIN_TOKEN, REPO_ROOT, LiveCluster, emulator_process, live_cluster

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

LONG_TOKENS = 600
SHORT_TOKENS = 200
BASELINE_REQUESTS = 200
"""Requests of the fault-free baseline each case measures first (same mix and concurrency as its fault phase)."""
REMOTE_POLICY = f"""
pd_disaggregation_policy:
  remote_prefill:
    min_input_tokens: {LONG_TOKENS - 100}
    min_expected_output_tokens: 1
    require_decode_pool_pressure: false
    max_prefill_queue_wait_ms: 600000
  local_prefill: {{max_input_tokens: {SHORT_TOKENS + 56}}}
"""
"""Long prompts (600 tokens) go remote, short ones (200) local."""
HEALTH = {"interval_s": 0.2, "timeout_s": 2.0}
"""Health checks every 0.2 s; a 2-s probe timeout: the instances share this process's event loop with 100
clients and the router on a shared 2-core machine, where a 0.5-s probe timed out under load and marked every
decode instance down at once (a killed instance is still seen at once: its connections are refused)."""
ALWAYS_TRY_REMOTE = {"health": {**HEALTH, "transfer_min_samples": 100000}}
"""A health window that never declares the transfer path unhealthy: every long prompt is tried remotely."""
CHAOS_ROUTER = {"health": HEALTH}


def _median_s(tally: Tally) -> float:
    latencies = sorted(o.latency_s for o in tally.outcomes if o.kind == "ok")
    return latencies[len(latencies) // 2]


def _set_faults(host: EmulatorHost, faults: FaultConfig, seed: int) -> None:
    for k, inst in enumerate(host.instances):
        inst.faults = FaultInjector(faults, np.random.default_rng(seed + k))


def _failed_pulls(host: EmulatorHost) -> float:
    return float(sum(i.metrics.nixl_num_failed_transfers._value.get() for i in host.instances))


def _long(rid: str, k: int) -> dict[str, Any]:
    return body_for(rid, LONG_TOKENS, 8, stream=k % 4 != 0)  # a quarter non-streaming


def _mixed(max_tokens: int, spread: bool = False) -> Any:
    """Long (remote) and short (local) prompts, a fifth non-streaming; ``spread``: outputs of 0.5-1.5x
    ``max_tokens``, so that requests are at all stages at any moment."""

    def body(rid: str, k: int) -> dict[str, Any]:
        tokens = max_tokens // 2 + k * 37 % (max_tokens + 1) if spread else max_tokens
        return body_for(rid, LONG_TOKENS if k % 3 == 0 else SHORT_TOKENS, tokens, stream=k % 5 != 0)

    return body


async def _baseline(c: LiveCluster, make_body: Any) -> Tally:
    async with client_session() as session:
        tally = Tally()
        tally.add(await load(session, c.url, "base", BASELINE_REQUESTS, CONCURRENCY, make_body))
        return tally


async def _fault_phase(
    c: LiveCluster, make_body: Any, prefix: str = "fault", run: LoadRun | None = None
) -> tuple[Tally, RouterCounts]:
    """The fault phase's load, and the router's counters over it (settled: every request recorded)."""
    async with client_session() as session:
        before = await router_counts(session, c.url)
        tally = Tally()
        tally.add(await load(session, c.url, prefix, NUM_REQUESTS, CONCURRENCY, make_body, run=run))
        counts = await settled_counts(session, c.url, before, tally.sent)
    return tally, counts


def _check(tally: Tally, counts: RouterCounts, missing: int) -> None:
    """No request lost; the router counted what the client saw."""
    assert tally.lost_details() == []
    assert missing == 0
    assert tally.sent >= NUM_REQUESTS
    assert tally.concurrency >= CONCURRENCY
    assert (counts.ok, counts.error) == (tally.count("ok"), tally.count("failed")), (counts, tally.failures())


@pytest.mark.parametrize("failure_frac", [0.0, 0.1, 0.25, 0.5])
async def test_transfer_failures_complete_through_fallback(
    tmp_path: Path, chaos_table: ChaosTable, failure_frac: float
) -> None:
    async with live_cluster(
        tmp_path, 1, 2, policy_yaml=REMOTE_POLICY, router_overrides=ALWAYS_TRY_REMOTE, time_scale=TIME_SCALE
    ) as c:
        baseline = await _baseline(c, _long)
        _set_faults(c.host, FaultConfig(transfer_failure_frac=failure_frac), seed=7)
        pulls_before = _failed_pulls(c.host)
        fault, counts = await _fault_phase(c, _long)
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
            router=counts,
        )
        row.lost += missing
        _check(fault, counts, missing)
        assert fault.count("failed") == 0, [o.detail for o in fault.outcomes if o.kind == "failed"]
        assert len(records) == NUM_REQUESTS
        assert all(r["fallback"] in (None, "transfer_failed") for r in records)
        assert all(r["route"] == "local_prefill" for r in fell_back)
        assert all(r["route"] == "remote_prefill" for r in records if r["fallback"] is None)
        assert len(fell_back) == pulls  # one fallback per failed pull, no more, no less
        if failure_frac >= 0.25:
            assert len(fell_back) > 0.5 * failure_frac * NUM_REQUESTS
        if failure_frac == 0.0:
            assert not fell_back


DELAY_TIME_SCALE = 0.5
"""The delay cases compare a pull's duration with the router's timeout: slower scaling keeps event-loop lag
(wall time, not scaled) small next to the scaled timeout."""


@pytest.mark.parametrize("delay_s", [0.2, 0.6, 2.0])
async def test_transfer_delays_up_to_and_past_the_timeout(
    tmp_path: Path, chaos_table: ChaosTable, delay_s: float
) -> None:
    timeout_s = 1.0  # emulated seconds, like the delay
    wall_timeout_s = timeout_s * DELAY_TIME_SCALE
    overrides = {**ALWAYS_TRY_REMOTE, "timeouts": {"remote_first_token_s": wall_timeout_s}}
    async with live_cluster(
        tmp_path, 1, 2, policy_yaml=REMOTE_POLICY, router_overrides=overrides, time_scale=DELAY_TIME_SCALE
    ) as c:
        baseline = await _baseline(c, _long)
        _set_faults(c.host, FaultConfig(transfer_delay_s=delay_s), seed=3)
        fault, counts = await _fault_phase(c, _long)
        c.router.log.flush()  # type: ignore[union-attr]
        records = [r for r in c.records() if r["request_id"].startswith("fault-")]
        missing = assert_records_match(fault.outcomes, records)
        timed_out = [r for r in records if r["fallback"] == "transfer_timeout"]
        row = chaos_table.add(
            f"transfer delay {delay_s:g} s",
            f"+{delay_s:g} s per KV pull (remote first-token timeout {timeout_s:g} s; time scale {DELAY_TIME_SCALE})",
            fault,
            baseline,
            notes=f"{len(timed_out)} of {sum(r['stream'] for r in records)} streams fell back on transfer_timeout "
            "(non-streaming requests wait for their pull)",
            router=counts,
        )
        row.lost += missing
        _check(fault, counts, missing)
        assert fault.count("failed") == 0
        assert all(r["fallback"] in (None, "transfer_timeout") for r in records)
        streams = [r for r in records if r["stream"]]
        if delay_s >= timeout_s:
            # past the timeout the streams are served locally; a non-streaming request has no first token to
            # time, so it waits for its pull under the whole-request timeout (timeouts.first_token_s). The timeout
            # runs from the response headers: when this process's event loop (instances, router and clients
            # share it) stalls for longer than delay - timeout between the instance sending its headers and the
            # router reading them, the pull ends first and the stream is served remotely, so not quite all
            assert {r["request_id"] for r in timed_out} <= {r["request_id"] for r in streams}
            assert len(timed_out) >= 0.95 * len(streams), [r for r in streams if r not in timed_out][:3]
            # the timeout bounds the wait: the median stream starts before the pull would have ended
            ttft = sorted(r["ttft_s"] for r in streams)
            assert ttft[len(ttft) // 2] < delay_s * DELAY_TIME_SCALE
        if delay_s <= 0.25 * timeout_s:
            assert len(timed_out) <= 0.02 * len(streams)  # only a stream delayed by load, never the pull


async def test_prefill_instance_killed_mid_prefill(tmp_path: Path, chaos_table: ChaosTable) -> None:
    # a slowed prefill instance (600-token prefills take seconds), killed while it holds requests
    args = ["--prefill", "1", "--decode", "0", "--id-offset", "9", "--slow-factor", "40", "--time-scale", "0.1"]
    async with emulator_process(args) as (proc, urls):
        extra = [{"id": "p9", "url": urls["p9"], "role": "prefill"}]
        async with live_cluster(
            tmp_path, 0, 2, policy_yaml=REMOTE_POLICY, extra_instances=extra, router_overrides=CHAOS_ROUTER,
            time_scale=TIME_SCALE,
        ) as c:  # fmt: skip
            baseline = await _baseline(c, lambda rid, k: body_for(rid, SHORT_TOKENS, 8))
            p9 = c.router.registry.instances["p9"]
            run = LoadRun()
            task = asyncio.create_task(_fault_phase(c, _long, run=run))
            await wait_until(lambda: p9.in_flight >= 20, 20, 0.01, "prefills in flight on p9")
            held = p9.in_flight
            os.kill(proc.pid, signal.SIGKILL)
            fault, counts = await asyncio.wait_for(task, 10 * REQUEST_BOUND_S)
            c.router.log.flush()  # type: ignore[union-attr]
            records = [r for r in c.records() if r["request_id"].startswith("fault-")]
            missing = assert_records_match(fault.outcomes, records)
            errored = [r for r in records if "prefill_error" in (r["fallback"] or "")]
            row = chaos_table.add(
                "prefill instance killed mid-prefill",
                f"SIGKILL of the only prefill instance with {held} prefills in flight",
                fault,
                baseline,
                notes=f"{len(errored)} in flight: fallback=prefill_error, served locally; the rest local at once",
                router=counts,
            )
            row.lost += missing
            _check(fault, counts, missing)
            assert fault.count("failed") == 0
            assert len(errored) >= held
            assert all(r["route"] == "local_prefill" for r in errored)
            # afterwards the router knows: local at once (no prefill instance, or the transfer path is unhealthy)
            later = sorted(records, key=lambda r: r["arrival_ts"])[-CONCURRENCY:]
            assert all(r["route"] == "local_prefill" and r["fallback"] is None for r in later)
            assert {r["reason"] for r in later} <= {"no_prefill_instance", "kv_transfer_unhealthy"}


async def test_decode_instance_killed_mid_stream(tmp_path: Path, chaos_table: ChaosTable) -> None:
    args = ["--prefill", "0", "--decode", "1", "--id-offset", "9", "--time-scale", str(TIME_SCALE)]
    async with emulator_process(args) as (proc, urls):
        extra = [{"id": "d9", "url": urls["d9"], "role": "decode"}]
        async with live_cluster(
            tmp_path, 0, 1, extra_instances=extra, router_overrides=CHAOS_ROUTER, time_scale=TIME_SCALE
        ) as c:

            def long_stream(rid: str, k: int) -> dict[str, Any]:
                # 100-200 tokens (spread, so that the requests on d9 are at all stages when it dies); a quarter
                # non-streaming
                return body_for(rid, SHORT_TOKENS, 100 + k * 37 % 101, stream=k % 4 != 0)

            baseline = await _baseline(c, long_stream)
            d9 = c.router.registry.instances["d9"]
            run = LoadRun()
            task = asyncio.create_task(_fault_phase(c, long_stream, run=run))
            await wait_until(
                lambda: len(run.outcomes) >= NUM_REQUESTS // 4 and d9.in_flight >= CONCURRENCY // 4,
                60, 0.01, "a quarter of the load done and streams on d9",
            )  # fmt: skip
            await asyncio.sleep(0.5 * _median_s(baseline))  # well into the streams on d9, far from their ends
            on_d9 = d9.in_flight
            os.kill(proc.pid, signal.SIGKILL)
            fault, counts = await asyncio.wait_for(task, 10 * REQUEST_BOUND_S)
            c.router.log.flush()  # type: ignore[union-attr]
            records = [r for r in c.records() if r["request_id"].startswith("fault-")]
            missing = assert_records_match(fault.outcomes, records)
            migrated = [r for r in records if "migration" in (r["fallback"] or "")]
            retried = [r for r in records if "decode_retry" in (r["fallback"] or "")]
            row = chaos_table.add(
                "decode instance killed mid-stream",
                f"SIGKILL of one of two decode instances with {on_d9} requests on it (100-200-token outputs)",
                fault,
                baseline,
                notes=f"{len(migrated)} streams migrated to d0 mid-stream (text checked token for token); "
                f"{len(retried)} retried whole on d0 before their first byte (non-streaming, or sent to d9 before "
                "the router saw it die); migration_limit 3",
                router=counts,
            )
            row.lost += missing
            _check(fault, counts, missing)
            assert fault.count("failed") == 0, [o.detail for o in fault.outcomes if o.kind == "failed"][:5]
            assert migrated, "no stream was cut by the kill"
            assert counts.migrations == len(migrated)
            assert all(r["decode_instance"] == "d0" and r["stream"] for r in migrated)
            later = sorted(records, key=lambda r: r["arrival_ts"])[-CONCURRENCY:]
            assert all(r["decode_instance"] == "d0" for r in later)


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
    time_scale = 0.25  # in-flight streams (400 tokens) last long enough to be cut
    host = EmulatorHost(
        ClusterConfig(), [InstanceSpec("p0"), InstanceSpec("d0"), InstanceSpec("d1")], time_scale=time_scale
    )
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
                "health": HEALTH,
            }
        )
    )
    url = f"http://127.0.0.1:{port}"
    procs: list[asyncio.subprocess.Process] = []
    session = client_session()
    try:
        procs.append(await _spawn_router(config, port))

        def long_streams(rid: str, k: int) -> dict[str, Any]:
            return body_for(rid, LONG_TOKENS if k % 2 else SHORT_TOKENS, 400)

        baseline = Tally()
        baseline.add(await load(session, url, "base", BASELINE_REQUESTS, CONCURRENCY, _mixed(16)))
        run = LoadRun()
        task = asyncio.create_task(load(session, url, "inflight", CONCURRENCY, CONCURRENCY, long_streams, run=run))
        await wait_until(lambda: run.peak_in_flight >= CONCURRENCY, 20, 0.01, "all streams in flight")
        await asyncio.sleep(0.5)  # streams under way
        in_flight_at_kill = run.in_flight
        os.kill(procs[0].pid, signal.SIGKILL)
        await procs[0].wait()
        inflight = await asyncio.wait_for(task, REQUEST_BOUND_S)
        procs.append(await _spawn_router(config, port))
        after = await load(session, url, "after", NUM_REQUESTS - CONCURRENCY, CONCURRENCY, _mixed(16))
        counts = await settled_counts(session, url, RouterCounts(0, 0, 0, {}), len(after.outcomes))
        fault = Tally()
        fault.add(inflight)
        fault.add(after)
        assert procs[1].returncode is None
        procs[1].send_signal(signal.SIGTERM)  # graceful stop flushes the new router's request log
        await asyncio.wait_for(procs[1].wait(), 30)

        records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        missing = assert_records_match(after.outcomes, records)
        killed = [o for o in inflight.outcomes if o.kind == "failed"]
        row = chaos_table.add(
            "router killed and restarted",
            f"SIGKILL of the router with {in_flight_at_kill} streams in flight, restart on the same port, "
            f"{len(after.outcomes)} new requests (time scale {time_scale})",
            fault,
            baseline,
            notes=f"in flight: {len(killed)} failed cleanly (connection closed), "
            f"{sum(o.kind == 'ok' for o in inflight.outcomes)} finished before the kill; new: all ok; router "
            "ok/error: the restarted router's counters over the new requests",
            router=counts,
        )
        row.lost += missing
        assert fault.lost_details() == []
        assert missing == 0
        assert fault.sent >= NUM_REQUESTS
        assert fault.concurrency >= CONCURRENCY
        assert all(o.kind == "ok" for o in after.outcomes), [o.detail for o in after.outcomes if o.kind != "ok"][:5]
        assert (counts.ok, counts.error) == (len(after.outcomes), 0)
        assert len(killed) >= CONCURRENCY // 2
        assert all(o.latency_s < 10 for o in inflight.outcomes)  # told at once, not after a timeout
    finally:
        await session.close()
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await host.stop()


async def _flip_roles_at_progress(c: LiveCluster, run: LoadRun, flips: list[dict[str, str]]) -> int:
    """PUT each role change when the load has finished the next fifth of its requests; returns how many."""
    done = 0
    for k, roles in enumerate(flips, start=1):
        share = k * NUM_REQUESTS // (len(flips) + 1)
        await wait_until(lambda share=share: len(run.outcomes) >= share, 60, 0.01, f"{share} requests done")
        async with c.session.put(c.url + "/admin/roles", json={"roles": roles}, headers=c.admin_headers()) as resp:
            assert resp.status == 200, await resp.text()
            done += 1
    return done


async def test_role_flip_under_load_fails_nothing(tmp_path: Path, chaos_table: ChaosTable) -> None:
    async with live_cluster(
        tmp_path, 1, 2, policy_yaml=REMOTE_POLICY, router_overrides=CHAOS_ROUTER, time_scale=TIME_SCALE
    ) as c:
        baseline = await _baseline(c, _mixed(40))
        run = LoadRun()
        task = asyncio.create_task(_fault_phase(c, _mixed(40), run=run))
        changes = [{"d1": "prefill"}, {"d1": "decode"}, {"p0": "decode"}, {"p0": "prefill"}]
        flips = await _flip_roles_at_progress(c, run, changes)
        fault, counts = await asyncio.wait_for(task, 10 * REQUEST_BOUND_S)
        c.router.log.flush()  # type: ignore[union-attr]
        missing = assert_records_match(fault.outcomes, c.records())
        row = chaos_table.add(
            "role flip under load",
            f"{flips} role changes through the admin API (d1 decode→prefill→decode, p0 prefill→decode→prefill)",
            fault,
            baseline,
            notes="each flip drains the instance first",
            router=counts,
        )
        row.lost += missing
        _check(fault, counts, missing)
        assert fault.count("failed") == 0, [o.detail for o in fault.outcomes if o.kind == "failed"]


async def test_composite_transfer_storm_and_decode_killed_during_role_flip(
    tmp_path: Path, chaos_table: ChaosTable
) -> None:
    """Every KV pull fails with p=0.5 while d1 is flipped to prefill and, during its drain, d9 is killed."""
    args = ["--prefill", "0", "--decode", "1", "--id-offset", "9", "--time-scale", str(TIME_SCALE)]
    args += ["--transfer-failure-frac", "0.5", "--seed", "9"]
    async with emulator_process(args) as (proc, urls):
        extra = [{"id": "d9", "url": urls["d9"], "role": "decode"}]
        async with live_cluster(
            tmp_path, 1, 2, policy_yaml=REMOTE_POLICY, extra_instances=extra, router_overrides=ALWAYS_TRY_REMOTE,
            time_scale=TIME_SCALE,
        ) as c:  # fmt: skip
            baseline = await _baseline(c, _mixed(100, spread=True))
            _set_faults(c.host, FaultConfig(transfer_failure_frac=0.5), seed=11)
            d1, d9 = c.router.registry.instances["d1"], c.router.registry.instances["d9"]
            run = LoadRun()
            task = asyncio.create_task(_fault_phase(c, _mixed(100, spread=True), run=run))
            await wait_until(
                lambda: len(run.outcomes) >= NUM_REQUESTS // 4 and d1.in_flight >= 5 and d9.in_flight >= 5,
                60, 0.01, "a quarter of the load done, streams on d1 and d9",
            )  # fmt: skip
            await asyncio.sleep(0.5 * _median_s(baseline))  # well into the streams on d9
            async with c.session.put(
                c.url + "/admin/roles", json={"roles": {"d1": "prefill"}}, headers=c.admin_headers()
            ) as resp:
                assert resp.status == 200
            draining = d1.draining
            on_d9 = d9.in_flight
            os.kill(proc.pid, signal.SIGKILL)  # while d1 drains
            await wait_until(lambda: len(run.outcomes) >= 3 * NUM_REQUESTS // 4, 60, 0.01, "3/4 of the load done")
            async with c.session.put(
                c.url + "/admin/roles", json={"roles": {"d1": "decode"}}, headers=c.admin_headers()
            ) as resp:
                assert resp.status == 200
            fault, counts = await asyncio.wait_for(task, 10 * REQUEST_BOUND_S)
            c.router.log.flush()  # type: ignore[union-attr]
            records = [r for r in c.records() if r["request_id"].startswith("fault-")]
            missing = assert_records_match(fault.outcomes, records)
            kinds = [k for r in records for k in (r["fallback"] or "").split(",") if k]
            row = chaos_table.add(
                "composite: transfer storm + decode killed during role flip",
                f"KV pulls fail with p=0.5 everywhere; d1 flipped decode→prefill and, while it drains, SIGKILL of "
                f"d9 ({on_d9} requests on it); d1 flipped back later",
                fault,
                baseline,
                notes=f"fallbacks: {kinds.count('transfer_failed')} transfer_failed, {kinds.count('decode_retry')} "
                f"decode_retry, {kinds.count('migration')} migration; d1 "
                f"{'still draining' if draining else 'already switched (idle at the flip)'} when d9 died",
                router=counts,
            )
            row.lost += missing
            _check(fault, counts, missing)
            assert fault.count("failed") == 0, [o.detail for o in fault.outcomes if o.kind == "failed"][:5]
            assert c.router.registry.instances["d1"].role == "decode"  # flipped and back
            assert kinds.count("transfer_failed") > 0.1 * NUM_REQUESTS
            assert counts.migrations >= 1
