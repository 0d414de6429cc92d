from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("policies", "env", "livestack", "agents", "router", "controller", "pdctl")


def test_every_package_is_tracked_by_git() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", *[f"{p}/__init__.py" for p in TOP_LEVEL]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert sorted(tracked) == sorted(f"{p}/__init__.py" for p in TOP_LEVEL), "a package is ignored or untracked"


@pytest.mark.slow
def test_wheel_contains_every_package_and_data(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    wheel = next(tmp_path.glob("pdctl-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for package in TOP_LEVEL:
        assert f"{package}/__init__.py" in names
    assert "policies/examples/seed_pd_policy.yaml" in names
    assert "env/workloads/trace-SHA256SUMS" in names
