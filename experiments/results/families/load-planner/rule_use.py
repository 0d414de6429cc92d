"""Split the paired comparison of the load-planner candidate by whether it ever put a group under ``dynamo-load``.

Usage (from experiments/results/families): python load-planner/rule_use.py TRACE_DIR

TRACE_DIR holds one ``experiments/trace_selector.py`` output per scenario (``default-NNNNN.txt``, run with
``--policy learned:experiments/results/learned/selector-load-planner-policy --seed 0``); its last line counts the
group-intervals each rule acted in. The goodputs are the committed rows of ``validation-576-last72-seed0.csv``, read
by :func:`agents.result_rows.read_rows` (which refuses rows of another simulator than this checkout's).
A scenario counts as up or down when the ratio is more than 0.1 % away from 1.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from agents.result_rows import read_rows

CANDIDATE = "learned:/tmp/cand-lp"
DEFAULT = "learned:default"
ROWS = Path(__file__).resolve().parent / "validation-576-last72-seed0.csv"


def acted_counts(trace: Path) -> dict[str, int]:
    """The last line of a trace: ``group-intervals per rule: RULE=N, …``."""
    last = trace.read_text(encoding="utf-8").splitlines()[-1]
    prefix = "group-intervals per rule: "
    if not last.startswith(prefix):
        raise SystemExit(f"{trace}: last line is not the per-rule count: {last!r}")
    return {rule: int(n) for rule, n in (item.split("=") for item in last[len(prefix) :].split(", "))}


def main() -> None:
    """Print the paired ratio where the planner acted and where it never did."""
    rows = read_rows([ROWS])
    ratios: dict[bool, list[float]] = {True: [], False: []}
    acted = total = 0
    for trace in sorted(Path(sys.argv[1]).glob("*.txt")):
        counts = acted_counts(trace)
        acted += counts["dynamo-load"]
        total += sum(counts.values())
        runs = rows[trace.stem]
        ratios[counts["dynamo-load"] > 0].append(runs[CANDIDATE][0] / runs[DEFAULT][0])
    for used, xs in ratios.items():
        geo = math.exp(sum(map(math.log, xs)) / len(xs))
        up, down = sum(x > 1.001 for x in xs), sum(x < 0.999 for x in xs)
        print(f"dynamo-load acted: {used}: {len(xs)} scenarios, paired {geo:.3f}, {up} up, {down} down")
    print(f"group-intervals under dynamo-load: {acted}/{total} = {acted / total:.3f}")


if __name__ == "__main__":
    main()
