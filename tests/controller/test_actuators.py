"""Actuators against loopback servers speaking the real protocols: the router admin API and the Kubernetes API
(``scale`` subresource, bearer token, merge patch). Unknown outcomes are never retried blindly."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from controller.actuators.base import Outcome, Plan
from controller.actuators.dryrun import DryRunActuator
from controller.actuators.kubernetes import KubernetesActuator, Workload, scale_path
from controller.actuators.router import RouterActuator, role_changes
from controller.audit import AuditLog
from controller.clock import VirtualClock
from controller.loop import ControlLoop
from controller.overrides import OverrideWatcher
from controller.sources.base import InstanceInfo, Readout, Topology
from controller.telemetry import Telemetry
from policies.documents import policy_document
from policies.policy_file import load_policy_data, load_policy_text, resolve_policy
from policies.schema import ControlAction, PoolTargets, RoutingThresholds
from router.admin import document_of

TOKEN = "s3cret"
BASE = resolve_policy(
    load_policy_text(
        """
tenant_groups: [{name: g, gpu_budget: 4}]
slo: {ttft_p95_ms: 800}
tenants:
  - {name: chat, group: g, match: {api_keys: [k1]}}
  - {name: rag, group: g, slo: {ttft_p95_ms: 2000}, expected_output_tokens: 64}
