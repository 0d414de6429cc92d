"""Trace a rule selector through one scenario: per control interval, each group's rule and predicted goodput ratios.

Usage: python experiments/trace_selector.py SCENARIO.yaml [--policy SPEC] [--seed N] [--rate-scale X] [--traces DIR]

SPEC is any spec whose policy is, or wraps, a rule selector (default ``learned:default``). Each line is the
simulated time (s), the rule acting in each group, the network's predicted goodput ratio per rule (the manifest's
rule order, sigmoid of the scores) and the interval's reward; the last four lines are the run's priority-weighted
goodput, the figure ``pdctl evaluate`` reports, its fraction of requests meeting both SLOs (what ``--sweep-rate``
holds at 0.9), how many group-intervals each rule acted in, and every change of a group's rule with its time.
``--rate-scale`` multiplies every tenant's request rate, as a rate sweep's probe does. Read-only: the selector
decides exactly as it does in ``pdctl evaluate``.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from pathlib import Path

import numpy as np

from agents.harness import slo_met, weighted_goodput_rps
from agents.policy_specs import make_policy
from agents.runs import episode_env, run_episode, scale_rates
from agents.selector_branch import find_selector
from env.gym_env import ControlStep, PDClusterEnv, resolve_scenario


def main() -> None:
    """Parse the arguments, run the scenario once and print the trace."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("--policy", default="learned:default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate-scale", type=float, default=1.0, help="every tenant's request rate times this")
    parser.add_argument("--traces", type=Path, default=Path(os.environ.get("PDCTL_TRACES", "data/traces")))
    args = parser.parse_args()
    if not args.rate_scale > 0:
        raise SystemExit(f"--rate-scale: {args.rate_scale} is not a positive multiplier")
    scenario = scale_rates(resolve_scenario(args.scenario, args.traces), args.rate_scale)
    policy = make_policy(args.policy, scenario, None, ())
    try:
        selector = find_selector(policy)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    scores = selector.network.scores
    last: dict[str, np.ndarray] = {}

    def recorded(inputs: np.ndarray) -> np.ndarray:
        out = scores(inputs)
        last["ratio"] = 1.0 / (1.0 + np.exp(-out.astype(np.float64)))
        return out

    object.__setattr__(selector.network, "scores", recorded)  # frozen dataclass: observe, do not change
    env = episode_env(scenario, policy, args.traces)
    print("# rules:", ", ".join(selector.manifest.rules))
    acted: Counter[str] = Counter()
    acting: dict[str, str] = {}
    changes: list[str] = []

    def on_interval(env: PDClusterEnv, step: ControlStep) -> None:
        chosen = selector.chosen_rules()
        acted.update(chosen.values())
        for group, rule in chosen.items():
            if group in acting and acting[group] != rule:
                changes.append(f"{env.sim.now_s:.0f} s {group}: {acting[group]} -> {rule}")
            acting[group] = rule
        ratios = " ".join("[" + ",".join(f"{v:.2f}" for v in row) + "]" for row in last.get("ratio", []))
        print(f"{env.sim.now_s:7.0f}s {chosen} {ratios} reward={step.reward:.2f}")

    sim = run_episode(env, policy, args.seed, on_interval).sim
    met = sum(slo_met(sim, ti) for ti in range(len(env.tenants)))
    arrived = sum(len(per) for per in sim.arrived)
    print(f"weighted goodput {weighted_goodput_rps(sim, env.tenants, env.scenario.duration_s):.4f} rps")
    print(f"requests meeting both SLOs {met}/{arrived} = {met / max(arrived, 1):.3f}")
    print("group-intervals per rule: " + ", ".join(f"{rule}={acted[rule]}" for rule in selector.manifest.rules))
    print("rule changes: " + ("; ".join(changes) if changes else "none"))


if __name__ == "__main__":
    main()
