"""The rules' rows reserved for one look (``experiments/results/families/reserved-validation/``) are usable.

They stand in for a run of the 13 rules on 136 validation scenarios (the forty-third session's look used them),
so they must be all there (every rule on every scenario, once), measured on exactly the pinned scenario files, and
by the simulator this checkout has: a change to ``env/sim`` or ``env/perf`` makes them stale, and this test then
says to re-run them (the commands are in that folder's README) rather than let a look compare rows of two simulators.
"""

from __future__ import annotations

import csv
from pathlib import Path

from agents.evaluate import simulator_digest
from agents.policy_specs import all_baseline_specs
from tests.families.test_pinned_eval_sets import _pinned

ROOT = Path(__file__).resolve().parents[2]
ROWS = ROOT / "experiments" / "results" / "families" / "reserved-validation" / "validation-1000-last136-rules-seed0.csv"
PIN = ROOT / "experiments" / "families" / "default-validation-1000.sha256"
FIRST_RESERVED = 864
"""The reserved scenarios are the pinned 1000 (the validation range until the forty-second session) less the first 864,
which earlier looks ran policies on."""


def _rows() -> list[dict[str, str]]:
    with ROWS.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _reserved_pins() -> dict[str, str]:
    """Scenario name → pinned SHA-256, for the reserved scenarios (the pin file lists them in order)."""
    pinned = list(_pinned(PIN).items())[FIRST_RESERVED:]
    return {name.removesuffix(".yaml"): digest for name, digest in pinned}


def test_every_rule_ran_once_on_every_reserved_scenario() -> None:
    rows = _rows()
    rules = set(all_baseline_specs()) - {"grid:"}  # the 12 baselines and the seed policy file
    assert len(rules) == 13
    seen = [(row["policy"], row["scenario"]) for row in rows]
    assert len(seen) == len(set(seen)), "a (rule, scenario) row is repeated"
    assert {row["tenant"] for row in rows} == {"ALL"}
    assert {row["num_seeds"] for row in rows} == {"1"}
    assert set(seen) == {(rule, scenario) for rule in rules for scenario in _reserved_pins()}


def test_the_rows_were_measured_on_the_pinned_files_by_this_checkouts_simulator() -> None:
    pins = _reserved_pins()
    assert len(pins) == 136
    rows = _rows()
    wrong_file = sorted({row["scenario"] for row in rows if row["scenario_sha256"] != pins[row["scenario"]]})
    assert not wrong_file, f"rows measured on other scenario files than pinned: {wrong_file[:3]}"
    simulators = {row["simulator_sha256"] for row in rows}
    assert simulators == {simulator_digest()}, (
        f"the reserved rules' rows were measured by simulator {sorted(simulators)}, this checkout's is "
        f"{simulator_digest()}: re-run them (experiments/results/families/reserved-validation/README.md)"
    )
