"""A request refused for its body (400, 413) is still counted, per tenant, with ``route="rejected"``.

Before, such a request reached no counter: a client sending malformed or oversized bodies was invisible in
``pdctl_router_requests_total``. The controller leaves these rows out of the load it reads
(``tests/controller/test_sources.py``): they cost the instances nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from livestack.emulator.tokenizer import prompt_text
from tests.router.cluster import live_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

POLICY = """
pd_disaggregation_policy:
  remote_prefill: {min_input_tokens: 2048, min_expected_output_tokens: 1, require_decode_pool_pressure: false}
  local_prefill: {max_input_tokens: 1024}
tenants:
  - name: chat
    match: {tenant_ids: [chat-app]}
"""


async def test_bad_bodies_are_answered_in_json_and_counted_per_tenant(tmp_path: Path) -> None:
    limits = {"max_body_bytes": 4096}
    async with live_cluster(tmp_path, policy_yaml=POLICY, router_overrides={"limits": limits}) as c:
        chat = {"X-Tenant-Id": "chat-app", "Content-Type": "application/json"}
        bodies = [b"{not json", b"[1, 2, 3]", b'{"prompt": "' + b"x" * 8192 + b'"}']
        statuses = []
        for body in bodies:
            async with c.session.post(c.url + "/v1/completions", data=body, headers=chat) as resp:
                statuses.append(resp.status)
                error = (await resp.json())["error"]
                assert error["message"]
        assert statuses == [400, 400, 413]
        async with c.session.post(c.url + "/v1/completions", data=b"{oops") as resp:  # no tenant header: default
            assert resp.status == 400
        served = {"prompt": prompt_text(100, salt="ok"), "max_tokens": 2}
        async with c.session.post(c.url + "/v1/completions", json=served, headers={"X-Tenant-Id": "chat-app"}) as resp:
            assert resp.status == 200
        async with c.session.get(c.url + "/metrics") as resp:
            text = await resp.text()
        records = c.records()
    assert 'pdctl_router_requests_total{outcome="error",route="rejected",tenant="chat"} 3.0' in text
    assert 'pdctl_router_requests_total{outcome="error",route="rejected",tenant="default"} 1.0' in text
    assert 'pdctl_router_requests_total{outcome="ok",route="local_prefill",tenant="chat"} 1.0' in text
    assert [r["tenant"] for r in records] == ["chat"]  # the request log holds routed requests only
