"""Merge the benchmark fragments (``benchmarks/results/raw/*.json``) into ``summary.json`` and ``summary.md``.

Run: ``python benchmarks/summary.py`` (``make bench`` runs it at the end of the session through
``benchmarks/conftest.py``). Every row keeps its own command, run time and machine, so a partial rerun updates
only the figures it measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
RAW = RESULTS / "raw"
ORDER = ["sim", "env", "policy_decide", "controller", "router_overhead", "router_memory", "soak"]


TARGETS = [
    # (fragment name prefix, metric, configuration prefix, statistic, operator, limit, the target as stated)
    ("sim_azure", "wall time of the whole trace", "", "min", "<", 2.0, "Azure conversation hour simulated in < 2 s"),
    ("sim", "simulated requests per wall second", "", "median", ">=", 50_000, ">= 50,000 simulated requests / s"),
    ("env", "env steps per second", "", "median", ">=", 1000 / 30, "1,000 env steps in < 30 s on 2 cores"),
    ("controller", "tick CPU time", "", "median", "<", 100.0, "controller tick < 100 ms CPU (median)"),
    ("router_overhead", "added TTFT p99", "200 streams, router", "median", "<", 2.0, "router added p99 TTFT < 2 ms"),
    ("soak", "instance changes per hour", "", "max", "<=", 12, "soak: <= 12 instance changes in any hour"),
]
"""Targets set by the project's issues; the verdicts below are computed from the measured figures."""


def target_met(op: str, value: float, limit: float) -> bool:
    """Whether ``value`` meets a target ``op limit`` (``op`` one of ``<``, ``<=``, ``>=``)."""
    return {"<": value < limit, "<=": value <= limit, ">=": value >= limit}[op]


def _verdicts(docs: list[dict[str, Any]]) -> list[str]:
    rows = []
    for prefix, metric, config, stat, op, limit, label in TARGETS:
        for doc in docs:
            if not doc["name"].startswith(prefix):
                continue
            for f in doc["figures"]:
                if f["metric"] != metric or not f["config"].startswith(config):
                    continue
                value = f[stat]
                ok = target_met(op, value, limit)
                rows.append(
                    f"| {label} | {f['config']} | {stat} {_num(value)} {f['unit']} | {'met' if ok else '**missed**'} |"
                )
    if not rows:
        return []
    return ["## Targets", "", "| target | configuration | measured | verdict |", "|---|---|---|---|", *rows, ""]


def _num(value: float) -> str:
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def load_fragments(raw: Path = RAW) -> list[dict[str, Any]]:
    docs = [json.loads(p.read_text()) for p in sorted(raw.glob("*.json"))]

    def key(doc: dict[str, Any]) -> tuple[int, str]:
        rank = next((i for i, prefix in enumerate(ORDER) if doc["name"].startswith(prefix)), len(ORDER))
        return rank, doc["name"]

    return sorted(docs, key=key)


def render(docs: list[dict[str, Any]]) -> str:
    lines = [
        "# Benchmark summary",
        "",
        "Written by `make bench` (= `PYTHONHASHSEED=0 python -m pytest -m benchmark -q -s benchmarks tests`), which",
        "runs every benchmark module; each writes a fragment to `benchmarks/results/raw/` and this summary merges",
        "them (`python benchmarks/summary.py`). Spread: median, interquartile range (q1-q3) and min-max over the",
        "repeats named in the *repeat* column. Per-module detail: the other files in `benchmarks/results/`.",
        "",
    ]
    machines = {(d["machine"]["cpu"], d["machine"]["cpus"], d["machine"]["python"]) for d in docs}
    for cpu, cpus, python in sorted(machines, key=str):
        lines.append(
            f"Machine: {cpu}, {cpus} CPUs, Python {python}; shared with other jobs (load average per section)."
        )
    lines.append("")
    for doc in docs:
        m = doc["machine"]
        lines += [
            f"## {doc['title']}",
            "",
            f"Command: `{doc['command']}` (run {doc['run']}; load average {m['load_avg_1m']} on {m['cpus']} CPUs)",
            "",
            "| metric | configuration | median | q1-q3 | min-max | unit | repeat | target |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for f in doc["figures"]:
            lines.append(
                f"| {f['metric']} | {f['config']} | **{_num(f['median'])}** | {_num(f['q1'])}-{_num(f['q3'])} | "
                f"{_num(f['min'])}-{_num(f['max'])} | {f['unit']} | {f['n']} x {f['repeat']} | {f['target'] or '-'} |"
            )
        if doc.get("notes"):
            lines += ["", doc["notes"]]
        lines.append("")
    return "\n".join(lines + _verdicts(docs))


def write_summary(raw: Path = RAW, out: Path = RESULTS) -> Path | None:
    docs = load_fragments(raw)
    if not docs:
        return None
    (out / "summary.json").write_text(json.dumps({"fragments": docs}, indent=2) + "\n")
    path = out / "summary.md"
    path.write_text(render(docs))
    return path


if __name__ == "__main__":
    written = write_summary()
    print(written or "no fragments in benchmarks/results/raw", file=sys.stderr)