routes: [{model: llama, tenant: rag}]
"""
    )
)


@dataclass
class FakeServer:
    url: str
    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    delay_s: float = 0.0
    status: int = 200


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def admin() -> AsyncIterator[tuple[FakeServer, dict[str, Any]]]:
    """The router admin API contract (docs/admin-api.md), in memory."""
    state: dict[str, Any] = {
        "generation": 1,
        "roles_generation": 0,
        "policy": {},
        "instances": [
            {"id": i, "url": "", "role": r, "pending_role": None, "healthy": True, "in_flight": 0, "draining": False}
            for i, r in (("p0", "prefill"), ("d0", "decode"), ("d1", "decode"))
        ],
        "kv_transfer_healthy": True,
    }
    server = FakeServer("")

    def authorized(request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {TOKEN}"

    async def handle(request: web.Request) -> web.Response:
        body: dict[str, Any] | None = await request.json() if request.can_read_body else None
        server.calls.append((request.method, request.path, body))
        await asyncio.sleep(server.delay_s)
        if not authorized(request):
            return web.json_response({"error": {"message": "no", "field": "Authorization"}}, status=401)
        if server.status != 200:
            return web.json_response({"error": {"message": "injected", "field": ""}}, status=server.status)
        if request.path == "/admin/policy":
            assert body is not None
            if body.get("generation", state["generation"] + 1) <= state["generation"]:  # compare-and-set
                error = {"message": "stale generation", "field": "generation", "current_generation": 0}
                return web.json_response({"error": {**error, "current_generation": state["generation"]}}, status=409)
            state["generation"] = body.get("generation", state["generation"] + 1)
            state["policy"] = body["policy"]
        elif request.path == "/admin/roles":
            assert body is not None
            if body.get("generation", state["roles_generation"] + 1) <= state["roles_generation"]:
                error = {"message": "stale generation", "field": "generation"}
                return web.json_response(
                    {"error": {**error, "current_generation": state["roles_generation"]}}, status=409
                )
            state["roles_generation"] = body.get("generation", state["roles_generation"] + 1)
            for inst in state["instances"]:
                if inst["id"] in body["roles"]:
                    inst["pending_role"] = body["roles"][inst["id"]]
        return web.json_response(state)

    app = web.Application()
    app.router.add_route("*", "/admin/{tail:.*}", handle)
    runner, server.url = await _serve(app)
    try:
        yield server, state
    finally:
        await runner.cleanup()


TOPOLOGY = Topology.from_instances(
    [InstanceInfo("p0", "g", "prefill"), InstanceInfo("d0", "g", "decode"), InstanceInfo("d1", "g", "decode")]
)


def test_role_changes_are_minimal_and_deterministic() -> None:
    assert role_changes(TOPOLOGY, {"g": PoolTargets(2, 1)}) == {"d1": "prefill"}
    assert role_changes(TOPOLOGY, {"g": PoolTargets(1, 2)}) == {}
    assert role_changes(TOPOLOGY, {"g": PoolTargets(0, 3)}) == {"p0": "decode"}
    pending = Topology.from_instances(
        [
            InstanceInfo("p0", "g", "prefill"),
            InstanceInfo("d0", "g", "decode"),
            InstanceInfo("d1", "g", "decode", None, "prefill"),
        ]
    )
    assert role_changes(pending, {"g": PoolTargets(2, 1)}) == {}, "a change in flight already counts"
    assert role_changes(pending, {"g": PoolTargets(3, 0)}) == {}, "the last decode instance never moves"


async def test_router_actuator_publishes_policy_and_roles(admin: tuple[FakeServer, dict[str, Any]]) -> None:
    server, state = admin
    actuator = RouterActuator(server.url, TOKEN, timeout_s=2.0)
    try:
        assert await actuator.ready()
        assert await actuator.observe(TOPOLOGY) is not None
        plan = Plan(1, {"tenants": [{"name": "rag"}]}, {"g": PoolTargets(2, 1)})
        result = await actuator.apply(plan, TOPOLOGY)
        assert result.outcome is Outcome.APPLIED
        assert [(m, p) for m, p, _ in server.calls[2:]] == [("PUT", "/admin/policy"), ("PUT", "/admin/roles")]
        assert server.calls[2][2] == {"generation": 2, "policy": {"tenants": [{"name": "rag"}]}}, "compare-and-set"
        assert server.calls[3][2] == {"generation": 1, "roles": {"d1": "prefill"}}, "compare-and-set on roles"
        observed = await actuator.observe(TOPOLOGY)
        assert observed is not None
        assert observed.pending["g"] == (1, 0)
        assert state["generation"] == 2
        assert (await actuator.apply(Plan(1), TOPOLOGY)).outcome is Outcome.UNCHANGED
        # The router already runs this document (read back by observe): not sent again.
        sent = len(server.calls)
        assert (await actuator.apply(Plan(2, {"tenants": [{"name": "rag"}]}), observed)).outcome is Outcome.UNCHANGED
        assert len(server.calls) == sent
        assert (await actuator.apply(Plan(3, {"tenants": [{"name": "chat"}]}), observed)).outcome is Outcome.APPLIED
        assert state["generation"] == 3
    finally:
        await actuator.close()


async def test_router_actuator_compares_the_policy_in_force_not_its_spelling(
    admin: tuple[FakeServer, dict[str, Any]],
) -> None:
    """The router reports its document re-dumped by its loader; the controller's document for the same
    policy is spelled differently (every key written, other key order, floats for ints): nothing is sent."""
    server, state = admin
    rag = RoutingThresholds(min_remote_input_tokens=4096, max_prefill_queue_wait_s=0.25, traffic_percent=50.0)
    planned = policy_document(BASE, ControlAction(thresholds={"rag": rag}), "published by pdctl controller")
    live = json.loads(json.dumps(planned))
    live["description"] = "written by a person"
    for tenant in live["tenants"]:
        tenant["rollout"]["traffic_percent"] = int(tenant["rollout"]["traffic_percent"])
        tenant.pop("prompt_length_buckets")  # empty: the same as leaving it out
        tenant["pd_disaggregation_policy"] = dict(reversed(tenant["pd_disaggregation_policy"].items()))
    state["policy"] = document_of(load_policy_data(live))
    actuator = RouterActuator(server.url, TOKEN, timeout_s=2.0)
    try:
        assert await actuator.observe(TOPOLOGY) is not None
        sent = len(server.calls)
        assert (await actuator.apply(Plan(1, planned), TOPOLOGY)).outcome is Outcome.UNCHANGED
        assert len(server.calls) == sent
        moved = policy_document(BASE, ControlAction(thresholds={"rag": replace(rag, traffic_percent=50.5)}))
        assert (await actuator.apply(Plan(2, moved), TOPOLOGY)).outcome is Outcome.APPLIED
        assert server.calls[-1][2] == {"generation": 2, "policy": moved}, "the document itself goes over the wire"
    finally:
        await actuator.close()


async def test_router_actuator_does_not_trust_a_reading_older_than_its_own_publication(
    admin: tuple[FakeServer, dict[str, Any]],
) -> None:
    """Regression: after publishing A over a live B, a plan back to B before the next reading was held as
    "already in force" (the stale reading of B), and the router kept running A."""
    server, state = admin
    actuator = RouterActuator(server.url, TOKEN, timeout_s=2.0)
    rollback = {"mode": "aggregated_only"}
    try:
        assert await actuator.observe(TOPOLOGY) is not None  # live: {} (the built-in defaults)
        assert (await actuator.apply(Plan(1, rollback), TOPOLOGY)).outcome is Outcome.APPLIED
        assert (await actuator.apply(Plan(2, rollback), TOPOLOGY)).outcome is Outcome.UNCHANGED
        assert (await actuator.apply(Plan(3, {}), TOPOLOGY)).outcome is Outcome.APPLIED
        assert state["policy"] == {}
        # A reading that fails is no reading: the next document is sent rather than compared with an old one.
        assert await actuator.observe(TOPOLOGY) is not None
        server.status = 503
        assert await actuator.observe(TOPOLOGY) is None
        server.status = 200
        sent = len(server.calls)
        assert (await actuator.apply(Plan(4, {}), TOPOLOGY)).outcome is Outcome.APPLIED
        assert [m for m, _, _ in server.calls[sent:]] == ["GET", "PUT"], "the generation is read, then the PUT"
    finally:
        await actuator.close()


async def test_router_actuator_reports_a_router_running_another_policy_than_it_put_in_force(
    admin: tuple[FakeServer, dict[str, Any]],
) -> None:
    """A drift is a router running another policy than the one this actuator last put there: after a restart
    (its generation back below ours) or another writer's change; never before anything was put, nor on a failed
    reading."""
    server, state = admin
    actuator = RouterActuator(server.url, TOKEN, timeout_s=2.0)
    rag = RoutingThresholds(min_remote_input_tokens=2048)
    ours = policy_document(BASE, ControlAction(thresholds={"rag": rag}))
    try:
        state["policy"] = {"mode": "aggregated_only"}
        assert await actuator.observe(TOPOLOGY) is not None
        assert actuator.policy_drift is None, "nothing put yet: whatever runs is no drift"
        assert (await actuator.apply(Plan(1, ours), TOPOLOGY)).outcome is Outcome.APPLIED
        assert await actuator.observe(TOPOLOGY) is not None
        assert actuator.policy_drift is None
        state["generation"], state["policy"] = 0, {}  # the router restarted onto its file's (default) policy
        assert await actuator.observe(TOPOLOGY) is not None
        assert actuator.policy_drift == (
            f"router {server.url} runs another policy (generation 0) than the one published at generation 2 "
            "(it restarted)"
        )
        server.status = 503
        assert await actuator.observe(TOPOLOGY) is None
        assert actuator.policy_drift is None, "a failed reading says nothing"
        server.status = 200
        state["generation"], state["policy"] = 5, {"mode": "aggregated_only"}
        assert await actuator.observe(TOPOLOGY) is not None
        assert actuator.policy_drift is not None
        assert actuator.policy_drift.endswith("(another writer)")
        # Found already in force when about to send it counts as put: the same policy again is no drift.
        state["policy"] = json.loads(json.dumps(ours))
        assert await actuator.observe(TOPOLOGY) is not None
        assert actuator.policy_drift is None
    finally:
        await actuator.close()


async def test_the_loop_publishes_its_table_again_to_a_router_that_restarted(
    tmp_path: Path, admin: tuple[FakeServer, dict[str, Any]]
) -> None:
    """Regression: a router restarted under a steady controller ran its own file's policy until the controller's
    policy next changed a threshold, because the loop publishes only what changed since its last publication."""
    from tests.controller.test_loop import FakeReader, make_config, make_runtime, surge

    server, state = admin
    router = {"kind": "router", "url": server.url, "token": TOKEN, "timeout_s": 2.0}
    config = make_config(tmp_path, policy="baseline:dynamo-legacy", actuators=[router])
    telemetry = Telemetry(CollectorRegistry())
    loop = ControlLoop(
        make_runtime(config, FakeReader(surge())), VirtualClock(), telemetry, AuditLog(None), OverrideWatcher(None)
    )
    drifts = "pdctl_controller_router_policy_drifts_total"
    try:
        first = await loop.tick()
        assert first.plan.policy_document is not None
        published = state["policy"]
        steady = await loop.tick()
        assert steady.plan.policy_document is None, "nothing changed: nothing published"
        state["generation"], state["policy"] = 0, {}  # restarted onto its file's policy
        after = await loop.tick()
        assert after.plan.policy_document is not None, "the whole table goes out again"
        assert state["policy"] == published
        assert after.record["policy_drift"][0].endswith("(it restarted)")
        assert telemetry.registry.get_sample_value(drifts) == 1.0
        again = await loop.tick()
        assert again.plan.policy_document is None
        assert "policy_drift" not in again.record
        assert telemetry.registry.get_sample_value(drifts) == 1.0
    finally:
        await loop.runtime.close()


async def test_router_actuator_pending_clears_once_the_role_change_settles(
    admin: tuple[FakeServer, dict[str, Any]],
) -> None:
    """Regression: the pending count of a group whose instances all settled must return to zero (observed on
    the previous tick's topology, a stale pending count held every later pool change)."""
    server, state = admin
    actuator = RouterActuator(server.url, TOKEN, timeout_s=2.0)
    try:
        await actuator.apply(Plan(1, None, {"g": PoolTargets(2, 1)}), TOPOLOGY)
        draining = await actuator.observe(TOPOLOGY)
        assert draining is not None
        assert draining.pending["g"] == (1, 0)
        for inst in state["instances"]:  # the router finishes the drain
            if inst["pending_role"]:
                inst["role"], inst["pending_role"] = inst["pending_role"], None
        settled = await actuator.observe(draining)
        assert settled is not None
        assert settled.pending["g"] == (0, 0)
        assert settled.pools["g"] == PoolTargets(2, 1)
    finally:
        await actuator.close()


async def test_router_actuator_rejected_and_unauthorized(admin: tuple[FakeServer, dict[str, Any]]) -> None:
    server, _ = admin
    wrong = RouterActuator(server.url, "wrong", timeout_s=2.0)
    try:
        assert not await wrong.ready()
        result = await wrong.apply(Plan(1, {"x": 1}), TOPOLOGY)
        assert result.outcome is Outcome.REJECTED
        assert not wrong.latch.set, "a refusal changed nothing: no latch"
    finally:
        await wrong.close()
    down = RouterActuator("http://127.0.0.1:9", TOKEN, timeout_s=1.0)
    try:
        result = await down.apply(Plan(1, {"x": 1}), TOPOLOGY)
        assert result.outcome is Outcome.FAILED
        assert await down.observe(TOPOLOGY) is None
    finally:
        await down.close()


async def test_unknown_outcome_is_not_retried_until_state_is_read_back(
    admin: tuple[FakeServer, dict[str, Any]],
) -> None:
    server, _ = admin
    actuator = RouterActuator(server.url, TOKEN, timeout_s=0.3)
    try:
        assert await actuator.observe(TOPOLOGY) is not None
        server.delay_s = 1.0
        first = await actuator.apply(Plan(1, {"description": "one"}, {"g": PoolTargets(2, 1)}), TOPOLOGY)
        assert first.outcome is Outcome.UNKNOWN
        assert actuator.latch.set
        sent = len(server.calls)
        held = await actuator.apply(Plan(2, {"p": 2}), TOPOLOGY)
        assert held.outcome is Outcome.HELD
        assert len(server.calls) == sent, "nothing sent while the outcome is unknown"
        server.delay_s = 0.0
        await asyncio.sleep(1.0)  # the slow first PUT completes on the server: its outcome was "applied"
        assert await actuator.observe(TOPOLOGY) is not None
        assert not actuator.latch.set
        # The state read back shows the document in force: it is not sent a second time.
        sent = len(server.calls)
        assert (await actuator.apply(Plan(3, {"description": "one"}), TOPOLOGY)).outcome is Outcome.UNCHANGED
        assert len(server.calls) == sent
        # Free text puts nothing new in force: not sent either.
        assert (await actuator.apply(Plan(3, {"description": "two"}), TOPOLOGY)).outcome is Outcome.UNCHANGED
        assert len(server.calls) == sent
        assert (await actuator.apply(Plan(3, {"mode": "aggregated_only"}), TOPOLOGY)).outcome is Outcome.APPLIED
        server.status = 503
        rollback_rag = {"tenants": [{"name": "rag", "mode": "aggregated_only"}]}
        assert (await actuator.apply(Plan(4, rollback_rag), TOPOLOGY)).outcome is Outcome.UNKNOWN
    finally:
        await actuator.close()


@pytest.fixture
async def kube() -> AsyncIterator[tuple[FakeServer, dict[str, dict[str, int]]]]:
    """A minimal API server: GET/PATCH of apps/v1 Deployment and StatefulSet ``scale`` subresources."""
    replicas: dict[str, dict[str, int]] = {
        "deployments/prefill": {"spec": 1, "status": 1},
        "deployments/decode": {"spec": 3, "status": 3},
    }
    server = FakeServer("")

    async def scale(request: web.Request) -> web.Response:
        namespace, kind, name = request.match_info["ns"], request.match_info["kind"], request.match_info["name"]
        body = await request.read()
        server.calls.append((request.method, request.path, body.decode() or None))
        await asyncio.sleep(server.delay_s)
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"kind": "Status", "status": "Failure", "code": 401}, status=401)
        key = f"{kind}/{name}"
        if key not in replicas:
            return web.json_response(
                {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}, status=404
            )
        if request.method == "PATCH":
            if request.headers.get("Content-Type") != "application/merge-patch+json":
                return web.json_response({"kind": "Status", "code": 415}, status=415)
            replicas[key]["spec"] = json.loads(body)["spec"]["replicas"]
        value = replicas[key]
        return web.json_response(
            {
                "kind": "Scale",
                "apiVersion": "autoscaling/v1",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"replicas": value["spec"]},
                "status": {"replicas": value["status"], "selector": f"app={name}"},
            }
        )

    app = web.Application()
    app.router.add_route("*", "/apis/apps/v1/namespaces/{ns}/{kind}/{name}/scale", scale)
    runner, server.url = await _serve(app)
    try:
        yield server, replicas
    finally:
        await runner.cleanup()


