"""experiments/trace_selector.py: its trace ends on the figures ``pdctl evaluate`` reports for the same run."""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

import pytest

from agents.harness import ALL_TENANTS, RunSpec, run_one
from tests.agents.experiment_scripts import run_experiment_script

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "experiments/scenarios/mooncake-multiturn-16.yaml"


def _trace(traces_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_experiment_script("trace_selector.py", SCENARIO, traces_dir, *args)


def test_a_scaled_trace_ends_on_the_goodput_and_attainment_of_the_same_scaled_evaluation(traces_dir: Path) -> None:
    out = _trace(traces_dir, "--seed", "1000", "--rate-scale", "0.0625")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("# rules: dynamo-legacy, aggregated")
    intervals = [line for line in lines if re.match(r"\s+\d+s \{'main': '", line)]
    assert len(intervals) >= 50
    acted = dict(item.split("=") for item in lines[-2].removeprefix("group-intervals per rule: ").split(", "))
    assert list(acted) == lines[0].removeprefix("# rules: ").split(", ")
    assert {rule: int(n) for rule, n in acted.items()} == {
        rule: sum(f"'main': '{rule}'" in line for line in intervals) for rule in acted
    }  # one group: each interval's rule counted once
    timeline = [re.match(r"\s+(\d+)s \{'main': '([^']+)'", line).groups() for line in intervals]  # type: ignore[union-attr]
    changes = [f"{t} s main: {a} -> {b}" for (_, a), (t, b) in itertools.pairwise(timeline) if a != b]
    assert lines[-1] == "rule changes: " + ("; ".join(changes) if changes else "none")
    goodput = float(re.search(r"weighted goodput ([0-9.]+) rps", out.stdout).group(1))  # type: ignore[union-attr]
    met, arrived = map(int, re.search(r"both SLOs (\d+)/(\d+)", out.stdout).groups())  # type: ignore[union-attr]
    spec = RunSpec("learned:default", str(SCENARIO), 1000, rate_scale=0.0625, traces_dir=str(traces_dir))
    row = next(r for r in run_one(spec).rows if r["tenant"] == ALL_TENANTS)
    assert goodput == pytest.approx(row["weighted_goodput_rps"], abs=5e-5)
    assert arrived == row["arrived"]
    assert met / arrived == pytest.approx(row["slo_attainment_frac"])
    unscaled = _trace(traces_dir, "--seed", "1000", "--rate-scale", "0.125")
    assert int(re.search(r"both SLOs \d+/(\d+)", unscaled.stdout).group(1)) > arrived  # type: ignore[union-attr]


def test_a_rate_scale_that_is_not_a_positive_multiplier_is_refused_in_one_line(traces_dir: Path) -> None:
    out = _trace(traces_dir, "--rate-scale", "0")
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == ["--rate-scale: 0.0 is not a positive multiplier"]
