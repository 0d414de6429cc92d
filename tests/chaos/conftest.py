"""The chaos suite's summary table: each case adds a row; the session writes ``benchmarks/results/chaos.{md,json}``.

Rows of cases not run in this session are kept from the previous file (each row carries its own run time), so
running one case refreshes its row only. ``make chaos`` runs them all.
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

from tests.chaos.common import Tally

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
COMMAND = "make chaos  (= PYTHONHASHSEED=0 python -m pytest -m chaos -q)"


@dataclass
class ChaosRow:
    case: str
    faults: str
    unit: str
    sent: int
    completed: int
    failed: int
    lost: int
    p99_ms: float | None
    baseline_p99_ms: float | None
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
    ) -> ChaosRow:
        row = ChaosRow(
            case, faults, unit, tally.sent, tally.count("ok"), tally.count("failed"), tally.count("lost"),
            tally.p99_ms() if unit == "requests" else None, baseline.p99_ms() if baseline is not None else None, notes,
            time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        )  # fmt: skip
        self.rows.append(row)
        return row

    def add_raw(self, row: ChaosRow) -> None:
        self.rows.append(row)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _impact(row: dict[str, object]) -> str:
    p99, base = row.get("p99_ms"), row.get("baseline_p99_ms")
    if not isinstance(p99, int | float) or not isinstance(base, int | float):
        return "-"
    return f"{p99 - base:+.0f}"


def write_tables(rows: list[dict[str, object]]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "chaos.json").write_text(json.dumps({"command": COMMAND, "rows": rows}, indent=2) + "\n")
    lines = [
        "# Chaos suite: faults injected into the emulated live stack",
        "",
        f"Command: `{COMMAND}`; machine: {platform.machine()}, {os.cpu_count()} CPUs shared with other jobs, "
        f"Python {platform.python_version()}. Source: `tests/chaos/`.",
        "",
        "Every request ends **ok** (HTTP 200, complete stream with `[DONE]`, exactly the text the emulator generates",
        "for its id), **failed** (the client was told within the bound: an error status with a JSON error, an SSE",
        "error event then `[DONE]`, or a refused/closed connection) or **lost** (a hang past the 30-s bound, a",
        "stream cut without an error, wrong text, an ok answer without its router record). p99 = client-side",
        "end-to-end latency of the ok requests; impact = p99 under the fault minus p99 of the same load without",
        "it (same run).",
        "",
        "| case | injected faults | unit | sent | completed | failed | lost | p99 (ms) | baseline p99 (ms) | p99 impact"
        " (ms) | notes | run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['faults']} | {r['unit']} | {r['sent']} | {r['completed']} | {r['failed']} | "
            f"**{r['lost']}** | {_fmt(r['p99_ms'])} | {_fmt(r['baseline_p99_ms'])} | {_impact(r)} | {r['notes']} | "
            f"{r['run']} |"  # type: ignore[arg-type]
        )
    total_lost = sum(int(r["lost"]) for r in rows)  # type: ignore[call-overload]
    lines += ["", f"Lost, all cases: **{total_lost}**.", ""]
    (RESULTS / "chaos.md").write_text("\n".join(lines))


@pytest.fixture(scope="session")
def chaos_table() -> Iterator[ChaosTable]:
    table = ChaosTable()
    yield table
    if not table.rows:
        return
    old: list[dict[str, object]] = []
    path = RESULTS / "chaos.json"
    if path.exists():
        old = json.loads(path.read_text())["rows"]
    fresh = [asdict(r) for r in table.rows]
    cases = {r["case"] for r in fresh}
    merged = [r for r in old if r["case"] not in cases] + fresh
    order = [
        "transfer", "prefill", "decode", "router", "role", "prometheus", "policy", "controller", "clock",
    ]  # fmt: skip

    def key(r: dict[str, object]) -> tuple[int, str]:
        case = str(r["case"])
        return next((i for i, p in enumerate(order) if case.startswith(p)), len(order)), case

    write_tables(sorted(merged, key=key))