def kube_actuator(url: str, timeout_s: float = 2.0, token: str = TOKEN) -> KubernetesActuator:
    workloads = (Workload("Deployment", "prefill"), Workload("Deployment", "decode"))
    return KubernetesActuator(url, "serving", token, {"g": workloads}, timeout_s)


def test_scale_paths() -> None:
    assert scale_path("ns", Workload("StatefulSet", "x")) == "/apis/apps/v1/namespaces/ns/statefulsets/x/scale"


async def test_kubernetes_actuator_reads_and_patches_scale(kube: tuple[FakeServer, dict[str, dict[str, int]]]) -> None:
    server, replicas = kube
    actuator = kube_actuator(server.url)
    try:
        assert await actuator.ready()
        observed = await actuator.observe(Topology())
        assert observed is not None
        assert observed.pools["g"] == PoolTargets(1, 3)
        result = await actuator.apply(Plan(1, pools={"g": PoolTargets(2, 3)}), observed)
        assert result.outcome is Outcome.APPLIED
        patches = [c for c in server.calls if c[0] == "PATCH"]
        assert patches == [
            ("PATCH", "/apis/apps/v1/namespaces/serving/deployments/prefill/scale", '{"spec": {"replicas": 2}}')
        ]
        assert replicas["deployments/prefill"]["spec"] == 2
        # Asked for but not ready yet → pending.
        observed = await actuator.observe(observed)
        assert observed is not None
        assert observed.pending["g"] == (1, 0)
    finally:
        await actuator.close()


