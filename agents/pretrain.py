"""Warm start by behaviour cloning: the policy first imitates the best baseline of each training scenario.

PPO from a random initialisation spends most of a short budget un-learning random thresholds and pool moves. The
warm start rolls out *teacher* policies (baselines, rule files) in the training scenarios on training seeds, encodes
each decision with :meth:`policies.action_codec.ActionCodec.encode` (the action the learned policy would have to
take to do the same), and fits the actor to them with the masked log-likelihood before reinforcement learning
begins. Per scenario, the teacher is the candidate with the highest priority-weighted goodput on a training seed,
so the warm-started policy starts at least as good as the best candidate it could express, and PPO improves from
there. Observation statistics of the demonstrations seed the ``VecNormalize`` statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from agents.evaluate import RunSpec, make_policy, run_one
from env.gym_env import PDClusterEnv
from policies.features import ObservationLayout

__all__ = ["Demonstrations", "behaviour_clone", "choose_teachers", "collect_demonstrations"]


@dataclass(slots=True)
class Demonstrations:
    """Observation vectors (raw), action masks and encoded teacher actions."""

    observations: np.ndarray
    masks: np.ndarray
    actions: np.ndarray

    def __len__(self) -> int:
        return int(self.observations.shape[0])


def choose_teachers(scenarios: Sequence[Path], candidates: Sequence[str], seed: int) -> dict[Path, str]:
    """Per scenario, the candidate spec with the highest weighted goodput on training seed ``seed``."""
    chosen: dict[Path, str] = {}
    for path in scenarios:
        scores = []
        for spec in candidates:
            rows = run_one(RunSpec(spec, str(path), seed)).rows
            scores.append(float(next(r for r in rows if r["tenant"] == "ALL")["weighted_goodput_rps"]))
        chosen[path] = candidates[int(np.argmax(scores))]
    return chosen


def collect_demonstrations(
    teachers: dict[Path, str], layout: ObservationLayout, seeds: Sequence[int]
) -> Demonstrations:
    """Roll each scenario's teacher out on ``seeds``, recording (observation, mask, encoded decision)."""
    observations: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    actions: list[np.ndarray] = []
    for path, spec in teachers.items():
        for seed in seeds:
            env = PDClusterEnv(path, layout=layout)
            env.reset(seed=seed)
            teacher = make_policy(spec, env.scenario)
            while env.sim.now_s < env.scenario.duration_s - 1e-9:
                context = env.policy_context()
                decision = teacher.decide(env.observation(), context)
                observations.append(env.observation().to_vector(layout))
                masks.append(env.action_masks())
                encoded = env.codec.encode(
                    decision, env.tenants, env.groups, context.current_pools, context.current_thresholds
                )
                actions.append(_respect_masks(encoded, masks[-1], env.codec.nvec))
                # step with what the learned policy would do, so states match what it will see
                env.step(actions[-1])
    return Demonstrations(np.asarray(observations, np.float32), np.asarray(masks, bool), np.asarray(actions, np.int64))


def _respect_masks(action: np.ndarray, mask: np.ndarray, nvec: np.ndarray) -> np.ndarray:
    """Replace a masked value: pool deltas by "no change" when allowed, anything else by the first allowed."""
    out = action.copy()
    start = 0
    for i, size in enumerate(int(n) for n in nvec):
        allowed = mask[start : start + size]
        if not allowed[out[i]]:
            out[i] = 1 if size == 3 and allowed[1] else int(np.flatnonzero(allowed)[0])
        start += size
    return out


def behaviour_clone(
    model: object,
    demos: Demonstrations,
    normalise: object,
    *,
    epochs: int = 30,
    batch_size: int = 256,
    learning_rate: float = 1e-3,
    seed: int = 0,
) -> list[float]:
    """Fit ``model``'s actor to the demonstrations (masked negative log-likelihood); returns the loss per epoch.

    ``normalise`` maps raw observation vectors to what the network sees (``VecNormalize.normalize_obs``).
    """
    policy = model.policy  # type: ignore[attr-defined]
    optimiser = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    obs = torch.as_tensor(normalise(demos.observations), dtype=torch.float32)  # type: ignore[operator]
    actions = torch.as_tensor(demos.actions)
    masks = demos.masks
    generator = np.random.default_rng(seed)
    losses: list[float] = []
    policy.set_training_mode(True)
    for _ in range(epochs):
        order = generator.permutation(len(demos))
        total = 0.0
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            _, log_prob, _ = policy.evaluate_actions(obs[idx], actions[idx], action_masks=masks[idx])
            loss = -log_prob.mean()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total += float(loss.detach()) * len(idx)
        losses.append(total / len(demos))
    policy.set_training_mode(False)
    return losses
