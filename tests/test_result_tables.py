"""The result tables quoted in experiments/results/families agree with the committed CSVs they were made from.

Each table of ``experiments/results/families/checked-tables.yaml`` is recomputed with ``summarize.py``'s
:func:`summarize`; a CSV edited, replaced or re-run without updating the quoted figure fails here.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.script_modules import load_script

FAMILIES = Path(__file__).resolve().parents[1] / "experiments/results/families"
LEARNED = "learned:experiments/results/learned"


def _load(name: str, filename: str) -> ModuleType:
    """A script of the results folder, imported as a module."""
    return load_script(FAMILIES / filename, name)


summarize = _load("families_summarize", "summarize.py")
CHECKED: dict[str, Any] = yaml.safe_load((FAMILIES / "checked-tables.yaml").read_text(encoding="utf-8"))
TABLES: list[dict[str, Any]] = CHECKED["tables"]
CAPACITY_TABLES: list[dict[str, Any]] = CHECKED["capacity_tables"]


def _flat(items: list[Any]) -> list[str]:
    return [str(FAMILIES / f) for item in items for f in (item if isinstance(item, list) else [item])]


def _spec(name: str) -> str:
    return name.replace("L/", f"{LEARNED}/", 1)


def _check(table: dict[str, Any]) -> list[str]:
    """What in ``table`` disagrees with its recomputation (empty: all agrees)."""
    versus = _spec(table["versus"]) if table.get("versus") else None
    policies = [_spec(p) for p in table["expect"]]
    only = summarize.read_names(str(FAMILIES / table["scenarios_from"])) if table.get("scenarios_from") else None
    got = summarize.summarize(
        _flat(table["files"]), policies, bool(table.get("pool_seeds")), versus, table.get("starved"), only
    )
    wrong = []
    for name, want in table["expect"].items():
        fig = got.figures[_spec(name)]
        seen = {
            "x_single": round(fig.vs_single_geomean, 3),
            "share": f"{fig.at_least_best}/{len(got.scenarios)}",
            "floor": round(fig.floor, 3),
            "below": fig.below_floor_line,
            "below_starved": fig.below_starved,
            "near": f"{fig.near_best}/{len(got.scenarios)}",
        }
        if "paired" in want:
            pr = got.paired[_spec(name)]
            seen["paired"] = [round(pr.ratio, 3), round(pr.low, 3), round(pr.high, 3)]
        for key, value in want.items():
            expected = [round(v, 3) for v in value] if key == "paired" else value
            if seen[key] != expected:
                wrong.append(f"{name} {key}: quoted {expected}, the CSVs give {seen[key]}")
    return wrong


@pytest.mark.parametrize("table", TABLES, ids=[t["name"] for t in TABLES])
def test_a_quoted_table_is_what_its_csvs_give(table: dict[str, Any]) -> None:
    assert _check(table) == []


def test_a_quoted_figure_that_disagrees_with_the_csvs_is_caught() -> None:
    table = dict(TABLES[0])
    name, right = next(iter(table["expect"].items()))
    table["expect"] = {name: {**right, "x_single": 9.999, "share": "1/72"}}
    assert _check(table) == [
        f"{name} x_single: quoted 9.999, the CSVs give {right['x_single']}",
        f"{name} share: quoted 1/72, the CSVs give {right['share']}",
    ]


def test_the_scenarios_below_the_floor_line_are_counted_with_those_whose_best_rule_is_starved(tmp_path: Path) -> None:
    rows = {  # scenario: (learned goodput, rule goodput, offered weighted load; "" where a file carries none)
        "s1": (0.5, 1.0, "4.0"),  # below 0.9x, the rule serves a quarter of the offered load: starved
        "s2": (0.5, 1.0, "1.5"),  # below 0.9x, the rule serves two thirds: not starved
        "s3": (0.95, 1.0, "4.0"),  # above the line
        "s4": (0.1, 1.0, ""),  # below, no offered load known: not counted as starved
    }
    path = tmp_path / "results.csv"
    lines = ["policy,scenario,tenant,weighted_goodput_rps_mean,gpu_seconds_mean,offered_weighted_rps_mean"]
    for scenario, (learned, rule, offered) in rows.items():
        lines.append(f"learned:x,{scenario},ALL,{learned},3600,{offered}")
        lines.append(f"baseline:a,{scenario},ALL,{rule},3600,{offered}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    figures = summarize.summarize([str(path)], ["learned:x"]).figures
    assert (figures["learned:x"].below_floor_line, figures["learned:x"].below_starved) == (3, 1)
    assert (figures["baseline:a"].below_floor_line, figures["baseline:a"].below_starved) == (0, 0)
    assert (figures["learned:x"].near_best, figures["baseline:a"].near_best) == (0, 4)  # 0.95x is not within 1 %
    only = summarize.summarize([str(path)], ["learned:x"], starved=True)
    assert only.scenarios == ["s1", "s3"]
    assert only.figures["learned:x"].below_floor_line == 1
    assert summarize.summarize([str(path)], ["learned:x"], starved=False).scenarios == ["s2", "s4"]
    served = tmp_path / "served.csv"  # s2 alone: its rule serves two thirds of the offered load
    served.write_text("\n".join([lines[0], *[line for line in lines if ",s2," in line]]) + "\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"--starved: no scenario of .*served\.csv is starved"):
        summarize.summarize([str(served)], ["learned:x"], starved=True)
    names = tmp_path / "names.txt"
    names.write_text("# the feasible ones\ns2\n\ns4  # no offered load\nelsewhere\n", encoding="utf-8")
    picked = summarize.summarize([str(path)], ["learned:x"], only=summarize.read_names(str(names)))
    assert picked.scenarios == ["s2", "s4"]
    assert picked.figures["learned:x"].below_floor_line == 2
    assert summarize.summarize([str(path)], ["learned:x"], starved=False, only=frozenset({"s2"})).scenarios == ["s2"]
    with pytest.raises(SystemExit, match="--scenarios-from: none of its scenarios is among those of"):
        summarize.summarize([str(path)], ["learned:x"], only=frozenset({"elsewhere"}))
    names.write_text("# nothing\n\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=f"--scenarios-from {names}: names no scenario"):
        summarize.read_names(str(names))


def test_the_shipped_rules_a_table_lacks_are_named(tmp_path: Path) -> None:
    from agents.policy_specs import all_baseline_specs

    shipped = [r for r in all_baseline_specs() if r != "grid:"]
    assert "baseline:dynamo-legacy" in shipped
    assert "file:policies/examples/seed_pd_policy.yaml" in shipped
    header = "policy,scenario,tenant,weighted_goodput_rps_mean,gpu_seconds_mean"
    some = tmp_path / "some.csv"
    some.write_text(f"{header}\nlearned:x,s1,ALL,1.0,3600\nbaseline:dynamo-legacy,s1,ALL,2.0,3600\n", encoding="utf-8")
    got = summarize.summarize([str(some)], ["learned:x"])
    assert got.rules == ["baseline:dynamo-legacy"]
    assert got.rules_not_run == [r for r in shipped if r != "baseline:dynamo-legacy"]
    every = tmp_path / "every.csv"  # every shipped rule, but one of them not on every scenario
    lines = [header, "learned:x,s1,ALL,1.0,3600", "learned:x,s2,ALL,1.0,3600"]
    lines += [f"{r},s1,ALL,0.5,3600" for r in shipped] + [f"{r},s2,ALL,0.5,3600" for r in shipped[1:]]
    every.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert summarize.summarize([str(every)], ["learned:x"]).rules_not_run == [shipped[0]]
    assert summarize.summarize([str(every)], ["learned:x"], only=frozenset({"s1"})).rules_not_run == [shipped[0]]


def test_a_bound_is_the_best_of_its_rules_per_scenario_and_never_a_rule(tmp_path: Path) -> None:
    header = "policy,scenario,tenant,weighted_goodput_rps_mean,gpu_seconds_mean"
    rows = {"s1": (1.0, 2.0, 3.0, 4.0), "s2": (1.0, 3.0, 2.0, 1.5)}  # learned, rule a, rule b, rule c
    lines = [header]
    for scenario, goodputs in rows.items():
        for policy, goodput in zip(("learned:x", "baseline:a", "baseline:b", "baseline:c"), goodputs, strict=True):
            lines.append(f"{policy},{scenario},ALL,{goodput},{3600 * goodput}")
    path = tmp_path / "results.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    bound = "bound:baseline:a+baseline:b"
    got = summarize.summarize([str(path)], ["learned:x", bound], versus="learned:x")
    assert got.rules == ["baseline:a", "baseline:b", "baseline:c"]  # the bound is no rule
    assert got.best_counts == {"baseline:a": 1, "baseline:b": 0, "baseline:c": 1}
    figures = got.figures[bound]
    assert figures.floor == pytest.approx(3.0 / 4.0)  # s1: b's 3 against c's 4; s2: a's 3, the best rule
    assert figures.at_least_best == 1
    assert figures.gpu_h == pytest.approx(3.0 + 3.0)  # the chosen rule's GPU-hours on each scenario
    assert got.paired[bound].ratio == pytest.approx(3.0)
    for bad in ("bound:", "bound:baseline:a+learned:x"):
        with pytest.raises(SystemExit, match=re.escape(f"--policy {bad}: a bound names rules")):
            summarize.summarize([str(path)], [bad])


def test_the_scenarios_where_a_rule_outside_a_subset_is_best_are_listed(tmp_path: Path) -> None:
    header = "policy,scenario,tenant,weighted_goodput_rps_mean,gpu_seconds_mean"
    rows = {  # scenario: (learned, rule a, rule b outside the subset; "" where b did not run)
        "s1": (3.0, 2.0, 4.0),  # b best: listed
        "s2": (1.0, 2.0, 1.0),  # a best: not listed
        "s3": (1.0, 2.0, 2.0),  # a tie: not listed
        "s4": (1.0, 0.0, 1.0),  # the subset serves nothing: no ratio to it
    }
    lines = [header]
    for scenario, (learned, a, b) in rows.items():
        lines += [f"learned:x,{scenario},ALL,{learned},3600", f"baseline:a,{scenario},ALL,{a},3600"]
        lines.append(f"baseline:b,{scenario},ALL,{b},3600")
    lines.append("learned:x,s5,ALL,1.0,3600")  # s5: no rule of the subset ran
    lines.append("baseline:b,s5,ALL,9.0,3600")
    path = tmp_path / "results.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert summarize.beyond([str(path)], ["baseline:a"], "learned:x") == [
        summarize.Beyond("s1", "baseline:b", 2.0, 1.5, 0.75)
    ]
    assert summarize.beyond([str(path)], ["baseline:a", "baseline:b"], "learned:x") == []


def test_the_lowest_scenarios_name_the_floor_its_rule_and_the_compared_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    header = "policy,scenario,tenant,weighted_goodput_rps_mean,gpu_seconds_mean,offered_weighted_rps_mean"
    rows = {  # scenario: (learned x, learned y, rule a, rule b, offered)
        "s1": (1.0, 2.0, 4.0, 2.0, 5.0),  # a best; x 0.25, y 0.5; not starved
        "s2": (3.0, 1.0, 1.0, 3.0, 10.0),  # b best; x 1.0; starved (3 of 10)
        "s3": (1.0, 1.0, 2.0, 1.0, 3.0),  # a best; x 0.5: ties y's s1 ratio only
        "s4": (0.9, 0.9, 1.0, 1.0, 1.0),  # a and b tie: the first rule in order is named
    }
    lines = [header]
    for scenario, values in rows.items():
        offered = values[-1]
        for policy, goodput in zip(("learned:x", "learned:y", "baseline:a", "baseline:b"), values, strict=False):
            lines.append(f"{policy},{scenario},ALL,{goodput},3600,{offered}")
    path = tmp_path / "results.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    got = summarize.summarize([str(path)], ["learned:x", "learned:y"], versus="learned:y")
    assert got.worst("learned:x", 2) == [("s1", pytest.approx(0.25)), ("s3", pytest.approx(0.5))]
    assert got.worst("learned:x", 2)[0][1] == got.figures["learned:x"].floor
    assert got.worst("learned:y", 9) == [
        ("s2", pytest.approx(1.0 / 3.0)),
        ("s1", pytest.approx(0.5)),
        ("s3", pytest.approx(0.5)),
        ("s4", pytest.approx(0.9)),
    ]
    assert got.best_rule == {"s1": "baseline:a", "s2": "baseline:b", "s3": "baseline:a", "s4": "baseline:a"}
    assert got.starved == frozenset({"s2"})
    not_starved = summarize.summarize([str(path)], ["learned:y"], starved=False)
    assert [s for s, _ in not_starved.worst("learned:y", 1)] == ["s1"]
    summarize._print_worst(got, ["learned:x"], 1, "learned:y")
    assert "| s1 | baseline:a | no | 0.250 | 0.500 |" in capsys.readouterr().out


capacity = _load("families_capacity_table", "capacity_table.py")


def test_the_capacity_table_compares_sustained_rates_with_the_per_scenario_and_the_single_best_rule(
    tmp_path: Path,
) -> None:
    rates = {  # scenario: (learned, rule A, rule B)
        "s1": (0.50, 0.40, 0.20),  # learned above both
        "s2": (0.30, 0.60, 0.30),  # learned at B, half of A
        "s3": (0.10, 0.00, 0.00),  # no rule sustains any rate: left out of the means
    }
    entries = [
        {"policy": p, "scenario": s, "max_rate_scale": r[i], "first_failing_scale": 1.0}
        for s, r in rates.items()
        for i, p in enumerate(("learned:x", "baseline:a", "baseline:b"))
    ]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(entries), encoding="utf-8")
    scenarios, single, figures = capacity.capacity_figures(capacity.read_sweeps([str(path)]), "learned:x")
    assert scenarios == ["s1", "s2", "s3"]
    assert single == "baseline:a"
    learned = figures[0]
    assert learned.policy == "learned:x"
    assert learned.at_least_best == 2  # s1 and s3 (0.10 >= 0)
    assert learned.vs_best_geomean == pytest.approx(math.sqrt(1.25 * 0.5))
    assert learned.vs_single_geomean == pytest.approx(math.sqrt(1.25 * 0.5))
    assert learned.floor == pytest.approx(0.5)
    assert learned.left_out == 1
    rule_b = next(f for f in figures if f.policy == "baseline:b")
    assert rule_b.vs_best_geomean == pytest.approx(math.sqrt(0.5 * 0.5))
    assert rule_b.at_least_best == 1  # only s3, where nobody sustains any rate


def test_the_capacity_table_refuses_rates_of_two_simulators(tmp_path: Path) -> None:
    """Sweeps by two simulators (an engine fix in between), or beside sweeps that did not record it, are not pooled."""

    def sweep(name: str, **simulator: str) -> str:
        path = tmp_path / name
        entries = [{"policy": p, "scenario": "s", "max_rate_scale": 1.0, **simulator} for p in ("learned:x", "rule")]
        path.write_text(json.dumps(entries), encoding="utf-8")
        return str(path)

    same = [sweep("a.json", simulator_sha256="aaaa"), sweep("a2.json", simulator_sha256="aaaa")]
    assert capacity.read_sweeps(same) == {"s": {"learned:x": 1.0, "rule": 1.0}}
    other, unrecorded = sweep("b.json", simulator_sha256="bbbb"), sweep("old.json")
    with pytest.raises(SystemExit) as refused:
        capacity.read_sweeps([same[0], other])
    assert str(refused.value) == (
        f"{other}: swept by simulator bbbb, {same[0]} by aaaa (the simulator_sha256 field); "
        "rates of two simulators are not compared"
    )
    with pytest.raises(SystemExit, match=r"swept by simulator aaaa, .*old\.json by unrecorded"):
        capacity.read_sweeps([unrecorded, same[0]])


def test_policies_named_not_rules_are_left_out_of_the_best_rule(tmp_path: Path) -> None:
    """A grid optimum or another learned policy swept beside the rules is no rule: it does not raise the bar."""
    entries = [
        {"policy": p, "scenario": "s", "max_rate_scale": r}
        for p, r in (("learned:x", 0.5), ("baseline:a", 0.4), ("grid:", 0.8), ("learned:y", 0.9))
    ]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(entries), encoding="utf-8")
    table = capacity.read_sweeps([str(path)])
    _, single, figures = capacity.capacity_figures(table, "learned:x", ("learned:", "grid:"))
    assert single == "baseline:a"
    assert [f.policy for f in figures] == ["learned:x", "baseline:a"]
    assert figures[0].at_least_best == 1
    _, single, figures = capacity.capacity_figures(table, "learned:x")  # by default every other policy is a rule
    assert single == "learned:y"
    assert figures[0].at_least_best == 0
    with pytest.raises(SystemExit, match="--policy learned:x: no rule was swept on every scenario it was"):
        capacity.capacity_figures(table, "learned:x", ("learned:", "grid:", "baseline:"))


def test_a_capacity_table_for_a_policy_never_swept_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps([{"policy": "baseline:a", "scenario": "s", "max_rate_scale": 1.0}]), encoding="utf-8")
    with pytest.raises(SystemExit, match="--policy learned:x: no scenario was swept with it and a rule"):
        capacity.capacity_figures(capacity.read_sweeps([str(path)]), "learned:x")


def test_a_policy_that_fails_the_lowest_probe_counts_as_half_of_it_not_as_zero(tmp_path: Path) -> None:
    entries = [
        {"policy": "learned:x", "scenario": "s", "max_rate_scale": 0.0},
        {"policy": "baseline:a", "scenario": "s", "max_rate_scale": 0.25},
    ]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(entries), encoding="utf-8")
    _, _, figures = capacity.capacity_figures(capacity.read_sweeps([str(path)]), "learned:x")
    assert figures[0].floor == pytest.approx(capacity.ZERO_RATE_AS / 0.25)
    assert figures[0].at_least_best == 0


def _check_capacity(table: dict[str, Any]) -> list[str]:
    """What in a yardstick-(b) ``table`` disagrees with its recomputation from the sweeps (empty: all agrees)."""
    scenarios, single, figures = capacity.capacity_figures(
        capacity.read_sweeps(_flat(table["sweeps"])), table["policy"], table.get("not_rules", ())
    )
    wrong = []
    if single != table["single"]:
        wrong.append(f"single best rule: quoted {table['single']}, the sweeps give {single}")
    by_policy = {f.policy: f for f in figures}
    for name, want in table["expect"].items():
        fig = by_policy[name]
        seen = {
            "share": f"{fig.at_least_best}/{len(scenarios)}",
            "x_best": round(fig.vs_best_geomean, 3),
            "x_single": round(fig.vs_single_geomean, 3),
            "floor": round(fig.floor, 3),
        }
        wrong += [f"{name} {k}: quoted {v}, the sweeps give {seen[k]}" for k, v in want.items() if seen[k] != v]
    return wrong


@pytest.mark.parametrize("table", CAPACITY_TABLES, ids=[t["name"] for t in CAPACITY_TABLES])
def test_a_quoted_capacity_table_is_what_its_sweeps_give(table: dict[str, Any]) -> None:
    assert _check_capacity(table) == []


def test_a_quoted_capacity_figure_that_disagrees_with_the_sweeps_is_caught() -> None:
    table = {**CAPACITY_TABLES[0], "single": "baseline:nope"}
    name, right = next(iter(table["expect"].items()))
    table["expect"] = {name: {**right, "share": "0/40"}}
    assert _check_capacity(table) == [
        "single best rule: quoted baseline:nope, the sweeps give baseline:aggregated",
        f"{name} share: quoted 0/40, the sweeps give {right['share']}",
    ]


@pytest.mark.parametrize("script", ["summarize.py", "capacity_table.py"])
def test_the_results_scripts_print_their_help(script: str) -> None:
    """``--help`` renders every option's help (argparse %-formats it: a bare percent sign crashed it once)."""
    env = {**os.environ, "PYTHONPATH": str(FAMILIES.parents[2])}
    done = subprocess.run(
        [sys.executable, script, "--help"], cwd=FAMILIES, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--policy" in done.stdout


HEADROOM_TABLES: list[dict[str, Any]] = CHECKED["headroom_tables"]
headroom = load_script(FAMILIES.parents[1] / "admission_headroom.py", "admission_headroom")


def _check_headroom(table: dict[str, Any]) -> list[str]:
    """What in ``table`` disagrees with ``admission_headroom.py``'s summary of its CSV (empty: all agrees)."""
    got = headroom.summarize(FAMILIES / table["csv"])
    wrong = []
    for name, want in table["expect"].items():
        spread = got.headroom[name]
        seen = {
            "count": spread.count,
            "median": round(spread.median, 2),
            "q1": round(spread.q1, 2),
            "q3": round(spread.q3, 2),
            "above_one": got.above_one[name],
            "policy_vs_best": round(got.policy_vs_best[name], 3),
            "policy_vs_admission": round(got.policy_vs_admission[name], 3),
        }
        wrong += [f"{name} {k}: quoted {v}, the CSV gives {seen[k]}" for k, v in want.items() if seen[k] != v]
    for pattern, want in table["patterns"].items():
        median = round(got.sustained_over_estimate[pattern].median, 2)
        if median != want:
            wrong.append(f"pattern {pattern}: quoted {want}, the CSV gives {median}")
    return wrong


@pytest.mark.parametrize("table", HEADROOM_TABLES, ids=[t["name"] for t in HEADROOM_TABLES])
def test_a_quoted_headroom_table_is_what_its_csv_gives(table: dict[str, Any]) -> None:
    assert _check_headroom(table) == []


def test_a_quoted_headroom_figure_that_disagrees_with_the_csv_is_caught() -> None:
    table = HEADROOM_TABLES[0]
    right = table["expect"]["starved"]
    wrong = {**table, "expect": {"starved": {**right, "median": 9.99}}, "patterns": {"steady": 0.01}}
    assert _check_headroom(wrong) == [
        f"starved median: quoted 9.99, the CSV gives {right['median']}",
        f"pattern steady: quoted 0.01, the CSV gives {table['patterns']['steady']}",
    ]


PAIRED_TABLES: list[dict[str, Any]] = CHECKED.get("paired_tables", [])


def _check_paired(table: dict[str, Any]) -> list[str]:
    """What in a paired-only ``table`` (two policies, no rules run) disagrees with the CSVs (empty: all agrees).

    For a look that runs only a candidate and the default (a second look whose rules were not run): the paired
    goodput ratio with its 95 % bootstrap interval (:func:`agents.paired.paired_ratio`, seed 0, as ``summarize.py
    --versus``) and how many scenarios go up and down.
    """
    from agents.paired import paired_ratio
    from agents.result_rows import read_rows

    rows = read_rows([Path(p) for p in _flat(table["files"])])
    policy, versus = _spec(table["policy"]), _spec(table["versus"])
    both = sorted(s for s, by in rows.items() if policy in by and versus in by)
    pr = paired_ratio({s: rows[s][policy][0] for s in both}, {s: rows[s][versus][0] for s in both})
    seen = {
        "scenarios": len(both),
        "paired": [round(pr.ratio, 3), round(pr.low, 3), round(pr.high, 3)],
        "up_down": [pr.wins, pr.losses],
    }
    want = table["expect"]
    return [f"{table['policy']} {k}: quoted {v}, the CSVs give {seen[k]}" for k, v in want.items() if seen[k] != v]


@pytest.mark.parametrize("table", PAIRED_TABLES, ids=[t["name"] for t in PAIRED_TABLES])
def test_a_quoted_paired_table_is_what_its_csvs_give(table: dict[str, Any]) -> None:
    assert _check_paired(table) == []


def test_a_quoted_paired_figure_that_disagrees_with_the_csvs_is_caught() -> None:
    table = PAIRED_TABLES[0]
    right = table["expect"]["paired"]
    wrong = {**table, "expect": {"paired": [1.5, 1.4, 1.6]}}
    assert _check_paired(wrong) == [f"{table['policy']} paired: quoted [1.5, 1.4, 1.6], the CSVs give {right}"]
