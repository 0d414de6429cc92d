"""Warm start by behaviour cloning: the policy first imitates the best baseline of each training scenario.

PPO from a random initialisation spends most of a short budget un-learning random thresholds and pool moves. The
warm start rolls out *teacher* policies (baselines, rule files) in the training scenarios on training seeds, encodes
each decision with :meth:`policies.action_codec.ActionCodec.encode` (the action the learned policy would have to
take to do the same), and fits the actor to them with the masked log-likelihood before reinforcement learning
begins. Per scenario, the teacher is the candidate with the highest priority-weighted goodput on a training seed,
so the warm-started policy starts at least as good as the best candidate it could express, and PPO improves from
there. Observation statistics of the demonstrations seed the ``VecNormalize`` statistics.

A stronger teacher is the *lookahead expert* (``pretrain.expert: lookahead``): a receding-horizon controller over
the candidate policies. At every control interval it snapshots the simulator (a pickle round trip: the env, its
RNG streams and the candidates' state), follows each candidate closed-loop for ``horizon_intervals`` intervals in
its own copy, and acts as the candidate with the highest summed reward (ties keep the previous choice, so it does
not churn for nothing). With ``prefer_best_alone`` ties go first to the candidate best on its own over the episode
(``best_alone_scope: episode``) or over all training seeds of the scenario (``scenario``), so that states the
horizon cannot tell apart get one consistent label; ``switch_margin_frac`` widens a tie to returns within that
fraction of the best, so the expert leaves its preferred candidate only for a clear gain over the horizon (a pool
move that pays off after minutes looks like a loss over two). Candidates are the teachers plus the best few static
configurations of the grid search on the training seeds. It is a *privileged* expert: its copies see the episode's
future arrivals. The student only sees observations, so it learns what the expert's choices correlate with in the
live metrics (policy switching by rollout; a rollout over base policies is at least as good as the best of them
when the horizon covers their effects). Expert episodes run in parallel processes, one per (scenario, seed).

Pool *targets* (``layout.pool_actions: target``, :mod:`policies.action_codec`) suit imitation better than deltas:
a target labels every interval of a regime with the split it should be at, where a delta labels only the two or
three intervals that make the move.

Imitation alone drifts: the student makes a small mistake, reaches states the expert never visited, and has no
label there (in batch-summarization-8 the expert moves an instance from prefill to decode in two or three of
sixty intervals; a student that misses them stays at the wrong split for the whole episode). With
``dagger_iterations`` (DAgger, Ross et al. 2011) the student then drives episodes while the expert labels every
state it visits, and the student is refitted on all labels so far.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.harness import RunSpec, run_one, weighted_goodput_rps
from agents.lookahead import LookaheadChooser, encoded_action, encoded_step, keep_current
from agents.policy_specs import make_policy, static_policy
from agents.process_map import map_in_processes
from agents.runs import running
from env.gym_env import PDClusterEnv
from policies.base import Policy
from policies.features import ObservationLayout

__all__ = [
    "Demonstrations",
    "ExpertEpisode",
    "LookaheadTask",
    "behaviour_clone",
    "candidate_scores",
    "candidate_scores_many",
    "choose_teachers",
    "collect_demonstrations",
    "collect_lookahead_demonstrations",
    "lookahead_episode",
    "with_candidate_scores",
]


@dataclass(slots=True)
class Demonstrations:
    """Observation vectors (raw), action masks and encoded teacher actions."""

    observations: np.ndarray
    masks: np.ndarray
    actions: np.ndarray
    pool_moves: np.ndarray
    """Per demonstration: whether the action changes a pool (what ``pool_move_weight`` weighs)."""

    def __len__(self) -> int:
        return int(self.observations.shape[0])

    @classmethod
    def from_steps(cls, steps: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, bool]]) -> Demonstrations:
        """Stack (observation, mask, action, moves pools) tuples."""
        if not steps:
            raise ValueError("no demonstrations were recorded")
        observations, masks, actions, moves = zip(*steps, strict=True)
        return cls(
            np.asarray(observations, np.float32),
            np.asarray(masks, bool),
            np.asarray(actions, np.int64),
            np.asarray(moves, bool),
        )

    @classmethod
    def concatenate(cls, parts: Sequence[Demonstrations]) -> Demonstrations:
        """All demonstrations of ``parts``, in order."""
        return cls(
            np.concatenate([p.observations for p in parts]),
            np.concatenate([p.masks for p in parts]),
            np.concatenate([p.actions for p in parts]),
            np.concatenate([p.pool_moves for p in parts]),
        )


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
    steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, bool]] = []
    for path, spec in teachers.items():
        for seed in seeds:
            env = PDClusterEnv(path, layout=layout)
            env.reset(seed=seed)
            teacher = make_policy(spec, env.scenario)
            while env.sim.now_s < env.scenario.duration_s - 1e-9:
                steps.append(_labelled(env, teacher))
                # step with what the learned policy would do, so states match what it will see
                env.step(steps[-1][2])
    return Demonstrations.from_steps(steps)


@dataclass(frozen=True, slots=True)
class LookaheadTask:
    """One expert episode (picklable: it crosses process boundaries)."""

    scenario_path: str
    seed: int
    candidates: tuple[str, ...]
    """Policy specs (``baseline:``, ``file:``, ``learned:``)."""
    grid_points: tuple[Mapping[str, Any], ...]
    """Static configurations (:func:`agents.policy_specs.static_policy`), also candidates."""
    layout: ObservationLayout
    horizon_intervals: int = 12
    score_candidates: bool = True
    """Also run every candidate alone on the same seed (the expert's improvement is then measured)."""
    driver: str | None = None
    """DAgger: a policy spec (``learned:PATH``, the student so far) that acts in the episode while the expert only
    labels the states it visits; ``None``: the expert acts (its own state distribution)."""
    prefer_best_alone: bool = False
    """Ties go first to the candidate best on its own over the episode (needs ``score_candidates``), then to the
    previous choice; ``False``: to the previous choice only."""
    switch_margin_frac: float = 0.0
    """The expert leaves its kept candidate only for one whose horizon return is higher by more than this fraction
    of the best (0: any gain); see :class:`agents.lookahead.LookaheadChooser`."""
    route_switch_margin_frac: float | None = None
    """The margin for a candidate whose copy ends the horizon with the kept candidate's pool sizes (``None``:
    ``switch_margin_frac``); see :class:`agents.lookahead.LookaheadChooser`."""
    alone_scores: Mapping[str, float] | None = None
    """Each candidate's goodput alone on this episode, when already known (:func:`candidate_scores`); skips
    ``score_candidates``' runs."""
    preferred: str | None = None
    """The candidate ties go to first (overrides the episode's best alone), e.g. the best over all training seeds."""


@dataclass(slots=True)
class ExpertEpisode:
    """The demonstrations of one expert episode and how the expert did against its candidates."""

    scenario: str
    seed: int
    demonstrations: Demonstrations
    expert_weighted_goodput_rps: float
    candidate_weighted_goodput_rps: dict[str, float] = field(default_factory=dict)
    chosen_intervals: dict[str, int] = field(default_factory=dict)
    """How many intervals the expert acted as each candidate."""


def _candidates(task: LookaheadTask, env: PDClusterEnv) -> tuple[list[str], list[Policy]]:
    names = list(task.candidates)
    policies = [make_policy(spec, env.scenario) for spec in task.candidates]
    for point in task.grid_points:
        policy = static_policy(point, env.scenario)
        names.append(policy.policy_id)
        policies.append(policy)
    return names, policies


def _labelled(env: PDClusterEnv, policy: Policy) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(observation, mask, encoded decision of ``policy``, whether it moves a pool) at the current interval."""
    action = encoded_action(env, policy)
    moves = env.codec.moves_pools(action, env.groups, env.current_pools())
    return env.observation().to_vector(env.layout), env.action_masks(), action, moves


def _weighted_goodput_rps(env: PDClusterEnv) -> float:
    """Drain the episode and score it as :func:`agents.harness.run_one` does (priority-weighted, both SLOs)."""
    return weighted_goodput_rps(env.drain(), env.tenants, env.scenario.duration_s)


def _scores_alone(task: LookaheadTask, names: Sequence[str]) -> dict[str, float]:
    """Each candidate's weighted goodput when it alone acts for the whole episode (same seed)."""
    alone: dict[str, float] = {}
    for i, name in enumerate(names):
        solo = PDClusterEnv(task.scenario_path, layout=task.layout)
        solo.reset(seed=task.seed)
        policy = _candidates(task, solo)[1][i]
        while running(solo):
            solo.step(encoded_action(solo, policy))
        alone[name] = _weighted_goodput_rps(solo)
    return alone


def candidate_scores(task: LookaheadTask) -> dict[str, float]:
    """Each candidate's weighted goodput when it alone acts for the whole episode of ``task``."""
    env = PDClusterEnv(task.scenario_path, layout=task.layout)
    return _scores_alone(task, _candidates(task, env)[0])


def candidate_scores_many(tasks: Sequence[LookaheadTask], workers: int = 2) -> list[dict[str, float]]:
    """:func:`candidate_scores` for every task (in ``workers`` processes), in order."""
    return map_in_processes(candidate_scores, tasks, workers, spawn=True)


def with_candidate_scores(
    tasks: Sequence[LookaheadTask], cache_path: Path, workers: int, *, by_scenario: bool
) -> list[LookaheadTask]:
    """``tasks`` with each candidate's score alone filled in, computed once per (scenario, seed).

    Scores are cached in ``cache_path`` (JSON), so DAgger rounds reuse them. With ``by_scenario``, every task of
    a scenario prefers the candidate best on average over that scenario's seeds.
    """
    cache: dict[str, dict[str, float]] = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    keys = [f"{task.scenario_path}#{task.seed}" for task in tasks]
    missing = {key: task for task, key in zip(tasks, keys, strict=True) if key not in cache}
    cache.update(zip(missing, candidate_scores_many(list(missing.values()), workers), strict=True))
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    cache_path.write_text(json.dumps(cache, indent=1) + "\n")
    preferred: dict[str, str] = {}
    if by_scenario:
        for path in {task.scenario_path for task in tasks}:
            per_seed = [cache[key] for task, key in zip(tasks, keys, strict=True) if task.scenario_path == path]
            means = {name: float(np.mean([scores[name] for scores in per_seed])) for name in per_seed[0]}
            preferred[path] = max(means, key=means.__getitem__)
    return [
        replace(task, alone_scores=cache[key], preferred=preferred.get(task.scenario_path))
        for task, key in zip(tasks, keys, strict=True)
    ]


def lookahead_episode(task: LookaheadTask) -> ExpertEpisode:
    """Run the lookahead expert through one episode, recording (observation, mask, expert action)."""
    env = PDClusterEnv(task.scenario_path, layout=task.layout)
    env.reset(seed=task.seed)
    names, policies = _candidates(task, env)
    driver = make_policy(task.driver, env.scenario) if task.driver else None
    steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, bool]] = []
    if task.alone_scores is not None:
        alone = dict(task.alone_scores)
    else:
        alone = _scores_alone(task, names) if task.score_candidates else {}
    default: int | None = None
    if task.preferred is not None:
        if task.preferred not in names:
            raise ValueError(f"preferred candidate {task.preferred!r} is not one of {names}")
        default = names.index(task.preferred)
    elif alone and task.prefer_best_alone:
        default = int(np.argmax([alone[name] for name in names]))
    chooser = LookaheadChooser(
        task.horizon_intervals, task.switch_margin_frac, default, route_switch_margin_frac=task.route_switch_margin_frac
    )
    counts: dict[str, int] = {}
    while running(env):
        chosen = chooser.choose(env, policies, encoded_step)
        counts[names[chosen]] = counts.get(names[chosen], 0) + 1
        steps.append(_labelled(env, policies[chosen]))
        keep_current(policies, chosen, env.observation(), env.policy_context())
        env.step(steps[-1][2] if driver is None else encoded_action(env, driver))
    demos = Demonstrations.from_steps(steps)
    expert = _weighted_goodput_rps(env)
    return ExpertEpisode(Path(task.scenario_path).stem, task.seed, demos, expert, alone, counts)


