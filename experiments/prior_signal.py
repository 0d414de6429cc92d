"""A diagnostic: does an episode-labelled selector network name a scenario's best rule from its first windows?

Usage: python experiments/prior_signal.py ROWS.csv [ROWS.csv ...] --scenario-dir DIR --prior POLICY_DIR
       [--policy SPEC] [--seed N] [--windows 1,3,6,12] [--traces DIR] --out FILE.json

The shipped selector's network is fitted on windowed labels: each rule's goodput over the next 8 intervals, over the
best rule's. While a group serves its load every rule would, so it scores every rule near 1.0 and the selector keeps
its first rule (dynamo-legacy) until the load or the network hurts it (``families/four-rule-bound/``). A network
fitted on episode labels (each rule's goodput over the whole episode; ``label_window_intervals`` unset) learns
instead which rule tends to be best over a whole run from states like this one: a prior, which a selector could
consult when its windowed scores tie.

This script asks whether such a prior carries the signal before anything is built on it. For every scenario of the
rows files that has a row of each of the selector's rules, it runs ``--policy`` (a rule selector, default
``learned:default``) once as ``pdctl evaluate`` does, keeps every group's network input at every interval in which
the group had traffic (the inputs the selector decided on), and scores them with the selector's own network and with
the ``--prior`` network. For each of ``--windows`` *k* it averages each network's predicted goodput ratios over a
group's first *k* such windows, then over the scenario's groups, and takes the best-scored rule; that is compared
with the scenario's best rule among the selector's rules in the rows (its committed goodput). Nothing is chosen or
shipped from this: it reads used development data only.

The output JSON has, per scenario, the rows' best rule, whether it is starved (its best rule serves under half the
offered load, as ``summarize.py --starved`` counts), the selector's own goodput over the best of all rules in the
rows, and each network's pick per *k*; and a summary of how often each network's pick is the best rule, on the
servable and the starved scenarios, beside always picking the first rule.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from agents.gate import file_sha256
from agents.policy_specs import make_policy
from agents.result_rows import read_rows
from agents.runs import episode_env, run_episode
from agents.selector_branch import find_selector
from env.gym_env import resolve_scenario
from policies.rule_selector import RuleSelector
from policies.set_features import SET_GROUP_FEATURES

STARVED_FRAC = 0.5
"""As ``summarize.py``: a scenario whose best rule's goodput is under this fraction of its offered load."""
NEAR_FRAC = 0.99
"""A picked rule within 1 % of the best rule's goodput counts as near it (``summarize.py``'s ``near``)."""
_RATE_KNOWN = len(SET_GROUP_FEATURES) + [f.name for f in SET_GROUP_FEATURES].index("request_rate_per_instance")
"""The input column that flags a group's request rate as known (:func:`policies.set_features.encode_row`)."""


def _geomean(ratios: list[float]) -> float | None:
    """Geometric mean of positive ratios (a zero counts as 1e-6); None for none."""
    return float(np.exp(np.mean(np.log(np.maximum(ratios, 1e-6))))) if ratios else None


def check_scenario_files(paths: list[Path], scenario_dir: Path) -> None:
    """Refuse, in one line, a row measured on another scenario file than the one in ``scenario_dir``.

    Its ``scenario_sha256`` against the file's; a missing file is refused too. The rows' values are read by
    :func:`agents.result_rows.read_rows` (which refuses rows of another simulator than this checkout's).

    Raises:
        SystemExit: a file is missing or differs.
    """
    for path in paths:
        with path.open(newline="") as handle:
            for row in csv.DictReader(handle):
                scenario = scenario_dir / f"{row['scenario']}.yaml"
                if not scenario.is_file():
                    raise SystemExit(f"{path}: scenario {row['scenario']}: no file {scenario}")
                pinned = row.get("scenario_sha256")
                if pinned and file_sha256(scenario) != pinned:
                    raise SystemExit(f"{path}: scenario {row['scenario']}: {scenario} is not the file it was run on")


def group_windows(scenario: Path, spec: str, seed: int, traces: Path) -> tuple[RuleSelector, list[np.ndarray]]:
    """Run ``spec`` on ``scenario``; each group's inputs in the windows it had traffic, ``[windows, width]``."""
    resolved = resolve_scenario(scenario, traces)
    policy = make_policy(spec, resolved, None, ())
    selector = find_selector(policy)
    scores = selector.network.scores
    per_group: dict[int, list[np.ndarray]] = {}

    def recorded(inputs: np.ndarray) -> np.ndarray:
        for gi, row in enumerate(inputs):
            if row[_RATE_KNOWN] > 0:
                per_group.setdefault(gi, []).append(np.array(row))
        return scores(inputs)

    object.__setattr__(selector.network, "scores", recorded)  # frozen dataclass: observe, do not change
    run_episode(episode_env(resolved, policy, traces), policy, seed)
    object.__setattr__(selector.network, "scores", scores)
    return selector, [np.stack(rows) for _, rows in sorted(per_group.items()) if rows]


def pick(network_scores: Callable[[np.ndarray], np.ndarray], groups: list[np.ndarray], k: int) -> int:
    """The rule of best predicted goodput ratio, averaged over each group's first ``k`` windows, then over groups."""
    means = []
    for windows in groups:
        logits = network_scores(windows[:k])
        means.append((1.0 / (1.0 + np.exp(-logits.astype(np.float64)))).mean(0))
    return int(np.argmax(np.mean(means, axis=0)))


