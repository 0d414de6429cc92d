"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def traces_dir() -> Path:
    path = SHARED / "traces"
    if not path.is_dir():
        pytest.skip(f"shared traces folder {path} is absent")
    return path
