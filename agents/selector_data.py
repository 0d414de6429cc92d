"""Training data of the rule selector: every candidate rule run on every training scenario, group by group.

:func:`rule_rollout` runs one scenario and seed under one rule through the one episode loop
(:func:`agents.runs.run_episode`) and records, at every interval, each tenant group's selector input
(:func:`policies.rule_selector.group_features`, the rows the selector would read) and, once the run is drained,
each group's priority-weighted goodput (:func:`agents.harness.slo_met`, the scoring of :mod:`policies.scoring`).

Every rule runs every scenario, so the inputs cover the states each candidate leads to (the selector may run any
of them), and each group's label is known for every rule: :func:`selector_targets` turns the goodputs of a group
into a distribution over the rules (the best rule in hindsight, softened so that near-ties share the mass and a
rule far below the best gets almost none). The hindsight choice labels data only; the selector decides from the
window it sees.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agents.harness import slo_met
from agents.policy_specs import make_policy
from agents.runs import episode_env, run_episode
from env.gym_env import resolve_scenario
from policies.base import Policy, PolicyContext
from policies.features import Observation
from policies.rule_selector import GROUP_INPUT_WIDTH, group_features
from policies.schema import ControlAction
from policies.set_features import build_set_observation

__all__ = [
    "GroupRollout",
    "RolloutTask",
    "SelectorDataset",
    "collect_rollouts",
    "rule_rollout",
    "selector_targets",
]


@dataclass(frozen=True, slots=True)
class RolloutTask:
    """One scenario and seed under one rule (picklable: it crosses process boundaries)."""

    scenario_path: str
    rule: str
    """A baseline name (``dynamo-legacy``), run as ``baseline:NAME``."""
    seed: int
    traces_dir: str | None = None


@dataclass(frozen=True, slots=True)
class GroupRollout:
    """One tenant group of one rollout: its inputs at every interval and its goodput over the episode."""

    scenario: str
    seed: int
    group: str
    rule: str
    inputs: np.ndarray
    """``[intervals, GROUP_INPUT_WIDTH]``."""
    weighted_goodput_rps: float
    offered_weighted_rps: float
    wall_s: float


class _Recorder:
    """A policy that records the group inputs of every interval and decides as the wrapped rule."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.inputs: list[np.ndarray] = []

    @property
    def policy_id(self) -> str:
        """The wrapped rule's id."""
        return self.inner.policy_id

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """Record the inputs, then decide as the rule."""
        grouped = context.grouped()
        self.inputs.append(group_features(build_set_observation(observation.window, grouped.observation_context())))
        return self.inner.decide(observation, context)


def rule_rollout(task: RolloutTask) -> list[GroupRollout]:
    """Run ``task`` and return one :class:`GroupRollout` per tenant group (module docstring)."""
    start = time.perf_counter()
    scenario = resolve_scenario(Path(task.scenario_path), task.traces_dir)
    recorder = _Recorder(make_policy(f"baseline:{task.rule}", scenario))
    env = episode_env(scenario, recorder.inner, task.traces_dir)
    sim = run_episode(env, recorder, task.seed).sim
    duration_s = scenario.duration_s
    inputs = np.stack(recorder.inputs) if recorder.inputs else np.zeros((0, len(env.groups), GROUP_INPUT_WIDTH))
    wall_s = time.perf_counter() - start
    out = []
    for gi, group in enumerate(env.groups):
        members = [(ti, t) for ti, t in enumerate(env.tenants) if t.group == group.name]
        out.append(
            GroupRollout(
                scenario=scenario.name,
                seed=task.seed,
                group=group.name,
                rule=task.rule,
                inputs=inputs[:, gi, :].astype(np.float32),
                weighted_goodput_rps=sum(t.priority * slo_met(sim, ti) for ti, t in members) / duration_s,
                offered_weighted_rps=sum(t.priority * len(sim.arrived[ti]) for ti, t in members) / duration_s,
                wall_s=wall_s,
            )
        )
    return out


