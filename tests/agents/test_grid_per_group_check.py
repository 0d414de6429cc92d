"""experiments/grid_per_group_check.py: both grid methods on a two-group scenario, compared in one table row."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.agents.experiment_scripts import run_experiment_script
from tests.env.helpers import tiny_scenario


def test_the_check_runs_both_methods_and_finds_the_exhaustive_best_on_independent_groups(tmp_path: Path) -> None:
    path = tmp_path / "tiny2.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(duration_s=40.0, groups=2, name="tiny2").model_dump(mode="json")))
    done = run_experiment_script("grid_per_group_check.py", path, tmp_path, "--seeds", "0", "--workers", "1")
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("| tiny2 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    exhaustive_runs, per_group_runs = int(cells[1]), int(cells[2])
    assert exhaustive_runs == 91  # 1 aggregated + 15 splits x 6 remote levels
    assert per_group_runs < exhaustive_runs
    assert cells[3] == cells[4]  # no transfer failures to draw: the groups are independent, the search exact
    assert cells[5] == "1.0000"
    assert re.search(r"at the exhaustive best on 1 of 1$", done.stdout.strip())
