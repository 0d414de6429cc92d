"""The router's admin API on a live cluster: authentication, validation (old policy kept) and draining role changes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from livestack.emulator.tokenizer import prompt_text
from tests.router.cluster import LiveCluster, live_cluster, parse_sse, stream_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

POLICY = """
pd_disaggregation_policy:
  remote_prefill: {min_input_tokens: 2048}
tenants:
  - name: chat
"""


async def _state(c: LiveCluster) -> dict[str, Any]:
    async with c.session.get(c.url + "/admin/state", headers=c.admin_headers()) as resp:
        assert resp.status == 200
        return dict(await resp.json())


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/admin/state", None),
        ("PUT", "/admin/policy", {"policy": {}}),
        ("PUT", "/admin/roles", {"roles": {"d0": "prefill"}}),
    ],
)
@pytest.mark.parametrize("token", [None, "wrong-token", ""])
async def test_missing_or_wrong_token_is_401(
    tmp_path: Path, method: str, path: str, body: Any, token: str | None
) -> None:
    async with live_cluster(tmp_path, 1, 1, policy_yaml=POLICY) as c:
        before = await _state(c)
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        async with c.session.request(method, c.url + path, json=body, headers=headers) as resp:
            assert resp.status == 401
            assert (await resp.json())["error"]["field"] == "Authorization"
        assert await _state(c) == before


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/admin/policy", b"{not json", "<body>"),
        ("/admin/policy", b"[1, 2]", "<body>"),
        ("/admin/policy", {"generation": 3}, "policy"),
        ("/admin/policy", {"policy": "text"}, "policy"),
        ("/admin/policy", {"generation": "five", "policy": {}}, "generation"),
        ("/admin/policy", {"policy": {}, "extra": 1}, "extra"),
        (
            "/admin/policy",
            {"policy": {"pd_disaggregation_policy": {"remote_prefill": {"min_input_tokens": -5}}}},
            "policy.pd_disaggregation_policy.remote_prefill.min_input_tokens",
        ),
        ("/admin/policy", {"policy": {"tenants": [{"name": "x", "colour": "red"}]}}, "policy.tenants[0].colour"),
        (
            "/admin/policy",
            {"policy": {"pd_disaggregation_policy": {"local_prefill": {"max_input_tokens": 9000}}}},
            "policy.pd_disaggregation_policy",
        ),
        ("/admin/roles", {"roles": {"nope": "decode"}}, "roles.nope"),
        ("/admin/roles", {"roles": {"p0": "verifier"}}, "roles.p0"),
        ("/admin/roles", {"roles": ["p0"]}, "roles"),
        ("/admin/roles", {"roles": {"d0": "prefill"}}, "roles"),  # no decode instance would remain
    ],
)
async def test_malformed_body_is_400_naming_the_field_and_changes_nothing(
    tmp_path: Path, path: str, body: Any, field: str
) -> None:
    async with live_cluster(tmp_path, 1, 1, policy_yaml=POLICY) as c:
        before = await _state(c)
        kwargs: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
        async with c.session.put(c.url + path, headers=c.admin_headers(), **kwargs) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
        assert error["field"] == field
        assert error["message"]
        assert await _state(c) == before
        # the old policy still routes: the tenant exists and requests are served
        result = await stream_request(c.session, c.url, {"prompt": "hi", "max_tokens": 2}, {"X-Tenant-Id": "chat"})
        assert result.done
        assert c.records()[-1]["tenant"] == "chat"


async def test_valid_policy_swap_bumps_generation(tmp_path: Path) -> None:
    async with live_cluster(tmp_path, 1, 1, policy_yaml=POLICY) as c:
        assert (await _state(c))["generation"] == 0
        new_policy = {"tenants": [{"name": "batch", "match": {"tenant_ids": ["b"]}}]}
        async with c.session.put(c.url + "/admin/policy", json={"policy": new_policy}, headers=c.admin_headers()) as r:
            assert await r.json() == {"generation": 1, "tenants": ["batch", "default"]}
        state = await _state(c)
        assert state["policy"] == new_policy
        assert state["generation"] == 1
        await stream_request(c.session, c.url, {"prompt": "hi", "max_tokens": 2}, {"X-Tenant-Id": "b"})
        assert c.records()[-1]["tenant"] == "batch"


async def test_role_change_drains_in_flight_requests_first(tmp_path: Path) -> None:
    async with live_cluster(tmp_path, 1, 2) as c:
        body = {"prompt": prompt_text(50, salt="drain"), "max_tokens": 60, "stream": True}
        async with c.session.post(c.url + "/v1/completions", json=body, headers={"X-Request-Id": "long"}) as resp:
            first = await resp.content.readany()
            assert first.startswith(b"data: ")
            serving = c.router.registry.instances["d0"]
            assert serving.in_flight == 1
            async with c.session.put(
                c.url + "/admin/roles", json={"roles": {"d0": "prefill"}}, headers=c.admin_headers()
            ) as r:
                assert r.status == 200
                state = await r.json()
            d0 = next(i for i in state["instances"] if i["id"] == "d0")
            assert d0 == {**d0, "role": "decode", "pending_role": "prefill", "draining": True, "in_flight": 1}
            # while draining, new requests avoid d0 entirely
            others = await asyncio.gather(
                *(stream_request(c.session, c.url, {"prompt": f"q{k}", "max_tokens": 2}) for k in range(4))
            )
            assert all(o.done for o in others)
            assert {r["decode_instance"] for r in c.records()} == {"d1"}
            rest = await resp.read()
        events, done = parse_sse(first + rest)
        assert done
        assert len(events) == 60  # the in-flight stream finished on d0
        d0 = next(i for i in (await _state(c))["instances"] if i["id"] == "d0")
        assert d0 == {**d0, "role": "prefill", "pending_role": None, "draining": False, "in_flight": 0}


async def test_decode_instance_switched_during_the_prefill_leg_is_not_used(tmp_path: Path) -> None:
    """A remote request plans its decode instance before its prefill leg; if that instance changes role while
    the prefill runs, the decode leg goes to an instance that serves decode now (the drain promise)."""
    remote = """