def collect_rollouts(
    tasks: Sequence[RolloutTask], workers: int, on_done: Callable[[int, int], None] | None = None
) -> list[GroupRollout]:
    """Run ``tasks`` over ``workers`` processes; the rollouts in task order. ``on_done(done, total)`` reports."""
    results: list[list[GroupRollout]] = [[] for _ in tasks]
    if workers <= 1:
        for i, task in enumerate(tasks):
            results[i] = rule_rollout(task)
            if on_done is not None:
                on_done(i + 1, len(tasks))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(rule_rollout, task): i for i, task in enumerate(tasks)}
            for done, future in enumerate(as_completed(futures), start=1):
                results[futures[future]] = future.result()
                if on_done is not None:
                    on_done(done, len(tasks))
    return [r for per_task in results for r in per_task]


@dataclass(frozen=True, slots=True)
class SelectorDataset:
    """Inputs, soft rule targets and sample weights (each group of each scenario weighs 1 in all)."""

    inputs: np.ndarray
    """``[samples, GROUP_INPUT_WIDTH]``."""
    targets: np.ndarray
    """``[samples, rules]``, rows sum to 1."""
    ratios: np.ndarray
    """``[samples, rules]``: each rule's goodput over the best rule's, for the sample's group (in [0, 1])."""
    weights: np.ndarray
    """``[samples]``."""
    groups: int
    """Labelled (scenario, seed, group) triples."""
    best_counts: dict[str, int]
    """How many of them each rule is best on."""


def selector_targets(
    rollouts: Sequence[GroupRollout], rules: Sequence[str], temperature_frac: float
) -> SelectorDataset:
    """Soft targets per labelled group: ``softmax((goodput / best − 1) / temperature_frac)`` over ``rules``.

    A group whose every rule has zero goodput (nothing could meet its objectives) teaches nothing and is left
    out. Each group's samples are all its rollouts' intervals (under every rule), weighted to 1 in all.

    Raises:
        ValueError: a group lacks a rollout of some rule, or ``temperature_frac`` is not positive.
    """
    if temperature_frac <= 0:
        raise ValueError(f"temperature_frac must be > 0, got {temperature_frac}")
    by_group: dict[tuple[str, int, str], dict[str, GroupRollout]] = {}
    for rollout in rollouts:
        by_group.setdefault((rollout.scenario, rollout.seed, rollout.group), {})[rollout.rule] = rollout
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    rs: list[np.ndarray] = []
    ws: list[np.ndarray] = []
    best_counts = dict.fromkeys(rules, 0)
    labelled = 0
    for key, per_rule in sorted(by_group.items()):
        missing = [r for r in rules if r not in per_rule]
        if missing:
            raise ValueError(f"scenario {key[0]} seed {key[1]} group {key[2]}: no rollout of rule {missing[0]}")
        goodput = np.array([per_rule[r].weighted_goodput_rps for r in rules], dtype=np.float64)
        best = float(goodput.max())
        if best <= 0:
            continue
        logits = (goodput / best - 1.0) / temperature_frac
        target = np.exp(logits - logits.max())
        target /= target.sum()
        inputs = np.concatenate([per_rule[r].inputs for r in rules])
        if len(inputs) == 0:
            continue
        labelled += 1
        best_counts[rules[int(np.argmax(goodput))]] += 1
        xs.append(inputs)
        ys.append(np.repeat(target[None, :], len(inputs), axis=0))
        rs.append(np.repeat((goodput / best)[None, :], len(inputs), axis=0))
        ws.append(np.full(len(inputs), 1.0 / len(inputs)))
    if not xs:
        raise ValueError("no labelled group: every rollout had zero goodput")
    weights = np.concatenate(ws)
    return SelectorDataset(
        inputs=np.concatenate(xs).astype(np.float32),
        targets=np.concatenate(ys).astype(np.float32),
        ratios=np.concatenate(rs).astype(np.float32),
        weights=(weights * len(weights) / max(math.fsum(weights), 1e-12)).astype(np.float32),
        groups=labelled,
        best_counts=best_counts,
    )
