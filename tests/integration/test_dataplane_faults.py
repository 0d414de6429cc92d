"""Faults on the live data plane: failed KV transfers fall back, a crashed decode instance fails only its streams."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from livestack.emulator import FaultConfig
from livestack.emulator.tokenizer import generated_text, prompt_text
from tests.router.cluster import emulator_process, live_cluster, stream_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

REMOTE_POLICY = """
pd_disaggregation_policy:
  remote_prefill:
    min_input_tokens: 2048
    min_expected_output_tokens: 1
    require_decode_pool_pressure: false
    max_prefill_queue_wait_ms: 600000
  local_prefill: {max_input_tokens: 1024}
"""


def _text(salt: str, n: int) -> str:
    """The emulator's first ``n`` output tokens after ``prompt_text(2500, salt=salt)``."""
    return generated_text(prompt_text(2500, salt=salt), n)


async def test_injected_transfer_failures_all_complete_by_fallback(tmp_path: Path) -> None:
    faults = FaultConfig(transfer_failure_frac=0.3)
    num_requests = 40
    # a wide health window: every request is attempted remotely, so every failure exercises the fallback
    overrides = {"health": {"interval_s": 0.2, "timeout_s": 0.5, "transfer_min_samples": 1000}}
    async with live_cluster(tmp_path, 1, 2, faults=faults, policy_yaml=REMOTE_POLICY, router_overrides=overrides) as c:

        async def one(k: int) -> None:
            rid = f"req-{k}"
            body = {"prompt": prompt_text(2500, salt=rid), "max_tokens": 8}
            if k % 4 == 0:  # some non-streaming requests
                async with c.session.post(c.url + "/v1/completions", json=body, headers={"X-Request-Id": rid}) as r:
                    assert r.status == 200
                    data = await r.json()
                assert data["choices"][0]["text"] == _text(rid, 8)
                return
            result = await stream_request(c.session, c.url, body, {"X-Request-Id": rid})
            assert result.status == 200
            assert result.errors == []
            assert result.done
            assert result.text == _text(rid, 8)

        await asyncio.wait_for(asyncio.gather(*(one(k) for k in range(num_requests))), timeout=60)
        records = c.records()
        assert len(records) == num_requests
        assert all(r["status"] == 200 and r["error"] is None for r in records)
        fell_back = [r for r in records if r["fallback"] == "transfer_failed"]
        remote = [r for r in records if r["route"] == "remote_prefill" and r["fallback"] is None]
        assert len(fell_back) + len(remote) == num_requests
        assert all(r["reason"] == "long_prompt" and r["route"] == "local_prefill" for r in fell_back)
        failed_pulls = sum(i.metrics.nixl_num_failed_transfers._value.get() for i in c.host.instances)
        assert len(fell_back) == failed_pulls
        assert 4 <= failed_pulls <= 22  # 30 % of 40, loosely
        async with c.session.get(c.url + "/metrics") as resp:
            text = await resp.text()
        assert f'pdctl_router_fallbacks_total{{kind="transfer_failed",tenant="default"}} {float(failed_pulls)}' in text


async def test_unhealthy_transfer_path_routes_local(tmp_path: Path) -> None:
    faults = FaultConfig(transfer_failure_frac=1.0)
    overrides = {"health": {"interval_s": 0.2, "transfer_min_samples": 3, "transfer_unhealthy_frac": 0.5}}
    async with live_cluster(tmp_path, 1, 1, faults=faults, policy_yaml=REMOTE_POLICY, router_overrides=overrides) as c:
        for k in range(6):
            result = await stream_request(c.session, c.url, {"prompt": prompt_text(2500, salt=str(k)), "max_tokens": 3})
            assert result.done
            assert result.errors == []
        reasons = [r["reason"] for r in c.records()]
        assert reasons[:3] == ["long_prompt"] * 3
        assert reasons[3:] == ["kv_transfer_unhealthy"] * 3
        async with c.session.get(c.url + "/admin/state", headers=c.admin_headers()) as resp:
            assert (await resp.json())["kv_transfer_healthy"] is False


