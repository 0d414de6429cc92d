"""A controller process restarted mid-surge carries on from its control memory (real router, real Prometheus,
``python -m controller`` stopped with SIGTERM and started again on the same configuration).

Before the control memory, the new process started from the base file: its first tick published the RAG tenant's
remote-prefill threshold back near the base value (4096) while the surge that had lowered it went on, and the
router's policy generation moved for it. Now the first tick after the restart starts from the threshold in force.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.controller.harness import remote_min_tokens, wait_until
from tests.controller.stack import live_stack, poll_state

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_a_restarted_controller_carries_on_from_the_threshold_in_force(tmp_path: Path) -> None:
    async with live_stack(tmp_path) as stack:
        stack.trickle("chat", 100, period_s=0.4)
        await stack.wait_for_data("chat")
        stack.trickle("rag", 3000, period_s=0.2, concurrency=3)

        def lowered_twice(state: dict[str, Any]) -> bool:
            rag_min = remote_min_tokens(state["policy"], "rag")
            return rag_min is not None and rag_min <= 2304

        before = await poll_state(stack, lowered_twice, 60, "two steps down of the RAG threshold")
        await asyncio.to_thread(stack.controller.stop)
        at_stop = await stack.state()
        kept = remote_min_tokens(at_stop["policy"], "rag")
        assert kept is not None
        assert kept <= remote_min_tokens(before["policy"], "rag")  # type: ignore[operator]
        memory = json.loads((tmp_path / "controller.memory.json").read_text())
        assert memory["format"] == "pdctl-control-memory"
        assert memory["policy_thresholds"]["rag"]["min_remote_input_tokens"] == kept

        ticks_before = len(stack.audit())
        await asyncio.to_thread(stack.controller.start)

        async def ticked_again() -> bool:
            return len(stack.audit()) > ticks_before

        await wait_until(ticked_again, 30, what="the restarted controller's first tick")
        first = stack.audit()[ticks_before]
        published = first["plan"]["thresholds"]["rag"]["min_remote_input_tokens"]
        assert published <= kept, f"the first tick after the restart went back up ({kept} -> {published})"
        after = await stack.state()
        rag_now = remote_min_tokens(after["policy"], "rag")
        assert rag_now is not None
        assert rag_now <= kept
        if rag_now == kept:
            assert after["generation"] == at_stop["generation"], "the table in force is not sent again"
