"""What an operator must find in the router's log: the KV-transfer breaker opening and closing, and refused
admin calls (401) with their reason, never the token."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from livestack.emulator import FaultConfig
from livestack.emulator.tokenizer import prompt_text
from router.estimates import TransferHealth
from tests.router.cluster import ADMIN_TOKEN, live_cluster, stream_request

POLICY = """
pd_disaggregation_policy:
  remote_prefill: {min_input_tokens: 2048, min_expected_output_tokens: 1, require_decode_pool_pressure: false}
  local_prefill: {max_input_tokens: 1024, prefer_when_prefix_cache_hit: false}
"""


def _messages(caplog: pytest.LogCaptureFixture, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "pdctl.router" and needle in r.getMessage()]


def test_the_breaker_logs_each_change_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pdctl.router")
    health = TransferHealth(window_s=10.0, min_samples=4, unhealthy_frac=0.5)
    for t in range(3):
        health.record(float(t), False)
    assert health.healthy(3.0)  # too few outcomes to judge
    assert not _messages(caplog, "breaker")
    for t in range(3, 6):
        health.record(float(t), False)
    assert not health.healthy(6.0)
    opened = _messages(caplog, "breaker opened")
    assert len(opened) == 1
    assert "4 of the last 4 remote requests failed (limit 50 %)" in opened[0]
    assert "local prefill for 10 s, then up to 8 probe the path" in opened[0]
    assert health.allows_remote(16.0)  # open for 10 s: half-open, probes try the path again
    assert health.allows_remote(16.5)
    assert len(_messages(caplog, "breaker half-open")) == 1
    for t in range(8):
        health.sent_remote(17.0 + t)
        health.record(17.5 + t, True)
    assert health.healthy(26.0)
    assert len(_messages(caplog, "breaker closed")) == 1
    assert "0 of 8 probe requests failed" in _messages(caplog, "breaker closed")[0]
    assert len(_messages(caplog, "breaker")) == 3


@pytest.mark.integration
@pytest.mark.timeout(60)
async def test_a_live_transfer_storm_opens_the_breaker_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pdctl.router")
    health = {"interval_s": 0.2, "timeout_s": 0.5, "transfer_min_samples": 3, "transfer_window_s": 60}
    faults = FaultConfig(transfer_failure_frac=1.0)
    async with live_cluster(tmp_path, faults=faults, policy_yaml=POLICY, router_overrides={"health": health}) as c:
        for k in range(4):
            body = {"prompt": prompt_text(3000, salt=f"storm-{k}"), "max_tokens": 4}
            result = await stream_request(c.session, c.url, body)
            assert result.status == 200  # served locally after the failed pull
        routes = [(r["route"], r["reason"], r["fallback"]) for r in c.records()]
    assert routes[:3] == [("local_prefill", "long_prompt", "transfer_failed")] * 3
    assert routes[3][1] == "kv_transfer_unhealthy"  # the open breaker routes the next one local at once
    opened = _messages(caplog, "KV transfer breaker opened")
    assert len(opened) == 1
    assert "3 of the last 3 remote requests" in opened[0]


@pytest.mark.integration
@pytest.mark.timeout(60)
async def test_refused_admin_calls_are_logged_with_the_reason_and_not_the_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pdctl.router")
    async with live_cluster(tmp_path) as c:
        async with c.session.get(c.url + "/admin/state") as resp:
            assert resp.status == 401
        async with c.session.put(c.url + "/admin/roles", json={"roles": {}}, headers=c.admin_headers("guess")) as resp:
            assert resp.status == 401
        async with c.session.get(c.url + "/admin/state", headers=c.admin_headers()) as resp:
            assert resp.status == 200
    refused = _messages(caplog, "refused (401)")
    assert len(refused) == 2
    assert refused[0].startswith("admin GET /admin/state refused (401): no Authorization header; from 127.0.0.1")
    assert refused[1].startswith("admin PUT /admin/roles refused (401): wrong or malformed bearer token")
    assert not any(ADMIN_TOKEN in r.getMessage() or "guess" in r.getMessage() for r in caplog.records)
