"""Every import the code makes is declared in pyproject.toml, and every module imports.

The static check reads each module's imports (function-local ones too) and maps each third-party top-level module
to the distribution that provides it (``importlib.metadata.packages_distributions``). The distribution must be
declared directly: a runtime dependency for the six packages, a runtime or ``dev`` dependency for the tests and
benchmarks. A package that is merely present on the machine, or pulled in by another dependency, does not count: that
is how an undeclared ``pydantic_settings`` once passed CI.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("policies", "env", "livestack", "agents", "router", "controller", "pdctl")
TEST_TREES = ("tests", "benchmarks")
# Imported only inside a function of a feature that names its extra in its error message.
OPTIONAL_EXTRAS = {"ray": "ray"}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match is not None, f"pyproject.toml: unparseable requirement {requirement!r}"
    return _normalise(match.group(1))


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_requirement_name(r) for r in project["dependencies"]}
    extras = {
        extra: {_requirement_name(r) for r in requirements}
        for extra, requirements in project["optional-dependencies"].items()
    }
    return runtime, extras


def _python_files(tree: str) -> Iterator[Path]:
    yield from sorted((ROOT / tree).rglob("*.py"))


def _local_names(tree: str) -> set[str]:
    """Module names a test tree imports from its own folders (``harness``, ``summary``…)."""
    return {p.stem for p in (ROOT / tree).rglob("*.py")} | {p.name for p in (ROOT / tree).rglob("*") if p.is_dir()}


def _third_party_imports(path: Path, local: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    own = set(PACKAGES) | set(TEST_TREES) | local
    return {m for m in found if m not in sys.stdlib_module_names and m not in own and m != "__future__"}


def _undeclared(trees: tuple[str, ...], allowed: set[str], optional: dict[str, str]) -> list[str]:
    providers = packages_distributions()
    problems: list[str] = []
    for tree in trees:
        local = _local_names(tree) if tree in TEST_TREES else set()
        for path in _python_files(tree):
            for module in sorted(_third_party_imports(path, local)):
                dists = {_normalise(d) for d in providers.get(module, [])}
                where = f"{path.relative_to(ROOT)}: imports {module!r}"
                if not dists:
                    problems.append(f"{where}, which no installed distribution provides")
                elif not dists & allowed and module not in optional:
                    problems.append(f"{where} ({', '.join(sorted(dists))}), not declared")
    return problems


def test_every_runtime_import_is_a_declared_runtime_dependency() -> None:
    runtime, extras = _declared()
    for module, extra in OPTIONAL_EXTRAS.items():
        assert _normalise(module) in extras[extra], f"optional import {module!r} is not in the [{extra}] extra"
    assert _undeclared(PACKAGES, runtime, OPTIONAL_EXTRAS) == []


def test_every_test_import_is_declared_in_runtime_or_dev() -> None:
    runtime, extras = _declared()
    assert _undeclared(TEST_TREES, runtime | extras["dev"], {}) == []


def test_the_check_catches_an_undeclared_import(tmp_path: Path) -> None:
    # A module the machine has (pytest) but the runtime dependencies do not declare is reported.
    runtime, _ = _declared()
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import pytest\n")
    assert _third_party_imports(module, set()) == {"pytest"}
    assert "pytest" not in runtime


def _all_modules() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in _python_files(package):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.parametrize("module", _all_modules())
def test_every_module_imports(module: str) -> None:
    importlib.import_module(module)
