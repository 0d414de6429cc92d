"""Summarise `pdctl evaluate` runs on a generated scenario family against its rules (issue 18's yardsticks).

Usage: python experiments/results/families/summarize.py RESULTS.csv [RESULTS.csv ...] --policy SPEC [--policy SPEC]
       [--pool-seeds] [--versus SPEC] [--starved only|exclude] [--scenarios-from FILE] [--worst N]

Reads the per-scenario ALL rows (mean over seeds) of every given results.csv, takes every `baseline:` / `file:`
policy as a rule, and prints, per policy named with --policy: its priority-weighted goodput against the
per-scenario best rule (floor = the lowest ratio, share of scenarios at >= 1.0x) and against the single rule that
is best over the whole set (geometric mean of ratios to the per-scenario best), and GPU-hours side by side; it names
the shipped rules (`pdctl evaluate --policies baselines`) the files lack, since the best rule is the best of those
run; then the
count of scenarios below issue 18's floor line (0.9x the per-scenario best rule), and how many of those are
scenarios whose best rule itself serves less than half the offered weighted load.

With ``--versus SPEC``, every other --policy is also compared with SPEC scenario by scenario: the geometric-mean
goodput ratio with a 95 % bootstrap interval over scenarios (:func:`agents.paired.paired_ratio`, seed 0). A
difference whose interval straddles 1.0 is one these scenarios cannot tell from noise.

A ``--policy bound:RULE+RULE+...`` is no policy but a bound: on each scenario the best of the named rules, as if a
clairvoyant chose among them once per scenario before it ran (what a selector over those rules would reach if it
always picked the right one from the start and never switched). It is figured like a policy and is never a rule.

``--starved only`` (``exclude``) restricts every figure to the scenarios whose best rule serves less than half the
offered weighted load (to the others); the single best rule is then the best over that subset. ``--scenarios-from
FILE`` restricts them to the scenarios the file names, one per line.

``--worst N`` lists, per --policy, the N scenarios where it is lowest against the per-scenario best rule, with that
rule, whether the scenario is starved, and (with ``--versus``) the compared policy's ratio on the same scenario: the
floor line is one scenario's ratio, and this names it.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from agents.paired import PairedRatio, paired_ratio
from agents.policy_specs import all_baseline_specs
from agents.source_digest import OneSimulator

FLOOR_LINE = 0.9
"""Issue 18's floor: no scenario below this times its best rule."""

NEAR_LINE = 0.99
"""Reported beside the share (not a line of issue 18): scenarios within 1 % of their best rule. The share counts a tie
with the best of 13 rules but not 0.999×; this count shows how many scenarios sit that close to the line, where two
policies' shares can differ by noise."""

RULE_PREFIXES = ("baseline:", "file:")
"""A policy whose spec starts with one of these is a rule (the best rule is the best of them)."""

BOUND_PREFIX = "bound:"
"""A --policy ``bound:RULE+RULE+...`` is the per-scenario best of those rules (module docstring)."""

STARVED_FRAC = 0.5
"""A scenario whose best rule serves less than this fraction of its offered weighted load is past what any of the
rules can serve: a ratio to the best rule there compares ways of failing."""


def _best_of(rows: dict[str, dict[str, float]], rules: list[str]) -> str:
    """The rule of ``rules`` with the highest goodput in one scenario's ``rows`` (the first of equals)."""
    return max(rules, key=lambda r: rows[r]["goodput"])


