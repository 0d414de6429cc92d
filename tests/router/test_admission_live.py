"""The router's admission stage on a live emulated cluster: 429 with Retry-After, counted and logged as refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from livestack.emulator.tokenizer import prompt_text
from tests.router.cluster import live_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

POLICY = """
tenants:
  - name: tight
    match: {tenant_ids: [tight-app]}
    slo: {ttft_p95_ms: 1}
  - name: loose
    match: {tenant_ids: [loose-app]}
    slo: {ttft_p95_ms: 60000}
"""


async def test_a_request_that_would_miss_its_ttft_objective_is_refused_with_429(tmp_path: Path) -> None:
    admission = {"ttft_slack_frac": 1.0, "retry_after_s": 1.5}
    async with live_cluster(tmp_path, policy_yaml=POLICY, router_overrides={"admission": admission}) as c:
        body = {"prompt": prompt_text(600, salt="a"), "max_tokens": 2}
        async with c.session.post(c.url + "/v1/completions", json=body, headers={"X-Tenant-Id": "tight-app"}) as r:
            assert r.status == 429
            assert r.headers["Retry-After"] == "2"
            assert r.headers["X-Pdctl-Route"] == "refused"
            assert "admission" in (await r.json())["error"]["message"]
        async with c.session.post(c.url + "/v1/completions", json=body, headers={"X-Tenant-Id": "loose-app"}) as r:
            assert r.status == 200
        async with c.session.get(c.url + "/metrics") as r:
            text = await r.text()
        records = c.records()
        in_queue = {i.id: i.awaiting_first_token_tokens for i in c.router.registry.instances.values()}
    assert 'pdctl_router_requests_total{outcome="error",route="refused",tenant="tight"} 1.0' in text
    assert 'pdctl_router_requests_total{outcome="ok",route="local_prefill",tenant="loose"} 1.0' in text
    assert [(r["tenant"], r["route"], r["status"]) for r in records] == [
        ("tight", "refused", 429),
        ("loose", "local_prefill", 200),
    ]
    assert records[0]["reason"] == "admission_refused"
    assert set(in_queue.values()) == {0}  # every local leg left the admission stage's queue at its first byte


async def test_without_the_setting_every_request_is_admitted(tmp_path: Path) -> None:
    async with live_cluster(tmp_path, policy_yaml=POLICY) as c:
        body = {"prompt": prompt_text(600, salt="b"), "max_tokens": 2}
        async with c.session.post(c.url + "/v1/completions", json=body, headers={"X-Tenant-Id": "tight-app"}) as r:
            assert r.status == 200
