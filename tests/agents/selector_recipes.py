"""Small selector recipes for the tests: the default family cut down, and an experiment file over it."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FAMILY = ROOT / "experiments" / "families" / "default.yaml"


def small_family(tmp_path: Path) -> Path:
    """The default family cut to one or two 4-GPU groups of one or two tenants and 2-minute episodes."""
    data = yaml.safe_load(DEFAULT_FAMILY.read_text())
    data["name"] = "small"
    data["groups"] = {"count": {"min": 2, "max": 2}, "gpu_budget": {4: 1}}
    data["tenants"]["count"] = {"min": 2, "max": 2}
    data["episode"]["duration_s"] = {"min": 120, "max": 120}
    data["cluster"]["profiles"] = {"h200-llama3-8b": 1}
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def experiment(tmp_path: Path, family: Path, **selector: object) -> Path:
    """An experiment file of the rule-selector recipe over ``family``, two training scenarios, ``selector`` merged."""
    data = {
        "name": "selector-smoke",
        "algorithm": "rule_selector",
        "family": {"path": str(family), "validation_scenarios": 1},
        "eval_seeds": [1000],
        "layout": {"kind": "set"},
        "normalize_observations": False,
        "selector": {"family_scenarios": 2, "epochs": 3, "hidden_width": 8, "workers": 1, **selector},
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