def _rows(paths: list[str], pool_seeds: bool = False) -> dict[str, dict[str, dict[str, float]]]:
    """Per scenario and policy: goodput, GPU-hours and the offered weighted load (NaN where a file has none).

    With ``pool_seeds``, a (scenario, policy) pair found in several files (runs on other seeds) gets the mean over
    all their seeds (weighted by ``num_seeds``); without it, the last file's row stands.

    Exits with one line when two files measured a scenario of the same name on different scenario files (the
    ``scenario_sha256`` column `pdctl evaluate` writes; files without it are not checked): a generator or a
    performance model that changed in between makes their ratios meaningless. Likewise when two rows were measured
    by different simulators (the ``simulator_sha256`` column, a digest of the simulator's source; files written
    before it existed count as one simulator, "unrecorded").
    """
    table: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    seeds: dict[tuple[str, str], float] = {}
    digests: dict[str, tuple[str, str]] = {}
    simulator = OneSimulator()
    for path in paths:
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                if row["tenant"] != "ALL" or float(row.get("rate_scale") or 1.0) != 1.0:
                    continue
                simulator.see(row.get("simulator_sha256"), path)
                digest = row.get("scenario_sha256") or ""
                if digest:
                    seen = digests.setdefault(row["scenario"], (digest, path))
                    if seen[0] != digest:
                        raise SystemExit(
                            f"{path}: scenario {row['scenario']} was measured on another file than in {seen[1]} "
                            f"(sha256 {digest[:12]} vs {seen[0][:12]}); regenerate and re-run one of them"
                        )
                goodput = float(row["weighted_goodput_rps_mean"])
                gpu_h = float(row["gpu_seconds_mean"]) / 3600.0
                offered = float(row.get("offered_weighted_rps_mean") or "nan")
                key = (row["scenario"], row["policy"])
                n = float(row.get("num_seeds") or 1)
                if pool_seeds and key in seeds:
                    before, m = table[key[0]][key[1]], seeds[key]
                    goodput = (before["goodput"] * m + goodput * n) / (m + n)
                    gpu_h = (before["gpu_h"] * m + gpu_h * n) / (m + n)
                    offered = (before["offered"] * m + offered * n) / (m + n)
                    n += m
                seeds[key] = n
                table[row["scenario"]][row["policy"]] = {"goodput": goodput, "gpu_h": gpu_h, "offered": offered}
    return table


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))


@dataclass(frozen=True)
class PolicyFigures:
    """One policy's figures over a set of scenarios (what a row of the printed table says)."""

    policy: str
    vs_best_geomean: float
    """Geometric mean of its goodput over the per-scenario best rule's."""
    vs_single_geomean: float
    """Geometric mean of its goodput over the single best rule's (the rule best over the whole set)."""
    floor: float
    """Its lowest ratio to the per-scenario best rule."""
    at_least_best: int
    """Scenarios at ≥ 1.0× the per-scenario best rule."""
    gpu_h: float
    below_floor_line: int = 0
    """Scenarios below :data:`FLOOR_LINE` × the per-scenario best rule."""
    below_starved: int = 0
    """Of those, the ones whose best rule serves less than :data:`STARVED_FRAC` of the offered weighted load (a
    scenario whose rows carry no offered load is not counted)."""
    near_best: int = 0
    """Scenarios at ≥ :data:`NEAR_LINE` × the per-scenario best rule."""


@dataclass(frozen=True)
class Summary:
    """Every figure the table prints, for ``policies`` and the rules, on the scenarios all of them ran."""

    scenarios: list[str]
    rules: list[str]
    single: str
    best_counts: dict[str, int]
    figures: dict[str, PolicyFigures]
    paired: dict[str, PairedRatio] = field(default_factory=dict)
    """Against ``versus``: every other policy's paired ratio."""
    rules_not_run: list[str] = field(default_factory=list)
    """The shipped rules (:func:`agents.policy_specs.all_baseline_specs`, less the grid) not among ``rules``: the
    per-scenario best rule is the best of ``rules`` only, and a rule left out could be better somewhere."""
    best_rule: dict[str, str] = field(default_factory=dict)
    """Per scenario: its best rule."""
    starved: frozenset[str] = frozenset()
    """The scenarios whose best rule serves less than :data:`STARVED_FRAC` of the offered weighted load."""
    ratios: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per policy and scenario: its goodput over the per-scenario best rule's (what ``floor`` is the minimum of)."""

    def worst(self, policy: str, count: int) -> list[tuple[str, float]]:
        """The ``count`` scenarios where ``policy`` is lowest against the best rule, lowest first (ties by name)."""
        by_scenario = self.ratios[policy]
        return sorted(by_scenario.items(), key=lambda item: (item[1], item[0]))[:count]


