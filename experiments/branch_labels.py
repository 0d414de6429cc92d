"""What each rule would achieve *from the state a policy reached*: a state-dependent label, measured by branching.

Usage: python experiments/branch_labels.py SCENARIO.yaml --group NAME --at-s T[,T...] [--policy SPEC] [--seed N]
       [--window-intervals W] [--traces DIR]

The policy (default ``learned:default``) runs the scenario; at each time ``T`` the simulator and a fresh instance of
each of the selector's four rules are snapshotted (a pickle round trip, as the lookahead expert does), and each rule
is followed from that state in its own copy (:func:`agents.selector_branch.branch`, what the recipe's DAgger rounds
label with). A line per ``T`` gives, for each rule, the priority-weighted number of
the group's requests arriving in the ``W`` control intervals from ``T`` that met both objectives, over the best
rule's (the selector's windowed label, :func:`agents.selector_data.window_goodput`), and the copies' wall time.
A copy runs until every request of the group arriving in the window has finished or failed (or to the
episode's end and its drain), so each window's count is final.

The selector's training labels (:func:`agents.selector_data.selector_targets`) are not this: they give every rule's
state at an interval the row of what each rule's **own** rollout achieved from its own state. Compare the two on a
state where the selector goes wrong to see whether a label measured from the state would have taught otherwise.
Read-only; a diagnostic.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from agents.policy_specs import make_policy
from agents.runs import EnvBound, control_interval, episode_env, running
from agents.selector_branch import branch
from env.gym_env import resolve_scenario

RULES = ("dynamo-legacy", "aggregated", "dynamo-isl-bounding", "dynamo-isl-or-load")


def main() -> None:
    """Parse the command line and print one line per branch time."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("--group", required=True)
    parser.add_argument("--at-s", required=True, help="comma-separated simulated times to branch at")
    parser.add_argument("--policy", default="learned:default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window-intervals", type=int, default=4)
    parser.add_argument("--traces", default=os.environ.get("PDCTL_TRACES"))
    args = parser.parse_args()
    try:
        times_s = sorted(float(t) for t in args.at_s.split(","))
    except ValueError:
        raise SystemExit(f"--at-s: not a comma-separated list of seconds: {args.at_s!r}") from None
    if args.window_intervals < 1:
        raise SystemExit(f"--window-intervals: must be >= 1, got {args.window_intervals}")
    scenario = resolve_scenario(args.scenario, args.traces)
    if args.group not in {g.name for g in scenario.tenant_groups}:
        raise SystemExit(f"--group: {args.group!r} is not a group of {args.scenario}")
    policy = make_policy(args.policy, scenario, None, ())
    env = episode_env(scenario, policy, args.traces)
    env.reset(seed=args.seed)
    if isinstance(policy, EnvBound):
        policy.bind(env)
    for at_s in times_s:
        while running(env) and env.sim.now_s < at_s - 1e-9:
            control_interval(env, policy)
        if not running(env):
            raise SystemExit(f"--at-s: {at_s} is past the episode's end ({scenario.duration_s} s)")
        met, wall_s, _ = branch(env, RULES, args.window_intervals, args.group)
        column = [g.name for g in env.groups].index(args.group)
        best = float(met[:, column].max()) or 1.0
        cells = " ".join(f"{rule}={m / best:.2f} ({m:.0f})" for rule, m in zip(RULES, met[:, column], strict=True))
        print(f"t={env.sim.now_s:.0f} s  {cells}  ({wall_s:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
