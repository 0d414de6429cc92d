"""The admin rollback keeps tenants (issue 21, finding 2): ``PUT /admin/rollback`` serves the named tenants (or all)
aggregated on top of the policy in force, survives policy writes (a controller's included), and stays until
``DELETE /admin/rollback``. Real router and emulated instances on 127.0.0.1."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.actuators.base import Outcome, Plan
from controller.actuators.router import RouterActuator
from controller.sources.base import InstanceInfo, Topology
from livestack.emulator.tokenizer import prompt_text
from router.flow import ROUTE_HEADER, ROUTE_REASON_HEADER
from tests.router.cluster import ADMIN_TOKEN, LiveCluster, live_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

RULE = """
    pd_disaggregation_policy:
      remote_prefill: {min_input_tokens: 512, min_expected_output_tokens: 1, require_decode_pool_pressure: false}
      local_prefill: {max_input_tokens: 256, prefer_when_prefix_cache_hit: false}"""
POLICY = f"""
tenants:
  - name: chat
    match: {{tenant_ids: [chat]}}{RULE}
  - name: rag
    match: {{tenant_ids: [rag]}}{RULE}
"""
TOPOLOGY = Topology.from_instances([InstanceInfo("p0", "g", "prefill"), InstanceInfo("d0", "g", "decode")])


async def _route(c: LiveCluster, tenant: str) -> tuple[str, str]:
    body = {"prompt": prompt_text(3000, salt=str(len(c.records()))), "max_tokens": 4}  # fresh: no prefix hit
    async with c.session.post(c.url + "/v1/completions", json=body, headers={"X-Tenant-Id": tenant}) as r:
        assert r.status == 200
        await r.read()
        return r.headers[ROUTE_HEADER], r.headers[ROUTE_REASON_HEADER]


async def _admin(c: LiveCluster, method: str, body: Any = None, token: str = ADMIN_TOKEN) -> tuple[int, Any]:
    async with c.session.request(method, c.url + "/admin/rollback", json=body, headers=c.admin_headers(token)) as r:
        return r.status, await r.json()


async def test_the_rollback_keeps_tenants_survives_policy_writes_and_stays_until_lifted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pdctl.controller")
    async with live_cluster(tmp_path, 1, 1, policy_yaml=POLICY) as c:
        remote = ("remote_prefill", "long_prompt")
        assert await _route(c, "rag") == remote
        status, state = await _admin(c, "PUT", {"tenants": ["rag"]})
        assert status == 200
        assert state["rollback"]["tenants"] == ["rag"]
        rolled_back = ("local_prefill", "disaggregation_disabled")
        assert await _route(c, "rag") == rolled_back
        assert await _route(c, "chat") == remote, "only the named tenant is rolled back"
        # A controller writes its policy (compare-and-set, as every tick may): the rollback stays.
        actuator = RouterActuator(c.url, ADMIN_TOKEN, 2.0)
        try:
            assert await actuator.observe(TOPOLOGY) is not None
            noted = [r.getMessage() for r in caplog.records if r.name == "pdctl.controller"]
            assert len(noted) == 1
            assert "operator rollback to aggregated serving in force" in noted[0]
            document = yaml.safe_load(POLICY)  # the controller's next policy: a tenant more
            document["tenants"].append({"name": "batch", "match": {"tenant_ids": ["batch"]}})
            written = await actuator.apply(Plan(1, document), TOPOLOGY)
            assert written.outcome is Outcome.APPLIED
        finally:
            await actuator.close()
        assert await _route(c, "rag") == rolled_back
        status, state = await _admin(c, "PUT", {})  # every tenant
        assert state["rollback"]["tenants"] == "*"
        assert await _route(c, "chat") == rolled_back
        status, state = await _admin(c, "DELETE")
        assert status == 200
        assert state["rollback"] is None
        assert await _route(c, "rag") == remote
        tenants = [rec["tenant"] for rec in c.records()]
        assert tenants == ["rag", "rag", "chat", "rag", "chat", "rag"], "requests keep their tenants throughout"


async def test_bad_rollback_calls_change_nothing(tmp_path: Path) -> None:
    async with live_cluster(tmp_path, 1, 1, policy_yaml=POLICY) as c:
        for body, field in (
            ({"tenants": []}, "tenants"),
            ({"tenants": "rag"}, "tenants"),
            ({"tenant": ["rag"]}, "tenant"),
        ):
            status, reply = await _admin(c, "PUT", body)
            assert status == 400
            assert reply["error"]["field"] == field
        status, _ = await _admin(c, "PUT", {"tenants": ["rag"]}, token="wrong")
        assert status == 401
        async with c.session.get(c.url + "/admin/state", headers=c.admin_headers()) as r:
            assert (await r.json())["rollback"] is None
        assert await _route(c, "rag") == ("remote_prefill", "long_prompt")
