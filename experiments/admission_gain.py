"""What the admission stage changes, policy by policy: goodput behind it against goodput without it, same runs.

Usage: python experiments/admission_gain.py OFF.csv ON.csv [--policy SPEC ...]

``OFF.csv`` and ``ON.csv`` are ``pdctl evaluate`` CSVs of the same scenarios and seed, without and with
``--admission-slack`` (whose rows name each policy ``SPEC+admission``), measured by one simulator. For every policy
in both (or the ``--policy`` ones) and for the per-scenario best rule (the best ``baseline:`` policy of each file),
it prints the ratio of weighted goodput with admission to without it: median and quartiles, how many scenarios
gain (> 1.001) and lose (< 0.999), and the lowest ratio, split into the scenarios where the best rule without
admission serves less than half the offered weighted load (``starved``, as ``summarize.py`` counts them) and the
others; and the share of requests refused (the ``failed`` column: with admission, nearly all failures are refusals).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

ADMISSION_SUFFIX = "+admission"
"""What ``pdctl evaluate --admission-slack 1`` appends to a policy's label."""

STARVED_FRAC = 0.5
"""As ``experiments/results/families/summarize.py``: a best rule serving less than this of the offered weighted load."""

BEST_RULE = "per-scenario best rule"

Row = dict[str, float]


def read(path: Path) -> tuple[dict[str, dict[str, Row]], str]:
    """Scenario → policy (label without the admission suffix) → its ``ALL`` row's figures; and the simulator digest.

    Raises:
        SystemExit: one line, when the file holds rows of two simulators.
    """
    out: dict[str, dict[str, Row]] = defaultdict(dict)
    digests: set[str] = set()
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["tenant"] != "ALL" or float(row.get("rate_scale") or 1.0) != 1.0:
                continue
            digests.add(row.get("simulator_sha256") or "unrecorded")
            policy = row["policy"].removesuffix(ADMISSION_SUFFIX)
            out[row["scenario"]][policy] = {
                "goodput": float(row["weighted_goodput_rps_mean"]),
                "offered": float(row.get("offered_weighted_rps_mean") or "nan"),
                "arrived": float(row["arrived_mean"]),
                "failed": float(row["failed_mean"]),
            }
    if len(digests) > 1:
        raise SystemExit(f"{path}: rows of {len(digests)} simulators (simulator_sha256); not compared")
    return out, next(iter(digests), "unrecorded")


def _best_rule(rows: dict[str, Row]) -> Row | None:
    rules = [r for policy, r in rows.items() if policy.startswith("baseline:")]
    return max(rules, key=lambda r: r["goodput"]) if rules else None


def _with_best_rule(table: dict[str, dict[str, Row]]) -> dict[str, dict[str, Row]]:
    out: dict[str, dict[str, Row]] = {}
    for scenario, rows in table.items():
        best = _best_rule(rows)
        out[scenario] = dict(rows) if best is None else {**rows, BEST_RULE: best}
    return out


def _ratio(on: float, off: float) -> float:
    if off > 0:
        return on / off
    return 1.0 if on <= 0 else float("inf")


def gains(
    off: dict[str, dict[str, Row]], on: dict[str, dict[str, Row]], policies: Sequence[str]
) -> dict[tuple[str, bool], list[float]]:
    """(policy, starved) → the goodput ratios with / without admission, one per scenario both files hold."""
    off, on = _with_best_rule(off), _with_best_rule(on)
    out: dict[tuple[str, bool], list[float]] = defaultdict(list)
    for scenario in sorted(set(off) & set(on)):
        best = off[scenario].get(BEST_RULE)
        starved = best is not None and best["offered"] > 0 and best["goodput"] < STARVED_FRAC * best["offered"]
        for policy in policies:
            if policy in off[scenario] and policy in on[scenario]:
                out[policy, starved].append(_ratio(on[scenario][policy]["goodput"], off[scenario][policy]["goodput"]))
    return out


def refused_frac(on: dict[str, dict[str, Row]], policy: str) -> float:
    """Failed (refused) requests over arrived ones, summed over the scenarios, for ``policy`` behind admission."""
    arrived = sum(rows[policy]["arrived"] for rows in on.values() if policy in rows)
    failed = sum(rows[policy]["failed"] for rows in on.values() if policy in rows)
    return failed / arrived if arrived else 0.0


def _line(policy: str, label: str, ratios: list[float]) -> str:
    if not ratios:
        return f"| {policy} | {label} | 0 | | | | |"
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    gain = sum(r > 1.001 for r in ratios)
    loss = sum(r < 0.999 for r in ratios)
    spread = f"{q[1]:.3f}× ({q[0]:.3f}–{q[2]:.3f})"
    return f"| {policy} | {label} | {len(ratios)} | {spread} | {gain} | {loss} | {min(ratios):.3f} |"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("off", type=Path, help="pdctl evaluate results.csv without admission")
    parser.add_argument("on", type=Path, help="the same runs with --admission-slack")
    parser.add_argument("--policy", action="append", default=[], help="a policy to report (default: all in both)")
    args = parser.parse_args(argv)
    for path in (args.off, args.on):
        if not path.is_file():
            parser.error(f"{path}: no such file")
    off, off_digest = read(args.off)
    on, on_digest = read(args.on)
    if off_digest != on_digest:
        raise SystemExit(
            f"{args.on}: measured by simulator {on_digest[:12]}, {args.off} by {off_digest[:12]}; not compared"
        )
    both = {p for rows in off.values() for p in rows} & {p for rows in on.values() for p in rows}
    policies = list(args.policy) or sorted(both)
    missing = [p for p in policies if p not in both]
    if missing:
        raise SystemExit(f"--policy {missing[0]}: not in both files (known: {', '.join(sorted(both))})")
    ratios = gains(off, on, [BEST_RULE, *policies])
    print("| policy | scenarios | n | goodput with / without admission: median (quartiles) | gain | loss | lowest |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for policy in [BEST_RULE, *policies]:
        everything = ratios[policy, True] + ratios[policy, False]
        for label, values in (
            ("all", everything),
            ("starved", ratios[policy, True]),
            ("not starved", ratios[policy, False]),
        ):
            print(_line(policy, label, values))
    print()
    for policy in policies:
        print(f"{policy}: {100 * refused_frac(on, policy):.1f} % of arrived requests refused behind admission")
    return 0


if __name__ == "__main__":
    sys.exit(main())
