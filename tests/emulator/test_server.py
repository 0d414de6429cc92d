"""One emulated instance over HTTP: endpoints, the NIXL handshake, injected faults, timing from the engine model."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from env.scenario import ClusterConfig
from livestack.emulator import EmulatorHost, FaultConfig, InstanceSpec
from livestack.emulator.engine import build_engine
from livestack.emulator.tokenizer import generated_text, prompt_text
from tests.router.cluster import parse_sse

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _host(faults: FaultConfig | None = None, time_scale: float = 1.0) -> EmulatorHost:
    host = EmulatorHost(
        ClusterConfig(), [InstanceSpec("p0"), InstanceSpec("d0", faults=faults or FaultConfig())], time_scale=time_scale
    )
    await host.start()
    return host


async def _metric(session: aiohttp.ClientSession, url: str, line_start: str) -> float:
    async with session.get(url + "/metrics") as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=")
        text = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


async def test_plain_endpoints(session: aiohttp.ClientSession) -> None:
    host = await _host()
    try:
        url = host.urls["d0"]
        async with session.get(url + "/health") as resp:
            assert resp.status == 200
            assert await resp.read() == b""
        async with session.get(url + "/v1/models") as resp:
            models = await resp.json()
        assert models["object"] == "list"
        assert models["data"][0]["owned_by"] == "vllm"
        assert models["data"][0]["max_model_len"] == 131072
        async with session.post(url + "/tokenize", json={"prompt": "abcdefgh", "return_token_strs": True}) as resp:
            tokens = await resp.json()
        assert tokens["count"] == 2
        assert tokens["token_strs"] == ["abcd", "efgh"]
        async with session.post(url + "/v1/completions", json={"prompt": "x", "model": "nope"}) as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["type"] == "NotFoundError"
    finally:
        await host.stop()


async def test_nixl_handshake_and_decode_skips_prefill(session: aiohttp.ClientSession) -> None:
    host = await _host()
    try:
        p, d = host.urls["p0"], host.urls["d0"]
        prompt = prompt_text(3000, salt="pd")
        p_body = {"prompt": prompt, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
        async with session.post(p + "/v1/completions", json=p_body, headers={"X-Request-Id": "rid"}) as resp:
            prefill = await resp.json()
        params = prefill["kv_transfer_params"]
        assert set(params) == {
            "do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id", "remote_request_id",
            "remote_host", "remote_port", "tp_size", "remote_num_tokens",
        }  # fmt: skip
        assert params["do_remote_prefill"] is True
        assert params["do_remote_decode"] is False
        assert len(params["remote_block_ids"]) == 1
        assert len(params["remote_block_ids"][0]) == 3000 // 16 + 1
        assert params["remote_request_id"].startswith("cmpl-rid-0-")
        assert params["remote_num_tokens"] == 3000
        assert prefill["usage"]["completion_tokens"] == 1
        assert prefill["choices"][0]["finish_reason"] == "length"
        # the prefill instance holds the KV until the decode instance pulls it
        assert await _metric(session, p, "vllm:kv_cache_usage_perc{") > 0
        d_body = {"prompt": prompt, "max_tokens": 6, "stream": True, "kv_transfer_params": params}
        async with session.post(d + "/v1/completions", json=d_body, headers={"X-Request-Id": "rid"}) as resp:
            assert resp.headers["Content-Type"] == "text/event-stream"
            events, done = parse_sse(await resp.read())
        assert done
        assert "".join(e["choices"][0]["text"] for e in events) == generated_text(prompt, 6)
        assert await _metric(session, p, "vllm:kv_cache_usage_perc{") == 0.0
        assert await _metric(session, d, 'vllm:prompt_tokens_by_source_total{engine="0",model_name') == 3000
        assert await _metric(session, d, "vllm:external_prefix_cache_hits_total{") == 2999
        assert await _metric(session, d, "vllm:nixl_xfer_time_seconds_count{") == 1
        assert await _metric(session, d, "vllm:request_prefill_kv_computed_tokens_sum{") == 1
    finally:
        await host.stop()


async def test_failed_pull_is_a_500_or_an_error_event(session: aiohttp.ClientSession) -> None:
    host = await _host(FaultConfig(transfer_failure_frac=1.0))
    try:
        d = host.urls["d0"]
        params = {"do_remote_prefill": True, "remote_engine_id": "elsewhere", "remote_num_tokens": 100}
        body = {"prompt": prompt_text(100), "max_tokens": 3, "kv_transfer_params": params}
        async with session.post(d + "/v1/completions", json=body) as resp:
            assert resp.status == 500
            assert (await resp.json())["error"]["type"] == "InternalServerError"
        async with session.post(d + "/v1/completions", json={**body, "stream": True}) as resp:
            assert resp.status == 200
            events, done = parse_sse(await resp.read())
        assert done
        assert [set(e) for e in events] == [{"error"}]
        assert await _metric(session, d, "vllm:nixl_num_failed_transfers_total{") == 2
        assert await _metric(session, d, 'vllm:request_success_total{engine="0",finished_reason="error"') == 2
        # an ordinary (aggregated) request is unaffected
        async with session.post(d + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as resp:
            assert resp.status == 200
    finally:
        await host.stop()


@pytest.mark.parametrize("time_scale", [1.0, 0.25])
async def test_ttft_follows_the_engine_model_in_scaled_time(session: aiohttp.ClientSession, time_scale: float) -> None:
    """An idle instance's TTFT for one prompt is the engine's modelled prefill step, scaled."""
    host = await _host(time_scale=time_scale)
    try:
        engine = build_engine(ClusterConfig())
        step_s = engine.model.step_time_s(4096, 1, 0, 0, [(4096, 0)])
        loop_time = __import__("asyncio").get_running_loop().time
        wall_ttfts_s = []
        for attempt in range(3):  # fresh prompts (no prefix-cache hit), one after another on an idle instance
            body = {"prompt": prompt_text(4096, salt=f"{time_scale}-{attempt}"), "max_tokens": 2, "stream": True}
            start = loop_time()
            async with session.post(host.urls["d0"] + "/v1/completions", json=body) as resp:
                await resp.content.readany()
                wall_ttfts_s.append(loop_time() - start)
                await resp.read()
        # never faster than the model; later only by event-loop latency. A busy CI machine can stall one request's
        # event loop for a while, so the upper bound holds for the quickest of the three.
        assert all(step_s * time_scale * 0.95 < wall_s for wall_s in wall_ttfts_s)
        assert min(wall_ttfts_s) < step_s * time_scale * 1.5 + 0.05
        ttft_sum = await _metric(session, host.urls["d0"], "vllm:time_to_first_token_seconds_sum{")
        # metrics are in emulated seconds: at least the modelled steps, at most what the client saw
        assert 3 * step_s * 0.95 < ttft_sum <= sum(wall_ttfts_s) / time_scale + 1e-3
    finally:
        await host.stop()


async def test_crash_after_requests_stops_answering(session: aiohttp.ClientSession) -> None:
    host = EmulatorHost(ClusterConfig(), [InstanceSpec("d0", faults=FaultConfig(crash_after_requests=2))])
    await host.start()
    try:
        url = host.urls["d0"]
        async with session.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": 1}) as resp:
            assert resp.status == 200
        with pytest.raises(aiohttp.ClientError):
            async with session.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": 1}) as resp:
                await resp.read()
        with pytest.raises(aiohttp.ClientError):
            async with session.get(url + "/health") as resp:
                await resp.read()
    finally:
        await host.stop()


async def test_slow_instance_takes_slow_factor_longer(session: aiohttp.ClientSession) -> None:
    cluster = ClusterConfig()
    host = EmulatorHost(cluster, [InstanceSpec("fast"), InstanceSpec("slow", faults=FaultConfig(slow_factor=4.0))])
    await host.start()
    try:
        loop = __import__("asyncio").get_running_loop()
        durations = {}
        for name, url in host.urls.items():
            start = loop.time()
            async with session.post(url + "/v1/completions", json={"prompt": prompt_text(2000), "max_tokens": 20}) as r:
                assert r.status == 200
            durations[name] = loop.time() - start
        assert 2.5 < durations["slow"] / durations["fast"] < 5.0
    finally:
        await host.stop()
