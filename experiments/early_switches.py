"""How a rule selector's early switches fare: scenarios where it changed a group's rule early, against the rest.

Usage: python experiments/early_switches.py TRACES_DIR RULES.csv [--within-s 90] [--first-rule dynamo-legacy]

``TRACES_DIR`` holds one ``<scenario>.txt`` per scenario, the output of ``experiments/trace_selector.py`` on it (its
last lines: the run's priority-weighted goodput and every change of a group's rule with its time). ``RULES.csv`` is
``pdctl evaluate`` rows of the rules on the same scenarios and seed (the tenant=ALL rows, e.g. a reserved set's). For
the scenarios with a change within ``--within-s`` seconds of the start and for the others, the table gives how many
there are, how many are below 0.9x their best rule, the geometric mean over the best rule of the selector and of
``--first-rule`` (the rule a selector starts with, what never switching early would keep at first), and on how many
the selector is at or above that rule. Read-only; the selector's figure is the trace's, so run the traces with the
policy and seed the question is about.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agents.result_rows import read_rows

_GOODPUT = re.compile(r"^weighted goodput ([0-9.]+) rps$", re.MULTILINE)
_CHANGE = re.compile(r"(\d+) s (\S+): (\S+) -> (\S+)")
_FLOOR = 1e-3
"""Ratios are floored here in a geometric mean (a zero would make it zero whatever the rest)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One scenario: the selector's and the first rule's goodput over the best rule's, and its first change."""

    scenario: str
    selector_ratio: float
    first_rule_ratio: float
    first_change_s: float | None


def _rules(path: Path) -> dict[str, dict[str, float]]:
    """Scenario → rule name → weighted goodput, by :func:`agents.result_rows.read_rows` (``baseline:`` dropped)."""
    return {
        scenario: {policy.removeprefix("baseline:"): goodput for policy, (goodput, _) in by_policy.items()}
        for scenario, by_policy in read_rows([path]).items()
    }


def _over(goodput: float, best: float) -> float:
    """``goodput`` over the best rule's (1 where no rule serves anything)."""
    return goodput / best if best > 0 else 1.0


def outcomes(traces: Path, rules_csv: Path, first_rule: str) -> list[Outcome]:
    """Every traced scenario that the rules' rows cover, in name order."""
    rules = _rules(rules_csv)
    out = []
    for trace in sorted(traces.glob("*.txt")):
        scenario = trace.stem
        if scenario not in rules:
            raise SystemExit(f"{trace}: no rule rows for {scenario} in {rules_csv}")
        text = trace.read_text(encoding="utf-8")
        goodput = _GOODPUT.search(text)
        if goodput is None:
            raise SystemExit(f"{trace}: no 'weighted goodput' line (not a finished trace_selector.py output)")
        changes = text.rsplit("rule changes:", 1)[-1]
        times = [float(m.group(1)) for m in _CHANGE.finditer(changes)]
        best = max(rules[scenario].values())
        if first_rule not in rules[scenario]:
            raise SystemExit(f"{rules_csv}: no row of {first_rule} on {scenario}")
        out.append(
            Outcome(
                scenario,
                _over(float(goodput.group(1)), best),
                _over(rules[scenario][first_rule], best),
                min(times) if times else None,
            )
        )
    return out


def _geomean(values: Sequence[float]) -> float:
    return math.exp(math.fsum(math.log(max(v, _FLOOR)) for v in values) / len(values)) if values else math.nan


def table(rows: Sequence[Outcome], within_s: float, first_rule: str) -> str:
    """The Markdown table: early changers against the rest."""
    early = [r for r in rows if r.first_change_s is not None and r.first_change_s <= within_s]
    rest = [r for r in rows if r not in early]
    header = f"| scenarios | count | below 0.9x | selector × best rule | {first_rule} × best rule |"
    lines = [f"{header} selector ≥ {first_rule} |", "|---|---:|---:|---:|---:|---:|"]
    for label, part in ((f"a change within {within_s:g} s", early), ("no change that early", rest)):
        lines.append(
            f"| {label} | {len(part)} | {sum(r.selector_ratio < 0.9 for r in part)} | "
            f"{_geomean([r.selector_ratio for r in part]):.3f} | {_geomean([r.first_rule_ratio for r in part]):.3f} | "
            f"{sum(r.selector_ratio >= r.first_rule_ratio for r in part)} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", type=Path)
    parser.add_argument("rules", type=Path)
    parser.add_argument("--within-s", type=float, default=90.0)
    parser.add_argument("--first-rule", default="dynamo-legacy")
    args = parser.parse_args(argv)
    if not args.traces.is_dir():
        raise SystemExit(f"{args.traces}: not a folder of trace_selector.py outputs")
    rows = outcomes(args.traces, args.rules, args.first_rule)
    if not rows:
        raise SystemExit(f"{args.traces}: no <scenario>.txt trace in it")
    print(table(rows, args.within_s, args.first_rule))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
