"""Env speed: 1,000 ``step()`` calls of an 8-GPU scenario, resets included (target: under 30 s on 2 cores).

Run: ``PYTHONHASHSEED=0 python -m pytest benchmarks/env -m benchmark -s -q``.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from harness import figure, write_fragment

from env.gym_env import PDClusterEnv

STEPS = 1000
BLOCK = 100
BUDGET_S = 30.0
COMMAND = "PYTHONHASHSEED=0 python -m pytest benchmarks/env -m benchmark -s -q -p no:randomly"
_FIGURES: list[dict[str, object]] = []


def _run(scenario: str, policy: str) -> tuple[float, int, list[float]]:
    env = PDClusterEnv(scenario)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    env.reset(seed=0)
    resets = 1
    noop = env.codec.noop(env.tenants, env.thresholds)
    blocks: list[float] = []
    block_start = start
    for k in range(STEPS):
        if policy == "random":
            mask = env.action_masks()
            action = []
            offset = 0
            for size in env.codec.nvec:
                allowed = np.flatnonzero(mask[offset : offset + size])
                action.append(int(rng.choice(allowed)))
                offset += int(size)
            a = np.asarray(action, dtype=np.int64)
        else:
            a = noop
        _, _, terminated, truncated, _ = env.step(a)
        if terminated or truncated:
            env.reset(seed=resets)
            resets += 1
        if (k + 1) % BLOCK == 0:
            now = time.perf_counter()
            blocks.append(BLOCK / (now - block_start))
            block_start = now
    return time.perf_counter() - start, resets, blocks


@pytest.mark.benchmark
@pytest.mark.parametrize("policy", ["noop", "random"])
@pytest.mark.parametrize("scenario", ["rag-surge-8", "chatbot-8", "mixed-chat-rag-4p4d"])
def test_thousand_steps(scenario: str, policy: str) -> None:
    wall_s, resets, blocks = _run(scenario, policy)
    rate = STEPS / wall_s
    _FIGURES.append(
        figure("env steps per second", f"{scenario}, {policy} actions (resets included)", "steps/s", blocks,
               repeat=f"block of {BLOCK} steps", target="1,000 steps < 30 s (> 33 steps/s)")
    )  # fmt: skip
    write_fragment(
        "env",
        "Gym env (PDClusterEnv) steps per second",
        COMMAND,
        _FIGURES,
        notes="One step = one control interval of the simulator (guard, observation, reward included); see "
        "`benchmarks/env/RESULTS.md`.",
    )
    print(f"\n{scenario} ({policy} actions): {STEPS} steps, {resets} resets in {wall_s:.2f} s ({rate:.0f} steps/s)")
    if scenario != "mixed-chat-rag-4p4d":
        assert wall_s < BUDGET_S
