"""What refusing requests at the door would be worth: the best rule at its offered load and at its sustained rate.

Usage: python experiments/admission_headroom.py RESULTS.csv [RESULTS.csv ...] --scenarios-dir DIR --out OUT.csv
       [--policy SPEC] [--seed N] [--workers N] [--target FRAC]
       python experiments/admission_headroom.py --summary OUT.csv [--policy SPEC]

``RESULTS.csv`` are ``pdctl evaluate`` CSVs holding the rules (``baseline:NAME``) on the scenario files of
``--scenarios-dir`` (``NAME.yaml``), one seed. For every scenario all the rules ran on, the best rule there (highest
priority-weighted goodput at the offered load) is swept for the highest rate multiplier at which at least
``--target`` of the requests meet both objectives (:func:`agents.evaluate.sweep_rate`, as ``pdctl evaluate
--sweep-rate``); the sweep's run at that multiplier gives its weighted goodput.

Multiplying every tenant's arrival rate by *m* is, for Poisson arrivals, the same in distribution as admitting each
arriving request with probability *m* and refusing the rest at once (for trace replays, an approximation). So the
goodput at the sustainable multiplier is what the same rule on the same GPUs would serve behind a *static*
admission control that refuses the right constant fraction of the traffic; refused requests count as misses, as
every failed request does (:mod:`policies.scoring`). An admission control that follows the load (a surge, a flood,
a ramp) does at least as well, so this is a lower bound on the headroom. None of the rules refuses anything.

The CSV has one row per scenario; the last lines print the headroom (goodput behind static admission over goodput
at the offered load) over the scenarios where the best rule serves less than half the offered weighted load
(``starved``, as ``summarize.py`` counts them) and over the others, and with ``--policy`` that policy's goodput (from
the same CSVs) against both.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

from agents.evaluate import ALL_TENANTS, sweep_rate
from agents.harness import RunResult
from agents.result_rows import read_rows

STARVED_FRAC = 0.5
"""As ``experiments/results/families/summarize.py``: a best rule serving less than this of the offered weighted load."""


_DESCRIBED = re.compile(r"load (?P<load>[0-9./]+)\s+x capacity; pattern (?P<pattern>[a-z_-]+)")


def family_knobs(path: Path) -> tuple[float | None, str]:
    """The load (× the generator's capacity estimate) and the temporal pattern a generated scenario describes.

    With several tenant groups, the highest group's load: scaling every tenant's rate, the most loaded group is the
    first to miss. ``(None, "")`` for a scenario whose description does not say (a hand-written one).
    """
    description = str(yaml.safe_load(path.read_text(encoding="utf-8")).get("description") or "")
    found = _DESCRIBED.search(" ".join(description.split()))
    if found is None:
        return None, ""
    return max(float(x) for x in found["load"].split("/")), found["pattern"]


def main() -> None:
    """Sweep each scenario's best rule, run it at its sustainable multiplier, write the CSV and print the summary."""
    parser = argparse.ArgumentParser()
    parser.add_argument("results", nargs="*", type=Path)
    parser.add_argument("--scenarios-dir", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--policy", help="also report this policy's goodput at the offered load, from RESULTS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.9, help="attainment the sustainable multiplier must hold")
    parser.add_argument("--summary", type=Path, help="only print the summary of a CSV this script wrote")
    args = parser.parse_args()
    if args.summary is not None:
        print_summary(args.summary, args.policy)
        return
    for flag, value in (("RESULTS", args.results), ("--scenarios-dir", args.scenarios_dir), ("--out", args.out)):
        if not value:
            parser.error(f"{flag} is required (unless --summary)")
    traces = os.environ.get("PDCTL_TRACES")
    rows = read_rows(args.results)
    rules = sorted({p for by in rows.values() for p in by if p.startswith("baseline:")})
    if not rules:
        raise SystemExit(f"{args.results[0]}: no baseline: rows at rate 1.0")
    best: dict[str, str] = {}
    for scenario, by in sorted(rows.items()):
        if not all(r in by for r in rules):
            continue
        if not (args.scenarios_dir / f"{scenario}.yaml").is_file():
            raise SystemExit(f"--scenarios-dir {args.scenarios_dir}: no {scenario}.yaml")
        best[scenario] = max(rules, key=lambda r, by=by: by[r][0])  # type: ignore[misc]
        if args.policy and args.policy not in by:
            raise SystemExit(f"--policy {args.policy}: no row for scenario {scenario}")
    if not best:
        raise SystemExit(f"{args.results[0]}: no scenario has rows of all of {', '.join(rules)}")
    probed: dict[tuple[str, float], float] = {}  # (scenario, multiplier) -> weighted goodput of the sweep's probe

    def keep(result: RunResult) -> None:
        if result.error is None:
            total = next(r for r in result.rows if r["tenant"] == ALL_TENANTS)
            key = (Path(result.spec.scenario_path).stem, result.spec.rate_scale)
            probed[key] = float(total["weighted_goodput_rps"])

    sustainable: dict[str, float] = {}
    for rule in rules:
        mine = [args.scenarios_dir / f"{s}.yaml" for s, r in best.items() if r == rule]
        if mine:
            records = sweep_rate(
                mine, [rule], [args.seed], target_frac=args.target, workers=args.workers, traces_dir=traces,
                on_done=keep,
            )  # fmt: skip
            for rec in records:
                sustainable[rec["scenario"]] = float(rec["max_rate_scale"])
    # the sweep already ran each rule at the multiplier it reports: its goodput there is the probe's
    shed_goodput = {s: probed[(s, m)] if m > 0 else 0.0 for s, m in sustainable.items()}
    write_table(args, rows, best, sustainable, shed_goodput)
    print(f"wrote {args.out}: {len(best)} scenarios, seed {args.seed}, target {args.target:g}")
    print_summary(args.out, args.policy)


def write_table(
    args: argparse.Namespace,
    rows: dict[str, dict[str, tuple[float, float]]],
    best: dict[str, str],
    sustainable: dict[str, float],
    shed_goodput: dict[str, float],
) -> None:
    """The per-scenario CSV (module docstring)."""
    fields = [*FIELDS, "policy_goodput_rps"] if args.policy else list(FIELDS)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for scenario, rule in sorted(best.items()):
            goodput, offered = rows[scenario][rule]
            shed = shed_goodput[scenario]
            load, pattern = family_knobs(args.scenarios_dir / f"{scenario}.yaml")
            row = {
                "scenario": scenario,
                "best_rule": rule,
                "offered_weighted_rps": f"{offered:.4f}",
                "best_goodput_rps": f"{goodput:.4f}",
                "served_frac": f"{goodput / offered:.4f}",
                "starved": int(goodput < STARVED_FRAC * offered),
                "sustainable_scale": repr(sustainable[scenario]),  # exact: re-runnable at this multiplier
                "static_admission_goodput_rps": f"{shed:.4f}",
                "headroom": f"{shed / goodput if goodput > 0 else math.inf:.4f}",
                "family_load": "" if load is None else f"{load:g}",
                "pattern": pattern,
                "sustained_over_estimate": "" if load is None else f"{sustainable[scenario] * load:.4f}",
            }
            if args.policy:
                row["policy_goodput_rps"] = f"{rows[scenario][args.policy][0]:.4f}"
            writer.writerow(row)


FIELDS = (
    "scenario",
    "best_rule",
    "offered_weighted_rps",
    "best_goodput_rps",
    "served_frac",
    "starved",
    "sustainable_scale",
    "static_admission_goodput_rps",
    "headroom",
    "family_load",
    "pattern",
    "sustained_over_estimate",
)
"""The CSV's columns (``policy_goodput_rps`` follows with ``--policy``)."""


@dataclass(frozen=True)
class Spread:
    """A median with its quartiles and range over ``count`` values."""

    count: int
    median: float
    q1: float
    q3: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        """The spread of ``values`` (at least one)."""
        ordered = sorted(values)
        q = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else [ordered[0]] * 3
        return cls(len(ordered), q[1], q[0], q[2], ordered[0], ordered[-1])


@dataclass(frozen=True)
class HeadroomSummary:
    """What the script prints, from one CSV it wrote (:func:`summarize`)."""

    headroom: dict[str, Spread]
    """``starved`` / ``not starved`` → goodput behind static admission over the best rule's at the offered load."""
    above_one: dict[str, int]
    """How many of each class gain from static admission (headroom above 1.0)."""
    policy_vs_best: dict[str, float]
    """With a policy column: its median goodput over the best rule's, per class."""
    policy_vs_admission: dict[str, float]
    """With a policy column: its median goodput over the best rule's behind static admission, per class."""
    sustained_over_estimate: dict[str, Spread]
    """Per temporal pattern: the best rule's sustainable multiplier × the scenario's load, i.e. the rate it sustains
    over the generator's capacity estimate (1.0: the estimate is the rate sustained at the attainment target)."""


def summarize(path: Path) -> HeadroomSummary:
    """The summary of a CSV this script wrote."""
    with path.open(newline="") as handle:
        table = list(csv.DictReader(handle))
    classes: dict[str, list[dict[str, str]]] = {"starved": [], "not starved": []}
    for row in table:
        classes["starved" if row["starved"] == "1" else "not starved"].append(row)
    headroom, above, vs_best, vs_admission = {}, {}, {}, {}
    for name, members in classes.items():
        if not members:
            continue
        ratios = [float(r["headroom"]) for r in members]
        headroom[name] = Spread.of(ratios)
        above[name] = sum(v > 1.0 for v in ratios)
        if "policy_goodput_rps" in members[0]:
            mine = [float(r["policy_goodput_rps"]) for r in members]
            best = [float(r["best_goodput_rps"]) for r in members]
            shed = [float(r["static_admission_goodput_rps"]) for r in members]
            vs_best[name] = statistics.median(m / b if b > 0 else math.inf for m, b in zip(mine, best, strict=True))
            vs_admission[name] = statistics.median(
                m / s if s > 0 else math.inf for m, s in zip(mine, shed, strict=True)
            )
    patterns: dict[str, list[float]] = defaultdict(list)
    for row in table:
        if row["sustained_over_estimate"]:
            patterns[row["pattern"]].append(float(row["sustained_over_estimate"]))
    estimate = {p: Spread.of(v) for p, v in sorted(patterns.items())}
    return HeadroomSummary(headroom, above, vs_best, vs_admission, estimate)


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.inf


def print_summary(path: Path, policy: str | None) -> None:
    """Print :func:`summarize` of ``path``."""
    summary = summarize(path)
    for name, spread in summary.headroom.items():
        print(
            f"{name} ({spread.count}): static admission / best rule at the offered load: median {spread.median:.2f}x "
            f"(quartiles {spread.q1:.2f}-{spread.q3:.2f}, min {spread.low:.2f}, max {spread.high:.2f}); "
            f"above 1.0 on {summary.above_one[name]}"
        )
        if name in summary.policy_vs_best:
            print(
                f"  {policy or 'the policy column'}: median {summary.policy_vs_best[name]:.3f}x the best rule, "
                f"{summary.policy_vs_admission[name]:.3f}x the best rule behind static admission"
            )
    if summary.sustained_over_estimate:
        print(
            "the best rule's sustainable rate over the generator's capacity estimate (multiplier x load), by pattern:"
        )
        for pattern, spread in summary.sustained_over_estimate.items():
            print(
                f"  {pattern} ({spread.count}): median {spread.median:.2f} (quartiles {spread.q1:.2f}-{spread.q3:.2f})"
            )


if __name__ == "__main__":
    main()
