"""Where a rule selector loses: its rule changes per scenario, beside the four rules' goodput.

Usage: python experiments/selector_switches.py SCENARIO.yaml ... --rules CSV [--rules CSV ...] [--policy SPEC]
       [--seed N] [--rate-scale X] [--below X] [--traces DIR]

Runs each scenario once under SPEC (default ``learned:default``), exactly as ``pdctl evaluate`` does, and records
every change of rule of every tenant group. ``--rules`` are ``pdctl evaluate`` CSVs holding the selector's rules
(``baseline:NAME``) on the same scenario files, seed and rate scale (``--rate-scale`` multiplies every tenant's
request rate, as in ``experiments/trace_selector.py``). For each scenario whose weighted goodput is below ``--below``
(default 0.9) times the per-scenario best rule's, one line: the ratio, the best rule, and the changes
(``time_s:group:from>to``), classed as

* ``aggregated-not-best``: some group was moved to ``aggregated`` and aggregated is not the best rule;
* ``never-switched``: no group changed rule;
* ``other``: the rest.

The last lines count the classes and the share of scenarios at or above the best rule (this seed only).
"""

from __future__ import annotations

import argparse
import csv
import os
from collections import Counter
from pathlib import Path

from agents.harness import weighted_goodput_rps
from agents.policy_specs import make_policy
from agents.runs import episode_env, run_episode, scale_rates
from agents.selector_branch import find_selector
from env.gym_env import ControlStep, PDClusterEnv, resolve_scenario

Change = tuple[float, str, str, str]
"""(time_s, group, rule before, rule after)."""


def rule_goodputs(paths: list[Path], rules: list[str], rate_scale: float = 1.0) -> dict[str, dict[str, float]]:
    """Scenario → rule → weighted goodput (req/s): the ``ALL`` rows of ``pdctl evaluate`` CSVs at ``rate_scale``."""
    out: dict[str, dict[str, float]] = {}
    wanted = {f"baseline:{rule}": rule for rule in rules}
    for path in paths:
        with path.open(newline="") as handle:
            for row in csv.DictReader(handle):
                rule = wanted.get(row["policy"])
                if rule is None or row["tenant"] != "ALL" or float(row.get("rate_scale") or 1.0) != rate_scale:
                    continue
                out.setdefault(row["scenario"], {})[rule] = float(row["weighted_goodput_rps_mean"])
    return out


def run_with_changes(
    scenario_path: Path, spec: str, seed: int, traces: Path, rate_scale: float = 1.0
) -> tuple[float, list[Change]]:
    """One run of ``scenario_path`` under ``spec``: its weighted goodput (req/s) and every group's rule changes."""
    scenario = scale_rates(resolve_scenario(scenario_path, traces), rate_scale)
    policy = make_policy(spec, scenario, None, ())
    selector = find_selector(policy)
    env = episode_env(scenario, policy, traces)
    changes: list[Change] = []
    before: dict[str, str] = {}

    def on_interval(env: PDClusterEnv, step: ControlStep) -> None:
        chosen = selector.chosen_rules()
        for group, rule in chosen.items():
            if group in before and before[group] != rule:
                changes.append((env.sim.now_s, group, before[group], rule))
        before.update(chosen)

    sim = run_episode(env, policy, seed, on_interval).sim
    return weighted_goodput_rps(sim, env.tenants, env.scenario.duration_s), changes


def loss_class(best_rule: str, changes: list[Change]) -> str:
    """The class of a lost scenario (module docstring)."""
    if any(after == "aggregated" for _, _, _, after in changes) and best_rule != "aggregated":
        return "aggregated-not-best"
    return "never-switched" if not changes else "other"


def main() -> None:
    """Parse the arguments, run every scenario and print the lost ones."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", type=Path, nargs="+")
    parser.add_argument("--rules", type=Path, action="append", required=True, help="pdctl evaluate CSV with the rules")
    parser.add_argument("--policy", default="learned:default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate-scale", type=float, default=1.0, help="every tenant's request rate times this")
    parser.add_argument("--below", type=float, default=0.9, help="list scenarios below this times the best rule")
    parser.add_argument("--traces", type=Path, default=Path(os.environ.get("PDCTL_TRACES", "data/traces")))
    args = parser.parse_args()
    if not args.rate_scale > 0:
        raise SystemExit(f"--rate-scale: {args.rate_scale} is not a positive multiplier")
    probe = make_policy(args.policy, resolve_scenario(args.scenarios[0], args.traces), None, ())
    try:
        rules = list(find_selector(probe).manifest.rules)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    table = rule_goodputs(args.rules, rules, args.rate_scale)
    classes: Counter[str] = Counter()
    at_best = 0
    for path in args.scenarios:
        name = path.stem
        goodputs = table.get(name, {})
        missing = [rule for rule in rules if rule not in goodputs]
        if missing:
            raise SystemExit(
                f"--rules: no row of baseline:{missing[0]} on scenario {name} at rate scale {args.rate_scale}"
            )
        best_rule = max(goodputs, key=lambda rule: goodputs[rule])
        goodput, changes = run_with_changes(path, args.policy, args.seed, args.traces, args.rate_scale)
        best = goodputs[best_rule]
        ratio = goodput / best if best > 0 else 1.0
        at_best += ratio >= 1.0
        if ratio < args.below:
            kind = loss_class(best_rule, changes)
            classes[kind] += 1
            listed = " ".join(f"{t:.0f}:{g}:{a}>{b}" for t, g, a, b in changes)
            print(f"{ratio:.3f} {name} best={best_rule} {kind} {listed}", flush=True)
    total = len(args.scenarios)
    counted = ", ".join(f"{kind} {n}" for kind, n in sorted(classes.items()))
    print(f"below {args.below}: {counted or 'none'}")
    print(f"at or above the best rule: {at_best}/{total}")


if __name__ == "__main__":
    main()