async def test_kubernetes_actuator_errors(kube: tuple[FakeServer, dict[str, dict[str, int]]]) -> None:
    server, _ = kube
    wrong = kube_actuator(server.url, token="nope")
    try:
        assert await wrong.observe(Topology()) is None
        result = await wrong.apply(Plan(1, pools={"g": PoolTargets(2, 3)}), Topology(pools={"g": PoolTargets(1, 3)}))
        assert result.outcome is Outcome.REJECTED
    finally:
        await wrong.close()
    slow = kube_actuator(server.url, timeout_s=0.3)
    try:
        server.delay_s = 1.0
        result = await slow.apply(Plan(1, pools={"g": PoolTargets(1, 4)}), Topology(pools={"g": PoolTargets(1, 3)}))
        assert result.outcome is Outcome.UNKNOWN
        held = await slow.apply(Plan(2, pools={"g": PoolTargets(1, 4)}), Topology(pools={"g": PoolTargets(1, 3)}))
        assert held.outcome is Outcome.HELD
        server.delay_s = 0.0
        assert await slow.observe(Topology()) is not None
        assert not slow.latch.set
    finally:
        await slow.close()


async def test_dry_run_records_and_simulates() -> None:
    actuator = DryRunActuator()
    topology = Topology(pools={"g": PoolTargets(1, 3)})
    assert await actuator.observe(topology) == topology
    await actuator.apply(Plan(1, pools={"g": PoolTargets(2, 2)}), topology)
    assert len(actuator.records) == 1
    observed = await actuator.observe(topology)
    assert observed is not None
    assert observed.pools["g"] == PoolTargets(2, 2)


