"""The chaos suite's summary table: each case adds a row; ``make chaos`` writes ``benchmarks/results/chaos.{md,json}``.

The table is written only where ``PDCTL_CHAOS_RESULTS`` names a directory (``make chaos`` sets it to
``benchmarks/results``), so an ordinary test run never rewrites the committed table. Rows of cases not run in
this session are kept from the previous file (each row carries its own run time), so running one case refreshes
its row only.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from tests.chaos.common import RouterCounts, Tally

RESULTS_ENV = "PDCTL_CHAOS_RESULTS"
"""Directory the session writes ``chaos.{md,json}`` to; unset: the table is not written."""
COMMAND = "make chaos  (= PDCTL_CHAOS_RESULTS=benchmarks/results PYTHONHASHSEED=0 python -m pytest -m chaos -q)"


@dataclass
class ChaosRow:
    case: str
    faults: str
    unit: str
    sent: int
    concurrency: int
    completed: int
    failed: int
    lost: int
    migrations: int
    router_ok: int | None
    router_error: int | None
    p99_ms: float | None
    baseline_p99_ms: float | None
    wall_s: float
    notes: str
    run: str


class ChaosTable:
    def __init__(self) -> None:
        self.rows: list[ChaosRow] = []

    def add(
        self,
        case: str,
        faults: str,
        tally: Tally,
        baseline: Tally | None = None,
        notes: str = "",
        unit: str = "requests",
        router: RouterCounts | None = None,
    ) -> ChaosRow:
        """A row for ``tally``; ``router``: the router's own counters over the same requests (cross-check)."""
        row = ChaosRow(
            case, faults, unit, tally.sent, tally.concurrency, tally.count("ok"), tally.count("failed"),
            tally.count("lost"), router.migrations if router is not None else 0,
            router.ok if router is not None else None, router.error if router is not None else None,
            tally.p99_ms() if unit == "requests" else None, baseline.p99_ms() if baseline is not None else None,
            round(tally.wall_s, 1), notes, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        )  # fmt: skip
        self.rows.append(row)
        return row


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _impact(row: dict[str, object]) -> str:
    p99, base = row.get("p99_ms"), row.get("baseline_p99_ms")
    if not isinstance(p99, int | float) or not isinstance(base, int | float):
        return "-"
    return f"{p99 - base:+.0f}"


def _count(value: object) -> str:
    return "-" if value is None else str(value)


def write_tables(results: Path, rows: list[dict[str, object]]) -> None:
    results.mkdir(parents=True, exist_ok=True)
    (results / "chaos.json").write_text(json.dumps({"command": COMMAND, "rows": rows}, indent=2) + "\n")
    lines = [
        "# Chaos suite: faults injected into the emulated live stack",
        "",
        f"Command: `{COMMAND}`; machine: {platform.machine()}, {os.cpu_count()} CPUs shared with other jobs, "
        f"Python {platform.python_version()}. Source: `tests/chaos/`.",
        "",
        "Every request ends **ok** (HTTP 200, complete stream with `[DONE]`, exactly the text the emulator generates",
        "for its prompt: nothing dropped or duplicated), **failed** (the client was told within the bound: an error",
        "status with a JSON error, an SSE error event then `[DONE]`, or a refused/closed connection) or **lost** (a",
        "hang past the 30-s bound, a stream cut without an error, wrong text, an ok answer without its router",
        "record). sent/concurrency: requests of the fault phase and the most in flight at once (client side).",
        "router ok/error: the router's own `pdctl_router_requests_total{outcome}` over the same requests (cross-check",
        "of completed/failed; `-` where the router was not the one counting, see notes). migrations: streams",
        'resumed on another decode instance (`pdctl_router_migrations_total{outcome="completed"}`). wall: seconds',
        "of the fault phase's load (emulated instances 10x faster than modelled time unless the case says",
        "otherwise). p99 = client-side end-to-end latency of the ok requests; baseline = 200 requests of the same",
        "mix and concurrency before the fault (same run); impact = the difference.",
        "",
        "| case | injected faults | unit | sent | concurrency | completed | failed | lost | migrations | router ok |"
        " router error | wall (s) | p99 (ms) | baseline p99 (ms) | p99 impact (ms) | notes | run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['faults']} | {r['unit']} | {r['sent']} | {r['concurrency']} | {r['completed']} | "
            f"{r['failed']} | **{r['lost']}** | {r['migrations']} | {_count(r['router_ok'])} | "
            f"{_count(r['router_error'])} | {r['wall_s']} | {_fmt(r['p99_ms'])} | {_fmt(r['baseline_p99_ms'])} | "  # type: ignore[arg-type]
            f"{_impact(r)} | {r['notes']} | {r['run']} |"
        )
    total_lost = sum(int(r["lost"]) for r in rows)  # type: ignore[call-overload]
    lines += ["", f"Lost, all cases: **{total_lost}**.", ""]
    (results / "chaos.md").write_text("\n".join(lines))


@pytest.fixture(scope="session")
def chaos_table() -> Iterator[ChaosTable]:
    table = ChaosTable()
    yield table
    directory = os.environ.get(RESULTS_ENV)
    if not table.rows or not directory:
        return
    results = Path(directory)
    old: list[dict[str, object]] = []
    path = results / "chaos.json"
    if path.exists():
        old = [r for r in json.loads(path.read_text())["rows"] if "concurrency" in r]  # rows of this layout only
    fresh = [asdict(r) for r in table.rows]
    cases = {r["case"] for r in fresh}
    merged = [r for r in old if r["case"] not in cases] + fresh
    order = [
        "transfer", "prefill", "decode", "router", "role", "composite", "prometheus", "policy", "controller", "clock",
    ]  # fmt: skip

    def key(r: dict[str, object]) -> tuple[int, str]:
        case = str(r["case"])
        return next((i for i, p in enumerate(order) if case.startswith(p)), len(order)), case

    write_tables(results, sorted(merged, key=key))
