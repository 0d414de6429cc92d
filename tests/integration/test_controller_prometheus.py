"""The controller daemon against a real Prometheus scraping the emulated cluster and the router.

Every test starts the emulated instances and the router (in this process), a real ``prometheus`` on loopback
scraping their ``/metrics`` every second, and ``python -m controller`` in its own process, actuating through
the router's admin API. Nothing is mocked: the assertions read the router's live state, the controller's
``/metrics`` and its audit log. The RAG-surge test also runs with the built-in scraper as the source (the
embedded default) instead of Prometheus.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.controller.harness import remote_min_tokens, role_map, wait_until
from tests.controller.stack import INTERVAL_S, expires_in, live_stack, poll_state

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


async def _first_tick(stack: Any) -> dict[str, Any]:
    """Wait until the controller has ticked (an audit record) and return the router's state then.

    The router starts with the controller's own base policy, so the first tick publishes nothing: the actuator
    compares typed policies, and an equal one (whatever its description) is left as it is.
    """

    async def ticked() -> bool:
        return len(stack.audit()) > 0

    await wait_until(ticked, 20, what="the controller's first tick")
    state: dict[str, Any] = await stack.state()
    return state


@pytest.mark.parametrize("source", ["prometheus", "scrape"])
async def test_rag_surge_shifts_instances_toward_prefill_and_lowers_the_rag_threshold(
    tmp_path: Path, source: str
) -> None:
    async with live_stack(tmp_path, source_kind=source) as stack:
        stack.trickle("chat", 100, period_s=0.4)
        await stack.wait_for_data("chat")
        before = await stack.state()
        assert role_map(before) == {"p0": "prefill", "d0": "decode", "d1": "decode"}
        assert remote_min_tokens(before["policy"], "rag") == 4096
        # The surge: long RAG prompts (3000 tokens) prefilled on the decode instances; TTFT far above 20 ms.
        stack.trickle("rag", 3000, period_s=0.2, concurrency=3)

        def shifted(state: dict[str, Any]) -> bool:
            roles = role_map(state)
            rag_min = remote_min_tokens(state["policy"], "rag")
            return list(roles.values()).count("prefill") == 2 and rag_min is not None and rag_min < 4096

        after = await poll_state(
            stack, shifted, timeout_s=40, what="a decode instance moved to prefill and a lower RAG threshold"
        )
        assert remote_min_tokens(after["policy"], "chat") == 4096, "only the tenant missing its TTFT objective moves"
        reasons = " ".join(r["decision"]["reason"] for r in stack.audit())
        assert "interactive:prefill_pressure_shift" in reasons
        assert "rag:lower_remote_threshold 4096->3072" in reasons
        applied = [r for r in stack.audit() if r["plan"]["pools"]]
        assert applied
        assert applied[0]["plan"]["pools"]["interactive"] == [2, 1]
        assert all(a["outcome"] == "applied" for r in applied for a in r["actuation"])


async def test_prometheus_stopped_controller_holds_reports_staleness_and_resumes(tmp_path: Path) -> None:
    async with live_stack(tmp_path, rules={"allow_scale_in": True}) as stack:
        stack.trickle("chat", 100, period_s=0.4)
        await stack.wait_for_data("chat")
        roles = role_map(await stack.state())
        ctl = stack.controller
        assert await asyncio.to_thread(ctl.metric, "pdctl_controller_observation_stale") == 0

        await asyncio.to_thread(stack.prometheus.stop)
        outage_start = len(stack.audit())

        async def stale() -> bool:
            value = await asyncio.to_thread(ctl.metric, "pdctl_controller_observation_stale")
            return value == 1

        await wait_until(stale, 20, what="the controller to report stale observations")
        await asyncio.sleep(3 * INTERVAL_S)
        staleness = await asyncio.to_thread(ctl.metric, "pdctl_controller_observation_staleness_seconds")
        assert staleness is not None
        assert staleness > 3.0
        assert (await asyncio.to_thread(ctl.metric, "pdctl_controller_source_errors_total") or 0) >= 3
        during = stack.audit()[outage_start:]
        assert len(during) >= 3
        assert all(r["observation"]["source_error"] for r in during[1:])
        assert all(not r["plan"]["pools"] for r in during), "no pool change while blind"
        assert role_map(await stack.state()) == roles

        await asyncio.to_thread(stack.prometheus.start)

        async def fresh() -> bool:
            value = await asyncio.to_thread(ctl.metric, "pdctl_controller_observation_stale")
            return value == 0

        await wait_until(fresh, 30, what="fresh observations after Prometheus returned")
        assert stack.audit()[-1]["observation"]["source_error"] is None


async def test_override_takes_effect_within_one_interval_and_expiry_restores_the_policy(tmp_path: Path) -> None:
    async with live_stack(tmp_path) as stack:
        state = await _first_tick(stack)
        assert remote_min_tokens(state["policy"], "rag") == 4096
        override = {
            "description": "incident 42: keep RAG prompts off the decode pool",
            "expires_at": expires_in(6.0),
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
        staging = stack.tmp_path / "rag-override.yaml.tmp"
        staging.write_text(yaml.safe_dump(override))
        written = time.monotonic()
        staging.rename(stack.override_dir / "rag-override.yaml")
        state = await poll_state(stack, lambda s: remote_min_tokens(s["policy"], "rag") == 1024, 10, "the override")
        took_s = time.monotonic() - written
        # One interval, plus the tick's own work (Prometheus queries, the PUT) and this test's 0.25 s polling.
        print(f"override in force after {took_s:.2f} s")
        assert took_s <= INTERVAL_S + 1.0, f"override took {took_s:.2f} s"
        assert remote_min_tokens(state["policy"], "chat") == 4096, "tenants the override does not name keep theirs"
        assert await asyncio.to_thread(stack.controller.metric, "pdctl_controller_override_active") == 1
        state = await poll_state(stack, lambda s: remote_min_tokens(s["policy"], "rag") == 4096, 15, "expiry")
        assert await asyncio.to_thread(stack.controller.metric, "pdctl_controller_override_active") == 0
        assert stack.audit()[-1]["overrides"]["active"] == []


async def test_rollback_file_turns_every_tenant_aggregated_in_one_step(tmp_path: Path) -> None:
    async with live_stack(tmp_path) as stack:
        await _first_tick(stack)
        (stack.override_dir / "rollback.yaml").write_text("mode: aggregated_only\n")

        def rolled_back(state: dict[str, Any]) -> bool:
            return all(t.get("mode") == "aggregated_only" for t in state["policy"]["tenants"])

        await poll_state(stack, rolled_back, 10, "every tenant aggregated")
        assert await asyncio.to_thread(stack.controller.metric, "pdctl_controller_rollback_active") == 1
        (stack.override_dir / "rollback.yaml").unlink()
        await poll_state(
            stack, lambda s: not any(t.get("mode") == "aggregated_only" for t in s["policy"]["tenants"]), 10, "restore"
        )


async def test_malformed_override_changes_nothing(tmp_path: Path) -> None:
    async with live_stack(tmp_path) as stack:
        await _first_tick(stack)
        await asyncio.sleep(2 * INTERVAL_S)
        before = await stack.state()
        (stack.override_dir / "bad.yaml").write_text(
            "tenants:\n  - name: rag\n    pd_disaggregation_policy:\n      remote_prefill: {min_input_tokens: -5}\n"
        )
        (stack.override_dir / "unknown.yaml").write_text("tenants:\n  - name: nobody\n    mode: aggregated_only\n")

        async def refused() -> bool:
            bad = await asyncio.to_thread(stack.controller.metric, "pdctl_controller_override_refused", file="bad.yaml")
            other = await asyncio.to_thread(
                stack.controller.metric, "pdctl_controller_override_refused", file="unknown.yaml"
            )
            return bad == 1 and other == 1

        await wait_until(refused, 10, what="both files refused")
        await asyncio.sleep(2 * INTERVAL_S)
        after = await stack.state()
        assert after["generation"] == before["generation"]
        assert after["policy"] == before["policy"]
        refusals = stack.audit()[-1]["overrides"]["refused"]
        assert "min_input_tokens" in refusals["bad.yaml"]
        assert "'nobody' is not in the policy" in refusals["unknown.yaml"]
        assert await asyncio.to_thread(stack.controller.metric, "pdctl_controller_override_refusals_total") == 2


async def test_sighup_with_a_bad_config_keeps_the_old_one(tmp_path: Path) -> None:
    async with live_stack(tmp_path) as stack:
        ctl = stack.controller
        await _first_tick(stack)
        info = {"policy_id": "baseline:queue_kv", "generation": "1", "mode": "active"}
        assert await asyncio.to_thread(ctl.metric, "pdctl_controller_policy_info", **info) == 1
        good = yaml.safe_load(ctl.config_path.read_text())
        ctl.config_path.write_text(yaml.safe_dump({**good, "policy": "baseline:no_such_baseline"}))
        ctl.signal(signal.SIGHUP)

        async def reload_refused() -> bool:
            value = await asyncio.to_thread(ctl.metric, "pdctl_controller_config_reloads_total", result="error")
            return value == 1

        await wait_until(reload_refused, 10, what="the bad reload to be refused")
        ticks = await asyncio.to_thread(ctl.metric, "pdctl_controller_ticks_total", result="ok")
        await asyncio.sleep(2.5 * INTERVAL_S)
        assert (await asyncio.to_thread(ctl.metric, "pdctl_controller_ticks_total", result="ok") or 0) > (ticks or 0)
        assert await asyncio.to_thread(ctl.metric, "pdctl_controller_policy_info", **info) == 1
        assert "unknown baseline 'no_such_baseline'" in ctl.log_text()

        ctl.config_path.write_text(yaml.safe_dump({**good, "mode": "advisory"}))
        ctl.signal(signal.SIGHUP)
        advisory = {"policy_id": "baseline:queue_kv", "generation": "2", "mode": "advisory"}

        async def swapped() -> bool:
            return await asyncio.to_thread(ctl.metric, "pdctl_controller_policy_info", **advisory) == 1

        await wait_until(swapped, 10, what="the good reload")
        await asyncio.sleep(2 * INTERVAL_S)
        assert stack.audit()[-1]["mode"] == "advisory"
        assert stack.audit()[-1]["generation"] == 2
    # SIGTERM (sent when the stack closes) stops the daemon gracefully.
    assert stack.controller.proc is not None
    assert stack.controller.proc.returncode == 0
    assert "controller stopped" in stack.controller.log_text()
