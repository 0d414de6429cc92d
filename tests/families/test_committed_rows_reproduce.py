"""The committed issue-18 rows of the shipped default policy reproduce, bit for bit, on this checkout.

Every row records the simulator that measured it (``simulator_sha256``, a digest of ``env/sim`` and ``env/perf``)
and the scenario file (``scenario_sha256``), and the table scripts refuse rows of another simulator. What decides a
run is more than the simulator: the rule selector and its network, the flap-damping bar, the trial check, the SLO
watchdog, the guard's cooldowns and reversal holds, the rules themselves and the env's control step all live outside
that digest. A change to any of them would leave every committed ``learned:default`` table (README's "at a glance",
``experiments/results/families/``) stale under the same digest, with nothing failing. This test re-runs a few of
those rows, picked to pass through each of those parts, and compares them with the committed figures exactly.

The scenarios are test-family files regenerated from the family (nothing is selected or tuned here: the shipped
policies are only re-run). ``learned:default`` on default-20126 (three groups, every one of the selector's four
rules acts), default-20105 (three groups, six tenants, a network incident and a load ramp) and default-20140 (one
group of 4 GPUs where the best rule serves under half the offered load, one of the scenarios below the floor line);
two of the rules it switches between; and ``queue_kv``, the rule that moves thresholds and pools, on two scenarios
where the guard's reversal holds act: changing the threshold reversal hold changes default-20042, the pool
reversal hold default-20049. Measured when this test was written, each of these guard defaults changed alone fails
at least one case: ``hysteresis_ticks`` 2 → 1, ``threshold_dead_band_frac`` 0.05 → 0.3, ``cooldown_s`` 60 → 20,
``threshold_reversal_hold_s`` 600 → 30, ``pool_reversal_hold_s`` 600 → 0. The selector's trial check
(``TRIAL_CHECK_*`` in :mod:`policies.rule_selector`) acts in none of 27 quick test scenarios tried, so no case here
covers it.
"""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import pytest

from agents.evaluate import simulator_digest
from agents.harness import ALL_TENANTS, RunSpec, run_one
from env.families import load_family, scenario_yaml
from policies.registry import DEFAULT_LEARNED_ARTIFACT

REPO = Path(__file__).resolve().parents[2]
FAMILY = REPO / "experiments" / "families" / "default.yaml"
RESULTS = REPO / "experiments" / "results" / "families"
TEST_280_ROWS = {  # the committed seed-0 rows of the 280 test scenarios, by policy: (file, the policy's label there)
    # learned:default since the fifty-first session: its artifact's rows, measured under its own path before it shipped
    "learned:default": (
        RESULTS / "l560" / "test-280-seed0.csv",
        f"learned:{DEFAULT_LEARNED_ARTIFACT.relative_to(REPO).as_posix()}",
    ),
    "baseline:dynamo-legacy": (RESULTS / "admission-control" / "test-280-seed0.csv", "baseline:dynamo-legacy"),
    "baseline:aggregated": (RESULTS / "admission-control" / "test-280-seed0.csv", "baseline:aggregated"),
    "baseline:queue_kv": (RESULTS / "all-rules" / "test-280-nine-rules-seed0.csv", "baseline:queue_kv"),
}
CASES = (  # (policy, test-family seed)
    ("learned:default", 20126),
    ("learned:default", 20105),
    ("learned:default", 20140),
    ("baseline:dynamo-legacy", 20126),
    ("baseline:dynamo-legacy", 20140),
    ("baseline:aggregated", 20105),
    ("baseline:queue_kv", 20042),
    ("baseline:queue_kv", 20049),
)
SEED = 0


def _committed_row(path: Path, policy: str, scenario: str) -> dict[str, str]:
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if (row["policy"], row["scenario"], row["tenant"]) == (policy, scenario, ALL_TENANTS):
                return row
    raise AssertionError(f"{path}: no {ALL_TENANTS} row for {policy} on {scenario}")


@pytest.fixture(scope="module")
def scenario_files(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    family = load_family(FAMILY)
    out_dir = tmp_path_factory.mktemp("family-test")
    files: dict[int, Path] = {}
    for seed in sorted({seed for _, seed in CASES}):
        path = out_dir / f"default-{seed}.yaml"
        path.write_text(scenario_yaml(family, seed), encoding="utf-8")
        files[seed] = path
    return files


@pytest.mark.parametrize(("policy", "scenario_seed"), CASES)
def test_a_committed_row_of_the_test_family_reproduces_exactly(
    scenario_files: dict[int, Path], policy: str, scenario_seed: int
) -> None:
    path = scenario_files[scenario_seed]
    rows_file, label = TEST_280_ROWS[policy]
    committed = _committed_row(rows_file, label, path.stem)
    assert committed["simulator_sha256"] == simulator_digest(), (
        f"{rows_file.name} was measured by simulator {committed['simulator_sha256']}, this checkout's is "
        f"{simulator_digest()}: re-measure the committed tables (their COMMANDS.txt) before comparing"
    )
    assert hashlib.sha256(path.read_bytes()).hexdigest() == committed["scenario_sha256"], (
        f"{path.stem} no longer regenerates as measured (tests/families/test_pinned_eval_sets.py says why)"
    )
    row = next(r for r in run_one(RunSpec(policy, str(path), SEED)).rows if r["tenant"] == ALL_TENANTS)
    got = (row["weighted_goodput_rps"], row["arrived"], row["finished"], row["churn_changes"])
    expected = (
        float(committed["weighted_goodput_rps_mean"]),
        round(float(committed["arrived_mean"])),
        round(float(committed["finished_mean"])),
        float(committed["churn_changes_mean"]),
    )
    assert got == expected, (
        f"{policy} on {path.stem}, seed {SEED}: (weighted goodput, arrived, finished, churn) {got} on this checkout, "
        f"{expected} committed in {rows_file.relative_to(REPO)}. Something outside the simulator digest "
        "(the policy, the selector, the watchdog, the guard, the control step) changed what the run decides: every "
        "committed table of this policy is stale. Re-measure them (their COMMANDS.txt) or undo the change."
    )
