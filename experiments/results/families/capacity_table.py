"""Summarise `pdctl evaluate --sweep-rate` runs on a scenario family: yardstick (b) against the rules.

Usage: python experiments/results/families/capacity_table.py SWEEP.json [SWEEP.json ...] --policy SPEC
    [--not-a-rule TEXT ...] [--rows]

Reads every given ``sweep.json`` (one entry per policy and scenario: the highest rate multiplier at which at least
``target_frac`` of requests met both SLOs) and prints, for the policy named with ``--policy`` and for each rule
(every other policy in the files, but those whose spec contains a ``--not-a-rule`` text, e.g. ``learned:``, when
several policies were swept beside the rules), over the scenarios all of them were swept on:

- the share of scenarios where it sustains at least the per-scenario best rule's rate;
- the geometric mean of its rate over the per-scenario best rule's, and over the single rule best over the set;
- the lowest ratio to the per-scenario best rule (the floor).

A rate of 0 means the policy failed the sweep's lowest probe (``pdctl evaluate --sweep-rate`` stops halving at
1/16), so its true rate lies below 1/16: in the ratios it counts as :data:`ZERO_RATE_AS` (half that probe), not as
0, which would make every geometric mean 0. Scenarios where no rule sustains any rate are left out of the ratios
and counted.

``--rows`` also prints the per-scenario rates. Policies are named as in the sweep (``baseline:dynamo-legacy``, …).
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from agents.source_digest import OneSimulator

ZERO_RATE_AS = 1 / 32
"""The rate a ratio takes for a policy that failed the sweep's lowest probe (1/16): half that probe."""


@dataclass(frozen=True)
class CapacityFigures:
    """One policy's sustainable-rate figures over a set of scenarios."""

    policy: str
    at_least_best: int
    vs_best_geomean: float
    vs_single_geomean: float
    floor: float
    left_out: int
    """Scenarios left out of the ratios: no rule sustains any rate there."""


def read_sweeps(paths: list[str]) -> dict[str, dict[str, float]]:
    """Per scenario and policy, the highest sustained rate multiplier (the last file's entry stands).

    Raises:
        SystemExit: two entries were measured by different simulators (their ``simulator_sha256``, a digest of the
            simulator's source; entries written before it existed count as one simulator, "unrecorded"). One line
            naming both files.
    """
    table: dict[str, dict[str, float]] = defaultdict(dict)
    simulator = OneSimulator(verb="swept", holder="field", noun="rates")
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for entry in json.load(handle):
                simulator.see(entry.get("simulator_sha256"), path)
                table[entry["scenario"]][entry["policy"]] = float(entry["max_rate_scale"])
    return table


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values)) if values else float("nan")


def capacity_figures(
    table: dict[str, dict[str, float]], policy: str, not_rules: Sequence[str] = ()
) -> tuple[list[str], str, list[CapacityFigures]]:
    """The scenarios compared, the single best rule, and the figures of ``policy`` then of every rule.

    The rules are every other policy in ``table`` whose spec contains none of ``not_rules``.

    Raises:
        SystemExit: no scenario was swept with ``policy`` and at least one rule (one line).
    """
    scenarios = sorted(s for s, by in table.items() if policy in by and len(by) > 1)
    if not scenarios:
        raise SystemExit(f"--policy {policy}: no scenario was swept with it and a rule")
    rules = sorted({p for s in scenarios for p in table[s] if p != policy})
    rules = [r for r in rules if all(r in table[s] for s in scenarios) and not any(t in r for t in not_rules)]
    if not rules:
        raise SystemExit(f"--policy {policy}: no rule was swept on every scenario it was")
    best = {s: max(table[s][r] for r in rules) for s in scenarios}

    def rate(s: str, p: str) -> float:
        return table[s][p] if table[s][p] > 0 else ZERO_RATE_AS

    def ratios_over(p: str, denominator: dict[str, float]) -> list[float]:
        return [rate(s, p) / max(denominator[s], ZERO_RATE_AS) for s in scenarios if best[s] > 0]

    def vs_best(r: str) -> float:
        return _geomean(ratios_over(r, best))

    single = max(rules, key=vs_best)
    single_rate = {s: table[s][single] for s in scenarios}
    out = []
    for p in [policy, *rules]:
        to_best = ratios_over(p, best)
        out.append(
            CapacityFigures(
                policy=p,
                at_least_best=sum(table[s][p] >= best[s] - 1e-9 for s in scenarios),
                vs_best_geomean=_geomean(to_best),
                vs_single_geomean=_geomean(ratios_over(p, single_rate)),
                floor=min(to_best) if to_best else float("nan"),
                left_out=sum(best[s] <= 0 for s in scenarios),
            )
        )
    return scenarios, single, out


def main() -> None:
    """Print the capacity table (Markdown)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("sweeps", nargs="+")
    parser.add_argument("--policy", required=True)
    parser.add_argument(
        "--not-a-rule", action="append", default=[], metavar="TEXT", help="no policy whose spec has TEXT is a rule"
    )
    parser.add_argument("--rows", action="store_true", help="also print the per-scenario rates")
    args = parser.parse_args()
    table = read_sweeps(args.sweeps)
    scenarios, single, figures = capacity_figures(table, args.policy, args.not_a_rule)
    n = len(scenarios)
    print(f"{n} scenarios; single best rule over the set (geometric mean of rate × the per-scenario best): {single}\n")
    print("| policy | ≥ best rule's rate | geo mean × per-scenario best rule | × single best rule | floor |")
    print("|---|---:|---:|---:|---:|")
    for f in figures:
        print(
            f"| {f.policy} | {f.at_least_best}/{n} | {f.vs_best_geomean:.3f} | {f.vs_single_geomean:.3f} "
            f"| {f.floor:.3f} |"
        )
    left_out = figures[0].left_out
    if left_out:
        print(f"\n{left_out} scenario(s) where no rule sustains any rate are left out of the means and the floor.")
    if args.rows:
        names = [f.policy for f in figures]
        print("\n| scenario | " + " | ".join(names) + " |")
        print("|---|" + "---:|" * len(names))
        for s in scenarios:
            print(f"| {s} | " + " | ".join(f"{table[s][p]:.3f}" for p in names) + " |")


if __name__ == "__main__":
    main()
