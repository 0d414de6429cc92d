"""Router memory per 1,000 concurrent streams.

The router (``pdctl router``, its own process; request log and metrics on) sits in front of one emulated decode
instance (in the client's process) that admits every stream at once (``max_num_seqs`` 1,200) and generates
slowly (time scale 10), so 1,000 streaming completions stay open together. Per repeat, a fresh router process:
its resident set (``VmRSS`` from ``/proc``) at rest after a warm-up, then with all 1,000 streams open and past
their first token (the largest of three readings 0.3 s apart), then after every stream was closed and the router
reports no request in flight; then a second cycle. *Per 1,000 streams* = open − at rest. CPython's allocator
keeps freed arenas, so RSS stays near its high-water mark after the streams close; the leak check is that a
second cycle of 1,000 streams does not grow it further.

Run: ``PYTHONHASHSEED=0 python -m pytest benchmarks/router/test_router_memory.py -m benchmark -q -s -p no:randomly``
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml
from harness import figure, write_fragment

from env.scenario import ClusterConfig
from livestack.emulator import EmulatorHost, InstanceSpec

REPO = Path(__file__).resolve().parents[2]
COMMAND = "PYTHONHASHSEED=0 python -m pytest benchmarks/router/test_router_memory.py -m benchmark -q -s -p no:randomly"
STREAMS = 1000
REPEATS = 3
TIME_SCALE = 10.0


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def _in_flight(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    match = re.search(r"^pdctl_router_in_flight_requests (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else -1.0


async def _open_stream(
    session: aiohttp.ClientSession, url: str, k: int, started: list[int], event: asyncio.Event
) -> None:
    body = {"prompt": f"stream {k} " * 5, "max_tokens": 400, "stream": True}
    async with session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        await resp.content.readany()
        started.append(k)
        if len(started) == STREAMS:
            event.set()
        await asyncio.sleep(3600)  # held open until cancelled


async def _cycle(session: aiohttp.ClientSession, url: str, pid: int) -> tuple[float, float]:
    """Open ``STREAMS`` streams, read the router's RSS, close them all; (RSS open, RSS after) in MiB."""
    started: list[int] = []
    event = asyncio.Event()
    tasks = [asyncio.create_task(_open_stream(session, url, k, started, event)) for k in range(STREAMS)]
    try:
        deadline = asyncio.get_running_loop().time() + 300
        while not event.is_set():
            failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
            if failed:
                raise failed[0].exception()  # type: ignore[misc]
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"only {len(started)} of {STREAMS} streams started within 300 s")
            await asyncio.sleep(0.2)
        assert await _in_flight(session, url) == STREAMS
        readings = []
        for _ in range(3):
            readings.append(_rss_mib(pid))
            await asyncio.sleep(0.3)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    for _ in range(200):
        if await _in_flight(session, url) == 0:
            break
        await asyncio.sleep(0.1)
    assert await _in_flight(session, url) == 0
    await asyncio.sleep(1.0)
    return max(readings), _rss_mib(pid)


async def _one_router(tmp: Path, upstream: str) -> dict[str, float]:
    """A fresh router process: RSS at rest, with the streams open, after, and after a second cycle."""
    config = tmp / "router.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": {"host": "127.0.0.1", "port": 0},
                "instances": [{"id": "d0", "url": upstream, "role": "decode", "max_num_seqs": 1200}],
                "request_log": str(tmp / "requests.jsonl"),
            }
        )
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pdctl", "router", "--config", str(config), "--log-level", "WARNING",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=str(REPO),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            while True:
                line = (await proc.stdout.readline()).decode()
                assert line, "router exited"
                if "router listening on" in line:
                    url = re.search(r"http://[0-9.:]+", line).group(0)  # type: ignore[union-attr]
                    break
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
            for _ in range(50):  # warm-up: pools, code paths, log buffers
                async with session.post(url + "/v1/completions", json={"prompt": "w", "max_tokens": 2}) as r:
                    await r.read()
            await asyncio.sleep(1.0)
            rest = _rss_mib(proc.pid)
            open_mib, after = await _cycle(session, url, proc.pid)
            open_again, after_again = await _cycle(session, url, proc.pid)
        result = {"rest": rest, "open": open_mib, "after": after, "open2": open_again, "after2": after_again}
        print("\nrouter RSS (MiB): " + ", ".join(f"{k} {v:.1f}" for k, v in result.items()))
        return result
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def _measure(tmp: Path) -> list[dict[str, float]]:
    cluster = ClusterConfig(max_num_seqs=1200, max_num_batched_tokens=16384, kv_capacity_tokens=2_000_000)
    host = EmulatorHost(cluster, [InstanceSpec("d0")], time_scale=TIME_SCALE)
    await host.start()
    try:
        results = []
        for k in range(REPEATS):
            (tmp / str(k)).mkdir()
            results.append(await _one_router(tmp / str(k), host.urls["d0"]))
        return results
    finally:
        await host.stop()


@pytest.mark.benchmark
@pytest.mark.timeout(900)
def test_router_memory_per_thousand_streams(tmp_path: Path) -> None:
    results = asyncio.run(_measure(tmp_path))
    per_thousand = [(r["open"] - r["rest"]) * 1000 / STREAMS for r in results]
    second = [r["open2"] - r["open"] for r in results]
    write_fragment(
        "router_memory",
        "Router memory per 1,000 concurrent streams",
        COMMAND,
        [
            figure("router RSS growth per 1,000 open streams", "1,000 SSE streams via the router, log + metrics on",
                   "MiB", per_thousand, repeat="fresh router process", better="lower"),
            figure("router RSS at rest", "after a 50-request warm-up", "MiB", [r["rest"] for r in results],
                   repeat="router process", better="lower"),
            figure("RSS after the streams closed", "after the first cycle", "MiB", [r["after"] for r in results],
                   repeat="router process", better="lower"),
            figure("RSS growth of a second 1,000-stream cycle", "open (2nd) - open (1st)", "MiB", second,
                   repeat="router process", target="~0 (no leak)", better="lower"),
        ],
        notes="VmRSS of the router process. Per stream the router holds the client connection, the upstream "
        "connection, the handler task, the request record and the relay buffers.",
    )  # fmt: skip
    assert all(p > 0 for p in per_thousand)
    # a second cycle reuses what the first one allocated: memory does not grow per cycle (no leak per stream)
    assert max(second) < 0.25 * min(per_thousand)
