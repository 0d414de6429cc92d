"""Which tenants miss their objectives even at a small fraction of their load, and by which objective.

Usage: python experiments/low_load_objectives.py SCENARIO.yaml ... [--policies SPEC,SPEC,...] [--rate-scale X]
       [--target FRAC] [--seed N] [--workers N]

Runs each scenario under each of ``--policies`` (default: the four rules of the issue-18 tables) with every tenant's
request rate multiplied by ``--rate-scale`` (default 1/16). Each tenant is judged by the run that served it best.
For every tenant whose best SLO attainment is below ``--target`` (default 0.9), one line: that attainment, its
arrivals and the policy, and its TTFT and TPOT p95 there against the bounds each request is scored against (the
tightest quantile objective set, as :mod:`policies.scoring` counts a request met). A tenant that misses under every
policy at a sixteenth of its load misses because its requests cannot be served within its objectives on these GPUs
by any of them, not because of the load.

The last line counts the tenants listed, of all tenants run, by archetype (the name before the dash), by the
scenario's model profile and by the objective their p95 exceeds.
"""

from __future__ import annotations

import argparse
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from agents.harness import ALL_TENANTS, RunResult, RunSpec, run_many
from policies.schema import Slo


def _objective(slo: dict[str, float], kind: str) -> float | None:
    """The per-request bound of ``kind`` (``ttft``/``tpot``) a request is scored against, None without objective.

    :meth:`policies.schema.Slo.ttft_target_s` / ``tpot_target_s``: the tightest quantile objective set.
    """
    target = Slo(**{k: float(v) for k, v in slo.items()})
    bound = target.ttft_target_s() if kind == "ttft" else target.tpot_target_s()
    return None if math.isinf(bound) else bound


RULES = "baseline:dynamo-legacy,baseline:aggregated,baseline:dynamo-isl-bounding,baseline:dynamo-isl-or-load"
"""The four rules the issue-18 tables compare against (the default of ``--policies``)."""


def best_rows(results: list[RunResult]) -> dict[str, dict[str, Any]]:
    """Tenant → the row of the run that served it best (highest SLO attainment; the first on ties; known ones first).

    Each row gains ``policy``, the spec of that run.
    """
    best: dict[str, dict[str, Any]] = {}
    for result in results:
        for row in result.rows:
            if row["tenant"] == ALL_TENANTS:
                continue
            attainment = row["slo_attainment_frac"]
            held = best.get(row["tenant"])
            held_attainment = None if held is None else held["slo_attainment_frac"]
            if held is None or (attainment is not None and (held_attainment is None or attainment > held_attainment)):
                best[row["tenant"]] = {**row, "policy": result.spec.policy}
    return best


def main() -> None:
    """Run the scenarios at the reduced rate and list the tenants below the target (module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("scenarios", nargs="+", type=Path)
    parser.add_argument("--policies", default=RULES, help="comma list of specs; each tenant is judged by its best")
    parser.add_argument("--rate-scale", type=float, default=1 / 16)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if not args.rate_scale > 0:
        parser.error(f"--rate-scale must be > 0, got {args.rate_scale}")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        parser.error("--policies names no policy")
    traces = os.environ.get("PDCTL_TRACES")
    specs = [
        RunSpec(pol, str(p), args.seed, args.rate_scale, traces_dir=traces) for p in args.scenarios for pol in policies
    ]
    results = run_many(specs, args.workers)
    archetypes: Counter[str] = Counter()
    tenants: Counter[str] = Counter()
    profiles: Counter[str] = Counter()
    profile_tenants: Counter[str] = Counter()
    binding: Counter[str] = Counter()
    for k, path in enumerate(args.scenarios):
        mine = results[k * len(policies) : (k + 1) * len(policies)]
        failed = next((r for r in mine if r.error is not None), None)
        if failed is not None:
            raise SystemExit(f"{path} under {failed.spec.policy}: {failed.error}")
        scenario = yaml.safe_load(path.read_text(encoding="utf-8"))
        slos = {t["name"]: t.get("slo") or {} for t in scenario["tenants"]}
        profile = str(scenario["cluster"]["profile"])
        profile_tenants[profile] += len(slos)
        tenants.update(name.split("-")[0] for name in slos)
        cells = []
        for name, row in best_rows(mine).items():
            attainment = row["slo_attainment_frac"]
            if attainment is None or attainment >= args.target:
                continue
            ttft, tpot = _objective(slos[name], "ttft"), _objective(slos[name], "tpot")
            over = [
                kind
                for kind, seen, objective in (("ttft", row["ttft_p95_s"], ttft), ("tpot", row["tpot_p95_s"], tpot))
                if objective is not None and seen is not None and seen > objective
            ]
            archetypes[name.split("-")[0]] += 1
            profiles[profile] += 1
            binding["+".join(over) or "neither p95"] += 1
            seen_ttft, seen_tpot = row["ttft_p95_s"] or 0.0, row["tpot_p95_s"] or 0.0
            cells.append(
                f"{name} {attainment:.2f} of {row['arrived']} at best ({row['policy']}): "
                f"TTFT p95 {seen_ttft:.2f}/{ttft} s, TPOT p95 {seen_tpot:.3f}/{tpot} s"
            )
        print(f"{path.stem} (x{args.rate_scale:g}): {'; '.join(cells) or 'every tenant met'}")
    by_archetype = ", ".join(f"{a} {archetypes[a]}/{n}" for a, n in sorted(tenants.items()))
    by_profile = ", ".join(f"{p} {profiles[p]}/{n}" for p, n in sorted(profile_tenants.items()))
    print(
        f"{sum(archetypes.values())} of {sum(tenants.values())} tenants below {args.target:g} under every policy in "
        f"{len(args.scenarios)} scenarios ({by_archetype}; {by_profile}); "
        f"p95 over its objective: {dict(sorted(binding.items()))}"
    )


if __name__ == "__main__":
    main()
