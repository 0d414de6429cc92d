"""Compare `pdctl evaluate` runs of the same policies under different guard limits, scenario by scenario.

Usage: python experiments/results/families/pool-hold/compare_guards.py BASE.csv OTHER.csv [OTHER.csv ...]

Reads the ``ALL`` rows of each file; a row's policy is its spec without the ``+guard[...]`` suffix that
``pdctl evaluate --guard`` adds, so the same policy lines up across files. Prints, per (policy, scenario), the
priority-weighted goodput (req/s) and the pool changes (``churn_changes``, mean over seeds) in each file, then per file
the geometric mean of its goodput over BASE's (pairs where both are positive) and how many pairs it raised and lowered.
Exits with one line when the files do not hold the same (policy, scenario) pairs.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path


def _rows(path: Path) -> dict[tuple[str, str], tuple[float, float]]:
    """(policy without the guard suffix, scenario) → (weighted goodput, pool changes)."""
    out: dict[tuple[str, str], tuple[float, float]] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["tenant"] != "ALL":
                continue
            policy = row["policy"].split("+guard[")[0]
            out[(policy, row["scenario"])] = (float(row["weighted_goodput_rps_mean"]), float(row["churn_changes_mean"]))
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the comparison table and the summary lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if len(args.files) < 2:
        raise SystemExit("compare_guards: need a base file and at least one other")
    tables = [_rows(path) for path in args.files]
    keys = sorted(tables[0])
    for path, table in zip(args.files[1:], tables[1:], strict=True):
        if sorted(table) != keys:
            raise SystemExit(f"{path}: other (policy, scenario) pairs than {args.files[0]}; not compared")
    names = [path.stem for path in args.files]
    print("| policy | scenario | " + " | ".join(f"{n} goodput (changes)" for n in names) + " |")
    print("|---|---|" + "---:|" * len(names))
    for key in keys:
        cells = " | ".join(f"{t[key][0]:.3f} ({t[key][1]:.1f})" for t in tables)
        print(f"| {key[0]} | {key[1]} | {cells} |")
    print()
    for name, table in zip(names[1:], tables[1:], strict=True):
        logs = [math.log(table[k][0] / tables[0][k][0]) for k in keys if table[k][0] > 0 and tables[0][k][0] > 0]
        up = sum(table[k][0] > tables[0][k][0] for k in keys)
        down = sum(table[k][0] < tables[0][k][0] for k in keys)
        geo = math.exp(sum(logs) / len(logs)) if logs else float("nan")
        print(f"{name}: {geo:.3f}x {names[0]} (geometric mean over {len(logs)} pairs); {up} up, {down} down")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
