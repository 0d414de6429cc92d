"""The transfer rollback on the live stack: emulated instances whose every KV transfer fails, the real router, a
real Prometheus, and the controller daemon running ``learned:default`` in its own process.

The shipped selector starts the group under ``dynamo-legacy`` (two prefill, two decode instances). Once a control
window shows the group's transfer path unusable (:mod:`policies.transfer_fallback`: at least 8 remote legs, half
of them failed), its ``transfer_fallback`` switches the group to ``aggregated`` and the guard lets the move toward
aggregated serving through in one tick, although the controller's guard paces every other move at one instance per
minute. Nothing is mocked: the assertions read the controller's audit log and the router's live state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from livestack.emulator import FaultConfig
from tests.controller.harness import role_map
from tests.controller.stack import live_stack, poll_state

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

POLICY = """
pd_disaggregation_policy:
  remote_prefill: {min_input_tokens: 1024, min_expected_output_tokens: 1, require_decode_pool_pressure: false}
  local_prefill: {max_input_tokens: 1024}
slo: {ttft_p95_ms: 5000, tpot_p95_ms: 1000}
tenant_groups:
  - {name: interactive, gpu_budget: 4, pools: {prefill: {min: 0, max: 3}, decode: {min: 1, max: 4}}}
tenants:
  - {name: rag, group: interactive, match: {tenant_ids: [rag]}}
"""
"""One group of four instances (p0, p1 prefill; d0, d1 decode) that may serve fully aggregated."""


async def test_a_failing_transfer_path_rolls_the_group_back_to_aggregated_in_one_tick(tmp_path: Path) -> None:
    async with live_stack(
        tmp_path,
        policy_yaml=POLICY,
        num_prefill=2,
        num_decode=2,
        faults=FaultConfig(transfer_failure_frac=1.0),
        # The router's breaker judges a wide window here, so every request keeps trying the remote path (and
        # completes by its local fallback): the control window then holds enough failed legs to judge.
        router_overrides={"health": {"interval_s": 0.2, "timeout_s": 0.5, "transfer_min_samples": 1000}},
        policy="learned:default",
        guard={"max_step_per_tick": 1, "cooldown_s": 60.0, "hysteresis_ticks": 2, "max_staleness_s": 3.0},
    ) as stack:
        before = await stack.state()
        assert role_map(before) == {"p0": "prefill", "p1": "prefill", "d0": "decode", "d1": "decode"}
        stack.trickle("rag", 3000, period_s=0.1, concurrency=4)

        def aggregated(state: dict[str, Any]) -> bool:
            return set(role_map(state).values()) == {"decode"}

        await poll_state(stack, aggregated, timeout_s=45, what="both prefill instances switched to decode")
        records = stack.audit()
        moved = [r for r in records if r["plan"]["pools"].get("interactive")]
        assert moved, "the controller planned no pool move"
        first = moved[0]
        assert first["plan"]["pools"]["interactive"] == [0, 4]  # both prefill instances in one tick, not one
        assert any(c["reason"] == "transfer_rollback" for c in first["clamps"])
        assert "interactive: aggregated" in first["decision"]["reason"]
        assert all(a["outcome"] == "applied" for a in first["actuation"])
        failed = first["observation"]["groups"]["interactive"]["kv_transfer_failure_frac"]
        assert failed is not None
        assert failed >= 0.5
        # Every request so far was answered: the failed transfers fell back to local prefill.
        statuses = {r["status"] for r in stack.cluster.records()}
        assert statuses == {200}