async def test_prefill_instance_down_falls_back_local(tmp_path: Path) -> None:
    # the prefill instance passes its health check, then crashes on its first generation request
    async with emulator_process(["--prefill", "1", "--decode", "0", "--crash-after-requests", "1"]) as (proc, urls):
        extra = [{"id": "p9", "url": urls["p0"], "role": "prefill"}]
        # no active health checks during the test: the router learns of the dead instance from the failed call
        overrides = {"health": {"interval_s": 60}}
        async with live_cluster(
            tmp_path, 0, 1, policy_yaml=REMOTE_POLICY, extra_instances=extra, router_overrides=overrides
        ) as c:
            result = await stream_request(
                c.session, c.url, {"prompt": prompt_text(2500, salt="x"), "max_tokens": 3}, {"X-Request-Id": "x"}
            )
            assert result.done
            assert result.errors == []
            assert result.text == _text("x", 3)
            rec = c.records()[0]
            assert (rec["route"], rec["fallback"]) == ("local_prefill", "prefill_error")
            again = await stream_request(c.session, c.url, {"prompt": prompt_text(2500, salt="y"), "max_tokens": 3})
            assert again.done
            assert c.records()[1]["reason"] == "no_prefill_instance"
        assert await proc.wait() == 70  # the emulator's crash exit status


async def test_crashed_decode_instance_fails_only_its_in_flight_streams(tmp_path: Path) -> None:
    # migration off: a stream cut mid-way ends with an error event (tests/integration/test_stream_migration.py
    # covers migration on)
    async with emulator_process(["--prefill", "0", "--decode", "1", "--id-offset", "1"]) as (proc, urls):
        extra = [{"id": "d1", "url": urls["d1"], "role": "decode"}]
        overrides = {"health": {"interval_s": 0.2, "timeout_s": 0.5}, "migration_limit": 0}
        async with live_cluster(tmp_path, 0, 1, extra_instances=extra, router_overrides=overrides) as c:
            num_streams = 12
            first_bytes = asyncio.Event()
            started = 0

            async def one(k: int) -> tuple[str, bool, list[dict[str, object]]]:
                nonlocal started
                rid = f"s{k}"
                body = {"prompt": prompt_text(200, salt=rid), "max_tokens": 120, "stream": True}
                async with c.session.post(c.url + "/v1/completions", json=body, headers={"X-Request-Id": rid}) as resp:
                    assert resp.status == 200
                    raw = b""
                    async for chunk in resp.content.iter_any():
                        if not raw:
                            started += 1
                            if started == num_streams:
                                first_bytes.set()
                        raw += chunk
                from tests.router.cluster import parse_sse

                events, done = parse_sse(raw)
                assert done  # never a hang, never a stream without [DONE]
                return rid, done, [e["error"] for e in events if "error" in e]

            tasks = [asyncio.create_task(one(k)) for k in range(num_streams)]
            await asyncio.wait_for(first_bytes.wait(), 20)
            os.kill(proc.pid, signal.SIGKILL)
            results = await asyncio.wait_for(asyncio.gather(*tasks), 40)
            served_by = {r["request_id"]: r["decode_instance"] for r in c.records()}
            on_d1 = {rid for rid, inst in served_by.items() if inst == "d1"}
            assert on_d1, "the crashed instance served none of the streams"
            assert len(on_d1) < num_streams
            for rid, _, errors in results:
                if rid in on_d1:
                    assert len(errors) == 1
                    assert errors[0]["code"] == 502
                else:
                    assert errors == []
            # afterwards, requests go to the surviving instance
            for k in range(4):
                after = await stream_request(
                    c.session, c.url, {"prompt": prompt_text(100, salt=f"a{k}"), "max_tokens": 3}
                )
                assert after.done
                assert after.errors == []
            assert {r["decode_instance"] for r in c.records()[-4:]} == {"d0"}


async def test_slow_transfer_times_out_and_falls_back_local(tmp_path: Path) -> None:
    faults = FaultConfig(transfer_delay_s=5.0)
    overrides = {"timeouts": {"remote_first_token_s": 0.3}}
    async with live_cluster(tmp_path, 1, 1, faults=faults, policy_yaml=REMOTE_POLICY, router_overrides=overrides) as c:
        rid = "slow-pull"
        result = await asyncio.wait_for(
            stream_request(
                c.session, c.url, {"prompt": prompt_text(2500, salt=rid), "max_tokens": 5}, {"X-Request-Id": rid}
            ),
            timeout=10,
        )
        assert result.done
        assert result.errors == []
        assert result.text == _text(rid, 5)
        rec = c.records()[0]
        assert (rec["route"], rec["reason"], rec["fallback"]) == ("local_prefill", "long_prompt", "transfer_timeout")
        assert rec["prefill_instance"] == "p0"
        assert rec["ttft_s"] < 2.0


