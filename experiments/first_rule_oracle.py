"""How much of a rule selector's gap to the per-scenario best rule its start makes: a diagnostic, never a policy.

Usage: python experiments/first_rule_oracle.py RULES.csv --scenario-dir DIR [--policy learned:default] [--seed 0]
       [--traces DIR] [--declared-rule aggregated] [--declared-below-bytes-per-s 4.5e10] [--out FILE.json]

For every scenario of ``RULES.csv`` (a ``pdctl evaluate`` results file holding the four rules the selector chooses
among, ``baseline:<rule>``) the selector runs twice on ``DIR/<scenario>.yaml``: as it ships (``plain``: each group
starts under its first rule, dynamo-legacy, and moves when the patience allows), and with each group's first
decision set to the scenario's best rule (``oracle``: a clairvoyant start; everything after it is the selector's own).
The oracle knows the whole run's outcome, so it can only bound what a better first decision could do. The script also
records, for each group, what the window of the selector's first decision showed of its KV-transfer path (the p95
transfer time over the tightest TTFT objective of its tenants, and the failed fraction; ``null``: no transfer in that
window), the only evidence a causal first decision could have about the network.

A third pass (``declared``) asks what a causal start that knows the deployment's *declared* KV link would give: each
group of a scenario whose base link bandwidth (``cluster.network``, what an operator knows of its hardware before any
transfer) is below ``--declared-below-bytes-per-s`` (default the family's healthy link, 45 GB/s) starts under
``--declared-rule`` (default aggregated); the other scenarios run as they ship. Deterministic for given arguments.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
from pathlib import Path
from typing import Any

from agents.harness import weighted_goodput_rps
from agents.policy_specs import make_policy
from agents.result_rows import read_rows
from agents.runs import episode_env, run_episode
from agents.selector_branch import find_selector
from env.gym_env import resolve_scenario
from policies.base import PolicyContext
from policies.features import Observation
from policies.schema import ControlAction


def best_rules(path: Path) -> dict[str, tuple[str, float]]:
    """Per scenario of a results file: the rule with the highest priority-weighted goodput, and that goodput.

    Refuses, in one line, rows of another simulator than this checkout's (:func:`agents.result_rows.read_rows`).
    """
    out: dict[str, tuple[str, float]] = {}
    for name, per in sorted(read_rows([path]).items()):
        rules = {p.removeprefix("baseline:"): goodput for p, (goodput, _) in per.items() if p.startswith("baseline:")}
        if rules:
            out[name] = max(rules.items(), key=lambda item: item[1])
    return out


def declared_link_bytes_per_s(scenario_path: Path, traces: Path) -> float:
    """The scenario's base KV link bandwidth: what its operator declares of the hardware, incidents aside."""
    return resolve_scenario(scenario_path, traces).cluster.network.link_bandwidth_bytes_per_s


def run(scenario_path: Path, spec: str, seed: int, traces: Path, first_rule: str | None) -> dict[str, Any]:
    """One episode: its weighted goodput and what each group's first-decision window showed of the KV path."""
    scenario = resolve_scenario(scenario_path, traces)
    policy = make_policy(spec, scenario, None, ())
    selector = find_selector(policy)
    if first_rule is not None:
        index = list(selector.manifest.rules).index(first_rule)
        selector._rule_in_force = lambda group, context: index  # type: ignore[method-assign]
    first_window: dict[str, dict[str, float | None]] = {}
    decide = selector.decide

    def recording(observation: Observation, context: PolicyContext) -> ControlAction:
        for group in context.groups:
            gw = observation.window.groups.get(group.name)
            if group.name in first_window or gw is None:
                continue
            tightest_s = min(t.slo.ttft_target_s() for t in context.tenants_of(group.name))
            p95_s = gw.kv_transfer_time_p95_s
            first_window[group.name] = {
                "transfer_p95_over_tightest_ttft": None if p95_s is None or p95_s == 0 else p95_s / tightest_s,
                "transfer_failed_frac": gw.kv_transfer_failure_frac,
            }
        return decide(observation, context)

    selector.decide = recording  # type: ignore[method-assign]
    env = episode_env(scenario, policy, traces)
    sim = run_episode(env, policy, seed, None).sim
    return {"goodput": weighted_goodput_rps(sim, env.tenants, env.scenario.duration_s), "first_window": first_window}