pd_disaggregation_policy:
  remote_prefill: {min_input_tokens: 2048, min_expected_output_tokens: 1, require_decode_pool_pressure: false}
tenants:
  - name: chat
"""
    async with live_cluster(tmp_path, 1, 2, policy_yaml=remote) as c:
        body = {"prompt": prompt_text(24000, salt="switch"), "max_tokens": 4}
        task = asyncio.create_task(stream_request(c.session, c.url, body, {"X-Tenant-Id": "chat"}))
        prefill = c.router.registry.instances["p0"]
        for _ in range(400):
            if prefill.in_flight:
                break
            await asyncio.sleep(0.005)
        assert prefill.in_flight == 1, "the prefill leg never started"
        async with c.session.put(
            c.url + "/admin/roles", json={"roles": {"d0": "prefill"}}, headers=c.admin_headers()
        ) as r:
            assert r.status == 200
        assert c.router.registry.instances["d0"].role == "prefill"
        assert prefill.in_flight == 1, "the prefill leg ended before the role change: the test proves nothing"
        result = await task
        assert result.done
        record = c.records()[-1]
        assert record["route"] == "remote_prefill"
        assert record["decode_instance"] == "d1"


async def test_policy_with_an_exponent_float_is_accepted_and_reported_as_sent(tmp_path: Path) -> None:
    # JSON's 1e-05 is a number; re-reading the document as YAML text once refused it as a string.
    async with live_cluster(tmp_path, 1, 1, policy_yaml=POLICY) as c:
        new_policy = {
            "pd_disaggregation_policy": {
                "remote_prefill": {"min_input_tokens": 2048, "max_prefill_queue_wait_ms": 1e-05}
            },
            "tenants": [{"name": "chat"}],
        }
        async with c.session.put(c.url + "/admin/policy", json={"policy": new_policy}, headers=c.admin_headers()) as r:
            assert r.status == 200
        state = await _state(c)
        assert state["policy"] == new_policy
        assert state["generation"] == 1
