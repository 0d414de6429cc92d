"""Honest request outcomes: a stream that delivered ``[DONE]`` is a success whatever the client does next.

Against the emulator (instances that keep a finished stream open a while after ``[DONE]``, as a slow close
behind a proxy does), clients that hang up the moment they read ``[DONE]`` are counted ``outcome="ok"`` with
their output tokens; clients that hang up before it are ``499``; every outcome counter matches what the
clients saw.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from livestack.emulator import FaultConfig
from livestack.emulator.tokenizer import prompt_text
from tests.router.cluster import LiveCluster, emulator_process, live_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

MAX_TOKENS = 8


async def _until_done_then_hang_up(c: LiveCluster, k: int, *, before_done: bool) -> bool:
    """Read the stream until ``[DONE]`` (or its first event) and close at once; True if ``[DONE]`` was seen."""
    body = {"prompt": prompt_text(64, salt=f"s{k}"), "max_tokens": MAX_TOKENS, "stream": True}
    seen = b""
    async with c.session.post(c.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        while b"data: [DONE]" not in seen:
            chunk = await resp.content.readany()
            if not chunk:
                break
            seen += chunk
            if before_done:
                break
        resp.close()  # the client goes away right now
    return b"data: [DONE]" in seen


def _counter(c: LiveCluster, outcome: str) -> float:
    value = c.router.metrics_registry.get_sample_value(
        "pdctl_router_requests_total", {"tenant": "default", "route": "local_prefill", "outcome": outcome}
    )
    return value or 0.0


async def test_client_leaving_right_after_done_is_a_success(tmp_path: Path) -> None:
    async with live_cluster(tmp_path, 1, 1, faults=FaultConfig(linger_after_done_s=0.5)) as c:
        complete = await asyncio.gather(*(_until_done_then_hang_up(c, k, before_done=False) for k in range(12)))
        early = await asyncio.gather(*(_until_done_then_hang_up(c, 100 + k, before_done=True) for k in range(4)))
        assert all(complete)
        delivered = sum(complete) + sum(early)  # an early hang-up that still saw [DONE] counts as delivered
        records: list[dict[str, object]] = []
        for _ in range(100):
            records = c.records()
            if len(records) == 16:
                break
            await asyncio.sleep(0.05)
        assert len(records) == 16
        ok = [r for r in records if r["status"] == 200 and r["error"] is None]
        assert len(ok) == delivered, [(r["status"], r["error"]) for r in records]
        assert all(r["output_tokens"] == MAX_TOKENS for r in ok), "a delivered stream keeps its output tokens"
        assert all(r["status"] == 499 for r in records if r not in ok)
        assert _counter(c, "ok") == delivered
        assert _counter(c, "error") == len(records) - delivered
        assert c.router.registry.instances["d0"].in_flight == 0


async def test_a_finished_stream_is_closed_without_waiting_for_the_instance(tmp_path: Path) -> None:
    """The router ends the client's response at ``[DONE]``; the instance's slow close is not the client's wait."""
    async with live_cluster(tmp_path, 1, 1, faults=FaultConfig(linger_after_done_s=5.0)) as c:
        body = {"prompt": prompt_text(64, salt="whole"), "max_tokens": MAX_TOKENS, "stream": True}
        timeout = aiohttp.ClientTimeout(total=3.0)  # well under the 5 s linger
        async with c.session.post(c.url + "/v1/completions", json=body, timeout=timeout) as resp:
            raw = await resp.read()
        assert raw.rstrip().endswith(b"data: [DONE]")


async def test_a_request_refused_for_want_of_a_decode_instance_is_counted(tmp_path: Path) -> None:
    """The 503 answered when no decode instance takes requests counts as an error, like any failed request."""
    async with emulator_process(["--prefill", "0", "--decode", "1", "--id-offset", "9"]) as (proc, urls):
        extra = [{"id": "d9", "url": urls["d9"], "role": "decode"}]
        async with live_cluster(tmp_path, 1, 0, extra_instances=extra) as c:
            proc.kill()
            await proc.wait()
            d9 = c.router.registry.instances["d9"]
            for _ in range(100):
                if not d9.healthy:
                    break
                await asyncio.sleep(0.05)
            body = {"prompt": prompt_text(64, salt="refused"), "max_tokens": MAX_TOKENS}
            async with c.session.post(c.url + "/v1/completions", json=body, headers={"X-Tenant-Id": "anyone"}) as resp:
                assert resp.status == 503
            sample = c.router.metrics_registry.get_sample_value(
                "pdctl_router_requests_total", {"tenant": "default", "route": "none", "outcome": "error"}
            )
            assert sample == 1.0