def collect_lookahead_demonstrations(
    tasks: Sequence[LookaheadTask], workers: int = 2
) -> tuple[Demonstrations, list[ExpertEpisode]]:
    """Run :func:`lookahead_episode` for every task (in ``workers`` processes); all demonstrations, and per episode."""
    episodes = map_in_processes(lookahead_episode, tasks, workers, spawn=True)
    return Demonstrations.concatenate([e.demonstrations for e in episodes]), episodes


def behaviour_clone(
    model: object,
    demos: Demonstrations,
    normalise: object,
    *,
    epochs: int = 30,
    batch_size: int = 256,
    learning_rate: float = 1e-3,
    seed: int = 0,
    pool_move_weight: float = 1.0,
) -> list[float]:
    """Fit ``model``'s actor to the demonstrations (masked negative log-likelihood); returns the loss per epoch.

    ``normalise`` maps raw observation vectors to what the network sees (``VecNormalize.normalize_obs``).
    ``pool_move_weight`` weighs demonstrations that move a pool (rare: a few per episode, but they decide the
    split for the rest of it) against those that hold the pools (weight 1; ``demos.pool_moves`` tells them apart).
    """
    policy = model.policy  # type: ignore[attr-defined]
    optimiser = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    obs = torch.as_tensor(normalise(demos.observations), dtype=torch.float32)  # type: ignore[operator]
    actions = torch.as_tensor(demos.actions)
    masks = demos.masks
    generator = np.random.default_rng(seed)
    weights = torch.ones(len(demos), dtype=torch.float32)
    if pool_move_weight != 1.0:
        weights[torch.as_tensor(demos.pool_moves)] = pool_move_weight
    losses: list[float] = []
    policy.set_training_mode(True)
    for _ in range(epochs):
        order = generator.permutation(len(demos))
        total = 0.0
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            _, log_prob, _ = policy.evaluate_actions(obs[idx], actions[idx], action_masks=masks[idx])
            loss = -(weights[idx] * log_prob).sum() / weights[idx].sum()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total += float(loss.detach()) * len(idx)
        losses.append(total / len(demos))
    policy.set_training_mode(False)
    return losses
