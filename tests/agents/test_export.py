from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from sb3_contrib import MaskablePPO
from stable_baselines3.common.running_mean_std import RunningMeanStd

from agents.export import export_policy
from policies import ObservationLayout
from policies.action_codec import ActionCodec
from policies.learned import LearnedPolicy

LAYOUT = ObservationLayout(max_groups=1, max_tenants=2)
CODEC = ActionCodec(LAYOUT)


class _SpacesOnly(gym.Env[np.ndarray, np.ndarray]):
    """Carries the real observation and action spaces so a model can be built; never stepped."""

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


@pytest.mark.parametrize("arch", [[32, 32], [16]])
def test_exported_policy_matches_sb3_predict(tmp_path: Path, arch: list[int]) -> None:
    model = MaskablePPO("MlpPolicy", _SpacesOnly(), policy_kwargs={"net_arch": arch}, seed=3, device="cpu")
    rms = RunningMeanStd(shape=(LAYOUT.size,))
    rng = np.random.default_rng(0)
    rms.update(rng.uniform(0, 2, size=(64, LAYOUT.size)))
    export_policy(model, tmp_path, LAYOUT, obs_rms=rms, clip_obs=10.0, tenants=["a", "b"], groups=["g"])
    learned = LearnedPolicy.load(tmp_path)
    space = LAYOUT.observation_space()
    for _ in range(50):
        raw = space.sample()
        mask = rng.random(int(CODEC.nvec.sum())) > 0.3
        start = 0
        for size in CODEC.nvec:  # at least one valid value per dimension
            mask[start] = True
            start += int(size)
        normalised = np.clip((raw - rms.mean) / np.sqrt(rms.var + 1e-8), -10, 10).astype(np.float32)
        expected, _ = model.predict(normalised, deterministic=True, action_masks=mask)
        assert learned.act(raw, mask).tolist() == np.asarray(expected).tolist()


def test_unsupported_layers_are_refused(tmp_path: Path) -> None:
    import torch

    model = MaskablePPO("MlpPolicy", _SpacesOnly(), policy_kwargs={"activation_fn": torch.nn.ELU}, device="cpu")
    with pytest.raises(ValueError, match="ELU"):
        export_policy(model, tmp_path, LAYOUT)


def test_pool_target_layout_travels_in_the_manifest(tmp_path: Path) -> None:
    import json

    layout = ObservationLayout(max_groups=1, max_tenants=2, pool_actions="target")
    codec = ActionCodec(layout)
    env = _SpacesOnly()
    env.action_space = codec.action_space()
    model = MaskablePPO("MlpPolicy", env, policy_kwargs={"net_arch": [16]}, seed=0, device="cpu")
    export_policy(model, tmp_path, layout)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["pool_actions"] == "target"
    learned = LearnedPolicy.load(tmp_path)
    assert learned.codec.targets
    assert learned.codec.nvec.tolist() == codec.nvec.tolist()
    # the same weights with the manifest claiming deltas no longer fit the codec: refused with the field named
    manifest["pool_actions"] = "delta"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="codec_hash"):
        LearnedPolicy.load(tmp_path)