def summary(ratios: list[float]) -> str:
    """Share at or above the best rule, geometric mean, floor and count below 0.9x."""
    n = len(ratios)
    geo = math.exp(sum(math.log(max(r, 1e-9)) for r in ratios) / n)
    share = sum(r >= 1.0 for r in ratios)
    below = sum(r < 0.9 for r in ratios)
    return f"{share}/{n} at >= 1.0x, geo mean {geo:.3f}x, floor {min(ratios):.3f}, {below} below 0.9x"


def paired(plain: list[float], oracle: list[float], label: str = "oracle start") -> str:
    """A changed start against the selector as it ships, scenario by scenario (geometric mean, up and down)."""
    ratios = [o / p for p, o in zip(plain, oracle, strict=True) if p > 0 and o > 0]
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    up, down = sum(r > 1.0 for r in ratios), sum(r < 1.0 for r in ratios)
    return f"{label} / as it ships: {geo:.3f}x geo mean over {len(ratios)}; {up} up, {down} down"


def main() -> None:
    """Parse the arguments, run every scenario both ways and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rules", type=Path)
    parser.add_argument("--scenario-dir", type=Path, required=True)
    parser.add_argument("--policy", default="learned:default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--traces", type=Path, default=Path(os.environ.get("PDCTL_TRACES", "data/traces")))
    parser.add_argument("--declared-rule", default="aggregated")
    parser.add_argument("--declared-below-bytes-per-s", type=float, default=4.5e10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for name, (best, best_goodput) in best_rules(args.rules).items():
        path = args.scenario_dir / f"{name}.yaml"
        if not path.is_file():
            raise SystemExit(f"--scenario-dir: {path} not found (the scenarios {args.rules} was measured on)")
        plain = run(path, args.policy, args.seed, args.traces, None)
        oracle = run(path, args.policy, args.seed, args.traces, best)
        link = declared_link_bytes_per_s(path, args.traces)
        degraded = link < args.declared_below_bytes_per_s
        declared = run(path, args.policy, args.seed, args.traces, args.declared_rule) if degraded else plain
        results[name] = {
            "best_rule": best,
            "declared_link_bytes_per_s": link,
            "plain_ratio": plain["goodput"] / best_goodput if best_goodput > 0 else 1.0,
            "oracle_ratio": oracle["goodput"] / best_goodput if best_goodput > 0 else 1.0,
            "declared_ratio": declared["goodput"] / best_goodput if best_goodput > 0 else 1.0,
            "first_window": plain["first_window"],
        }
    plain_r = [r["plain_ratio"] for r in results.values()]
    oracle_r = [r["oracle_ratio"] for r in results.values()]
    declared_r = [r["declared_ratio"] for r in results.values()]
    print(f"{args.policy} as it ships:       {summary(plain_r)}")
    print(f"with a clairvoyant first rule:  {summary(oracle_r)}")
    print(f"{args.declared_rule} first where the declared link is slow: {summary(declared_r)}")
    print(paired(plain_r, oracle_r))
    print(paired(plain_r, declared_r, "declared-link start"))
    slow = [r for r in results.values() if r["declared_link_bytes_per_s"] < args.declared_below_bytes_per_s]
    slow_plain, slow_declared = summary([r["plain_ratio"] for r in slow]), summary([r["declared_ratio"] for r in slow])
    print(f"  the {len(slow)} with a slow declared link: as it ships {slow_plain}; declared {slow_declared}")
    by_rule: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in results.values():
        by_rule[r["best_rule"]].append(r)
    for rule, rows in sorted(by_rule.items()):
        plain_n = sum(r["plain_ratio"] >= 1.0 for r in rows)
        oracle_n = sum(r["oracle_ratio"] >= 1.0 for r in rows)
        print(
            f"  best rule {rule}: {len(rows)} scenarios, at >= 1.0x {plain_n} as it ships, {oracle_n} with the oracle"
        )
    groups = [g for r in results.values() for g in r["first_window"].values()]
    seen = sum(g["transfer_p95_over_tightest_ttft"] is not None for g in groups)
    print(f"groups whose first-decision window showed any KV transfer: {seen} of {len(groups)}")
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
