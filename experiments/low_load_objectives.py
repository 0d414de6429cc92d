"""Which tenants miss their objectives even at a small fraction of their load, and by which objective.

Usage: python experiments/low_load_objectives.py SCENARIO.yaml ... [--policy SPEC | --best-rule-from HEADROOM.csv]
       [--rate-scale X] [--target FRAC] [--seed N] [--workers N]

Runs each scenario once with every tenant's request rate multiplied by ``--rate-scale`` (default 1/16), under
``--policy`` (default ``baseline:dynamo-legacy``) or, with ``--best-rule-from``, under the best rule that
``experiments/admission_headroom.py`` recorded for it. For every tenant whose SLO attainment is below ``--target``
(default 0.9), one line: its attainment and arrivals, and its TTFT and TPOT p95 against its objectives (the p95
objective, else the p99 one). A tenant that misses at a sixteenth of its load misses because its requests cannot
be served within its objectives on these GPUs at all, not because of the policy or the load.

The last line counts the tenants listed, of all tenants run, by archetype (the name before the dash), by the
scenario's model profile and by the objective their p95 exceeds.
"""

from __future__ import annotations

import argparse
import csv
import os
from collections import Counter
from pathlib import Path

import yaml

from agents.harness import ALL_TENANTS, RunSpec, run_many


def _objective(slo: dict[str, float], kind: str) -> float | None:
    """The tenant's p95 objective of ``kind`` (``ttft``/``tpot``), else its p99 one, else None."""
    value = slo.get(f"{kind}_p95_s", slo.get(f"{kind}_p99_s"))
    return None if value is None else float(value)


def main() -> None:
    """Run the scenarios at the reduced rate and list the tenants below the target (module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("scenarios", nargs="+", type=Path)
    parser.add_argument("--policy", default="baseline:dynamo-legacy")
    parser.add_argument("--best-rule-from", type=Path, help="admission_headroom.py CSV naming each scenario's rule")
    parser.add_argument("--rate-scale", type=float, default=1 / 16)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if not args.rate_scale > 0:
        parser.error(f"--rate-scale must be > 0, got {args.rate_scale}")
    policy_of = dict.fromkeys((p.stem for p in args.scenarios), args.policy)
    if args.best_rule_from is not None:
        with args.best_rule_from.open(newline="") as handle:
            recorded = {row["scenario"]: row["best_rule"] for row in csv.DictReader(handle)}
        missing = sorted(set(policy_of) - set(recorded))
        if missing:
            raise SystemExit(f"--best-rule-from {args.best_rule_from}: no row for scenario {missing[0]}")
        policy_of = {name: recorded[name] for name in policy_of}
    traces = os.environ.get("PDCTL_TRACES")
    specs = [RunSpec(policy_of[p.stem], str(p), args.seed, args.rate_scale, traces_dir=traces) for p in args.scenarios]
    archetypes: Counter[str] = Counter()
    tenants: Counter[str] = Counter()
    profiles: Counter[str] = Counter()
    profile_tenants: Counter[str] = Counter()
    binding: Counter[str] = Counter()
    for path, result in zip(args.scenarios, run_many(specs, args.workers), strict=True):
        if result.error is not None:
            raise SystemExit(f"{path}: {result.error}")
        scenario = yaml.safe_load(path.read_text(encoding="utf-8"))
        slos = {t["name"]: t.get("slo") or {} for t in scenario["tenants"]}
        profile = str(scenario["cluster"]["profile"])
        profile_tenants[profile] += len(slos)
        cells = []
        tenants.update(name.split("-")[0] for name in slos)
        for row in result.rows:
            attainment = row["slo_attainment_frac"]
            if row["tenant"] == ALL_TENANTS or attainment is None or attainment >= args.target:
                continue
            slo = slos[row["tenant"]]
            ttft, tpot = _objective(slo, "ttft"), _objective(slo, "tpot")
            over = [
                kind
                for kind, seen, objective in (("ttft", row["ttft_p95_s"], ttft), ("tpot", row["tpot_p95_s"], tpot))
                if objective is not None and seen is not None and seen > objective
            ]
            archetypes[row["tenant"].split("-")[0]] += 1
            profiles[profile] += 1
            binding["+".join(over) or "neither p95"] += 1
            seen_ttft, seen_tpot = row["ttft_p95_s"] or 0.0, row["tpot_p95_s"] or 0.0
            cells.append(
                f"{row['tenant']} {attainment:.2f} of {row['arrived']}: TTFT p95 {seen_ttft:.2f}/{ttft} s, "
                f"TPOT p95 {seen_tpot:.3f}/{tpot} s"
            )
        print(f"{path.stem} ({policy_of[path.stem]} at x{args.rate_scale:g}): {'; '.join(cells) or 'every tenant met'}")
    by_archetype = ", ".join(f"{a} {archetypes[a]}/{n}" for a, n in sorted(tenants.items()))
    by_profile = ", ".join(f"{p} {profiles[p]}/{n}" for p, n in sorted(profile_tenants.items()))
    print(
        f"{sum(archetypes.values())} of {sum(tenants.values())} tenants below {args.target:g} in "
        f"{len(args.scenarios)} scenarios ({by_archetype}; {by_profile}); "
        f"p95 over its objective: {dict(sorted(binding.items()))}"
    )


if __name__ == "__main__":
    main()
