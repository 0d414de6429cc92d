"""What a client sees under injected faults: every request ends ok, failed (cleanly) or lost.

* **ok**: HTTP 200, the whole stream (``[DONE]``, no error event) and exactly the text the emulator generates
  for that prompt (:func:`livestack.emulator.tokenizer.generated_text`): nothing dropped, duplicated or corrupted;
* **failed**: the client was told, within the bound: an HTTP error status with a JSON error body, an SSE error
  event followed by ``[DONE]``, or a refused/closed connection;
* **lost**: anything else: no answer within the bound (a hang), a 200 stream that ends without ``[DONE]`` and
  without an error, a 200 with the wrong text, or an error body that is not the documented JSON shape.

Load is always a fixed number of requests (bounded, self-stopping) with a client-side time bound on each. Every
case runs at least :data:`NUM_REQUESTS` requests at a concurrency of at least :data:`CONCURRENCY`, and
cross-checks the client's count with the router's own ``pdctl_router_requests_total{outcome}``
(:class:`RouterCounts`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from livestack.emulator.tokenizer import generated_text, prompt_text

REQUEST_BOUND_S = 30.0
"""No request may take longer than this (client side) in any chaos case: past it, it counts as lost."""
NUM_REQUESTS = 1000
"""Requests of each case's fault phase (at least)."""
CONCURRENCY = 100
"""Requests in flight at once in each case's fault phase (at least)."""
TIME_SCALE = 0.1
"""Wall seconds per emulated second of the emulated instances (10x faster), unless a case says otherwise."""


def client_session() -> aiohttp.ClientSession:
    """A client pool without a connection cap (aiohttp's default of 100 would cap the concurrency)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=REQUEST_BOUND_S)
    )


@dataclass(frozen=True)
class Outcome:
    request_id: str
    kind: str  # "ok" | "failed" | "lost"
    latency_s: float
    detail: str = ""


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)
    concurrency: int = 0
    """The most requests in flight at once over the loads added (client side)."""
    wall_s: float = 0.0
    """Wall seconds of the loads added."""

    def extend(self, items: Sequence[Outcome]) -> None:
        self.outcomes.extend(items)

    def add(self, run: LoadRun) -> None:
        """Add a finished :func:`load` run."""
        self.outcomes.extend(run.outcomes)
        self.concurrency = max(self.concurrency, run.peak_in_flight)
        self.wall_s += run.wall_s

    def count(self, kind: str) -> int:
        return sum(1 for o in self.outcomes if o.kind == kind)

    @property
    def sent(self) -> int:
        return len(self.outcomes)

    def p99_ms(self) -> float | None:
        lat = [o.latency_s for o in self.outcomes if o.kind == "ok"]
        return float(np.percentile(lat, 99)) * 1e3 if lat else None

    def failures(self) -> dict[str, int]:
        """How many requests failed, by the start of their detail (for assertion messages)."""
        return dict(Counter(o.detail[:80] for o in self.outcomes if o.kind == "failed"))

    def lost_details(self) -> list[str]:
        return [f"{o.request_id}: {o.detail}" for o in self.outcomes if o.kind == "lost"]


@dataclass
class LoadRun:
    """One bounded load: its outcomes (filled as requests end), peak in-flight count and wall time."""

    outcomes: list[Outcome] = field(default_factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0
    wall_s: float = 0.0


@dataclass(frozen=True)
class RouterCounts:
    """The router's own counters over a phase (differences of ``/metrics`` readings)."""

    ok: int
    error: int
    migrations: int
    """Streams resumed on another decode instance (``pdctl_router_migrations_total{outcome="completed"}``)."""
    migration_outcomes: dict[str, int]

    def __sub__(self, other: RouterCounts) -> RouterCounts:
        keys = set(self.migration_outcomes) | set(other.migration_outcomes)
        return RouterCounts(
            self.ok - other.ok,
            self.error - other.error,
            self.migrations - other.migrations,
            {k: self.migration_outcomes.get(k, 0) - other.migration_outcomes.get(k, 0) for k in keys},
        )


async def router_counts(session: aiohttp.ClientSession, url: str) -> RouterCounts:
    """Read ``pdctl_router_requests_total`` (summed over tenants and routes) and the migration counters."""
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    outcomes: dict[str, float] = {}
    migrations: dict[str, float] = {}
    for line in text.splitlines():
        for name, into in (("pdctl_router_requests_total{", outcomes), ("pdctl_router_migrations_total{", migrations)):
            if line.startswith(name):
                labels, value = line.rsplit(" ", 1)
                outcome = labels.split('outcome="', 1)[1].split('"', 1)[0]
                into[outcome] = into.get(outcome, 0.0) + float(value)
    return RouterCounts(
        int(outcomes.get("ok", 0)),
        int(outcomes.get("error", 0)),
        int(migrations.get("completed", 0)),
        {k: int(v) for k, v in migrations.items()},
    )


async def settled_counts(
    session: aiohttp.ClientSession, url: str, before: RouterCounts, expected: int, wait_s: float = 5.0
) -> RouterCounts:
    """The router's counters since ``before`` once it has recorded ``expected`` requests (or after ``wait_s``).

    A client can read a stream's end a moment before the router's handler records it.
    """
    deadline = time.monotonic() + wait_s
    while True:
        counts = await router_counts(session, url) - before
        if counts.ok + counts.error >= expected or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.05)


