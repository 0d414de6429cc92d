"""Speed of the selector recipe's rule rollouts on family scenarios, and a side-by-side check of two checkouts.

The learned-policy recipe (``experiments/selector-dwell.yaml``) spends almost all of its time in rule rollouts:
four rules over training scenarios of the default family at 1.0x and 1.5x load. Wall time on the project's
2-core machine varies by about 2x from one day to the next, so a speed change is only measured against a baseline
run *at the same time*: run this script once per checkout, concurrently (one process each, one core each), then
compare the two results. ``--compare`` also checks that both produced bit-identical rollouts (a digest of every
recorded input, decision time and goodput bin), so a speed-up that changes results is caught.

Run from the repository root (``BASE`` a worktree of the baseline commit, e.g. ``git worktree add /tmp/base
HEAD~1``; ``PYTHONPATH`` decides which checkout's code runs, this file only drives it)::

    PYTHONHASHSEED=0 PYTHONPATH=$PWD python benchmarks/sim/rollout_speed.py --out /tmp/new.json &
    PYTHONHASHSEED=0 PYTHONPATH=$BASE python benchmarks/sim/rollout_speed.py --out /tmp/base.json; wait
    python benchmarks/sim/rollout_speed.py --compare /tmp/base.json /tmp/new.json

Each result records the checkout its code came from (``code``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import agents.selector_data
from agents.selector_data import RolloutTask, rule_rollout
from env.families.config import load_family
from env.families.generate import scenario_name, scenario_yaml

REPO = Path(__file__).resolve().parents[2]
FAMILY = REPO / "experiments" / "families" / "default.yaml"
RULES = ("dynamo-legacy", "aggregated", "dynamo-isl-bounding", "dynamo-isl-or-load")
RATE_SCALES = (1.0, 1.5)


def run(indices: list[int], traces_dir: str | None, seed: int) -> dict[str, object]:
    """Every rule at every load on the training scenarios at ``indices``: times and digests, in one process."""
    family = load_family(FAMILY)
    seeds = family.split_seeds("train")
    tasks_out: list[dict[str, object]] = []
    start_s, start_cpu_s = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as folder:
        for index in indices:
            path = Path(folder) / f"{scenario_name(family, seeds[index])}.yaml"
            path.write_text(scenario_yaml(family, seeds[index]), encoding="utf-8")
            for rate_scale in RATE_SCALES:
                for rule in RULES:
                    task = RolloutTask(str(path), rule, seed, traces_dir, rate_scale)
                    task_start_s = time.perf_counter()
                    rollouts = rule_rollout(task)
                    wall_s = time.perf_counter() - task_start_s
                    digest = hashlib.sha256()
                    for r in rollouts:
                        digest.update(r.inputs.tobytes())
                        digest.update(repr((r.weighted_goodput_rps, r.offered_weighted_rps)).encode())
                        for array in (r.decision_s, r.met_weighted_per_bin):
                            if array is not None:
                                digest.update(array.tobytes())
                    intervals = len(rollouts[0].inputs) if rollouts else 0
                    tasks_out.append(
                        {
                            "scenario": path.stem,
                            "rule": rule,
                            "rate_scale": rate_scale,
                            "wall_s": wall_s,
                            "intervals": intervals,
                            "digest": digest.hexdigest(),
                        }
                    )
                    print(f"{path.stem} {rule} x{rate_scale}: {wall_s:.2f} s, {intervals} intervals", flush=True)
    wall_s = time.perf_counter() - start_s
    intervals = sum(int(t["intervals"]) for t in tasks_out)  # type: ignore[call-overload]
    return {
        "code": str(Path(agents.selector_data.__file__).resolve().parents[1]),
        "indices": indices,
        "seed": seed,
        "wall_s": wall_s,
        "process_s": time.process_time() - start_cpu_s,
        "intervals": intervals,
        "intervals_per_s": intervals / wall_s,
        "tasks": tasks_out,
    }


def compare(base_path: Path, new_path: Path) -> int:
    """Print the speed ratio new/base and whether every rollout is identical; non-zero if any differs."""
    base = json.loads(base_path.read_text(encoding="utf-8"))
    new = json.loads(new_path.read_text(encoding="utf-8"))
    pairs = list(zip(base["tasks"], new["tasks"], strict=True))
    keys = ("scenario", "rule", "rate_scale")
    if any(tuple(b[k] for k in keys) != tuple(n[k] for k in keys) for b, n in pairs):
        print(f"{new_path}: not the same tasks as {base_path}", file=sys.stderr)
        return 2
    differ = [b for b, n in pairs if b["digest"] != n["digest"]]
    ratios = [b["wall_s"] / n["wall_s"] for b, n in pairs]
    print(f"tasks: {len(pairs)}, identical rollouts: {len(pairs) - len(differ)}")
    print(
        f"intervals/s: base {base['intervals_per_s']:.2f}, new {new['intervals_per_s']:.2f}, "
        f"ratio {new['intervals_per_s'] / base['intervals_per_s']:.3f}"
    )
    print(
        f"per-task speed ratio base/new: median {statistics.median(ratios):.3f}, "
        f"min {min(ratios):.3f}, max {max(ratios):.3f}"
    )
    for task in differ:
        print(f"differs: {task['scenario']} {task['rule']} x{task['rate_scale']}")
    return 1 if differ else 0


def main() -> int:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the run's JSON here")
    parser.add_argument("--indices", default="0,10,20,30,40", help="training-split scenario indices, comma list")
    parser.add_argument("--seed", type=int, default=0, help="episode seed (the recipe's)")
    parser.add_argument("--traces", default=None, help="trace folder (default: env PDCTL_TRACES)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BASE", "NEW"), help="compare two runs' JSON")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        parser.error("--out is required without --compare")
    try:
        indices = [int(x) for x in args.indices.split(",")]
    except ValueError:
        parser.error(f"--indices: not a comma list of integers: {args.indices!r}")
    result = run(indices, args.traces, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"{result['intervals']} intervals in {result['wall_s']:.1f} s: {result['intervals_per_s']:.2f} intervals/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
