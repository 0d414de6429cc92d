"""Set policy end to end: train on a family's training split → export → load → decide on an unseen layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from agents.config import load_experiment
from agents.train import train
from env.families import generate_scenario, load_family
from env.set_env import ScenarioList, SetPolicyEnv
from policies.artifacts import load_learned
from policies.set_policy import SetPolicy

pytestmark = [pytest.mark.train]

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FAMILY = ROOT / "experiments" / "families" / "default.yaml"


def _small_family(tmp_path: Path) -> Path:
    """The default family cut to one 8-GPU group of one or two tenants and 5-minute episodes."""
    data = yaml.safe_load(DEFAULT_FAMILY.read_text())
    data["name"] = "small"
    data["groups"] = {"count": {"min": 1, "max": 1}, "gpu_budget": {8: 1}}
    data["tenants"]["count"] = {"min": 1, "max": 2}
    data["episode"]["duration_s"] = {"min": 300, "max": 300}
    data["cluster"]["profiles"] = {"h200-llama3-70b": 1}
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _experiment(tmp_path: Path, family: Path) -> Path:
    data = yaml.safe_load((ROOT / "experiments" / "generalist-family.yaml").read_text())
    data.update(
        name="set-smoke",
        family={"path": str(family), "validation_scenarios": 1},
        baselines=[],
        total_timesteps=256,
        n_envs=1,
        vec_env="dummy",
        eval_every_steps=0,
        early_stop_patience=0,
        hyperparameters={"n_steps": 64, "batch_size": 32, "n_epochs": 2, "set_hidden_width": 16},
        register_as=None,
    )
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _unseen_scenario(max_groups_seen: int, max_tenants_seen: int):  # type: ignore[no-untyped-def]
    """The first default-family validation scenario with more groups and tenants than any training episode."""
    family = load_family(DEFAULT_FAMILY)
    for seed in family.split_seeds("validation"):
        scenario = generate_scenario(family, seed)
        if len(scenario.tenant_groups) > max_groups_seen and len(scenario.tenants) > max_tenants_seen:
            return scenario
    raise AssertionError("no larger scenario in the validation split")


def test_train_on_a_family_export_load_and_decide_on_an_unseen_layout(tmp_path: Path) -> None:
    config = load_experiment(_experiment(tmp_path, _small_family(tmp_path)))
    result = train(config, tmp_path / "run", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", progress=False)
    assert result.timesteps >= config.total_timesteps
    assert result.env_steps_per_s > 0
    policy = load_learned(result.artifact)
    assert isinstance(policy, SetPolicy)
    assert policy.manifest.trained_on == ["family:small#train"]
    assert [p.name for p in (tmp_path / "run" / "validation-scenarios").iterdir()] == ["small-10000.yaml"]
    assert set(result.evaluation) == {f"learned:{result.artifact}"}

    # training saw one group of one or two tenants; decide on 2-3 groups with 3-6 tenants and other budgets
    unseen = _unseen_scenario(1, 2)
    env = SetPolicyEnv(ScenarioList((unseen,)))
    obs, _ = env.reset(seed=1000)
    assert result.model is not None
    for _ in range(10):
        mask = env.action_masks()
        expected, _ = result.model.predict(obs, deterministic=True, action_masks=mask)
        final = SetPolicy.load(tmp_path / "run" / "final")
        assert final.act(obs, mask).tolist() == np.asarray(expected).tolist()
        inner = env.inner
        action = policy.decide(inner.observation(), inner.policy_context())
        assert set(action.pools) == {g.name for g in inner.groups}
        assert set(action.thresholds) == {t.name for t in inner.tenants}
        obs, _, _, truncated, _ = env.step(policy.act(obs, mask))
        if truncated:
            break


def test_a_warm_start_from_a_teacher_policy_then_ppo(tmp_path: Path) -> None:
    """``pretrain.expert: policy``: labels on the family's first training scenario, one DAgger round, then PPO."""
    path = _experiment(tmp_path, _small_family(tmp_path))
    data = yaml.safe_load(path.read_text())
    data["pretrain"] = {
        "expert": "policy",
        "teachers": ["baseline:dynamo-legacy"],
        "seeds": [0],
        "family_scenarios": 1,
        "epochs": 2,
        "dagger_iterations": 1,
        "workers": 1,
    }
    path.write_text(yaml.safe_dump(data))
    config = load_experiment(path)
    result = train(config, tmp_path / "run", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", progress=False)
    assert isinstance(load_learned(result.artifact), SetPolicy)
    assert [p.name for p in (tmp_path / "run" / "pretrain-scenarios").iterdir()] == ["small-00000.yaml"]
    rounds = [yaml.safe_load((tmp_path / "run" / f"pretrain_set_round{i}.json").read_text()) for i in (0, 1)]
    assert rounds[0]["driver"] is None
    assert rounds[1]["driver"].startswith("learned:")
    assert [e["scenario"] for e in rounds[0]["episodes"]] == ["small-00000"]
