"""The rule that was best on a scenario at one seed, scored at another: how far a hindsight choice of rule carries.

Usage: python hindsight_rule.py --chosen-at A.csv [A.csv ...] --scored-at B.csv [B.csv ...] --label LABEL --out OUT.csv

Issue 18's floor line asks that no scenario fall below 0.9x its best rule. The best rule of a scenario is the best of
a dozen noisy runs on one sample path, so even a choice of rule made with hindsight on the *same scenario* (its
tenants, budgets, SLOs and traffic model) but another sample path need not reach it. This script makes that choice
measurable: for every scenario both sets of files hold, it takes the rule (a ``baseline:`` or ``file:`` policy) with the
highest weighted goodput in the ``--chosen-at`` files, among the rules both sets ran on every such scenario, and writes
that rule's row from the ``--scored-at`` files under the policy name ``LABEL``. ``summarize.py`` then scores ``LABEL``
beside the rules of the ``--scored-at`` files like any policy (share, floor, scenarios below 0.9x).

A clairvoyant choice, never a deployable policy: it knows which rule won the scenario at another seed. Only the
``tenant=ALL`` rows at rate 1.0 are read and written, as by ``summarize.py``, whose checks (one simulator, one scenario
file per scenario name) every input passes first.
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence
from pathlib import Path

from summarize import RULE_PREFIXES, _best_of, _rows

__all__ = ["hindsight_rows", "main"]


def _all_rows(paths: Sequence[str]) -> dict[tuple[str, str], dict[str, str]]:
    """(scenario, policy) → its ``tenant=ALL`` row at rate 1.0, every column as written (the last file's row stands)."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    for path in paths:
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                if row["tenant"] == "ALL" and float(row.get("rate_scale") or 1.0) == 1.0:
                    out[row["scenario"], row["policy"]] = row
    return out


def hindsight_rows(chosen_at: Sequence[str], scored_at: Sequence[str], label: str) -> list[dict[str, str]]:
    """One row per scenario both sets hold: the ``scored_at`` row of the rule best in ``chosen_at``, named ``label``.

    Raises:
        SystemExit: one line, when the two sets share no scenario or no rule ran on all of them at both.
    """
    chosen, scored = _rows(list(chosen_at)), _rows(list(scored_at))
    scenarios = sorted(set(chosen) & set(scored))
    if not scenarios:
        raise SystemExit(f"--chosen-at and --scored-at share no scenario ({', '.join([*chosen_at, *scored_at])})")
    rules = sorted(
        {p for s in scenarios for p in chosen[s] if p.startswith(RULE_PREFIXES)}
        & {p for s in scenarios for p in scored[s] if p.startswith(RULE_PREFIXES)}
    )
    rules = [r for r in rules if all(r in chosen[s] and r in scored[s] for s in scenarios)]
    if not rules:
        raise SystemExit("no rule (baseline: or file:) ran on every shared scenario in --chosen-at and --scored-at")
    raw = _all_rows(scored_at)
    out = []
    for scenario in scenarios:
        rule = _best_of(chosen[scenario], rules)
        out.append({**raw[scenario, rule], "policy": label})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Write the hindsight rows (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--chosen-at", nargs="+", required=True, help="pdctl evaluate CSVs the rule is chosen on")
    parser.add_argument("--scored-at", nargs="+", required=True, help="pdctl evaluate CSVs its row is taken from")
    parser.add_argument("--label", required=True, help="the policy name of the written rows (not baseline: or file:)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.label.startswith(RULE_PREFIXES):
        raise SystemExit(f"--label {args.label}: a rule's prefix would make summarize.py count it among the rules")
    rows = hindsight_rows(args.chosen_at, args.scored_at, args.label)
    fields = list(dict.fromkeys(field for row in rows for field in row))  # files may differ in their columns
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, restval="", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    print(f"{args.out}: {len(rows)} scenarios, {args.label}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