def summarize(
    paths: list[str],
    policies: list[str],
    pool_seeds: bool = False,
    versus: str | None = None,
    starved: bool | None = None,
    only: frozenset[str] | None = None,
) -> Summary:
    """The figures of ``policies`` (and of every rule) over the scenarios they and the rules all ran.

    ``versus``, when given, is added to ``policies`` and every other policy is compared with it scenario by
    scenario (:func:`agents.paired.paired_ratio`, seed 0). ``starved`` keeps only the scenarios whose best rule
    serves less than :data:`STARVED_FRAC` of the offered weighted load (``True``) or only the others (``False``).
    ``only`` keeps only the scenarios it names (the single best rule is then the best over them).
    """
    policies = list(policies)
    if versus and versus not in policies:
        policies.append(versus)
    table = _rows(paths, pool_seeds)
    for p in policies:
        if p.startswith(BOUND_PREFIX):
            _add_bound(table, p)
    scenarios = sorted(
        s for s, by in table.items() if all(p in by for p in policies) and any(p.startswith(RULE_PREFIXES) for p in by)
    )
    if not scenarios:
        raise SystemExit(f"no scenario has every policy of {policies} and a rule in {', '.join(paths)}")
    rules = sorted({p for s in scenarios for p in table[s] if p.startswith(RULE_PREFIXES)})
    rules = [r for r in rules if all(r in table[s] for s in scenarios)]
    best = {s: _best_of(table[s], rules) for s in scenarios}

    def ratio(s: str, p: str) -> float:
        top = table[s][best[s]]["goodput"]
        return table[s][p]["goodput"] / top if top > 0 else 1.0

    def starved_scenario(s: str) -> bool:
        top = table[s][best[s]]
        return top["offered"] > 0 and top["goodput"] < STARVED_FRAC * top["offered"]

    if starved is not None:
        scenarios = [s for s in scenarios if starved_scenario(s) == starved]
        if not scenarios:
            raise SystemExit(f"--starved: no scenario of {', '.join(paths)} is {'' if starved else 'not '}starved")
    if only is not None:
        scenarios = [s for s in scenarios if s in only]
        if not scenarios:
            raise SystemExit(f"--scenarios-from: none of its scenarios is among those of {', '.join(paths)}")
    single = max(rules, key=lambda r: _geomean([ratio(s, r) for s in scenarios]))
    starved_set = frozenset(s for s in scenarios if starved_scenario(s))
    figures: dict[str, PolicyFigures] = {}
    all_ratios: dict[str, dict[str, float]] = {}
    for p in [*policies, single, *[r for r in rules if r != single]]:
        ratios = [ratio(s, p) for s in scenarios]
        all_ratios[p] = dict(zip(scenarios, ratios, strict=True))
        figures[p] = PolicyFigures(
            policy=p,
            vs_best_geomean=_geomean(ratios),
            vs_single_geomean=_geomean(
                [
                    table[s][p]["goodput"] / table[s][single]["goodput"]
                    for s in scenarios
                    if table[s][single]["goodput"] > 0
                ]
            ),
            floor=min(ratios),
            at_least_best=sum(r >= 1.0 - 1e-9 for r in ratios),
            gpu_h=sum(table[s][p]["gpu_h"] for s in scenarios),
            below_floor_line=sum(r < FLOOR_LINE for r in ratios),
            near_best=sum(r >= NEAR_LINE - 1e-9 for r in ratios),
            below_starved=sum(r < FLOOR_LINE and s in starved_set for s, r in zip(scenarios, ratios, strict=True)),
        )
    paired: dict[str, PairedRatio] = {}
    if versus:
        base = {s: table[s][versus]["goodput"] for s in scenarios}
        for p in policies:
            if p != versus:
                paired[p] = paired_ratio({s: table[s][p]["goodput"] for s in scenarios}, base)
    counts = dict(sorted({r: sum(best[s] == r for s in scenarios) for r in rules}.items()))
    not_run = [r for r in all_baseline_specs() if r.startswith(RULE_PREFIXES) and r not in rules]
    return Summary(
        scenarios,
        rules,
        single,
        counts,
        figures,
        paired,
        not_run,
        best_rule={s: best[s] for s in scenarios},
        starved=starved_set,
        ratios=all_ratios,
    )