def body_for(request_id: str, prompt_tokens: int, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    return {"prompt": prompt_text(prompt_tokens, salt=request_id), "max_tokens": max_tokens, "stream": stream}


def _classify_sse(raw: bytes, expected: str) -> tuple[str, str]:
    events: list[Any] = []
    done = False
    for block in raw.decode(errors="replace").split("\n\n"):
        block = block.strip()
        if not block:
            continue
        if not block.startswith("data: "):
            return "lost", f"not an SSE event: {block[:80]!r}"
        payload = block[len("data: ") :]
        if payload == "[DONE]":
            done = True
            continue
        if done:
            return "lost", "event after [DONE]"
        try:
            events.append(json.loads(payload))
        except ValueError:
            return "lost", f"unparsable event {payload[:80]!r}"
    errors = [e["error"] for e in events if isinstance(e, dict) and "error" in e]
    if errors:
        if done and all(isinstance(e, dict) and e.get("message") for e in errors):
            return "failed", f"stream error: {errors[0].get('message')}"
        return "lost", f"error event without [DONE] or message: {errors}"
    if not done:
        return "lost", "stream ended without [DONE] and without an error"
    text = "".join(
        c.get("text") or c.get("delta", {}).get("content") or ""
        for e in events
        for c in (e.get("choices") or [])
        if isinstance(c, dict)
    )
    if text != expected:
        return "lost", f"wrong text ({len(text)} chars)"
    return "ok", ""


def _classify_unary(raw: bytes, expected: str) -> tuple[str, str]:
    try:
        data = json.loads(raw)
        text = data["choices"][0]["text"]
    except (ValueError, KeyError, IndexError, TypeError):
        return "lost", f"unparsable 200 body {raw[:80]!r}"
    if text != expected:
        return "lost", "wrong text"
    return "ok", ""


async def send(
    session: aiohttp.ClientSession,
    url: str,
    request_id: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    bound_s: float = REQUEST_BOUND_S,
) -> Outcome:
    """One request, classified (never raises for a request-level problem)."""
    start = time.monotonic()
    status = 0
    try:
        async with asyncio.timeout(bound_s):
            async with session.post(
                url + "/v1/completions", json=body, headers={"X-Request-Id": request_id, **(headers or {})}
            ) as resp:
                status = resp.status
                raw = await resp.read()
    except TimeoutError:
        return Outcome(request_id, "lost", time.monotonic() - start, f"no answer within {bound_s} s")
    except aiohttp.ClientError as exc:  # refused, reset or closed mid-body: the client knows it failed
        return Outcome(request_id, "failed", time.monotonic() - start, f"connection: {type(exc).__name__}")
    latency = time.monotonic() - start
    if status != 200:
        try:
            message = json.loads(raw)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            return Outcome(request_id, "lost", latency, f"HTTP {status} without a JSON error: {raw[:80]!r}")
        return Outcome(request_id, "failed", latency, f"HTTP {status}: {message}")
    expected = generated_text(body["prompt"], int(body["max_tokens"]))
    if body.get("stream"):
        kind, detail = _classify_sse(raw, expected)
    else:
        kind, detail = _classify_unary(raw, expected)
    return Outcome(request_id, kind, latency, detail)


async def load(
    session: aiohttp.ClientSession,
    url: Callable[[], str] | str,
    prefix: str,
    num_requests: int,
    concurrency: int,
    make_body: Callable[[str, int], dict[str, Any]],
    headers: dict[str, str] | Callable[[int], dict[str, str]] | None = None,
    gap_s: float = 0.0,
    run: LoadRun | None = None,
) -> LoadRun:
    """``num_requests`` requests, at most ``concurrency`` at a time, ``gap_s`` between starts per worker.

    ``headers``: the same for every request, or a function of the request's index. ``run``: filled as requests
    end (so that a case can act on the progress of a load running as a task).
    """
    queue = deque(range(num_requests))
    out = run if run is not None else LoadRun()

    async def worker() -> None:
        while queue:
            k = queue.popleft()
            rid = f"{prefix}-{k}"
            target = url() if callable(url) else url
            out.in_flight += 1
            out.peak_in_flight = max(out.peak_in_flight, out.in_flight)
            try:
                extra = headers(k) if callable(headers) else headers
                out.outcomes.append(await send(session, target, rid, make_body(rid, k), extra))
            finally:
                out.in_flight -= 1
            if gap_s:
                await asyncio.sleep(gap_s)

    start = time.monotonic()
    async with asyncio.timeout(REQUEST_BOUND_S * (num_requests // max(concurrency, 1) + 2)):
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    out.wall_s = time.monotonic() - start
    return out


def records_by_id(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["request_id"]: r for r in records}


def assert_records_match(outcomes: Sequence[Outcome], records: Sequence[dict[str, Any]]) -> int:
    """Every ok request has a router record with status 200 and no error; returns how many ok ones lack one."""
    by_id = records_by_id(records)
    missing = 0
    for o in outcomes:
        if o.kind != "ok":
            continue
        rec = by_id.get(o.request_id)
        if rec is None or rec["status"] != 200 or rec["error"] is not None:
            missing += 1
    return missing
