"""What restarting the controller costs, with its control state kept (its memory file) or lost.

Each policy runs with the controller restarted every N seconds, against the same run without restarts.

Usage: python experiments/restart_cost.py [--scenarios SPECS] [--policies SPECS] [--seeds 1000,1001]
       [--restart-every-s 600] [--traces DIR] [--out FILE.md]

A restart is what a new controller process does (:meth:`env.gym_env.PDClusterEnv.restart_control`): a fresh policy,
and the control state either read back as :meth:`policies.control.ControlState.after_restart` keeps it, with the
policy's own memory handed over when it has one (:class:`policies.base.RemembersState`; ``kept``), or started again
from the base file (``lost``: a controller without ``control_memory_file``); the simulated cluster runs on. Each row
is one scenario and policy, its priority-weighted goodput averaged over the seeds; the ratios are against the same
seeds without restarts. Deterministic for given arguments.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from pathlib import Path

from agents.evaluate import scenario_paths
from agents.harness import weighted_goodput_rps
from agents.policy_specs import make_policy
from agents.runs import episode_env, run_episode
from env.gym_env import ControlStep, PDClusterEnv, resolve_scenario
from policies.base import Policy, PolicyContext
from policies.features import Observation
from policies.registry import hand_over_memory
from policies.schema import ControlAction

MODES = ("none", "kept", "lost")


class _Restarting:
    """Delegates to a policy that a restart replaces with a fresh one (the policy id stays the same)."""

    def __init__(self, make: Callable[[], Policy]) -> None:
        self.make = make
        self.inner = make()

    @property
    def policy_id(self) -> str:
        return self.inner.policy_id

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        return self.inner.decide(observation, context)


def run(scenario_path: Path, spec: str, seed: int, mode: str, every_s: float, traces: Path) -> tuple[float, int]:
    """One episode: its weighted goodput (req/s) and the number of restarts."""
    scenario = resolve_scenario(scenario_path, traces)
    policy = _Restarting(lambda: make_policy(spec, scenario, None, ()))
    env = episode_env(scenario, policy.inner, traces)
    restarts = 0
    next_s = every_s

    def on_interval(env: PDClusterEnv, step: ControlStep) -> None:
        nonlocal next_s, restarts
        del step
        if mode != "none" and env.sim.now_s >= next_s:
            env.restart_control(keep_memory=mode == "kept")
            old, policy.inner = policy.inner, policy.make()
            if mode == "kept":
                hand_over_memory(old, policy.inner)
            next_s += every_s
            restarts += 1

    sim = run_episode(env, policy, seed, on_interval).sim
    return weighted_goodput_rps(sim, env.tenants, scenario.duration_s), restarts


def main() -> None:
    """Parse the arguments, run every scenario × policy × seed × mode, print (and write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="suite:dynamic")
    parser.add_argument("--policies", default="learned:default,baseline:queue_kv")
    parser.add_argument("--seeds", default="1000,1001")
    parser.add_argument("--restart-every-s", type=float, default=600.0)
    parser.add_argument("--traces", type=Path, default=Path(os.environ.get("PDCTL_TRACES", "data/traces")))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not args.restart_every_s > 0:
        raise SystemExit(f"--restart-every-s: {args.restart_every_s} is not a positive number of seconds")
    seeds = [int(s) for s in args.seeds.split(",")]
    command = (
        f"PYTHONHASHSEED=0 python experiments/restart_cost.py --scenarios {args.scenarios} --policies {args.policies} "
        f"--seeds {args.seeds} --restart-every-s {args.restart_every_s:g}"
    )
    lines = [
        f"Command: `{command}` (PDCTL_TRACES: the trace folder). Priority-weighted goodput (req/s), mean over the "
        "seeds; in brackets the ratio to no restart.",
        "",
        f"| scenario | policy | goodput, no restart | restart every {args.restart_every_s:g} s: memory kept | "
        "memory lost | restarts per run |",
        "|---|---|---:|---:|---:|---:|",
    ]
    ratios: dict[str, list[float]] = {"kept": [], "lost": []}
    for path in scenario_paths(args.scenarios.split(",")):
        for spec in args.policies.split(","):
            goodput: dict[str, float] = {}
            restarts = 0
            for mode in MODES:
                runs = [run(path, spec, seed, mode, args.restart_every_s, args.traces) for seed in seeds]
                goodput[mode] = statistics.fmean(g for g, _ in runs)
                restarts = max(restarts, max(r for _, r in runs))
            none = goodput["none"]
            cells = []
            for mode in ("kept", "lost"):
                ratio = goodput[mode] / none if none > 0 else float("nan")
                if none > 0:
                    ratios[mode].append(ratio)
                cells.append(f"{goodput[mode]:.3f} ({ratio:.3f}×)")
            lines.append(f"| {path.stem} | `{spec}` | {none:.3f} | {cells[0]} | {cells[1]} | {restarts} |")
            print(lines[-1], flush=True)
    geo = {m: statistics.geometric_mean(r) if r and min(r) > 0 else float("nan") for m, r in ratios.items()}
    lines.append("")
    lines.append(f"Geometric mean against no restart: memory kept {geo['kept']:.3f}×, memory lost {geo['lost']:.3f}×.")
    text = "\n".join(lines) + "\n"
    print(lines[-1])
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
