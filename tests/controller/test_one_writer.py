"""One writer: the router's admin writes are compare-and-set on ``generation``, and a second controller for the
same targets is refused by the lease file (real router on loopback, real controller processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.actuators.base import Outcome, Plan
from controller.actuators.router import RouterActuator
from controller.config import ControllerConfig
from controller.lease import Lease, LeaseHeldError, lease_path
from controller.sources.base import InstanceInfo, Topology
from policies.schema import PoolTargets
from tests.controller.harness import controller, controller_once
from tests.controller.test_loop import POLICY
from tests.router.cluster import ADMIN_TOKEN, live_cluster

pytestmark = pytest.mark.timeout(120)


def test_a_second_lease_holder_is_refused_with_one_line(tmp_path: Path) -> None:
    first, second = Lease(tmp_path / "c.lease"), Lease(tmp_path / "c.lease")
    first.acquire()
    with pytest.raises(LeaseHeldError) as refused:
        second.acquire()
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"another controller holds the lease {tmp_path / 'c.lease'} (pid ")
    first.release()
    second.acquire()  # released: the next one takes it
    second.release()


def writer_config(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """An active controller that actuates a router (none listens unless the test starts one)."""
    (tmp_path / "policy.yaml").write_text(POLICY)
    return {
        "mode": "active",
        "interval_s": 1.0,
        "policy": "baseline:queue_kv",
        "policy_file": str(tmp_path / "policy.yaml"),
        "actuators": [{"kind": "router", "url": "http://127.0.0.1:9", "token": "t", "timeout_s": 0.5}],
        "source": {"kind": "scrape", "router_metrics_url": "http://127.0.0.1:9/metrics", "timeout_s": 0.5},
        **overrides,
    }


def test_lease_path_is_per_target_and_only_for_writers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDCTL_DATA_DIR", str(tmp_path))
    one = lease_path(ControllerConfig(**writer_config(tmp_path)))
    assert one is not None
    assert one.parent == tmp_path
    other = writer_config(tmp_path, actuators=[{"kind": "router", "url": "http://127.0.0.1:10", "token": "t"}])
    assert lease_path(ControllerConfig(**other)) not in (None, one)
    assert lease_path(ControllerConfig(**writer_config(tmp_path, mode="advisory"))) is None
    assert lease_path(ControllerConfig(**writer_config(tmp_path, actuators=[{"kind": "dry_run"}]))) is None
    assert (
        lease_path(ControllerConfig(**writer_config(tmp_path, lease_file=str(tmp_path / "x.lease"))))
        == tmp_path / "x.lease"
    )


@pytest.mark.integration
def test_a_second_controller_process_is_refused(tmp_path: Path) -> None:
    config = writer_config(tmp_path, lease_file=str(tmp_path / "controller.lease"))
    with controller(config, tmp_path, name="first") as first:
        second_path = tmp_path / "second.yaml"
        second_path.write_text(yaml.safe_dump(config))
        second = controller_once(second_path)
        assert second.returncode == 3
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert lines[0].startswith(f"another controller holds the lease {tmp_path / 'controller.lease'} (pid ")
        assert first.proc is not None
        assert str(first.proc.pid) in lines[0]
        assert first.proc.poll() is None, "the first controller runs on"


TOPOLOGY = Topology.from_instances([InstanceInfo("p0", "g", "prefill"), InstanceInfo("d0", "g", "decode")])


@pytest.mark.integration
async def test_admin_writes_are_compare_and_set(tmp_path: Path) -> None:
    async with live_cluster(tmp_path, 1, 1) as c:
        headers = c.admin_headers()
        async with c.session.get(c.url + "/admin/state", headers=headers) as r:
            held = (await r.json())["generation"]
        for stale in sorted({held, max(held - 1, 0)}):
            body = {"generation": stale, "policy": {"mode": "aggregated_only"}}
            async with c.session.put(c.url + "/admin/policy", json=body, headers=headers) as r:
                assert r.status == 409
                error = (await r.json())["error"]
            assert error["field"] == "generation"
            assert error["current_generation"] == held
            assert error["message"].startswith(f"stale generation {stale}: the router holds generation {held}")
        # Two controllers read the same state; the first write wins, the second is refused, nothing is lost.
        a = RouterActuator(c.url, ADMIN_TOKEN, 2.0)
        b = RouterActuator(c.url, ADMIN_TOKEN, 2.0)
        try:
            assert await a.observe(TOPOLOGY) is not None
            assert await b.observe(TOPOLOGY) is not None
            rollback = {"mode": "aggregated_only"}
            assert (await a.apply(Plan(1, rollback), TOPOLOGY)).outcome is Outcome.APPLIED
            refused = await b.apply(Plan(1, {"tenants": [{"name": "chat"}]}), TOPOLOGY)
            assert refused.outcome is Outcome.REJECTED
            assert "409" in refused.detail
            async with c.session.get(c.url + "/admin/state", headers=headers) as r:
                state = await r.json()
            assert state["generation"] == held + 1
            assert state["policy"]["mode"] == "aggregated_only", "the first writer's policy stands"
            assert await b.observe(TOPOLOGY) is not None  # the next tick reads the state and may write again
            assert (await b.apply(Plan(2, {"tenants": [{"name": "chat"}]}), TOPOLOGY)).outcome is Outcome.APPLIED
        finally:
            await a.close()
            await b.close()


THREE = Topology.from_instances(
    [InstanceInfo("p0", "g", "prefill"), InstanceInfo("d0", "g", "decode"), InstanceInfo("d1", "g", "decode")]
)


@pytest.mark.integration
async def test_role_writes_are_compare_and_set(tmp_path: Path) -> None:
    """Two controllers decide role moves from the same reading: only the first moves instances."""
    async with live_cluster(tmp_path, 1, 2) as c:
        headers = c.admin_headers()
        async with c.session.get(c.url + "/admin/state", headers=headers) as r:
            before = await r.json()
        held = before["roles_generation"]
        body = {"generation": held, "roles": {"d1": "prefill"}}
        async with c.session.put(c.url + "/admin/roles", json=body, headers=headers) as r:
            assert r.status == 409
            error = (await r.json())["error"]
        assert error["current_generation"] == held
        assert error["message"].startswith(f"stale generation {held}: the router holds roles_generation {held}")
        a = RouterActuator(c.url, ADMIN_TOKEN, 2.0)
        b = RouterActuator(c.url, ADMIN_TOKEN, 2.0)
        try:
            seen_a = await a.observe(THREE)
            seen_b = await b.observe(THREE)
            assert seen_a is not None
            assert seen_b is not None
            assert (await a.apply(Plan(1, None, {"g": PoolTargets(2, 1)}), seen_a)).outcome is Outcome.APPLIED
            # b decided from the same, now stale, reading (move p0 to decode): refused, so a's move stands alone.
            refused = await b.apply(Plan(1, None, {"g": PoolTargets(0, 3)}), seen_b)
            assert refused.outcome is Outcome.REJECTED
            assert "409" in refused.detail
            async with c.session.get(c.url + "/admin/state", headers=headers) as r:
                after = await r.json()
            assert after["roles_generation"] == held + 1
            roles = {i["id"]: i["pending_role"] or i["role"] for i in after["instances"]}
            assert roles == {"p0": "prefill", "d0": "decode", "d1": "prefill"}
        finally:
            await a.close()
            await b.close()
