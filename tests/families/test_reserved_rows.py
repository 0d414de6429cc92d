"""The rules' rows reserved for a look (``experiments/results/families/reserved-validation*/``) are usable.

Each set stands in for a run of the 13 rules on validation scenarios no policy had run on when they were made (the
forty-third to fifty-first sessions' looks used the first seven; the eighth is unused), so it must be all there
(every rule on every scenario, once), measured on exactly the pinned scenario files, and by the simulator this
checkout has: a change to ``env/sim`` or ``env/perf`` makes the rows stale, and this test then says to re-run them
(the commands are in each folder's README) rather than let a look compare rows of two simulators.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.evaluate import simulator_digest
from agents.policy_specs import all_baseline_specs
from tests.families.test_pinned_eval_sets import _pinned

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results" / "families"
PINS = ROOT / "experiments" / "families"


@dataclass(frozen=True)
class ReservedSet:
    """One folder of reserved rules' rows: the rows, the pin file of its scenarios, and which of the pinned."""

    rows: Path
    pin: Path
    first: int
    """The reserved scenarios are the pin file's from this index on (earlier looks ran policies on the ones before)."""
    count: int


def _reserved(folder: str, pinned: int, count: int) -> ReservedSet:
    """The rows of the last ``count`` of the first ``pinned`` validation scenarios, in ``folder``."""
    return ReservedSet(
        RESULTS / folder / f"validation-{pinned}-last{count}-rules-seed0.csv",
        PINS / f"default-validation-{pinned}.sha256",
        first=pinned - count,
        count=count,
    )


SETS = {
    "reserved-validation": _reserved("reserved-validation", 1000, 136),
    "reserved-validation-2": _reserved("reserved-validation-2", 1080, 80),
    "reserved-validation-3": _reserved("reserved-validation-3", 1400, 120),
    "reserved-validation-4": _reserved("reserved-validation-4", 1720, 120),
    "reserved-validation-5": _reserved("reserved-validation-5", 2000, 80),
    "reserved-validation-6": _reserved("reserved-validation-6", 2320, 120),
    "reserved-validation-7": _reserved("reserved-validation-7", 2640, 120),
    "reserved-validation-8": _reserved("reserved-validation-8", 2960, 120),
}


def _rows(reserved: ReservedSet) -> list[dict[str, str]]:
    with reserved.rows.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _reserved_pins(reserved: ReservedSet) -> dict[str, str]:
    """Scenario name → pinned SHA-256, for the reserved scenarios (the pin file lists them in order)."""
    pinned = list(_pinned(reserved.pin).items())[reserved.first :]
    return {name.removesuffix(".yaml"): digest for name, digest in pinned}


@pytest.mark.parametrize("name", sorted(SETS))
def test_every_rule_ran_once_on_every_reserved_scenario(name: str) -> None:
    reserved = SETS[name]
    rows = _rows(reserved)
    rules = set(all_baseline_specs()) - {"grid:"}  # the 12 baselines and the seed policy file
    assert len(rules) == 13
    seen = [(row["policy"], row["scenario"]) for row in rows]
    assert len(seen) == len(set(seen)), "a (rule, scenario) row is repeated"
    assert {row["tenant"] for row in rows} == {"ALL"}
    assert {row["num_seeds"] for row in rows} == {"1"}
    assert set(seen) == {(rule, scenario) for rule in rules for scenario in _reserved_pins(reserved)}


@pytest.mark.parametrize("name", sorted(SETS))
def test_the_rows_were_measured_on_the_pinned_files_by_this_checkouts_simulator(name: str) -> None:
    reserved = SETS[name]
    pins = _reserved_pins(reserved)
    assert len(pins) == reserved.count
    rows = _rows(reserved)
    wrong_file = sorted({row["scenario"] for row in rows if row["scenario_sha256"] != pins[row["scenario"]]})
    assert not wrong_file, f"rows measured on other scenario files than pinned: {wrong_file[:3]}"
    simulators = {row["simulator_sha256"] for row in rows}
    assert simulators == {simulator_digest()}, (
        f"the reserved rules' rows were measured by simulator {sorted(simulators)}, this checkout's is "
        f"{simulator_digest()}: re-run them (experiments/results/families/{name}/README.md)"
    )
