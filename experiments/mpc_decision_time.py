"""Wall time per decision of the model-predictive controller (``mpc:H``) over one episode per scenario.

Usage: python experiments/mpc_decision_time.py SPEC SCENARIO.yaml [SCENARIO.yaml ...] [--seed 0] [--traces DIR]

Runs each scenario once under ``SPEC`` (seed 0 by default) and prints, per scenario, its size (groups, GPUs), the
number of decisions and the median, 95th percentile and largest wall time of one decision
(:attr:`agents.mpc.MpcPolicy.decide_times_s`), and the episode's wall time. Run it alone on the machine: the figures
are wall-clock times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from agents.policy_specs import make_policy
from agents.runs import episode_env, run_episode
from env.gym_env import resolve_scenario


def decision_summary(times_s: list[float]) -> str:
    """The count, median, 95th percentile (nearest rank below) and largest of per-decision wall times."""
    if not times_s:
        raise ValueError("no decisions were timed")
    ordered = sorted(times_s)
    p95_s = ordered[int(0.95 * (len(ordered) - 1))]
    return (
        f"{len(ordered)} decisions, median {statistics.median(ordered):.2f} s, p95 {p95_s:.2f} s, "
        f"max {ordered[-1]:.2f} s"
    )


def time_one(spec: str, path: Path, seed: int, traces: Path) -> str:
    """One episode of ``spec`` on the scenario at ``path``: its size and its per-decision wall times."""
    scenario = resolve_scenario(path, traces)
    policy = make_policy(spec, scenario, None, ())
    times_s = getattr(policy, "decide_times_s", None)
    if times_s is None:
        raise SystemExit(f"{spec}: this policy does not record the time of its decisions (mpc:H does)")
    env = episode_env(scenario, policy, traces)
    start_s = time.perf_counter()
    run_episode(env, policy, seed, None)
    wall_s = time.perf_counter() - start_s
    gpus = sum(g.gpu_budget for g in scenario.tenant_groups)
    return (
        f"{scenario.name}: {len(scenario.tenant_groups)} groups, {gpus} GPUs; {decision_summary(times_s)}; "
        f"episode {wall_s:.0f} s"
    )


def main() -> None:
    """Parse the arguments and print one line per scenario."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("scenarios", nargs="+", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--traces", type=Path, default=Path(os.environ.get("PDCTL_TRACES", "data/traces")))
    args = parser.parse_args()
    for path in args.scenarios:
        print(time_one(args.spec, path, args.seed, args.traces), flush=True)


if __name__ == "__main__":
    main()
