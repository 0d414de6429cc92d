"""``experiments/first_rule_oracle.py``: the clairvoyant start acts only on the first decision, and the figures its
results README quotes are what the committed JSON gives."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agents.evaluate import simulator_digest
from env.gym_env import resolve_scenario
from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[1]
oracle = load_script(REPO / "experiments" / "first_rule_oracle.py", "first_rule_oracle")
TRACES = Path(os.environ.get("PDCTL_TRACES", "data/traces"))
RESULTS = REPO / "experiments/results/families/first-rule-oracle/validation-504-last72-seed0.json"


def test_the_best_rule_is_read_from_the_rules_rows(tmp_path: Path) -> None:
    here = simulator_digest()
    path = tmp_path / "results.csv"
    path.write_text(
        "policy,scenario,rate_scale,tenant,weighted_goodput_rps_mean,simulator_sha256\n"
        f"baseline:dynamo-legacy,s1,1.0,ALL,2.0,{here}\n"
        f"baseline:aggregated,s1,1.0,ALL,3.0,{here}\n"
        f"baseline:aggregated,s1,2.0,ALL,9.0,{here}\n"
        f"baseline:aggregated,s1,1.0,chat,9.0,{here}\n"
        f"learned:default,s1,1.0,ALL,9.0,{here}\n"
    )
    assert oracle.best_rules(path) == {"s1": ("aggregated", 3.0)}
    path.write_text(path.read_text().replace(here, "0123456789abcdef"))
    with pytest.raises(SystemExit, match="measured by simulator 0123456789ab"):
        oracle.best_rules(path)


def test_the_oracle_sets_the_first_rule_and_the_selector_decides_from_there() -> None:
    path = REPO / "experiments" / "scenarios" / "network-incident-8.yaml"
    plain = oracle.run(path, "learned:default", 1000, TRACES, None)
    started = oracle.run(path, "learned:default", 1000, TRACES, "aggregated")
    again = oracle.run(path, "learned:default", 1000, TRACES, None)
    assert plain == again, "deterministic"
    assert started["goodput"] != plain["goodput"], "a group started under aggregated instead of legacy"
    assert set(plain["first_window"]) == {"main"}


def test_the_declared_link_is_the_base_one_not_an_incident_s() -> None:
    path = REPO / "experiments" / "scenarios" / "network-incident-8.yaml"
    scenario = resolve_scenario(path, TRACES)
    assert scenario.cluster.network.incidents, "the scenario has incidents"
    declared = oracle.declared_link_bytes_per_s(path, TRACES)
    assert declared == scenario.cluster.network.link_bandwidth_bytes_per_s
    assert all(i.link_bandwidth_bytes_per_s != declared for i in scenario.cluster.network.incidents)


def test_the_quoted_figures_are_what_the_committed_json_gives() -> None:
    rows = json.loads(RESULTS.read_text()).values()
    assert oracle.summary([r["plain_ratio"] for r in rows]) == (
        "45/72 at >= 1.0x, geo mean 0.986x, floor 0.442, 10 below 0.9x"
    )
    assert oracle.summary([r["oracle_ratio"] for r in rows]) == (
        "53/72 at >= 1.0x, geo mean 0.997x, floor 0.435, 6 below 0.9x"
    )
    assert oracle.paired([r["plain_ratio"] for r in rows], [r["oracle_ratio"] for r in rows]) == (
        "oracle start / as it ships: 1.012x geo mean over 72; 14 up, 13 down"
    )
    assert oracle.summary([r["declared_ratio"] for r in rows]) == (
        "48/72 at >= 1.0x, geo mean 0.980x, floor 0.240, 6 below 0.9x"
    )
    assert oracle.paired(
        [r["plain_ratio"] for r in rows], [r["declared_ratio"] for r in rows], "declared-link start"
    ) == ("declared-link start / as it ships: 0.995x geo mean over 72; 8 up, 8 down")
    slow = [r for r in rows if r["declared_link_bytes_per_s"] < 4.5e10]
    assert len(slow) == 16
    assert all(r["declared_ratio"] == r["plain_ratio"] for r in rows if r not in slow), "only slow links start changed"
    best = {rule: sorted(r["declared_link_bytes_per_s"] / 1e9 for r in slow if r["best_rule"] == rule) for rule in
            ("aggregated", "dynamo-legacy")}  # fmt: skip
    assert (best["aggregated"][0], best["aggregated"][-1]) == (1.09, 9.54)
    assert (best["dynamo-legacy"][0], best["dynamo-legacy"][-1]) == (3.29, 7.04)
    windows = [g for r in rows for g in r["first_window"].values()]
    assert (len(windows), sum(g["transfer_p95_over_tightest_ttft"] is not None for g in windows)) == (148, 8)
