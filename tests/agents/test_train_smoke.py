"""The CI smoke experiment: train → MLflow server → register → promote (or refused) → load back → same decisions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agents.config import load_experiment
from agents.registry import PromotionRefused, list_policies, promote
from agents.train import train
from controller.policy_registry import mlflow_resolver
from env.gym_env import PDClusterEnv
from policies.learned import LearnedPolicy

pytestmark = [pytest.mark.integration]

SMOKE = Path(__file__).resolve().parents[2] / "experiments" / "smoke.yaml"
EXAMPLES = Path(__file__).resolve().parents[2] / "policies" / "examples"


def test_smoke_experiment_end_to_end(mlflow_server: str, tmp_path: Path) -> None:
    config = load_experiment(SMOKE)
    result = train(config, tmp_path / "run", tracking_uri=mlflow_server, progress=False)
    assert result.timesteps >= config.total_timesteps
    assert (result.artifact / "manifest.json").is_file()
    assert result.registered_version is not None

    import mlflow

    run = mlflow.MlflowClient(mlflow_server).get_run(result.run_id)
    assert run.data.tags["pdctl.feature_hash"]
    assert "train/value_loss" in run.data.metrics
    assert "eval/learned_weighted_goodput_rps" in run.data.metrics

    refusal: PromotionRefused | None = None
    try:
        promote(config.register_as or "", result.registered_version, tracking_uri=mlflow_server, margin_frac=0.0)
    except PromotionRefused as exc:
        refusal = exc
    alias = "champion" if refusal is None else "challenger"
    if refusal is not None:
        assert "does not beat" in str(refusal)
    versions = list_policies(config.register_as, tracking_uri=mlflow_server)
    assert any(alias in v.aliases for v in versions)

    local = mlflow_resolver(mlflow_server, tmp_path / "download")(f"models:/{config.register_as}@{alias}")
    loaded = LearnedPolicy.load(local)
    # identical decisions to the in-memory model on recorded observations
    assert result.model is not None
    assert result.normalize_obs is not None
    env = PDClusterEnv("rag-surge-8", layout=loaded.manifest.layout)
    obs, _ = env.reset(seed=1000)
    in_memory_policy = LearnedPolicy.load(result.artifact)
    for _ in range(15):
        mask = env.action_masks()
        expected, _ = result.model.predict(result.normalize_obs(obs), deterministic=True, action_masks=mask)
        # the registered artifact is the chosen checkpoint; compare it with its own export, and the final
        # model with the final export
        assert loaded.act(obs, mask).tolist() == in_memory_policy.act(obs, mask).tolist()
        final = LearnedPolicy.load(tmp_path / "run" / "final")
        assert final.act(obs, mask).tolist() == np.asarray(expected).tolist()
        obs, _, _, truncated, _ = env.step(np.asarray(expected))
        if truncated:
            break
