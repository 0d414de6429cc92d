"""What each rule would achieve *from the state a policy reached*: a state-dependent label, measured by branching.

Usage: python experiments/branch_labels.py SCENARIO.yaml --group NAME --at-s T[,T...] [--policy SPEC] [--seed N]
       [--window-intervals W] [--traces DIR]

The policy (default ``learned:default``) runs the scenario; at each time ``T`` the simulator and a fresh instance of
each of the selector's four rules are snapshotted (a pickle round trip, as the lookahead expert does), and each rule
is followed from that state in its own copy. A line per ``T`` gives, for each rule, the priority-weighted number of
the group's requests arriving in the ``W`` control intervals from ``T`` that met both objectives, over the best
rule's (the selector's windowed label, :func:`agents.selector_data.window_goodput`), and the copy's wall time.
A copy runs until every request of the group arriving in the window has finished or failed (or to the
episode's end and its drain), so each window's count is final.

The selector's training labels (:func:`agents.selector_data.selector_targets`) are not this: they give every rule's
state at an interval the row of what each rule's **own** rollout achieved from its own state. Compare the two on a
state where the selector goes wrong to see whether a label measured from the state would have taught otherwise.
Read-only; a diagnostic, not part of any recipe.
"""

from __future__ import annotations

import argparse
import os
import pickle
import time
from pathlib import Path

import numpy as np

from agents.harness import slo_met_arrivals_s
from agents.policy_specs import make_policy
from agents.runs import EnvBound, control_interval, episode_env, running
from env.gym_env import PDClusterEnv, resolve_scenario
from env.sim.records import SimRequest
from env.sim.simulator import ClusterSimulator

RULES = ("dynamo-legacy", "aggregated", "dynamo-isl-bounding", "dynamo-isl-or-load")


def window_met(sim: ClusterSimulator, env: PDClusterEnv, group: str, start_s: float, end_s: float) -> float:
    """Priority-weighted count of ``group``'s requests arriving in ``[start_s, end_s)`` that met both objectives."""
    total = 0.0
    for index, tenant in enumerate(env.tenants):
        if tenant.group != group:
            continue
        arrivals = np.asarray(slo_met_arrivals_s(sim, index))
        total += tenant.priority * float(((arrivals >= start_s) & (arrivals < end_s)).sum())
    return total


def window_settled(env: PDClusterEnv, group: str, start_s: float, end_s: float) -> bool:
    """Whether the window has ended and none of ``group``'s requests arriving in it is still in flight."""
    sim = env.sim
    if sim.now_s < end_s - 1e-9:
        return False
    for index, tenant in enumerate(env.tenants):
        if tenant.group != group:
            continue
        for request in reversed(sim.arrived[index]):  # arrival order: walk back from the newest
            if request.arrival_s < start_s:
                break
            if request.arrival_s < end_s and request.status == SimRequest.IN_FLIGHT:
                return False
    return True


def branch(env: PDClusterEnv, rules: list[str], group: str, window_intervals: int) -> list[tuple[str, float, float]]:
    """Follow each rule from ``env``'s state in its own copy: (rule, window goodput, wall s) per rule."""
    start_s = env.sim.now_s
    interval_s = env.scenario.control_interval_s
    end_s = start_s + window_intervals * interval_s
    snapshot = pickle.dumps((env, [make_policy(f"baseline:{r}", env.scenario) for r in rules]))
    out = []
    for i, rule in enumerate(rules):
        copy_env, copies = pickle.loads(snapshot)  # our own bytes, made just above (never a file)
        began = time.perf_counter()
        while running(copy_env) and not window_settled(copy_env, group, start_s, end_s):
            control_interval(copy_env, copies[i])
        sim = copy_env.sim if running(copy_env) else copy_env.drain()
        out.append((rule, window_met(sim, copy_env, group, start_s, end_s), time.perf_counter() - began))
    return out


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
        rows = branch(env, list(RULES), args.group, args.window_intervals)
        best = max(met for _, met, _ in rows) or 1.0
        cells = " ".join(f"{rule}={met / best:.2f} ({met:.0f}, {wall:.1f} s)" for rule, met, wall in rows)
        print(f"t={env.sim.now_s:.0f} s  {cells}", flush=True)


if __name__ == "__main__":
    main()
