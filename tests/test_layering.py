"""Layering rules import-linter cannot see: no function imports a project package outside pdctl/.

A function-local import of a project package is how an import cycle gets dodged; the cycles are gone (issue 19), and
this keeps them gone. The command line (pdctl/) may import lazily to keep start-up fast.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("policies", "env", "agents", "router", "controller", "livestack", "pdctl")
CHECKED = ("policies", "env", "agents", "router", "controller", "livestack")


def _function_local_project_imports(path: Path, root: Path = ROOT) -> list[str]:
    found: list[str] = []
    tree = ast.parse(path.read_text(), filename=str(path))
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(func):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                if name.split(".")[0] in PROJECT:
                    found.append(f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}: {func.name} imports {name}")
    return found


def test_no_function_imports_a_project_package_outside_the_cli() -> None:
    problems = [
        p for pkg in CHECKED for f in sorted((ROOT / pkg).rglob("*.py")) for p in _function_local_project_imports(f)
    ]
    assert problems == []


def test_the_check_sees_a_function_local_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import env\n\n\ndef f():\n    from env.sim import build\n    import numpy\n    return build, numpy\n"
    )
    assert _function_local_project_imports(sample, tmp_path) == ["sample.py:5: f imports env.sim"]
