"""The set policy's torch network: export parity with the numpy runtime, permutation invariance, config checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml
from sb3_contrib import MaskablePPO

from agents.config import ExperimentError, load_experiment
from agents.set_export import export_set_policy
from agents.set_policy_net import SetActorCriticPolicy
from policies.artifacts import load_learned
from policies.set_codec import POOL_MOVES, SetActionCodec
from policies.set_features import SetLayout, SetObservation
from policies.set_policy import SetPolicy
from tests.policies.test_set_policy import random_observation

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = SetLayout()
CODEC = SetActionCodec(LAYOUT)


class _SpacesOnly(gym.Env[np.ndarray, np.ndarray]):
    """Carries the set policy's spaces so a model can be built; never stepped."""

    def __init__(self) -> None:
        self.observation_space = LAYOUT.observation_space()
        self.action_space = CODEC.action_space()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        raise NotImplementedError


def _model(seed: int, hidden: int = 32) -> MaskablePPO:
    kwargs = {"max_groups": 3, "max_tenants": 6, "hidden_width": hidden}
    return MaskablePPO(SetActorCriticPolicy, _SpacesOnly(), policy_kwargs=kwargs, seed=seed, device="cpu")


def _perturb_heads(model: MaskablePPO, seed: int) -> None:
    """Heads start near zero (gain 0.01); give them weight so arg-maxes are not ties."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        extractor = model.policy.mlp_extractor
        for head in (extractor.group_head, extractor.tenant_head):
            assert isinstance(head, torch.nn.Linear)
            head.weight.normal_(0.0, 1.0, generator=generator)


@pytest.mark.parametrize("seed", [0, 1])
def test_exported_set_policy_matches_sb3_predict(tmp_path: Path, seed: int) -> None:
    model = _model(seed)
    _perturb_heads(model, seed)
    export_set_policy(model, tmp_path, trained_on=["family:test#train"])
    policy = load_learned(tmp_path)
    assert isinstance(policy, SetPolicy)
    rng = np.random.default_rng(seed)
    for trial in range(40):
        obs = random_observation(rng, 1 + trial % 3, 3 + trial % 4).to_vector(LAYOUT)
        mask = rng.random(int(CODEC.nvec.sum())) > 0.3
        start = 0
        for size in CODEC.nvec:  # at least one valid value per dimension
            mask[start] = True
            start += int(size)
        with torch.no_grad():
            logits = model.policy.mlp_extractor.forward_actor(torch.as_tensor(obs[None])).numpy()[0]
        np.testing.assert_allclose(policy.network.logits(obs), logits, rtol=1e-4, atol=1e-5)
        expected, _ = model.predict(obs, deterministic=True, action_masks=mask)
        assert policy.act(obs, mask).tolist() == np.asarray(expected).tolist()


def test_torch_network_is_permutation_invariant() -> None:
    model = _model(3, hidden=16)
    _perturb_heads(model, 3)
    net = model.policy.mlp_extractor
    rng = np.random.default_rng(3)
    obs = random_observation(rng, 3, 6)
    perm = rng.permutation(6)
    shuffled = SetObservation(
        obs.group_rows, tuple(obs.tenant_rows[i] for i in perm), tuple(obs.tenant_group[i] for i in perm)
    )
    batch = torch.as_tensor(np.stack([obs.to_vector(LAYOUT), shuffled.to_vector(LAYOUT)]))
    with torch.no_grad():
        logits = net.forward_actor(batch).numpy()
        values = model.policy.predict_values(batch).numpy()
    cut = 3 * len(POOL_MOVES)
    np.testing.assert_allclose(logits[1, :cut], logits[0, :cut], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        logits[1, cut:].reshape(6, -1), logits[0, cut:].reshape(6, -1)[perm], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(values[1], values[0], rtol=1e-5, atol=1e-6)


def test_export_refuses_a_slot_policy(tmp_path: Path) -> None:
    from tests.agents.test_export import _SpacesOnly as SlotSpaces

    model = MaskablePPO("MlpPolicy", SlotSpaces(), device="cpu")
    with pytest.raises(ValueError, match="needs a MaskablePPO built with SetActorCriticPolicy"):
        export_set_policy(model, tmp_path)


def test_family_experiment_file_loads() -> None:
    config = load_experiment(ROOT / "experiments" / "generalist-family.yaml")
    assert config.family is not None
    assert config.family.train_split == "train"
    assert config.family.validation_split == "validation"
    assert config.layout.to_set_layout() == SetLayout(3, 6)
    assert not config.normalize_observations
    assert config.reward_scale == "offered"


def _write(tmp_path: Path, **changes: Any) -> Path:
    data = yaml.safe_load((ROOT / "experiments" / "generalist-family.yaml").read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"normalize_observations": True}, r"normalize_observations: must be false with layout.kind: set"),
        ({"layout": {"max_groups": 3}}, r"family: training on a family needs layout.kind: set"),
        ({"scenarios": ["rag-surge-8"]}, r"scenarios: leave empty when training on a family"),
        ({"family": None}, r"scenarios: name at least one training scenario, or a family"),
        (
            {"family": {"path": "experiments/families/default.yaml", "validation_split": "test"}},
            r"the test split is for the final judgement only",
        ),
        (
            {"family": {"path": "experiments/families/default.yaml", "validation_split": "train"}},
            r"validation_split 'train' is the train_split",
        ),
        ({"layout": {"kind": "set", "pool_actions": "delta"}}, r"pool_actions applies to kind: slots only"),
        (
            {"pretrain": {"teachers": ["baseline:aggregated"]}},
            r"pretrain.expert: layout.kind: set takes expert: policy",
        ),
        (
            {"layout": {"max_groups": 2}, "family": None, "scenarios": ["rag-surge-8"], "normalize_observations": True},
            r"reward_scale: offered needs layout.kind: set",
        ),
    ],
)
def test_bad_family_experiments_are_refused_naming_the_field(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ExperimentError, match=message) as info:
        load_experiment(_write(tmp_path, **changes))
    assert str(info.value).startswith(str(tmp_path / "exp.yaml"))
