"""``experiments/mpc_decision_time.py``: the per-decision figures it prints, and a policy that records no times."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[1]
timing = load_script(REPO / "experiments" / "mpc_decision_time.py", "mpc_decision_time")
TRACES = Path(os.environ.get("PDCTL_TRACES", "data/traces"))


def test_the_summary_is_count_median_p95_and_max() -> None:
    times_s = [0.1 * k for k in range(1, 21)]  # 0.1 … 2.0 s
    assert timing.decision_summary(times_s[::-1]) == "20 decisions, median 1.05 s, p95 1.90 s, max 2.00 s"
    with pytest.raises(ValueError, match="no decisions"):
        timing.decision_summary([])


def test_a_policy_that_times_nothing_is_refused_before_any_run() -> None:
    path = REPO / "experiments" / "scenarios" / "chatbot-8.yaml"
    with pytest.raises(SystemExit, match="baseline:dynamo-legacy: this policy does not record"):
        timing.time_one("baseline:dynamo-legacy", path, 0, TRACES)
