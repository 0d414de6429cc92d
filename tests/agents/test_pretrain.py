from __future__ import annotations

from pathlib import Path

import numpy as np
from sb3_contrib import MaskablePPO
from stable_baselines3.common.vec_env import DummyVecEnv

from agents.pretrain import behaviour_clone, choose_teachers, collect_demonstrations
from env.gym_env import SCENARIO_DIR, PDClusterEnv
from policies import ObservationLayout

LAYOUT = ObservationLayout()


def test_cloned_policy_reproduces_its_teacher() -> None:
    path = SCENARIO_DIR / "short-flood-8.yaml"
    teachers = choose_teachers([path], ["baseline:aggregated", "baseline:vllm-proxy"], seed=0)
    assert teachers[path] in {"baseline:aggregated", "baseline:vllm-proxy"}
    demos = collect_demonstrations({path: "baseline:aggregated"}, LAYOUT, seeds=[0])
    assert len(demos) > 10
    assert demos.masks.shape[1] == int(PDClusterEnv(path, layout=LAYOUT).codec.nvec.sum())
    venv = DummyVecEnv([lambda: PDClusterEnv(path, layout=LAYOUT)])
    model = MaskablePPO("MlpPolicy", venv, seed=0, device="cpu", policy_kwargs={"net_arch": [64, 64]})

    def identity(x: np.ndarray) -> np.ndarray:
        return x

    losses = behaviour_clone(model, demos, identity, epochs=25, seed=0)
    assert losses[-1] < 0.2 * losses[0]
    predicted, _ = model.predict(demos.observations, deterministic=True, action_masks=demos.masks)
    agreement = float(np.mean(np.all(np.asarray(predicted) == demos.actions, axis=1)))
    assert agreement > 0.9


def test_teacher_choice_is_the_best_candidate(tmp_path: Path) -> None:
    path = SCENARIO_DIR / "degraded-network-8.yaml"
    chosen = choose_teachers([path], ["baseline:vllm-proxy", "baseline:aggregated"], seed=0)
    # on a failing network, serving everything aggregated beats always-remote
    assert chosen[path] == "baseline:aggregated"
