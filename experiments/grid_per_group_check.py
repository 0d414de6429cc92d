"""Check the grid search's ``per_group`` method against the exhaustive one on scenarios small enough for both.

For each scenario, both methods search on the same seeds. Printed per scenario: the runs each made, the best
configuration's score under each (the per-group choice is run whole, so both are real scores), their ratio, and the
rank of the per-group choice among all exhaustive points. The per-group method is exact in distribution when the
groups are independent (``agents.grid_search._per_group_candidates``); this measures what it costs in practice.

    python experiments/grid_per_group_check.py /tmp/family-val144/default-100{15,24,00,18}.yaml --seeds 0
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from agents.grid_search import search

HEADER = ["scenario", "exhaustive runs", "per-group runs", "exhaustive best", "per-group best", "ratio", "rank"]


def _key(point: dict[str, Any]) -> str:
    return json.dumps([point["pools"], point["route"]], sort_keys=True)


def main() -> None:
    """Run both methods on each scenario and print a Markdown table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("scenarios", nargs="+", type=Path)
    parser.add_argument("--seeds", default="0", help="comma list of search seeds")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--traces", default=None, help="trace folder for ${PDCTL_TRACES}")
    args = parser.parse_args()
    seeds = tuple(int(s) for s in args.seeds.split(","))
    print("| " + " | ".join(HEADER) + " |")
    print("|---|" + "---:|" * (len(HEADER) - 1), flush=True)
    ratios = []
    with tempfile.TemporaryDirectory() as cache:
        for path in args.scenarios:
            ex, pg = (
                search(path, seeds=seeds, workers=args.workers, cache_dir=Path(cache), traces_dir=args.traces, method=m)
                for m in ("exhaustive", "per_group")
            )
            best_ex = ex["best_score"]["weighted_goodput_rps"]
            best_pg = pg["best_score"]["weighted_goodput_rps"]
            ranked = [_key(p) for p in sorted(ex["points"], key=lambda p: -p["weighted_goodput_rps"])]
            choice = _key(pg["best"])
            rank = f"{ranked.index(choice) + 1} of {len(ranked)}" if choice in ranked else "not an exhaustive point"
            ratio = best_pg / best_ex if best_ex > 0 else 1.0
            ratios.append(ratio)
            cells = [path.stem, ex["runs"], pg["runs"], f"{best_ex:.3f}", f"{best_pg:.3f}", f"{ratio:.4f}", rank]
            print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)
    at_best = sum(r >= 1 - 1e-9 for r in ratios)
    print(f"\nlowest ratio {min(ratios):.4f}; at the exhaustive best on {at_best} of {len(ratios)}")


if __name__ == "__main__":
    main()
