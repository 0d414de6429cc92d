"""Run a script of ``experiments/`` on a scenario as a user would: a subprocess from the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_experiment_script(
    script: str, scenario: Path, traces_dir: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """``python experiments/SCRIPT SCENARIO --traces DIR ARGS…``, its output captured (5-minute limit)."""
    return subprocess.run(
        [sys.executable, str(REPO / "experiments" / script), str(scenario), "--traces", str(traces_dir), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
