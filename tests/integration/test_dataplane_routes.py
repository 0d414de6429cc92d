"""Emulated instances + router on loopback: both routes serve correct streams; admin changes routing live."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from livestack.emulator.protocol import chat_prompt_text
from livestack.emulator.tokenizer import generated_text, prompt_text
from tests.router.cluster import StreamResult, live_cluster, stream_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

POLICY = """
pd_disaggregation_policy:
  remote_prefill:
    min_input_tokens: 2048
    min_expected_output_tokens: 1
    require_decode_pool_pressure: false
  local_prefill:
    max_input_tokens: 1024
tenants:
  - name: chat
    match: {tenant_ids: [chat-app]}
"""

LONG = prompt_text(3000, salt="long")
SHORT = prompt_text(100, salt="short")


def assert_complete(result: StreamResult, request_id: str, num_tokens: int, prompt_tokens: int, prompt: str) -> None:
    assert result.status == 200
    assert result.errors == []
    assert result.done
    assert result.text == generated_text(prompt, num_tokens)
    assert result.usage == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": num_tokens,
        "total_tokens": prompt_tokens + num_tokens,
    }
    assert all(e["id"] == f"cmpl-{request_id}" for e in result.events)


async def test_remote_and_local_routes_serve_correct_streams(tmp_path: Path) -> None:
    async with live_cluster(tmp_path, policy_yaml=POLICY) as c:
        body = {"max_tokens": 12, "stream_options": {"include_usage": True}}
        remote, local = await asyncio.gather(
            stream_request(c.session, c.url, {**body, "prompt": LONG}, {"X-Request-Id": "remote-1"}),
            stream_request(c.session, c.url, {**body, "prompt": SHORT}, {"X-Request-Id": "local-1"}),
        )
        assert_complete(remote, "remote-1", 12, 3000, LONG)
        assert_complete(local, "local-1", 12, 100, SHORT)
        records = {r["request_id"]: r for r in c.records()}
        assert records["remote-1"]["route"] == "remote_prefill"
        assert records["remote-1"]["reason"] == "long_prompt"
        assert records["remote-1"]["prefill_instance"] == "p0"
        assert records["remote-1"]["decode_instance"] == "d0"
        assert set(records["remote-1"]["stages"]) >= {
            "request_queue_wait",
            "prefill_compute_time",
            "first_token_emit_time",
        }
        assert records["local-1"]["route"] == "local_prefill"
        assert records["local-1"]["reason"] == "short_prompt"
        assert records["local-1"]["prefill_instance"] is None
        for rec in records.values():
            assert rec["output_tokens"] == 12
            assert rec["input_tokens"] in (3000, 100)
            assert 0 < rec["ttft_s"] <= rec["e2e_s"]
            assert rec["tpot_s"] > 0
        # the decode instance pulled the long prompt's KV (all but the last token) and computed the short one
        decode = c.host.instances[1].metrics
        assert decode.prompt_tokens_by_source["external_kv_transfer"]._value.get() == 2999
        assert decode.prompt_tokens_by_source["local_compute"]._value.get() == 1 + 100
        prefill = c.host.instances[0].metrics
        assert prefill.prompt_tokens._value.get() == 3000

        # non-streaming, chat, remote
        async with c.session.post(
            c.url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": LONG}], "max_tokens": 5},
            headers={"X-Request-Id": "chat-remote", "X-Tenant-Id": "chat-app"},
        ) as resp:
            assert resp.status == 200
            data = await resp.json()
        assert data["id"] == "chatcmpl-chat-remote"
        assert data["choices"][0]["message"]["content"] == generated_text(
            chat_prompt_text([{"role": "user", "content": LONG}]), 5
        )
        assert data["kv_transfer_params"] is None
        rec = {r["request_id"]: r for r in c.records()}["chat-remote"]
        assert (rec["tenant"], rec["route"], rec["stream"]) == ("chat", "remote_prefill", False)

        async with c.session.get(c.url + "/metrics") as resp:
            text = await resp.text()
        assert 'pdctl_router_decisions_total{reason="long_prompt",route="remote_prefill",tenant="default"} 1.0' in text
        assert 'pdctl_router_routed_prompt_tokens_total{route="remote_prefill",tenant="chat"}' in text
        assert (
            'pdctl_request_stage_seconds_count{route="remote_prefill",stage="prefill_compute_time",tenant="chat"} 1.0'
            in text
        )
        assert 'pdctl_router_ttft_seconds_count{route="local_prefill",tenant="default"} 1.0' in text


async def test_admin_threshold_change_reroutes_live(tmp_path: Path) -> None:
    async with live_cluster(tmp_path, policy_yaml=POLICY) as c:
        headers = {"X-Tenant-Id": "chat-app"}
        first = await stream_request(
            c.session, c.url, {"prompt": LONG, "max_tokens": 4}, {**headers, "X-Request-Id": "a"}
        )
        assert first.done
        async with c.session.get(c.url + "/admin/state", headers=c.admin_headers()) as resp:
            state = await resp.json()
        document = state["policy"]
        document["tenants"][0]["pd_disaggregation_policy"] = {
            "remote_prefill": {"min_input_tokens": 8192},
            "local_prefill": {"max_input_tokens": 4096},
        }
        async with c.session.put(
            c.url + "/admin/policy", json={"generation": 7, "policy": document}, headers=c.admin_headers()
        ) as resp:
            assert resp.status == 200
            assert await resp.json() == {"generation": 7, "tenants": ["chat", "default"]}
        second = await stream_request(
            c.session, c.url, {"prompt": LONG, "max_tokens": 4}, {**headers, "X-Request-Id": "b"}
        )
        assert second.done
        fresh = prompt_text(3000, salt="fresh")  # not cached on d0 yet (LONG is: it would go local on a prefix hit)
        other = await stream_request(c.session, c.url, {"prompt": fresh, "max_tokens": 4}, {"X-Request-Id": "c"})
        assert other.done
        records = {r["request_id"]: r for r in c.records()}
        assert (records["a"]["route"], records["a"]["reason"]) == ("remote_prefill", "long_prompt")
        assert (records["b"]["route"], records["b"]["reason"]) == ("local_prefill", "short_prompt")
        # only the tenant's thresholds changed: the default tenant still goes remote
        assert (records["c"]["route"], records["c"]["reason"]) == ("remote_prefill", "long_prompt")
        again = await stream_request(c.session, c.url, {"prompt": fresh, "max_tokens": 4}, {"X-Request-Id": "d"})
        assert again.done
        records = {r["request_id"]: r for r in c.records()}
        assert (records["d"]["route"], records["d"]["reason"]) == ("local_prefill", "prefix_cache_hit")
        assert records["d"]["prefix_hit_tokens"] == 2944  # 46 full 64-token blocks of 3000 tokens
        async with c.session.get(c.url + "/admin/state", headers=c.admin_headers()) as resp:
            assert (await resp.json())["generation"] == 7


async def test_instance_tokenizer_counts_prompt_tokens(tmp_path: Path) -> None:
    overrides = {"estimation": {"tokenizer": "instance"}}
    async with live_cluster(tmp_path, policy_yaml=POLICY, router_overrides=overrides) as c:
        chat = {"messages": [{"role": "user", "content": LONG}], "max_tokens": 2}
        async with c.session.post(c.url + "/v1/chat/completions", json=chat, headers={"X-Request-Id": "t1"}) as resp:
            usage = (await resp.json())["usage"]
        record = c.records()[-1]
        # the instance counts the chat template too; the router's record carries exactly that count
        assert record["input_tokens"] == usage["prompt_tokens"] == 3006


async def test_metrics_poll_reads_decode_kv_usage(tmp_path: Path) -> None:
    overrides = {"health": {"interval_s": 0.2, "metrics_poll_s": 0.05}}
    async with live_cluster(tmp_path, policy_yaml=POLICY, router_overrides=overrides) as c:
        body = {"prompt": prompt_text(4000, salt="kv"), "max_tokens": 60, "stream": True}
        async with c.session.post(c.url + "/v1/completions", json=body) as resp:
            await resp.content.readany()
            decode = c.router.registry.instances["d0"]
            for _ in range(40):
                if decode.kv_usage_frac:
                    break
                await asyncio.sleep(0.05)
            assert decode.kv_usage_frac is not None
            assert 0 < decode.kv_usage_frac < 0.1  # ~4000 tokens of a cache of ~800k tokens
            await resp.read()
