"""The result tables quoted in experiments/results/families agree with the committed CSVs they were made from.

Each table of ``experiments/results/families/checked-tables.yaml`` is recomputed with ``summarize.py``'s
:func:`summarize`; a CSV edited, replaced or re-run without updating the quoted figure fails here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

FAMILIES = Path(__file__).resolve().parents[1] / "experiments/results/families"
LEARNED = "learned:experiments/results/learned"


def _summarize_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("families_summarize", FAMILIES / "summarize.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


summarize = _summarize_module()
TABLES: list[dict[str, Any]] = yaml.safe_load((FAMILIES / "checked-tables.yaml").read_text(encoding="utf-8"))["tables"]


def _flat(items: list[Any]) -> list[str]:
    return [str(FAMILIES / f) for item in items for f in (item if isinstance(item, list) else [item])]


def _spec(name: str) -> str:
    return name.replace("L/", f"{LEARNED}/", 1)


def _check(table: dict[str, Any]) -> list[str]:
    """What in ``table`` disagrees with its recomputation (empty: all agrees)."""
    versus = _spec(table["versus"]) if table.get("versus") else None
    policies = [_spec(p) for p in table["expect"]]
    got = summarize.summarize(_flat(table["files"]), policies, bool(table.get("pool_seeds")), versus)
    wrong = []
    for name, want in table["expect"].items():
        fig = got.figures[_spec(name)]
        seen = {
            "x_single": round(fig.vs_single_geomean, 3),
            "share": f"{fig.at_least_best}/{len(got.scenarios)}",
            "floor": round(fig.floor, 3),
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
