"""Experiment files: what to train, on which scenarios, how long, and how to judge it.

Example (``experiments/rag-surge.yaml``)::

    name: rag-surge
    algorithm: maskable_ppo
    scenarios: [rag-surge-8]           # training mix: one scenario drawn per episode
    eval_scenarios: [rag-surge-8]      # judged on these, with eval_seeds never used in training
    eval_seeds: [1000, 1001, 1002]
    baselines: [baseline:dynamo-load, baseline:keda-queue]
    total_timesteps: 20000
    n_envs: 2
    seed: 0
    layout: {max_groups: 2, max_tenants: 4}
    hyperparameters: {learning_rate: 3.0e-4, n_steps: 128, batch_size: 64, net_arch: [64, 64]}

Unknown keys are refused; YAML keys are the field names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "ExperimentConfig",
    "ExperimentError",
    "Hyperparameters",
    "LayoutConfig",
    "PretrainConfig",
    "load_experiment",
]

TRAIN_SEED_LIMIT = 1000
"""Training episodes draw seeds below this; evaluation seeds must be at or above it (never seen in training)."""


class ExperimentError(ValueError):
    """An experiment file was refused (one line per problem, naming the file and field)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LayoutConfig(_Strict):
    """Observation/action slots."""

    max_groups: Annotated[int, Field(ge=1, le=8)] = 2
    max_tenants: Annotated[int, Field(ge=1, le=16)] = 4


class Hyperparameters(_Strict):
    """PPO hyperparameters (stable-baselines3 names)."""

    learning_rate: Annotated[float, Field(gt=0)] = 3e-4
    n_steps: Annotated[int, Field(ge=8)] = 128
    batch_size: Annotated[int, Field(ge=8)] = 64
    n_epochs: Annotated[int, Field(ge=1)] = 10
    gamma: Annotated[float, Field(gt=0, le=1)] = 0.95
    gae_lambda: Annotated[float, Field(gt=0, le=1)] = 0.95
    clip_range: Annotated[float, Field(gt=0)] = 0.2
    ent_coef: Annotated[float, Field(ge=0)] = 0.01
    vf_coef: Annotated[float, Field(ge=0)] = 0.5
    max_grad_norm: Annotated[float, Field(gt=0)] = 0.5
    net_arch: list[Annotated[int, Field(ge=1)]] = [64, 64]
    activation: Literal["tanh", "relu"] = "tanh"


class PretrainConfig(_Strict):
    """Behaviour-cloning warm start (:mod:`agents.pretrain`)."""

    teachers: list[str] = Field(min_length=1, description="Candidate teacher policy specs; best per scenario.")
    seeds: list[Annotated[int, Field(ge=0, lt=TRAIN_SEED_LIMIT)]] = [0, 1]
    epochs: Annotated[int, Field(ge=1)] = 30
    learning_rate: Annotated[float, Field(gt=0)] = 1e-3


class ExperimentConfig(_Strict):
    """A training experiment."""

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str = ""
    algorithm: Literal["maskable_ppo"] = "maskable_ppo"
    scenarios: list[str] = Field(min_length=1, description="Training scenarios (names or paths), mixed per episode.")
    eval_scenarios: list[str] = Field(default_factory=list, description="Held-back scenarios (default: scenarios).")
    eval_seeds: list[Annotated[int, Field(ge=TRAIN_SEED_LIMIT)]] = [1000, 1001, 1002]
    baselines: list[str] = Field(default_factory=list, description="Policy specs to beat (evaluated alongside).")
    total_timesteps: Annotated[int, Field(ge=1)] = 20_000
    n_envs: Annotated[int, Field(ge=1, le=64)] = 2
    vec_env: Literal["subprocess", "dummy"] = "subprocess"
    seed: Annotated[int, Field(ge=0)] = 0
    layout: LayoutConfig = LayoutConfig()
    normalize_observations: bool = True
    normalize_rewards: bool = True
    hyperparameters: Hyperparameters = Hyperparameters()
    pretrain: PretrainConfig | None = None
    eval_every_steps: Annotated[int, Field(ge=0)] = 0
    """Evaluate (and checkpoint) every so many steps; 0 = only at the end."""
    early_stop_patience: Annotated[int, Field(ge=0)] = 0
    """Stop after this many periodic evaluations without improvement; 0 = never."""
    promotion_margin_frac: Annotated[float, Field(ge=0)] = 0.02
    register_as: str | None = None
    """Register the exported policy under this name (alias ``challenger``) when the run ends."""

    @model_validator(mode="after")
    def _batch_fits(self) -> ExperimentConfig:
        rollout = self.hyperparameters.n_steps * self.n_envs
        if self.hyperparameters.batch_size > rollout:
            raise ValueError(
                f"hyperparameters.batch_size ({self.hyperparameters.batch_size}) exceeds n_steps × n_envs ({rollout})"
            )
        return self

    @property
    def held_out_scenarios(self) -> list[str]:
        """Evaluation scenarios (the training ones when none are named)."""
        return self.eval_scenarios or self.scenarios


def load_experiment(path: str | Path, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Read and validate an experiment file; ``overrides`` (field → value) replace top-level fields."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ExperimentError(f"{p}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise ExperimentError(f"{p}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ExperimentError(f"{p}: expected a mapping at the top level")
    data.update(overrides or {})
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors(include_url=False):
            loc = ".".join(str(part) for part in err["loc"]) or "<top>"
            lines.append(f"{p}: {loc}: {err['msg']}")
        raise ExperimentError("\n".join(lines)) from None
