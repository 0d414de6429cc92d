"""experiments/selector_switches.py: a scenario is listed as lost against the rules' rows it is given, and only then."""

from __future__ import annotations

import csv
import re
import subprocess
from pathlib import Path

import pytest

from agents.harness import ALL_TENANTS, RunSpec, run_one
from tests.agents.experiment_scripts import run_experiment_script

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "experiments/scenarios/mooncake-multiturn-16.yaml"
RULES = ("dynamo-legacy", "aggregated", "dynamo-isl-bounding", "dynamo-isl-or-load")
RATE_SCALE = "0.0625"


def _rules_csv(path: Path, goodputs: dict[str, float]) -> Path:
    """A ``pdctl evaluate``-shaped CSV: one ``ALL`` row per rule at the test's rate scale."""
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, ["policy", "scenario", "rate_scale", "tenant", "weighted_goodput_rps_mean"])
        writer.writeheader()
        for rule, goodput in goodputs.items():
            writer.writerow(
                {
                    "policy": f"baseline:{rule}",
                    "scenario": SCENARIO.stem,
                    "rate_scale": RATE_SCALE,
                    "tenant": ALL_TENANTS,
                    "weighted_goodput_rps_mean": goodput,
                }
            )
    return path


def _switches(traces_dir: Path, rules_csv: Path) -> subprocess.CompletedProcess[str]:
    return run_experiment_script(
        "selector_switches.py", SCENARIO, traces_dir, "--rules", str(rules_csv), "--seed", "1000",
        "--rate-scale", RATE_SCALE,
    )  # fmt: skip


def test_a_run_below_its_best_rule_is_listed_with_its_ratio_and_class_and_one_above_is_not(
    traces_dir: Path, tmp_path: Path
) -> None:
    spec = RunSpec("learned:default", str(SCENARIO), 1000, rate_scale=0.0625, traces_dir=str(traces_dir))
    goodput = next(r for r in run_one(spec).rows if r["tenant"] == ALL_TENANTS)["weighted_goodput_rps"]
    assert goodput > 0
    best = {**dict.fromkeys(RULES, goodput / 4), "dynamo-isl-bounding": goodput * 2}
    out = _switches(traces_dir, _rules_csv(tmp_path / "lost.csv", best))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    listed = re.match(r"([0-9.]+) (\S+) best=(\S+) (\S+)", lines[0])
    assert listed is not None, lines
    assert float(listed.group(1)) == pytest.approx(0.5, abs=1e-3)
    assert listed.groups()[1:3] == (SCENARIO.stem, "dynamo-isl-bounding")
    assert listed.group(4) in {"aggregated-not-best", "never-switched", "other"}
    assert lines[-2] == f"below 0.9: {listed.group(4)} 1"
    assert lines[-1] == "at or above the best rule: 0/1"

    out = _switches(traces_dir, _rules_csv(tmp_path / "won.csv", dict.fromkeys(RULES, goodput)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["below 0.9: none", "at or above the best rule: 1/1"]


def test_a_rules_file_without_one_of_the_selectors_rules_is_refused_in_one_line(
    traces_dir: Path, tmp_path: Path
) -> None:
    partial = _rules_csv(tmp_path / "partial.csv", dict.fromkeys(RULES[:3], 1.0))
    out = _switches(traces_dir, partial)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        f"--rules: no row of baseline:dynamo-isl-or-load on scenario {SCENARIO.stem} at rate scale 0.0625"
    ]