async def test_client_disconnect_aborts_the_decode_request(tmp_path: Path) -> None:
    async with live_cluster(tmp_path, 1, 1) as c:
        body = {"prompt": prompt_text(100, salt="gone"), "max_tokens": 500, "stream": True}
        async with c.session.post(c.url + "/v1/completions", json=body) as resp:
            assert (await resp.content.readany()).startswith(b"data: ")
            resp.close()  # the client goes away mid-stream
        decode = c.host.instances[1]
        for _ in range(50):
            if decode.metrics.request_success["abort"]._value.get() == 1:
                break
            await asyncio.sleep(0.05)
        assert decode.metrics.request_success["abort"]._value.get() == 1
        assert decode.metrics.request_success["length"]._value.get() == 0
        assert c.router.registry.instances["d0"].in_flight == 0
        await asyncio.sleep(0.1)
        assert c.records()[-1]["status"] == 499


async def test_retry_remote_prefill_tries_another_prefill_instance(tmp_path: Path) -> None:
    policy = REMOTE_POLICY + "fallback: {on_kv_transfer_timeout: retry_remote_prefill}\n"
    async with emulator_process(
        ["--prefill", "1", "--decode", "0", "--id-offset", "7", "--crash-after-requests", "1"]
    ) as (
        proc,
        urls,
    ):
        extra = [{"id": "p7", "url": urls["p7"], "role": "prefill"}]
        overrides = {"health": {"interval_s": 60}}
        async with live_cluster(
            tmp_path, 1, 1, policy_yaml=policy, extra_instances=extra, router_overrides=overrides
        ) as c:
            p0 = c.router.registry.instances["p0"]
            c.router.registry.acquire(p0, 1)  # p7 is now the least-loaded prefill instance: it is tried first
            rid = "retry"
            result = await stream_request(
                c.session, c.url, {"prompt": prompt_text(2500, salt=rid), "max_tokens": 4}, {"X-Request-Id": rid}
            )
            c.router.registry.release(p0, 1)
            assert result.done
            assert result.errors == []
            assert result.text == _text(rid, 4)
            rec = c.records()[0]
            assert (rec["route"], rec["prefill_instance"]) == ("remote_prefill", "p0")
            assert rec["fallback"] == "prefill_error,prefill_retry"
        assert await proc.wait() == 70


async def test_decode_failing_before_first_byte_is_retried_with_the_same_kv(tmp_path: Path) -> None:
    args = ["--prefill", "0", "--decode", "1", "--id-offset", "9", "--crash-after-requests", "1"]
    async with emulator_process(args) as (proc, urls):
        extra = [{"id": "d9", "url": urls["d9"], "role": "decode"}]
        overrides = {"health": {"interval_s": 60}}
        async with live_cluster(
            tmp_path, 1, 1, policy_yaml=REMOTE_POLICY, extra_instances=extra, router_overrides=overrides
        ) as c:
            d0 = c.router.registry.instances["d0"]
            c.router.registry.acquire(d0)  # d9 is now the least-loaded decode instance: it is tried first
            rid = "redo"
            result = await stream_request(
                c.session, c.url, {"prompt": prompt_text(2500, salt=rid), "max_tokens": 4}, {"X-Request-Id": rid}
            )
            c.router.registry.release(d0)
            assert result.done
            assert result.errors == []
            assert result.text == _text(rid, 4)
            rec = c.records()[0]
            assert (rec["route"], rec["fallback"], rec["decode_instance"]) == ("remote_prefill", "decode_retry", "d0")
            # d0 pulled the KV the prefill instance computed once
            assert c.host.instances[1].metrics.nixl_xfer_time._sum.get() > 0
            assert c.host.instances[0].metrics.prompt_tokens._value.get() == 2500
            assert not c.router.registry.instances["d9"].healthy
        assert await proc.wait() == 70
