"""Demonstrations for the set policy's warm start: a teacher policy's decisions in the set policy's action space.

:func:`set_demo_episode` runs one scenario and seed through the one episode loop (:func:`agents.runs.run_episode`)
with a labelling policy in control: at every interval it asks the *teacher* (any policy spec; ``mpc:H``, the
model-predictive controller that does not look ahead, is the one worth imitating) what it would do, records

* the set observation the set policy would see (:func:`policies.set_features.build_set_observation`, padded to the
  layout),
* the action masks it would act under (:meth:`policies.set_codec.SetActionCodec.masks`),
* the teacher's decision encoded in the set action space (:meth:`~policies.set_codec.SetActionCodec.encode`: the
  sign of each group's prefill change, the nearest route levels per tenant), a masked value replaced by holding,

and then acts as the teacher, or as the *driver* when one is given (DAgger: the student drives, the teacher labels
the states the student reaches). The teacher is asked every interval either way, so a stateful teacher keeps its
own history.

:func:`collect_set_demonstrations` runs many tasks in worker processes. The demonstrations have the same type as
the slot policy's (:class:`agents.pretrain.Demonstrations`), so :func:`agents.pretrain.behaviour_clone` fits them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from agents.harness import RunSpec, run_one, weighted_goodput_rps
from agents.lookahead import respect_masks
from agents.policy_specs import make_policy
from agents.pretrain import Demonstrations
from agents.runs import EnvBound, episode_env, run_episode
from env.gym_env import PDClusterEnv, resolve_scenario
from policies.base import Policy, PolicyContext
from policies.features import Observation
from policies.schema import ControlAction
from policies.set_codec import HOLD, SetActionCodec
from policies.set_features import SetLayout, build_set_observation

__all__ = [
    "SetDemoEpisode",
    "SetDemoTask",
    "TeacherChoice",
    "best_teacher_per_scenario",
    "collect_set_demonstrations",
    "set_demo_episode",
]


@dataclass(frozen=True, slots=True)
class SetDemoTask:
    """One labelled episode: ``teacher`` labels every interval of ``scenario_path`` on ``seed``.

    ``driver`` (a policy spec) acts instead of the teacher when given (a DAgger round).
    """

    scenario_path: str
    seed: int
    teacher: str
    layout: SetLayout
    driver: str | None = None


@dataclass(slots=True)
class SetDemoEpisode:
    """What one task gave: its demonstrations, the acting policy's weighted goodput and the teacher's time."""

    scenario: str
    seed: int
    demonstrations: Demonstrations
    weighted_goodput_rps: float
    teacher_s_per_interval: float


class _Labeller:
    """Acts as the driver (else the teacher) and records the teacher's encoded decision at every interval."""

    def __init__(self, teacher: Policy, driver: Policy | None, layout: SetLayout) -> None:
        self._teacher = teacher
        self._driver = driver
        self._layout = layout
        self._codec = SetActionCodec(layout)
        self._hold = np.zeros(len(self._codec.nvec), dtype=np.int64)
        self._hold[: layout.max_groups] = HOLD  # masked pool moves hold; a masked tenant level takes the first allowed
        self.steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, bool]] = []
        self.teacher_s = 0.0

    @property
    def policy_id(self) -> str:
        """The acting policy's id."""
        return (self._driver or self._teacher).policy_id

    def bind(self, env: PDClusterEnv) -> None:
        """Bind the teacher and the driver when they act in the simulator (``mpc:H``)."""
        for policy in (self._teacher, self._driver):
            if isinstance(policy, EnvBound):
                policy.bind(env)

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """The acting policy's decision; the teacher's is recorded (module docstring)."""
        start_s = time.perf_counter()
        label = self._teacher.decide(observation, context)
        self.teacher_s += time.perf_counter() - start_s
        vector = build_set_observation(observation.window, context.observation_context()).to_vector(self._layout)
        mask = self._codec.masks(context.groups, context.current_pools, len(context.tenants))
        action = self._codec.encode(
            label, context.tenants, context.groups, context.current_pools, context.current_thresholds
        )
        action = respect_masks(action, mask, self._codec.nvec, self._hold)
        moves_pool = bool(np.any(action[: self._layout.max_groups] != HOLD))
        self.steps.append((vector, mask, action, moves_pool))
        return label if self._driver is None else self._driver.decide(observation, context)


def set_demo_episode(task: SetDemoTask) -> SetDemoEpisode:
    """Run one labelled episode (module docstring)."""
    scenario = resolve_scenario(task.scenario_path)
    task.layout.check_fits(len(scenario.tenant_groups), len(scenario.tenants))
    teacher = make_policy(task.teacher, scenario)
    driver = None if task.driver is None else make_policy(task.driver, scenario)
    labeller = _Labeller(teacher, driver, task.layout)
    env = episode_env(scenario, labeller)
    sim = run_episode(env, labeller, task.seed).sim
    steps = max(len(labeller.steps), 1)
    return SetDemoEpisode(
        scenario=scenario.name,
        seed=task.seed,
        demonstrations=Demonstrations.from_steps(labeller.steps),
        weighted_goodput_rps=weighted_goodput_rps(sim, env.tenants, scenario.duration_s),
        teacher_s_per_interval=labeller.teacher_s / steps,
    )


def collect_set_demonstrations(
    tasks: Sequence[SetDemoTask], workers: int = 2
) -> tuple[Demonstrations, list[SetDemoEpisode]]:
    """Run every task (in ``workers`` processes when more than one); all demonstrations, and per episode."""
    if workers > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            episodes = list(pool.map(set_demo_episode, tasks))
    else:
        episodes = [set_demo_episode(task) for task in tasks]
    return Demonstrations.concatenate([e.demonstrations for e in episodes]), episodes


@dataclass(frozen=True, slots=True)
class TeacherChoice:
    """The teacher chosen for one training scenario, and every candidate's weighted goodput there."""

    scenario_path: str
    teacher: str
    weighted_goodput_rps: dict[str, float]


def _candidate_score(spec: RunSpec) -> float:
    rows = run_one(spec).rows
    return float(next(r for r in rows if r["tenant"] == "ALL")["weighted_goodput_rps"])


def best_teacher_per_scenario(
    scenario_paths: Sequence[str], teachers: Sequence[str], seed: int, workers: int = 2
) -> list[TeacherChoice]:
    """Per training scenario, the teacher with the highest weighted goodput over the whole episode on ``seed``.

    The choice is made in hindsight (the teacher that turned out best on that scenario), which is fine for labels
    only: the student sees the observations, never the choice, and must learn which behaviour the situation calls
    for. Ties go to the earlier teacher in ``teachers``.
    """
    specs = [RunSpec(teacher, path, seed) for path in scenario_paths for teacher in teachers]
    if workers > 1 and len(specs) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            scores = list(pool.map(_candidate_score, specs))
    else:
        scores = [_candidate_score(spec) for spec in specs]
    choices = []
    for index, path in enumerate(scenario_paths):
        row = scores[index * len(teachers) : (index + 1) * len(teachers)]
        choices.append(TeacherChoice(path, teachers[int(np.argmax(row))], dict(zip(teachers, row, strict=True))))
    return choices