def _add_bound(table: dict[str, dict[str, dict[str, float]]], spec: str) -> None:
    """Add the pseudo-policy ``spec`` (``bound:RULE+RULE+...``) to every scenario where all its rules ran.

    Its row there is a copy of the best of those rules' rows (goodput, GPU-hours and offered load).
    """
    members = [m for m in spec.removeprefix(BOUND_PREFIX).split("+") if m]
    if not members or any(not m.startswith(RULE_PREFIXES) for m in members):
        raise SystemExit(f"--policy {spec}: a bound names rules ({' or '.join(RULE_PREFIXES)}...) joined by '+'")
    for by in table.values():
        if all(m in by for m in members):
            by[spec] = dict(max((by[m] for m in members), key=lambda row: row["goodput"]))


@dataclass(frozen=True)
class Beyond:
    """A scenario where a rule outside a named subset beats every rule of the subset."""

    scenario: str
    best_rule: str
    over_subset: float
    """The best rule's goodput over the subset's best."""
    policy_over_subset: float
    policy_over_best: float


def beyond(paths: list[str], subset: list[str], policy: str) -> list[Beyond]:
    """The scenarios (those every file's rules and ``policy`` ran) where the best rule is not one of ``subset``.

    The rules are every ``baseline:`` / ``file:`` policy present on the scenario; a scenario lacking one of
    ``subset`` is left out.
    """
    table = _rows(paths)
    found: list[Beyond] = []
    for scenario, by in sorted(table.items()):
        if policy not in by or any(r not in by for r in subset):
            continue
        rules = {r: v["goodput"] for r, v in by.items() if r.startswith(RULE_PREFIXES)}
        top = max(rules, key=lambda r: rules[r])
        inside = max(rules[r] for r in subset)
        if rules[top] > inside * (1.0 + 1e-9) and inside > 0:
            mine = by[policy]["goodput"]
            found.append(Beyond(scenario, top, rules[top] / inside, mine / inside, mine / rules[top]))
    return found


