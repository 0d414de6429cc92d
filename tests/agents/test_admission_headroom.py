"""experiments/admission_headroom.py: the best rule swept and re-run at its sustainable rate, and the summary."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.evaluate import simulator_digest
from agents.harness import ALL_TENANTS, RunSpec, run_one
from env.families import load_family, scenario_yaml
from env.families.generate import scenario_name
from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "admission_headroom.py"
SCENARIO = REPO / "experiments/scenarios/demo-rag-surge-8.yaml"
RULES = ("dynamo-legacy", "aggregated", "dynamo-isl-bounding", "dynamo-isl-or-load")


headroom = load_script(SCRIPT, "admission_headroom")


def _rules_csv(path: Path, goodputs: dict[str, float], offered: float, simulator: str) -> Path:
    """A ``pdctl evaluate``-shaped CSV: one ``ALL`` row per rule at rate 1.0."""
    fields = ["policy", "scenario", "rate_scale", "tenant", "weighted_goodput_rps_mean", "offered_weighted_rps_mean",
              "simulator_sha256"]  # fmt: skip
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fields)
        writer.writeheader()
        for rule, goodput in goodputs.items():
            writer.writerow(
                {
                    "policy": f"baseline:{rule}",
                    "scenario": SCENARIO.stem,
                    "rate_scale": "1.0",
                    "tenant": ALL_TENANTS,
                    "weighted_goodput_rps_mean": goodput,
                    "offered_weighted_rps_mean": offered,
                    "simulator_sha256": simulator,
                }
            )
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=REPO, env=env
    )


def test_the_best_rule_is_rerun_at_the_rate_it_sustains_and_its_goodput_there_is_the_headroom(tmp_path: Path) -> None:
    goodputs = {**dict.fromkeys(RULES, 0.1), "dynamo-isl-bounding": 0.2}
    rules = _rules_csv(tmp_path / "rules.csv", goodputs, offered=10.0, simulator=simulator_digest())
    out = tmp_path / "headroom.csv"
    done = _run(str(rules), "--scenarios-dir", str(SCENARIO.parent), "--out", str(out), "--seed", "1000")
    assert done.returncode == 0, done.stderr
    with out.open(newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert row["best_rule"] == "baseline:dynamo-isl-bounding"
    assert row["starved"] == "1"  # 0.2 of 10 offered
    scale = float(row["sustainable_scale"])
    assert scale > 0
    again = run_one(RunSpec("baseline:dynamo-isl-bounding", str(SCENARIO), 1000, scale))
    total = next(r for r in again.rows if r["tenant"] == ALL_TENANTS)
    assert total["slo_attainment_frac"] >= 0.9  # the sweep's target holds at the multiplier it reports
    assert float(row["static_admission_goodput_rps"]) == pytest.approx(total["weighted_goodput_rps"], abs=1e-4)
    assert float(row["headroom"]) == pytest.approx(total["weighted_goodput_rps"] / 0.2, rel=1e-3)
    assert "starved (1): static admission / best rule at the offered load" in done.stdout


def test_rows_of_another_simulator_are_refused_in_one_line(tmp_path: Path) -> None:
    rules = _rules_csv(tmp_path / "rules.csv", dict.fromkeys(RULES, 1.0), offered=2.0, simulator="0" * 16)
    done = _run(str(rules), "--scenarios-dir", str(SCENARIO.parent), "--out", str(tmp_path / "o.csv"))
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"{rules}: measured by simulator 000000000000, this checkout's is {simulator_digest()[:12]} "
        "(the simulator_sha256 column); re-run the rules on this simulator"
    ]


def test_the_summary_splits_starved_scenarios_and_spreads_the_sustained_rate_by_pattern(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    rows = [  # scenario, starved, best goodput, static admission goodput, policy goodput, pattern, sustained/estimate
        ("a", 1, 1.0, 4.0, 0.5, "flood", 0.5),
        ("b", 1, 2.0, 2.0, 2.0, "flood", 0.7),
        ("c", 0, 5.0, 4.0, 5.0, "steady", 1.2),
    ]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, [*headroom.FIELDS, "policy_goodput_rps"])
        writer.writeheader()
        for name, starved, best, shed, mine, pattern, sustained in rows:
            values = {
                "scenario": name,
                "starved": starved,
                "best_goodput_rps": best,
                "static_admission_goodput_rps": shed,
                "headroom": shed / best,
                "pattern": pattern,
                "sustained_over_estimate": sustained,
                "policy_goodput_rps": mine,
            }
            writer.writerow(dict.fromkeys(headroom.FIELDS, "") | values)
    summary = headroom.summarize(path)
    assert summary.headroom["starved"].count == 2
    assert summary.headroom["starved"].median == pytest.approx(2.5)
    assert summary.above_one == {"starved": 1, "not starved": 0}
    assert summary.policy_vs_best["starved"] == pytest.approx(0.75)
    assert summary.policy_vs_admission["not starved"] == pytest.approx(1.25)
    assert summary.sustained_over_estimate["flood"].median == pytest.approx(0.6)
    assert summary.sustained_over_estimate["steady"].count == 1


def test_a_generated_scenario_names_its_highest_group_load_and_its_pattern(tmp_path: Path) -> None:
    family = load_family(REPO / "experiments/families/default.yaml")
    for seed in list(family.split_seeds("validation"))[:8]:
        path = tmp_path / f"{scenario_name(family, seed)}.yaml"
        path.write_text(scenario_yaml(family, seed), encoding="utf-8")
        load, pattern = headroom.family_knobs(path)
        assert load is not None
        assert 0 < load < 10
        assert pattern
    first = tmp_path / f"{scenario_name(family, next(iter(family.split_seeds('validation'))))}.yaml"
    assert "load 0.31/0.75 x capacity; pattern steady" in " ".join(first.read_text(encoding="utf-8").split())
    assert headroom.family_knobs(first) == (0.75, "steady")
    assert headroom.family_knobs(SCENARIO) == (None, "")
