"""Every committed training recipe loads, and a recipe whose family file is missing is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from agents.config import load_experiment
from pdctl.cli import app

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "experiments").glob("*.yaml"))


def test_the_recipes_are_found() -> None:
    assert len(RECIPES) >= 20, RECIPES


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_a_committed_recipe_loads_and_names_files_that_exist(path: Path) -> None:
    config = load_experiment(path)
    if config.family is not None:
        assert (ROOT / config.family.path).is_file(), config.family.path


def test_pdctl_train_refuses_a_missing_family_file_in_one_line(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "experiments" / "selector-dwell.yaml").read_text(encoding="utf-8"))
    data["family"]["path"] = str(tmp_path / "no-such-family.yaml")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = CliRunner().invoke(app, ["train", "--experiment", str(recipe), "--out", str(tmp_path / "out"), "--quiet"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "family.path" in lines[0], lines[0]
    assert "no-such-family.yaml" in lines[0], lines[0]
    assert "Traceback" not in result.output
