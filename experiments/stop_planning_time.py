"""Time a selector recipe's stop planning (the request-budget stops, before any rollout) serially and over workers.

Usage: python experiments/stop_planning_time.py RECIPE.yaml SCENARIO_DIR [--workers 2] [--repeats 2]

Writes the recipe's training scenarios into ``SCENARIO_DIR`` (as ``pdctl train`` does under its output folder), plans
every rollout run's stop with 1 process and with ``--workers``, alternately ``--repeats`` times, checks that both give
the same stops, and prints the seconds each took (the training run counts this time in its wall time).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from agents.config import load_experiment
from agents.selector_data import StopPlan, rollout_stops
from agents.set_training import family_split_paths


def main(argv: Sequence[str] | None = None) -> int:
    """Print the stops planned and the seconds per attempt."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", type=Path)
    parser.add_argument("scenarios", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    config = load_experiment(args.recipe)
    selector, family = config.selector, config.family
    if selector is None or family is None or selector.rollout_request_budget is None:
        raise SystemExit(f"{args.recipe}: not a rule-selector recipe with a family and a rollout_request_budget")
    paths = family_split_paths(config, args.scenarios, family.train_split, selector.family_scenarios)
    plans = [
        StopPlan(str(path), rate_scale, bandwidth_scale, seed, selector.rollout_request_budget,
                 selector.rollout_min_intervals)
        for index, path in enumerate(paths)
        for rate_scale, bandwidth_scale in selector.rollout_conditions(index)
        for seed in selector.seeds
    ]  # fmt: skip
    seconds: dict[int, list[float]] = {1: [], args.workers: []}
    reference: list[float | None] | None = None
    for _ in range(args.repeats):
        for workers in (1, args.workers):
            start = time.perf_counter()
            stops = rollout_stops(plans, workers)
            seconds[workers].append(time.perf_counter() - start)
            if reference is None:
                reference = stops
            elif stops != reference:
                raise SystemExit(f"{workers} workers planned other stops than 1")
    stopped = sum(stop is not None for stop in reference or [])
    print(f"{len(plans)} runs of {len(paths)} scenarios; {stopped} stop at the request budget")
    for workers, times in seconds.items():
        print(f"{workers} worker(s): " + ", ".join(f"{t:.1f} s" for t in times))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
