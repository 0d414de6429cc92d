"""A router restarted under a running controller gets the controller's table back (real router on loopback, real
Prometheus, ``python -m controller`` in its own process).

The router starts again from its own policy file (generation 0). Before, the controller published only what had
changed since its last publication, so with nothing changing (here: an override in force, steady) the router ran its
file's thresholds until the policy next moved one. Now the tick after the restart sees the router off the published
policy and publishes the whole table again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.app import Router
from tests.controller.harness import remote_min_tokens, wait_until
from tests.controller.stack import live_stack, poll_state

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

OVERRIDE = {
    "description": "keep RAG prompts of 1024 tokens and up on the prefill pool",
    "tenants": [
        {
            "name": "rag",
            "pd_disaggregation_policy": {
                "remote_prefill": {"min_input_tokens": 1024},
                "local_prefill": {"max_input_tokens": 512},
            },
        }
    ],
}


async def test_a_restarted_router_gets_the_published_table_back(tmp_path: Path) -> None:
    async with live_stack(tmp_path) as stack:
        staging = tmp_path / "rag.yaml.tmp"
        staging.write_text(yaml.safe_dump(OVERRIDE))
        staging.rename(stack.override_dir / "rag.yaml")
        before = await poll_state(stack, lambda s: remote_min_tokens(s["policy"], "rag") == 1024, 20, "the override")
        assert before["generation"] >= 1

        old = stack.cluster.router
        await old.stop()
        listen = old.config.listen.model_copy(update={"port": old.port})
        restarted = Router(old.config.model_copy(update={"listen": listen}))
        await restarted.start()
        stack.cluster.router = restarted
        try:
            fresh = await stack.state()
            assert fresh["generation"] == 0, "a restarted router starts from its own file"
            assert remote_min_tokens(fresh["policy"], "rag") == 4096

            def back(state: dict[str, Any]) -> bool:
                return remote_min_tokens(state["policy"], "rag") == 1024

            after = await poll_state(stack, back, 10, "the published table back on the restarted router")
            assert after["generation"] == 1

            async def counted() -> bool:
                drifts = await asyncio.to_thread(stack.controller.metric, "pdctl_controller_router_policy_drifts_total")
                return drifts is not None and drifts >= 1

            await wait_until(counted, 10, what="the drift counted")
            drifted = [r for r in stack.audit() if "policy_drift" in r]
            assert drifted
            assert drifted[0]["policy_drift"][0].endswith("(it restarted)")
            assert drifted[0]["plan"]["publish_policy"] is True
        finally:
            await restarted.stop()