async def test_loop_scales_kubernetes_deployments(
    tmp_path: Path, kube: tuple[FakeServer, dict[str, dict[str, int]]]
) -> None:
    """No instance list: pool counts come from the scale subresources, placement from series labels."""
    from tests.controller.test_loop import INST, FakeReader, R, make_config, make_runtime

    server, replicas = kube
    replicas["deployments/prefill"] = {"spec": 1, "status": 1}
    replicas["deployments/decode"] = {"spec": 1, "status": 1}
    k8s = {
        "kind": "kubernetes",
        "api_url": server.url,
        "namespace": "serving",
        "token": TOKEN,
        "groups": {"g": {"prefill": {"name": "prefill"}, "decode": {"name": "decode"}}},
    }
    config = make_config(tmp_path, instances=[], actuators=[k8s])
    results = {
        R["requests"]: [
            ({"tenant": "chat", "route": "local_prefill", "outcome": "ok"}, 10.0),
            ({"tenant": "rag", "route": "local_prefill", "outcome": "ok"}, 10.0),
        ],
        R["ttft_0.95"]: [({"tenant": "chat"}, 0.1), ({"tenant": "rag"}, 0.01)],
        R["tpot_0.95"]: [({"tenant": "chat"}, 0.01), ({"tenant": "rag"}, 5.0)],
        INST["kv_usage"]: [({"instance_id": "decode-0", "group": "g", "role": "decode"}, 0.5)],
    }
    loop = ControlLoop(
        make_runtime(config, FakeReader(Readout(results, 10.0, 0.0))),
        VirtualClock(),
        Telemetry(CollectorRegistry()),
        AuditLog(None),
        OverrideWatcher(None),
    )
    try:
        record = await loop.tick()
        assert record.window.groups["g"].num_decode == 1
        assert record.window.groups["g"].decode_kv_usage_frac == 0.5
        assert record.plan.pools == {"g": PoolTargets(1, 2)}, "TPOT over objective with budget room: add decode"
        assert [r.outcome for r in record.results] == [Outcome.APPLIED]
        assert replicas["deployments/decode"]["spec"] == 2
        # The new replica is not ready yet: the next tick sees it pending and holds.
        second = await loop.tick()
        assert second.window.groups["g"].pending_decode == 1
        assert second.plan.pools == {}
    finally:
        await loop.runtime.close()


async def test_kubernetes_token_file_is_reread_when_rotated(
    tmp_path: Path, kube: tuple[FakeServer, dict[str, dict[str, int]]]
) -> None:
    import os

    server, _ = kube
    token_file = tmp_path / "token"
    token_file.write_text("expired\n")
    workloads = (Workload("Deployment", "prefill"), Workload("Deployment", "decode"))
    actuator = KubernetesActuator(server.url, "serving", None, {"g": workloads}, 2.0, token_file=token_file)
    try:
        assert await actuator.observe(Topology()) is None
        token_file.write_text(f"{TOKEN}\n")
        stat = token_file.stat()
        os.utime(token_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
        assert await actuator.observe(Topology()) is not None
    finally:
        await actuator.close()
