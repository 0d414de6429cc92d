"""The README's benchmark figures are generated from the committed result files and agree with them.

Fails when someone edits a figure by hand or commits new results without regenerating the README
(``python benchmarks/readme_figures.py``).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "readme_figures.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("readme_figures", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


figures = _module()


def test_the_readme_agrees_with_the_result_files() -> None:
    assert figures.sync_readme(REPO / "README.md", write=False), "run: python benchmarks/readme_figures.py"


def test_a_hand_edited_figure_is_caught_and_regenerated(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index(figures.BEGIN)
    edited = text[:start] + text[start:].replace("target < 100 ms: met", "target < 100 ms: met easily", 1)
    readme.write_text(edited, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--readme", str(readme)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert "disagree" in done.stderr
    assert not figures.sync_readme(readme, write=True)
    assert readme.read_text(encoding="utf-8") == text  # everything outside the block untouched


def test_figures_follow_the_files(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(REPO / "benchmarks" / "results", results)
    path = results / "raw" / "router_overhead.json"
    doc = json.loads(path.read_text())
    for fig in doc["figures"]:  # both figures set here: the test does not depend on the last benchmark run
        if fig["metric"] == "added TTFT p50" and fig["config"].startswith("200 streams, router"):
            fig["median"] = 1.2
        if fig["metric"] == "added TTFT p99" and fig["config"].startswith("200 streams, router"):
            fig["median"] = 1.5
    path.write_text(json.dumps(doc))
    table = figures.figures_table(results, results / "raw")
    assert "1.20 ms / 1.50 ms" in table
    assert "target < 2 ms p99 at 200: met" in table
    soak = json.loads((results / "soak.json").read_text())
    del soak["flaps"]
    (results / "soak.json").write_text(json.dumps(soak))
    with pytest.raises(figures.FiguresError, match=r"soak\.json: missing or bad 'flaps'"):
        figures.figures_table(results, results / "raw")