def read_names(path: str) -> frozenset[str]:
    """Scenario names, one per line (blank lines and ``#`` comments skipped); refuses a missing or empty file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SystemExit(f"--scenarios-from {path}: {exc.strerror}") from None
    names = frozenset(line.split("#", 1)[0].strip() for line in lines) - {""}
    if not names:
        raise SystemExit(f"--scenarios-from {path}: names no scenario")
    return names


def _print_worst(summary: Summary, policies: list[str], count: int, versus: str | None) -> None:
    """Print, per policy, its ``count`` lowest scenarios against the best rule (Markdown)."""
    for p in policies:
        against = f" | {versus} ×" if versus and versus != p else ""
        print(f"\nlowest {count} of {p} against the per-scenario best rule:\n")
        print(f"| scenario | best rule | starved | × best rule{against} |")
        print(f"|---|---|---|---:|{'---:|' if against else ''}")
        for scenario, r in summary.worst(p, count):
            other = f" | {summary.ratios[versus][scenario]:.3f}" if against and versus else ""
            starved = "yes" if scenario in summary.starved else "no"
            print(f"| {scenario} | {summary.best_rule[scenario]} | {starved} | {r:.3f}{other} |")


def main() -> None:
    """Print the summary table (Markdown)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("results", nargs="+")
    parser.add_argument("--policy", action="append", default=[])
    parser.add_argument(
        "--pool-seeds", action="store_true", help="average a scenario and policy found in several files (other seeds)"
    )
    parser.add_argument("--versus", help="compare every other --policy with this one, scenario by scenario")
    parser.add_argument(
        "--beyond",
        metavar="RULE,RULE",
        help="also list the scenarios where a rule outside these beats all of them, with the first --policy's ratios",
    )
    parser.add_argument(
        "--starved",
        choices=("only", "exclude"),
        # argparse %-formats help strings: the percent sign is doubled
        help=f"only the scenarios whose best rule serves less than {STARVED_FRAC:.0%}% of the offered weighted load, "
        "or only the others",
    )
    parser.add_argument(
        "--scenarios-from",
        help="only the scenarios named in this file (one name per line; blank lines and # comments are skipped)",
    )
    parser.add_argument(
        "--worst",
        type=int,
        default=0,
        metavar="N",
        help="also list, per --policy, the N scenarios where it is lowest against the per-scenario best rule",
    )
    args = parser.parse_args()
    if args.worst < 0:
        parser.error(f"--worst must be >= 0, got {args.worst}")
    starved = None if args.starved is None else args.starved == "only"
    only = None if args.scenarios_from is None else read_names(args.scenarios_from)
    summary = summarize(args.results, args.policy, args.pool_seeds, args.versus, starved, only)
    n = len(summary.scenarios)
    print(f"{n} scenarios; rules: {', '.join(summary.rules)}")
    if summary.rules_not_run:
        print(f"shipped rules not run on all of them (not in the best rule): {', '.join(summary.rules_not_run)}")
    print(f"single best rule over the set: {summary.single}\n")
    print(
        "| policy | geo mean × per-scenario best rule | × single best rule (geo mean) | floor (min ×) "
        "| ≥ 1.0× best rule | GPU-h (sum) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for p, f in summary.figures.items():
        cells = [f"{f.vs_best_geomean:.3f}", f"{f.vs_single_geomean:.3f}", f"{f.floor:.3f}", f"{f.at_least_best}/{n}"]
        print(f"| {p} | {' | '.join(cells)} | {f.gpu_h:.1f} |")
    print("\nper-scenario best rule:", summary.best_counts)
    print(
        f"\nbelow {FLOOR_LINE}x the per-scenario best rule (of them, where the best rule serves less than "
        f"{STARVED_FRAC:.0%} of the offered weighted load):"
    )
    for p in args.policy:
        f = summary.figures[p]
        print(f"- {p}: {f.below_floor_line} ({f.below_starved})")
    print(f"\nat or above {NEAR_LINE}x the per-scenario best rule (within {1 - NEAR_LINE:.0%}; not a line):")
    for p in args.policy:
        print(f"- {p}: {summary.figures[p].near_best}/{n}")
    if args.versus:
        print(f"\npaired against {args.versus} (goodput ratio, geometric mean over scenarios):")
        for p, versus in summary.paired.items():
            print(f"- {p}: {versus.describe(0.95)}")
    if args.worst:
        _print_worst(summary, args.policy, args.worst, args.versus)
    if args.beyond:
        subset = [r.strip() for r in args.beyond.split(",") if r.strip()]
        policy = args.policy[0]
        print(f"\nscenarios where a rule outside {', '.join(subset)} is best:\n")
        print(f"| scenario | best rule | × best of those | {policy} × best of those | {policy} × best rule |")
        print("|---|---|---:|---:|---:|")
        for b in beyond(args.results, subset, policy):
            ratios = f"{b.over_subset:.3f} | {b.policy_over_subset:.3f} | {b.policy_over_best:.3f}"
            print(f"| {b.scenario} | {b.best_rule} | {ratios} |")


if __name__ == "__main__":
    main()
