"""The behaviour-cloning warm start before PPO (step 2b of :mod:`agents.train`).

Three sources of labels (``pretrain.expert``):

* ``best_teacher`` — the best of the teacher rules per training scenario (:func:`agents.pretrain.choose_teachers`);
* ``lookahead`` — the clairvoyant lookahead expert over the teachers and the best static grid points
  (:mod:`agents.lookahead`, slot layouts): it may label, it never ships;
* ``policy`` — teacher policy specs (``layout.kind: set``) on the first ``family_scenarios`` scenarios of the
  family's training split (:mod:`agents.set_imitation`): one teacher labels every scenario (``mpc:H``, the
  model-predictive controller that does not look ahead, or one rule); with several, each scenario's best teacher
  over its episode labels it (a hindsight choice, allowed for labels only).

Labels, losses and the teachers' own goodput go to MLflow and to files in the output folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
from sb3_contrib import MaskablePPO
from stable_baselines3.common.vec_env import VecNormalize

from agents.config import ExperimentConfig
from agents.evaluate import scenario_paths
from agents.grid_search import best_points
from agents.pretrain import (
    Demonstrations,
    LookaheadTask,
    behaviour_clone,
    choose_teachers,
    collect_demonstrations,
    collect_lookahead_demonstrations,
    with_candidate_scores,
)
from agents.set_imitation import SetDemoTask, best_teacher_per_scenario, collect_set_demonstrations
from agents.set_training import family_split_paths
from policies.features import ObservationLayout

__all__ = ["warm_start"]


def warm_start(
    model: MaskablePPO,
    venv: VecNormalize,
    config: ExperimentConfig,
    layout: ObservationLayout,
    out: Path,
    export: Callable[[Path], Path],
) -> None:
    """Behaviour cloning before PPO (see :mod:`agents.pretrain`); teachers, labels and losses go to MLflow.

    The labels come from the best teacher per scenario, from the lookahead expert, or (set layout) from one teacher
    policy on the family's training scenarios; with an expert, each of ``dagger_iterations`` rounds then lets the
    student drive (``export`` writes it to a folder), has the expert label the states it reaches, and refits on all
    labels so far.
    """
    pretrain = config.pretrain
    assert pretrain is not None
    if pretrain.expert == "policy":
        demos = _set_demonstrations(config, out, round_index=0, driver=None)
    elif pretrain.expert == "lookahead":
        demos = _lookahead_demonstrations(config, layout, out, round_index=0, driver=None)
    else:
        teachers = choose_teachers(scenario_paths(config.scenarios), pretrain.teachers, pretrain.seeds[0])
        mlflow.log_dict({str(k.stem): v for k, v in teachers.items()}, "pretrain_teachers.json")
        demos = collect_demonstrations(teachers, layout, pretrain.seeds)
    fresh = demos.observations
    for round_index in range(pretrain.dagger_iterations + 1):
        if config.normalize_observations:
            venv.obs_rms.update(fresh)
        losses = behaviour_clone(
            model,
            demos,
            venv.normalize_obs,
            epochs=pretrain.epochs,
            learning_rate=pretrain.learning_rate,
            seed=config.seed + round_index,
            pool_move_weight=pretrain.pool_move_weight,
        )
        name = "pretrain/nll" if round_index == 0 else f"pretrain/nll_round{round_index}"
        for epoch, loss in enumerate(losses):
            mlflow.log_metric(name, loss, step=epoch)
        mlflow.log_metric("pretrain/demonstrations", len(demos), step=round_index)
        if round_index == pretrain.dagger_iterations:
            break
        student = export(out / f"dagger-{round_index}")
        if pretrain.expert == "policy":
            extra = _set_demonstrations(config, out, round_index=round_index + 1, driver=f"learned:{student}")
        else:
            extra = _lookahead_demonstrations(
                config, layout, out, round_index=round_index + 1, driver=f"learned:{student}"
            )
        fresh = extra.observations
        demos = Demonstrations.concatenate([demos, extra])


def _lookahead_demonstrations(
    config: ExperimentConfig, layout: ObservationLayout, out: Path, *, round_index: int, driver: str | None
) -> Demonstrations:
    """Lookahead-expert labels on every training scenario and pretrain seed (``driver`` acts when given; DAgger)."""
    assert config.pretrain is not None
    pretrain = config.pretrain
    workers = pretrain.workers or os.cpu_count() or 1
    tasks: list[LookaheadTask] = []
    for path in scenario_paths(config.scenarios):
        points: list[dict[str, Any]] = []
        if pretrain.grid_candidates > 0:  # searched on the training seeds (cached); never on evaluation seeds
            points = best_points(path, pretrain.grid_candidates)
        tasks.extend(
            LookaheadTask(
                str(path),
                seed,
                tuple(pretrain.teachers),
                tuple(points),
                layout,
                pretrain.horizon_intervals,
                score_candidates=driver is None or pretrain.prefer_best_alone,
                driver=driver,
                prefer_best_alone=pretrain.prefer_best_alone,
                switch_margin_frac=pretrain.switch_margin_frac,
                route_switch_margin_frac=pretrain.route_switch_margin_frac,
            )
            for seed in pretrain.seeds
        )
    if pretrain.prefer_best_alone:
        scope = pretrain.best_alone_scope == "scenario"
        tasks = with_candidate_scores(tasks, out / "pretrain_candidate_scores.json", workers, by_scenario=scope)
    demos, episodes = collect_lookahead_demonstrations(tasks, workers=workers)
    if driver is not None:  # a DAgger round: the episode's goodput is the student's own
        scores = [e.expert_weighted_goodput_rps for e in episodes]
        mlflow.log_metric("pretrain/student_weighted_goodput_rps", float(np.mean(scores)), step=round_index)
        summary: dict[str, Any] = {
            "round": round_index,
            "driver": driver,
            "episodes": [
                {"scenario": e.scenario, "seed": e.seed, "student_weighted_goodput_rps": e.expert_weighted_goodput_rps}
                for e in episodes
            ],
        }
        (out / f"pretrain_dagger_round{round_index}.json").write_text(json.dumps(summary, indent=1) + "\n")
        mlflow.log_dict(summary, f"pretrain_dagger_round{round_index}.json")
        return demos
    report = [
        {
            "scenario": e.scenario,
            "seed": e.seed,
            "expert_weighted_goodput_rps": e.expert_weighted_goodput_rps,
            "best_candidate": max(e.candidate_weighted_goodput_rps, key=e.candidate_weighted_goodput_rps.__getitem__),
            "best_candidate_weighted_goodput_rps": max(e.candidate_weighted_goodput_rps.values()),
            "candidates": e.candidate_weighted_goodput_rps,
            "chosen_intervals": e.chosen_intervals,
        }
        for e in episodes
    ]
    summary = {"horizon_intervals": pretrain.horizon_intervals, "episodes": report}
    (out / "pretrain_expert.json").write_text(json.dumps(summary, indent=1) + "\n")
    mlflow.log_dict(summary, "pretrain_expert.json")
    gains = [
        e.expert_weighted_goodput_rps / max(max(e.candidate_weighted_goodput_rps.values()), 1e-9) for e in episodes
    ]
    mlflow.log_metric("pretrain/expert_over_best_candidate", float(np.mean(gains)))
    return demos


def _set_demonstrations(config: ExperimentConfig, out: Path, *, round_index: int, driver: str | None) -> Demonstrations:
    """Teacher labels on the family's first training scenarios and every pretrain seed.

    With one teacher it labels every scenario; with several, each scenario's best teacher over its whole episode on
    the first pretrain seed does (chosen once, in hindsight: it labels, it never acts at evaluation), so the student
    learns which rule's behaviour each situation calls for.
    """
    assert config.pretrain is not None
    pretrain = config.pretrain
    workers = pretrain.workers or os.cpu_count() or 1
    layout = config.layout.to_set_layout()
    paths = [str(p) for p in family_split_paths(config, out / "pretrain-scenarios", "train", pretrain.family_scenarios)]
    teacher_of = _scenario_teachers(paths, pretrain.teachers, pretrain.seeds[0], workers, out)
    tasks = [SetDemoTask(path, seed, teacher_of[path], layout, driver) for path in paths for seed in pretrain.seeds]
    demos, episodes = collect_set_demonstrations(tasks, workers=workers)
    summary: dict[str, Any] = {
        "round": round_index,
        "teachers": pretrain.teachers,
        "driver": driver,
        "episodes": [
            {
                "scenario": e.scenario,
                "seed": e.seed,
                "teacher": task.teacher,
                "weighted_goodput_rps": e.weighted_goodput_rps,
                "teacher_s_per_interval": e.teacher_s_per_interval,
            }
            for task, e in zip(tasks, episodes, strict=True)
        ],
    }
    name = f"pretrain_set_round{round_index}.json"
    (out / name).write_text(json.dumps(summary, indent=1) + "\n")
    mlflow.log_dict(summary, name)
    key = "pretrain/teacher_weighted_goodput_rps" if driver is None else "pretrain/student_weighted_goodput_rps"
    mlflow.log_metric(key, float(np.mean([e.weighted_goodput_rps for e in episodes])), step=round_index)
    return demos


def _scenario_teachers(paths: list[str], teachers: list[str], seed: int, workers: int, out: Path) -> dict[str, str]:
    """Each scenario's teacher: the only one, or the best per scenario (computed once, kept in the output folder)."""
    if len(teachers) == 1:
        return dict.fromkeys(paths, teachers[0])
    cache = out / "pretrain_set_teachers.json"
    if cache.exists():
        return {row["scenario_path"]: row["teacher"] for row in json.loads(cache.read_text())}
    choices = best_teacher_per_scenario(paths, teachers, seed, workers)
    rows = [asdict(choice) for choice in choices]
    cache.write_text(json.dumps(rows, indent=1) + "\n")
    mlflow.log_dict({"seed": seed, "scenarios": rows}, "pretrain_set_teachers.json")
    return {choice.scenario_path: choice.teacher for choice in choices}
