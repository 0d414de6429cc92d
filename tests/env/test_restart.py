"""Controller restarts in the simulator: with the control state kept (the controller's memory file), a restart
changes nothing; without it, a restart can undo the policy's thresholds.

One simulated day of the soak's scenario (``tests/soak/test_week_soak.py``: diurnal chat and RAG, a batch surge,
2 % KV transfer failures), the controller restarted every 10 minutes (143 restarts): a fresh policy each time, and
the control state either kept as :meth:`policies.control.ControlState.after_restart` says and the policy's own memory
handed over (what ``controller/control_memory.py`` reads back) or started again from the base file (a controller
without the file).
Measured when written: ``baseline:queue_kv`` 228 threshold reversals and the selector that was ``learned:default``
until the fifty-first session (``selector-dwell-w8-margin-bar-check-policy``) 384 without the memory, 0 and 0 with
it (as without restarts), with the same pool changes and goodput; the figures are what ``controller/README.md``
quotes. The default since then (``selector-560-late-misses-policy``) makes none without the memory on this day, so
its case checks that a kept memory changes nothing and that losing it makes no reversal.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from policies.guard import GuardLimits
from tests.script_modules import load_script
from tests.soak.test_policy_soak import soak
from tests.soak.test_week_soak import REPO, week_scenario

RESTART_EVERY_S = 600.0


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return week_scenario(tmp_path_factory.mktemp("restart"), days=1)


def _runs(spec: str, day: Path) -> dict[str, dict[str, Any]]:
    return {
        "none": soak(spec, GuardLimits(), day),
        "kept": soak(spec, GuardLimits(), day, restart_every_s=RESTART_EVERY_S, keep_memory=True),
        "lost": soak(spec, GuardLimits(), day, restart_every_s=RESTART_EVERY_S, keep_memory=False),
    }


PREVIOUS_DEFAULT = "learned:experiments/results/learned/selector-dwell-w8-margin-bar-check-policy"


@pytest.mark.parametrize(
    ("spec", "reversals_lost"), [("baseline:queue_kv", 228), (PREVIOUS_DEFAULT, 384), ("learned:default", 0)]
)
def test_a_restart_that_keeps_the_control_state_changes_nothing(spec: str, reversals_lost: int, day: Path) -> None:
    runs = _runs(spec, day)
    assert runs["kept"]["restarts"] == runs["lost"]["restarts"] == 143
    assert {k: v for k, v in runs["kept"].items() if k != "restarts"} == runs["none"], (
        "with the memory a restart is invisible: the same threshold and pool changes, no reversal, the same goodput"
    )
    assert runs["none"]["threshold_reversals"] == 0
    assert runs["lost"]["threshold_reversals"] == reversals_lost, "without it a restart may undo the thresholds"


@pytest.mark.parametrize(
    ("spec", "scenario"),
    [
        ("baseline:queue_kv", "short-flood-8"),
        ("learned:default", "network-incident-8"),
        ("watchdog:baseline:queue_kv", "network-incident-8"),
    ],
)
def test_the_restart_cost_script_runs_a_restart_as_the_controller_does(spec: str, scenario: str) -> None:
    """``experiments/restart_cost.py``, the goodput tables of ``experiments/results/restarts/``.

    With the memory a 2-minute crash loop leaves the run where it was; without it, it does not. ``queue_kv`` needs
    the guard's streaks kept, the selector its own memory handed over, the SLO watchdog its record (before it,
    ``watchdog:baseline:queue_kv`` kept 0.77× of its goodput there with the rest of the memory).
    """
    script = load_script(REPO / "experiments" / "restart_cost.py", "restart_cost")
    path = REPO / "experiments" / "scenarios" / f"{scenario}.yaml"
    traces = Path(os.environ.get("PDCTL_TRACES", "data/traces"))
    none, _ = script.run(path, spec, 1000, "none", 120.0, traces)
    kept, restarts = script.run(path, spec, 1000, "kept", 120.0, traces)
    lost, _ = script.run(path, spec, 1000, "lost", 120.0, traces)
    assert restarts >= 5
    assert kept == none
    assert lost != none
