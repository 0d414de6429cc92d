"""The set-policy parts of the training recipe (``layout.kind: set``), called by :mod:`agents.train`.

* :func:`set_env_factories` — training envs: :class:`env.set_env.SetPolicyEnv` drawing a fresh generated
  scenario per episode from the family's training split (or one of the listed scenarios);
* :func:`set_policy_args` — the ``MaskablePPO`` policy class and keyword arguments
  (:class:`agents.set_policy_net.SetActorCriticPolicy`);
* :func:`held_out_paths` / :func:`family_validation_paths` — the validation split's first scenarios, written as
  scenario files so the evaluation loop judges checkpoints on them exactly as on any scenario (the test split is
  never generated here); :func:`family_split_paths` writes any split's first scenarios (the warm start labels the
  training split's);
* :func:`export_set` — the artifact (:func:`agents.set_export.export_set_policy`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
from stable_baselines3.common.monitor import Monitor

from agents.config import ExperimentConfig
from agents.evaluate import scenario_paths
from agents.set_export import export_set_policy
from agents.set_policy_net import SetActorCriticPolicy
from agents.tracking import git_commit
from env.families import load_family, scenario_name, scenario_yaml
from env.gym_env import resolve_scenario
from env.set_env import FamilyDraw, ScenarioList, ScenarioSource, SetPolicyEnv

__all__ = [
    "export_set",
    "family_split_paths",
    "family_validation_paths",
    "held_out_paths",
    "scenario_source",
    "set_env_factories",
    "set_policy_args",
]


def scenario_source(config: ExperimentConfig) -> ScenarioSource:
    """Where the training episodes come from: the family's training split, else the listed scenarios."""
    if config.family is not None:
        return FamilyDraw(load_family(config.family.path), config.family.train_split)

    return ScenarioList(tuple(str(p) for p in scenario_paths(config.scenarios)))


def set_env_factories(config: ExperimentConfig) -> list[Callable[[], gym.Env]]:
    """One factory per training env; env ``rank`` is reset with seed ``config.seed + rank``."""
    layout = config.layout.to_set_layout()

    def factory(rank: int) -> Callable[[], gym.Env]:
        def _make() -> gym.Env:
            env = Monitor(SetPolicyEnv(scenario_source(config), layout, reward_scale=config.reward_scale))
            env.reset(seed=config.seed + rank)
            return env

        return _make

    return [factory(rank) for rank in range(config.n_envs)]


def set_policy_args(config: ExperimentConfig) -> tuple[type[SetActorCriticPolicy], dict[str, Any]]:
    """``(policy class, policy_kwargs)`` for ``MaskablePPO``."""
    layout = config.layout.to_set_layout()
    hp = config.hyperparameters
    return SetActorCriticPolicy, {
        "max_groups": layout.max_groups,
        "max_tenants": layout.max_tenants,
        "hidden_width": hp.set_hidden_width,
        "num_encoder_layers": hp.set_encoder_layers,
    }


def family_split_paths(config: ExperimentConfig, folder: Path, split: str, count: int) -> list[Path]:
    """The first ``count`` scenarios of a split of the experiment's family, written as scenario files in ``folder``.

    Raises:
        ValueError: the experiment has no family.
    """
    if config.family is None:
        raise ValueError("family scenarios: the experiment trains on listed scenarios, not a family")
    family = load_family(config.family.path)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in family.split_seeds(split)[:count]:
        path = folder / f"{scenario_name(family, seed)}.yaml"
        path.write_text(scenario_yaml(family, seed), encoding="utf-8")
        resolve_scenario(path)  # the written file must load as the generated scenario
        paths.append(path)
    return paths


def family_validation_paths(config: ExperimentConfig, out: Path) -> list[Path]:
    """The validation split's first ``validation_scenarios`` scenarios, written under ``out/validation-scenarios``.

    Raises:
        ValueError: the experiment has no family.
    """
    if config.family is None:
        raise ValueError("family_validation_paths: the experiment trains on listed scenarios, not a family")
    return family_split_paths(
        config, out / "validation-scenarios", config.family.validation_split, config.family.validation_scenarios
    )


def held_out_paths(config: ExperimentConfig, out: Path) -> list[Path]:
    """Where checkpoints are judged: the family's validation scenarios unless ``eval_scenarios`` names files."""
    if config.family is not None and not config.eval_scenarios:
        return family_validation_paths(config, out)

    return scenario_paths(config.held_out_scenarios)


def export_set(model: Any, out: Path, config: ExperimentConfig, run_id: str | None) -> Path:
    """Export ``model`` as a set-policy artifact with the experiment's provenance."""
    source = scenario_source(config)
    trained_on = [source.describe()] if isinstance(source, FamilyDraw) else list(config.scenarios)
    return export_set_policy(model, out, mlflow_run_id=run_id, git_commit=git_commit(), trained_on=trained_on)
