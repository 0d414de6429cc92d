"""The guard-variant figures quoted for the pool reversal hold agree with the committed CSVs they were made from.

``experiments/results/families/pool-hold/README.md`` (and the guard's docstring) quote, for the four pool-sizing rules
on the dynamic and static suites, the geometric-mean goodput of holding both directions and of holding only the
give-back, each over no hold. ``compare_guards.py`` recomputes them here; a CSV re-run or replaced without updating
the quoted figures fails, and so does a file whose pairs do not line up.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.script_modules import load_script

FOLDER = Path(__file__).resolve().parents[1] / "experiments/results/families/pool-hold"
compare = load_script(FOLDER / "compare_guards.py", "pool_hold_compare_guards")


@pytest.mark.parametrize(
    ("suite", "both", "give_back"),
    [
        ("dynamic", "0.631x dynamic-no-hold (geometric mean over 24 pairs); 6 up, 15 down",
         "1.277x dynamic-no-hold (geometric mean over 24 pairs); 14 up, 3 down"),
        ("static", "0.612x static-no-hold (geometric mean over 20 pairs); 2 up, 10 down",
         "1.189x static-no-hold (geometric mean over 20 pairs); 9 up, 1 down"),
    ],
)  # fmt: skip
def test_the_quoted_guard_variants_are_what_the_csvs_give(
    suite: str, both: str, give_back: str, capsys: pytest.CaptureFixture[str]
) -> None:
    files = [str(FOLDER / "guard-variants" / f"{suite}-{v}.csv") for v in ("no-hold", "both-directions", "give-back")]
    assert compare.main(files) == 0
    out = capsys.readouterr().out
    assert f"{suite}-both-directions: {both}" in out
    assert f"{suite}-give-back: {give_back}" in out


def test_files_of_other_pairs_are_refused(tmp_path: Path) -> None:
    base = FOLDER / "guard-variants" / "dynamic-no-hold.csv"
    other = FOLDER / "guard-variants" / "static-no-hold.csv"
    with pytest.raises(SystemExit, match=r"static-no-hold\.csv: other \(policy, scenario\) pairs than"):
        compare.main([str(base), str(other)])
