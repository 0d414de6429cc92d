"""The live stack for controller integration tests: emulated instances + router (in this process, from the
router helper's ``tests.router.cluster``), a real Prometheus scraping them, and the controller daemon in its
own process, acting on the router's admin API."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp

from livestack.emulator import FaultConfig
from livestack.emulator.tokenizer import prompt_text
from tests.controller.harness import (
    ControllerProcess,
    PrometheusServer,
    audit_records,
    controller,
    prometheus,
    wait_until,
)
from tests.router.cluster import ADMIN_TOKEN, LiveCluster, live_cluster, stream_request

POLICY = """
pd_disaggregation_policy:
  remote_prefill: {min_input_tokens: 4096, min_expected_output_tokens: 1, require_decode_pool_pressure: false}
  local_prefill: {max_input_tokens: 2048}
slo: {ttft_p95_ms: 5000, tpot_p95_ms: 1000}
tenant_groups:
  - {name: interactive, gpu_budget: 3, pools: {prefill: {min: 1, max: 2}, decode: {min: 1, max: 2}}}
tenants:
  - {name: chat, group: interactive, match: {tenant_ids: [chat]}}
  - {name: rag, group: interactive, slo: {ttft_p95_ms: 20, tpot_p95_ms: 1000}, match: {tenant_ids: [rag]}}
"""
"""Both tenants share one group of three instances (p0 prefill, d0 and d1 decode); the RAG tenant's TTFT
objective (20 ms) is missed by any 3000-token prompt, the chat tenant's (5 s) is not."""

INTERVAL_S = 1.0


@dataclass
class Stack:
    cluster: LiveCluster
    prometheus: PrometheusServer
    controller: ControllerProcess
    config: dict[str, Any]
    tmp_path: Path
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def audit_path(self) -> Path:
        return Path(self.config["audit_log"])

    @property
    def override_dir(self) -> Path:
        return Path(self.config["override_dir"])

    def audit(self) -> list[dict[str, Any]]:
        return audit_records(self.audit_path)

    async def state(self) -> dict[str, Any]:
        async with self.cluster.session.get(
            f"{self.cluster.url}/admin/state", headers=self.cluster.admin_headers()
        ) as response:
            assert response.status == 200
            body: dict[str, Any] = await response.json()
            return body

    async def request(self, tenant: str, prompt_tokens: int, salt: str, max_tokens: int = 8) -> int:
        body = {"max_tokens": max_tokens, "prompt": prompt_text(prompt_tokens, salt=salt)}
        try:
            result = await stream_request(self.cluster.session, self.cluster.url, body, {"X-Tenant-Id": tenant})
        except (aiohttp.ClientError, TimeoutError):
            return 0
        return result.status

    def trickle(self, tenant: str, prompt_tokens: int, period_s: float, concurrency: int = 1) -> None:
        """Background load: ``concurrency`` requests every ``period_s`` until the stack closes."""

        async def run() -> None:
            n = 0
            while True:
                n += 1
                await asyncio.gather(
                    *(self.request(tenant, prompt_tokens, f"{tenant}-{n}-{j}") for j in range(concurrency))
                )
                await asyncio.sleep(period_s)

        self.tasks.append(asyncio.create_task(run()))

    async def wait_for_data(self, tenant: str, timeout_s: float = 30.0) -> None:
        """Until a tick saw fresh data with a request rate for ``tenant``."""

        def seen() -> bool:
            for record in reversed(self.audit()):
                obs = record["observation"]
                rate = obs["tenants"].get(tenant, {}).get("request_rate_rps")
                if obs["source_error"] is None and rate is not None and obs["staleness_s"] < 3:
                    return True
            return False

        await wait_until(seen, timeout_s, what=f"fresh data for {tenant}")


def controller_config(
    tmp_path: Path,
    cluster: LiveCluster,
    prometheus_url: str,
    source_kind: str = "prometheus",
    policy_yaml: str = POLICY,
    **overrides: Any,
) -> dict[str, Any]:
    """Controller config for the stack; ``source_kind="scrape"`` uses the built-in scraper instead of Prometheus."""
    policy_path = tmp_path / "controller-policy.yaml"
    policy_path.write_text(policy_yaml)
    (tmp_path / "overrides").mkdir(exist_ok=True)
    config: dict[str, Any] = {
        "mode": "active",
        "interval_s": INTERVAL_S,
        "policy": "baseline:queue_kv",
        "policy_file": str(policy_path),
        "override_dir": str(tmp_path / "overrides"),
        "audit_log": str(tmp_path / "audit.jsonl"),
        "lease_file": str(tmp_path / "controller.lease"),
        "source": (
            {"kind": "prometheus", "url": prometheus_url, "window_s": 5.0, "timeout_s": 2.0}
            if source_kind == "prometheus"
            else {"kind": "scrape", "router_metrics_url": f"{cluster.url}/metrics", "window_s": 5.0, "timeout_s": 2.0}
        ),
        "instances": [
            {"id": iid, "group": "interactive", "role": "prefill" if iid.startswith("p") else "decode", "url": url}
            for iid, url in cluster.host.urls.items()
        ],
        "actuators": [{"kind": "router", "url": cluster.url, "token": ADMIN_TOKEN, "timeout_s": 3.0}],
        "guard": {"max_step_per_tick": 1, "cooldown_s": 3.0, "hysteresis_ticks": 2, "max_staleness_s": 3.0},
    }
    config.update(overrides)
    return config


@contextlib.asynccontextmanager
async def live_stack(
    tmp_path: Path,
    source_kind: str = "prometheus",
    *,
    policy_yaml: str = POLICY,
    num_prefill: int = 1,
    num_decode: int = 2,
    faults: FaultConfig | None = None,
    router_overrides: dict[str, Any] | None = None,
    **overrides: Any,
) -> AsyncIterator[Stack]:
    """The stack of one group ``interactive`` (``p0..`` prefill, ``d0..`` decode) under ``policy_yaml``.

    ``faults`` are injected into every emulated instance, ``router_overrides`` merged into the router's config and
    ``overrides`` into the controller's (:func:`controller_config`).
    """
    async with live_cluster(
        tmp_path,
        num_prefill=num_prefill,
        num_decode=num_decode,
        faults=faults,
        policy_yaml=policy_yaml,
        router_overrides=router_overrides,
    ) as cluster:
        instances = {iid: (url, "interactive") for iid, url in cluster.host.urls.items()}
        with prometheus(tmp_path, cluster.url, instances) as prom:
            config = controller_config(tmp_path, cluster, prom.url, source_kind, policy_yaml=policy_yaml, **overrides)
            # The controller process is started in a thread so that the in-process servers keep serving.
            ctx = controller(config, tmp_path)
            process = await asyncio.to_thread(ctx.__enter__)
            stack = Stack(cluster, prom, process, config, tmp_path)
            try:
                yield stack
            finally:
                for task in stack.tasks:
                    task.cancel()
                for task in stack.tasks:
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                await asyncio.to_thread(ctx.__exit__, None, None, None)


def expires_in(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


async def poll_state(
    stack: Stack, predicate: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        state = await stack.state()
        return state if predicate(state) else None

    result: dict[str, Any] = await wait_until(check, timeout_s, what=what)
    return result
