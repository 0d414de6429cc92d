"""A live emulated cluster plus router on loopback, for integration tests and benchmarks."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from env.scenario import ClusterConfig
from livestack.emulator import EmulatorHost, FaultConfig, InstanceSpec
from router.app import Router
from router.config import RouterConfig

ADMIN_TOKEN = "test-admin-token"
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class LiveCluster:
    host: EmulatorHost
    router: Router
    session: aiohttp.ClientSession
    log_path: Path

    @property
    def url(self) -> str:
        return self.router.url

    def records(self) -> list[dict[str, Any]]:
        assert self.router.log is not None
        return self.router.log.records()

    def admin_headers(self, token: str = ADMIN_TOKEN) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


@dataclass
class StreamResult:
    status: int
    events: list[Any]
    done: bool
    text: str
    usage: dict[str, Any] | None
    errors: list[dict[str, Any]]


def parse_sse(raw: bytes) -> tuple[list[Any], bool]:
    events: list[Any] = []
    done = False
    for block in raw.decode().split("\n\n"):
        block = block.strip()
        if not block:
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        if payload == "[DONE]":
            done = True
            continue
        assert not done, "event after [DONE]"
        events.append(json.loads(payload))
    return events, done


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    path: str = "/v1/completions",
) -> StreamResult:
    async with session.post(url + path, json={**body, "stream": True}, headers=headers or {}) as resp:
        raw = await resp.read()
    if resp.status != 200:
        return StreamResult(resp.status, [json.loads(raw)], False, "", None, [json.loads(raw)])
    events, done = parse_sse(raw)
    errors = [e["error"] for e in events if "error" in e]
    texts: list[str] = []
    usage = None
    for e in events:
        if "error" in e:
            continue
        if e.get("usage") and not e.get("choices"):
            usage = e["usage"]
        for choice in e.get("choices", []):
            texts.append(choice.get("text") or choice.get("delta", {}).get("content") or "")
    return StreamResult(resp.status, events, done, "".join(texts), usage, errors)


@asynccontextmanager
async def live_cluster(
    tmp_path: Path,
    num_prefill: int = 1,
    num_decode: int = 1,
    faults: FaultConfig | None = None,
    policy_yaml: str | None = None,
    extra_instances: list[dict[str, str]] | None = None,
    router_overrides: dict[str, Any] | None = None,
    cluster: ClusterConfig | None = None,
    time_scale: float = 1.0,
) -> AsyncIterator[LiveCluster]:
    """Emulated instances ``p0..``, ``d0..`` (in this process) and a router in front of them."""
    specs = [InstanceSpec(f"p{i}", faults=faults or FaultConfig()) for i in range(num_prefill)]
    specs += [InstanceSpec(f"d{i}", faults=faults or FaultConfig()) for i in range(num_decode)]
    host = EmulatorHost(cluster or ClusterConfig(), specs, time_scale=time_scale)
    await host.start()
    policy_path = None
    if policy_yaml is not None:
        policy_path = tmp_path / "policy.yaml"
        policy_path.write_text(policy_yaml)
    instances = [
        {"id": i, "url": u, "role": "prefill" if i.startswith("p") else "decode"} for i, u in host.urls.items()
    ]
    instances.extend(extra_instances or [])
    log_path = tmp_path / "requests.jsonl"
    config = RouterConfig.model_validate(
        {
            "listen": {"host": "127.0.0.1", "port": 0},
            "instances": instances,
            "policy_file": policy_path,
            "admin_token": ADMIN_TOKEN,
            "request_log": log_path,
            "health": {"interval_s": 0.2, "timeout_s": 0.5},
            **(router_overrides or {}),
        }
    )
    router = Router(config)
    await router.start()
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    try:
        yield LiveCluster(host, router, session, log_path)
    finally:
        await session.close()
        await router.stop()
        await host.stop()


@asynccontextmanager
async def emulator_process(
    args: Sequence[str], timeout_s: float = 20.0
) -> AsyncIterator[tuple[asyncio.subprocess.Process, dict[str, str]]]:
    """``python -m livestack.emulator ARGS`` in its own process; yields it and its instance URLs. Always reaped."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "livestack.emulator", "--base-port", "0", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, cwd=str(REPO_ROOT),
    )  # fmt: skip
    urls: dict[str, str] = {}
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(timeout_s):
            while True:
                line = (await proc.stdout.readline()).decode()
                if not line:
                    raise RuntimeError("emulator process exited before it was ready")
                parts = line.split()
                if len(parts) == 3 and parts[0] == "emulator":
                    urls[parts[1]] = parts[2]
                    if len(urls) >= _expected(args):
                        break
        yield proc, urls
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


def _expected(args: Sequence[str]) -> int:
    total = 0
    for flag, default in (("--prefill", 1), ("--decode", 1)):
        total += int(args[list(args).index(flag) + 1]) if flag in args else default
    return total