def main() -> None:
    """Parse the arguments, run every scenario once and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", type=Path, nargs="+")
    parser.add_argument("--scenario-dir", type=Path, required=True)
    parser.add_argument("--prior", type=Path, required=True, help="an exported selector fitted on episode labels")
    parser.add_argument("--policy", default="learned:default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--windows", default="1,3,6,12")
    parser.add_argument("--traces", type=Path, default=Path(os.environ.get("PDCTL_TRACES", "data/traces")))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    windows = [int(k) for k in args.windows.split(",")]
    if not windows or min(windows) < 1:
        raise SystemExit(f"--windows: {args.windows!r} is not a list of positive counts")
    prior = RuleSelector.load(args.prior)
    check_scenario_files(args.rows, args.scenario_dir)
    measured = read_rows(args.rows)
    results = []
    rules: list[str] = []
    for name, row in sorted(measured.items()):
        scenario = args.scenario_dir / f"{name}.yaml"
        selector, groups = group_windows(scenario, args.policy, args.seed, args.traces)
        rules = list(selector.manifest.rules)
        if prior.manifest.rules != rules:
            raise SystemExit(f"--prior: rules {prior.manifest.rules}, the selector's are {rules}")
        if not all(f"baseline:{r}" in row for r in rules) or not groups:
            continue
        goodput = {r: row[f"baseline:{r}"][0] for r in rules}
        best = max(rules, key=lambda r: goodput[r])
        top_any = max(v[0] for p, v in row.items() if p.startswith("baseline:"))
        own = row.get(args.policy)
        results.append(
            {
                "scenario": name,
                "best_rule": best,
                "starved": row[f"baseline:{best}"][0] < STARVED_FRAC * row[f"baseline:{best}"][1],
                "first_rule_ratio": goodput[rules[0]] / goodput[best] if goodput[best] > 0 else 1.0,
                "selector_ratio_to_best_of_all": None if own is None or top_any <= 0 else own[0] / top_any,
                "goodput_ratios": {r: goodput[r] / goodput[best] if goodput[best] > 0 else 1.0 for r in rules},
                "picks": {
                    str(k): {
                        "window": rules[pick(selector.network.scores, groups, k)],
                        "prior": rules[pick(prior.network.scores, groups, k)],
                    }
                    for k in windows
                },
            }
        )
        print(name, best, results[-1]["picks"], flush=True)
    summary: dict[str, object] = {}
    for label, starved in (("servable", False), ("starved", True)):
        chosen = [r for r in results if r["starved"] == starved]
        part: dict[str, object] = {
            "scenarios": len(chosen),
            "best_rules": dict(Counter(str(r["best_rule"]) for r in chosen)),
            "first_rule_is_best": sum(r["best_rule"] == rules[0] for r in chosen),
        }
        part["first_rule_within_1pct"] = sum(r["goodput_ratios"][rules[0]] >= NEAR_FRAC for r in chosen)  # type: ignore[index]
        for k in windows:
            for net in ("window", "prior"):
                picked = [r["goodput_ratios"][r["picks"][str(k)][net]] for r in chosen]  # type: ignore[index]
                part[f"{net}_k{k}_is_best"] = sum(r["picks"][str(k)][net] == r["best_rule"] for r in chosen)  # type: ignore[index]
                part[f"{net}_k{k}_within_1pct"] = sum(x >= NEAR_FRAC for x in picked)
                part[f"{net}_k{k}_geomean_ratio"] = _geomean(picked)
                part[f"{net}_k{k}_picks"] = dict(Counter(r["picks"][str(k)][net] for r in chosen))  # type: ignore[index]
        part["first_rule_geomean_ratio"] = _geomean([r["goodput_ratios"][rules[0]] for r in chosen])  # type: ignore[index]
        summary[label] = part
    document = {"policy": args.policy, "prior": str(args.prior), "seed": args.seed, "rules": rules}
    args.out.write_text(json.dumps({**document, "summary": summary, "scenarios": results}, indent=1) + "\n")
    print("\n".join(table(summary, windows, rules[0])))


def table(summary: Mapping[str, Any], windows: list[int], first_rule: str) -> list[str]:
    """The results README's table: per scenario class, each pick's count at the best rule, near it, geo mean."""
    lines = [
        "| scenarios | pick | = best of the four | within 1 % of it | geo mean × the best of the four |",
        "|---|---|---:|---:|---:|",
    ]
    for label in ("servable", "starved"):
        part = summary[label]
        count = part["scenarios"]
        lines.append(
            f"| {label} ({count}) | always {first_rule} | {part['first_rule_is_best']} | "
            f"{part['first_rule_within_1pct']} | {part['first_rule_geomean_ratio']:.3f} |"
        )
        for k in windows:
            for net, name in (("window", "windowed network (shipped)"), ("prior", "episode prior")):
                lines.append(
                    f"| {label} ({count}) | {name}, first {k} windows | {part[f'{net}_k{k}_is_best']} | "
                    f"{part[f'{net}_k{k}_within_1pct']} | {part[f'{net}_k{k}_geomean_ratio']:.3f} |"
                )
    return lines


if __name__ == "__main__":
    main()
