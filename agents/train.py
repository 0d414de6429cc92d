"""The training recipe: experiment file → vectorised envs → MaskablePPO → learn → evaluate → export → register.

Read top to bottom; each step is one function call. Everything random takes its seed from the experiment file:
training episodes use reset seeds ``seed + rank`` (and the RNG streams they start); evaluation uses the
experiment's ``eval_seeds`` (≥ 1000, never a training seed).

1. **Envs** — ``n_envs`` copies of :class:`env.gym_env.PDClusterEnv` in subprocesses, each wrapped in
   :class:`ScenarioMix` (one training scenario drawn per episode, so one policy serves many scenarios), under
   ``VecNormalize`` (observation statistics travel with the exported artifact; reward normalisation is training-only).
   With ``layout.kind: set`` the envs are :class:`env.set_env.SetPolicyEnv` (a fresh scenario of a family's
   training split per episode, relative observations, no observation statistics) and the policy is the set
   network (:mod:`agents.set_training`).
2. **Algorithm** — sb3-contrib ``MaskablePPO`` (the env's ``action_masks()`` are the guard's refusals), logging to
   MLflow through :class:`agents.tracking.MlflowWriter`.
3. **Learn** — with :class:`EvalCheckpointCallback` (periodic export + held-out evaluation through the very
   evaluation loop baselines are judged by, best checkpoint kept, early stop on plateau) and a rich progress bar.
4. **Export** — the best checkpoint as safetensors + manifest (:mod:`agents.export`).
5. **Evaluate** — learned vs the experiment's baselines on the held-out scenarios and seeds; the table goes to
   MLflow as an artifact and as ``eval/*`` metrics.
6. **Register** — optionally as a new version (alias ``challenger``), its held-out evaluation logged to the run as
   the promotion gate's evidence (:mod:`agents.gate`: bound to the artifact's files and the scenario set's hash).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import mlflow
import numpy as np
import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from sb3_contrib import MaskablePPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecNormalize

from agents.config import ExperimentConfig
from agents.evaluate import evaluate_policies, scenario_paths
from agents.export import export_policy
from agents.registry import (
    log_evidence,
    register_policy,
    training_evidence,
    training_run,
)
from agents.selector_train import train_selector
from agents.set_training import export_set, held_out_paths, set_env_factories, set_policy_args
from agents.tracking import MlflowWriter, provenance_tags, run_name
from agents.warm_start import warm_start
from env.gym_env import PDClusterEnv
from policies.features import ObservationLayout

__all__ = ["EvalCheckpointCallback", "ScenarioMix", "TrainResult", "make_vec_env", "train"]


class ScenarioMix(gym.Wrapper[np.ndarray, np.ndarray, np.ndarray, np.ndarray]):
    """Draws one of several scenarios at every reset (from the env's own seeded RNG)."""

    def __init__(self, env: PDClusterEnv, scenarios: Sequence[str]) -> None:
        super().__init__(env)
        self.scenarios = [str(s) for s in scenarios]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset into a scenario drawn uniformly from the env's RNG (unless ``options`` names one)."""
        unwrapped = self.env.unwrapped
        if seed is not None:
            gym.Env.reset(unwrapped, seed=seed)  # seeds the env's RNG; the draw below continues its stream
        options = dict(options or {})
        if "scenario" not in options and len(self.scenarios) > 1:
            options["scenario"] = self.scenarios[int(unwrapped.np_random.integers(len(self.scenarios)))]
        return self.env.reset(options=options or None)

    def action_masks(self) -> np.ndarray:
        """Forwarded to the env (MaskablePPO reads it through the vec env)."""
        masks: np.ndarray = self.env.unwrapped.action_masks()  # type: ignore[attr-defined]
        return masks


def _env_factory(scenarios: Sequence[str], layout: ObservationLayout, rank: int, seed: int) -> Callable[[], gym.Env]:
    def _make() -> gym.Env:
        env = Monitor(ScenarioMix(PDClusterEnv(scenarios[rank % len(scenarios)], layout=layout), scenarios))
        env.reset(seed=seed + rank)
        return env

    return _make


def make_vec_env(config: ExperimentConfig) -> VecNormalize:
    """The training envs (subprocesses unless ``vec_env: dummy``) under observation/reward normalisation."""
    if config.layout.kind == "set":  # a generated scenario (or a listed one) per episode, relative features
        factories = set_env_factories(config)
    else:
        layout = config.layout.to_layout()
        scenarios = [str(p) for p in scenario_paths(config.scenarios)]
        factories = [_env_factory(scenarios, layout, rank, config.seed) for rank in range(config.n_envs)]
    venv: VecEnv
    if config.vec_env == "subprocess" and config.n_envs > 1:
        venv = SubprocVecEnv(factories, start_method="spawn")
    else:
        venv = DummyVecEnv(factories)
    venv.seed(config.seed)
    return VecNormalize(
        venv,
        norm_obs=config.normalize_observations,
        norm_reward=config.normalize_rewards,
        clip_obs=10.0,
        gamma=config.hyperparameters.gamma,
    )


def _export(model: MaskablePPO, venv: VecNormalize, out: Path, config: ExperimentConfig, run_id: str | None) -> Path:
    if config.layout.kind == "set":
        return export_set(model, out, config, run_id)
    layout = config.layout.to_layout()
    tenants = [t.name for t in venv.get_attr("tenants", [0])[0]]
    groups = [g.name for g in venv.get_attr("groups", [0])[0]]
    commit = provenance_tags(layout).get("pdctl.git_commit")
    return export_policy(
        model,
        out,
        layout,
        obs_rms=venv.obs_rms if config.normalize_observations else None,
        clip_obs=venv.clip_obs,
        epsilon=venv.epsilon,
        tenants=tenants,
        groups=groups,
        mlflow_run_id=run_id,
        git_commit=commit,
        trained_on=list(config.scenarios),
    )


class EvalCheckpointCallback(BaseCallback):
    """Every ``every_steps``: export a checkpoint, score it on the validation seeds, keep the best, stop at plateaus."""

    def __init__(
        self,
        config: ExperimentConfig,
        venv: VecNormalize,
        out_dir: Path,
        run_id: str | None,
        scenarios: Sequence[Path],
    ) -> None:
        super().__init__()
        self.config = config
        self.venv = venv
        self.out_dir = out_dir
        self.run_id = run_id
        self.scenarios = list(scenarios)
        self.best_goodput = -np.inf
        self.best_path: Path | None = None
        self.evaluations_without_gain = 0
        self._next = config.eval_every_steps

    def evaluate_now(self) -> float:
        """Export the current policy, score it on the validation seeds, keep it if it is the best so far."""
        path = _export(
            cast(MaskablePPO, self.model),
            self.venv,
            self.out_dir / f"step-{self.num_timesteps}",
            self.config,
            self.run_id,
        )
        goodput = evaluate_policies([f"learned:{path}"], self.scenarios, self.config.validation_seeds)
        value = next(iter(goodput.values()))["mean"]
        self.logger.record("eval/weighted_goodput_rps", value)
        if value > self.best_goodput:
            self.best_goodput, self.best_path = value, path
            self.evaluations_without_gain = 0
        else:
            self.evaluations_without_gain += 1
        return value

    def _on_training_start(self) -> None:
        # the starting point (e.g. the warm-started policy) is a candidate too: PPO must beat it to replace it
        if self.config.eval_every_steps > 0:
            self.evaluate_now()

    def _on_step(self) -> bool:
        if self.config.eval_every_steps <= 0 or self.num_timesteps < self._next:
            return True
        self._next += self.config.eval_every_steps
        self.evaluate_now()
        patience = self.config.early_stop_patience
        return not (patience > 0 and self.evaluations_without_gain >= patience)


class RichProgressCallback(BaseCallback):
    """A rich progress bar over timesteps, with env steps per second."""

    def __init__(self, total_timesteps: int, enabled: bool = True) -> None:
        super().__init__()
        self.total = total_timesteps
        self.enabled = enabled
        self._progress: Progress | None = None
        self._task: Any = None

    def _on_training_start(self) -> None:
        if not self.enabled:
            return
        self._progress = Progress(
            TextColumn("training"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} steps"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        self._progress.start()
        self._task = self._progress.add_task("train", total=self.total)

    def _on_step(self) -> bool:
        if self._progress is not None:
            self._progress.update(self._task, completed=self.num_timesteps)
        return True

    def _on_training_end(self) -> None:
        if self._progress is not None:
            self._progress.stop()


@dataclass(slots=True)
class TrainResult:
    """What a training run produced."""

    artifact: Path
    run_id: str
    wall_s: float
    timesteps: int
    env_steps_per_s: float
    evaluation: dict[str, dict[str, float]] = field(default_factory=dict)
    registered_version: int | None = None
    model: MaskablePPO | None = None
    """The in-memory model at the end of training (for parity checks)."""
    normalize_obs: Callable[[np.ndarray], np.ndarray | dict[str, np.ndarray]] | None = None
    """The training-time observation normalisation, frozen at the end of training."""


def train(
    config: ExperimentConfig,
    out_dir: str | Path,
    *,
    tracking_uri: str | None = None,
    progress: bool = True,
    evaluate_baselines: bool = True,
) -> TrainResult:
    """Run one experiment end to end (see the module docstring).

    ``algorithm: rule_selector`` runs the rule selector's recipe instead (:func:`agents.selector_train.train_selector`).
    """
    if config.algorithm == "rule_selector":
        selected = train_selector(
            config, out_dir, tracking_uri=tracking_uri, progress=progress, evaluate_baselines=evaluate_baselines
        )
        return TrainResult(
            selected.artifact,
            selected.run_id,
            selected.wall_s,
            selected.timesteps,
            selected.env_steps_per_s,
            selected.evaluation,
            selected.registered_version,
        )
    torch.manual_seed(config.seed)
    torch.set_num_threads(1)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    layout = config.layout.to_layout()
    held_out = held_out_paths(config, out)  # a family's validation split (never its test split), else the files

    from mlflow import MlflowClient

    with training_run(config.name, run_name(config.name, config.algorithm, config.seed), tracking_uri) as (
        run_id,
        uri,
    ):
        mlflow.set_tags(
            provenance_tags(layout, {"pdctl.experiment": config.name, "pdctl.layout_kind": config.layout.kind})
        )
        mlflow.log_params(
            {
                "algorithm": config.algorithm,
                "total_timesteps": config.total_timesteps,
                "n_envs": config.n_envs,
                "seed": config.seed,
                "scenarios": ",".join(config.scenarios) or f"family:{config.family.path if config.family else ''}",
                **{f"hp.{k}": v for k, v in config.hyperparameters.model_dump().items()},
            }
        )
        mlflow.log_dict(config.model_dump(mode="json"), "experiment.json")

        # 1. envs
        venv = make_vec_env(config)
        # 2. algorithm
        hp = config.hyperparameters
        activation = torch.nn.Tanh if hp.activation == "tanh" else torch.nn.ReLU
        policy: Any = "MlpPolicy"
        policy_kwargs: dict[str, Any] = {"net_arch": list(hp.net_arch), "activation_fn": activation}
        if config.layout.kind == "set":
            policy, policy_kwargs = set_policy_args(config)
        model = MaskablePPO(
            policy,
            venv,
            learning_rate=hp.learning_rate,
            n_steps=hp.n_steps,
            batch_size=hp.batch_size,
            n_epochs=hp.n_epochs,
            gamma=hp.gamma,
            gae_lambda=hp.gae_lambda,
            clip_range=hp.clip_range,
            ent_coef=hp.ent_coef,
            vf_coef=hp.vf_coef,
            max_grad_norm=hp.max_grad_norm,
            policy_kwargs=policy_kwargs,
            seed=config.seed,
            device="cpu",
            verbose=0,
        )
        model.set_logger(Logger(folder=None, output_formats=[MlflowWriter()]))
        # 2b. optional warm start: imitate a teacher (agents.warm_start)
        if config.pretrain is not None:
            warm_start(model, venv, config, layout, out, lambda folder: _export(model, venv, folder, config, None))
        # 3. learn
        checkpoints = out / "checkpoints"
        eval_cb = EvalCheckpointCallback(config, venv, checkpoints, run_id, held_out)
        start = time.perf_counter()
        try:
            model.learn(
                config.total_timesteps, callback=[eval_cb, RichProgressCallback(config.total_timesteps, progress)]
            )
        finally:
            wall_s = time.perf_counter() - start
        steps = int(model.num_timesteps)
        mlflow.log_metrics({"time/train_wall_s": wall_s, "time/env_steps_per_s": steps / max(wall_s, 1e-9)})
        # 4. export: the best periodic checkpoint if it beats the final weights, else the final weights
        final = _export(model, venv, out / "final", config, run_id)
        artifact = out / "policy"
        chosen = final
        if eval_cb.best_path is not None:
            final_value = evaluate_policies([f"learned:{final}"], held_out, config.validation_seeds)[f"learned:{final}"]
            if eval_cb.best_goodput > final_value["mean"]:
                chosen = eval_cb.best_path
        if artifact.exists():
            shutil.rmtree(artifact)
        shutil.copytree(chosen, artifact)
        venv.training = False
        normalize_obs = venv.normalize_obs
        venv.close()
        mlflow.log_artifacts(str(artifact), artifact_path="policy")
        # 5. evaluate on held-out seeds
        specs = [f"learned:{artifact}", *(config.baselines if evaluate_baselines else [])]
        evaluation = evaluate_policies(specs, held_out, config.eval_seeds)
        learned = evaluation[f"learned:{artifact}"]["mean"]
        best_baseline = max((evaluation[s]["mean"] for s in specs[1:]), default=None)
        mlflow.log_metric("eval/learned_weighted_goodput_rps", learned)
        if best_baseline is not None:
            mlflow.log_metric("eval/best_baseline_weighted_goodput_rps", best_baseline)
        mlflow.log_dict(evaluation, "evaluation.json")
        (out / "evaluation.json").write_text(json.dumps(evaluation, indent=2) + "\n")
        # 6. register
        version = None
        if config.register_as:
            # The gate's evidence: this held-out evaluation, bound to the artifact's files and the scenario set.
            evidence = training_evidence(artifact, held_out, config.eval_seeds, evaluation)
            version = register_policy(artifact, config.register_as, tracking_uri=uri, run_id=run_id).version
            log_evidence(MlflowClient(tracking_uri=uri), config.register_as, version, evidence)
    return TrainResult(
        artifact, run_id, wall_s, steps, steps / max(wall_s, 1e-9), evaluation, version, model, normalize_obs
    )
