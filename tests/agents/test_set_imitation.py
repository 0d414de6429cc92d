"""The set policy's warm start: a teacher's decisions recorded in the set action space, and cloned."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from sb3_contrib import MaskablePPO
from stable_baselines3.common.vec_env import DummyVecEnv

from agents.evaluate import RunSpec, run_one
from agents.pretrain import behaviour_clone
from agents.set_imitation import SetDemoTask, best_teacher_per_scenario, collect_set_demonstrations, set_demo_episode
from agents.set_policy_net import SetActorCriticPolicy
from env.gym_env import resolve_scenario
from env.set_env import ScenarioList, SetPolicyEnv
from policies.set_codec import HOLD, SetActionCodec
from policies.set_features import SetLayout
from tests.env.helpers import tiny_scenario

LAYOUT = SetLayout(max_groups=3, max_tenants=6)


@pytest.fixture
def scenario_path(tmp_path: Path) -> Path:
    """Twelve control intervals, two tenants in one group."""
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(duration_s=120.0, rate_rps=3.0).model_dump(mode="json")))
    return path


def _goodput(spec: str, path: Path, seed: int) -> float:
    rows = run_one(RunSpec(spec, str(path), seed)).rows
    return float(next(r for r in rows if r["tenant"] == "ALL")["weighted_goodput_rps"])


def _allowed(actions: np.ndarray, masks: np.ndarray, codec: SetActionCodec) -> bool:
    offsets = np.concatenate([[0], np.cumsum(codec.nvec)[:-1]])
    return bool(all(masks[i, offsets + actions[i]].all() for i in range(len(actions))))


def test_each_scenario_gets_the_teacher_that_scores_best_on_it(tmp_path: Path, scenario_path: Path) -> None:
    busy = tmp_path / "busy.yaml"  # the same cluster at a higher load: the choice may differ per scenario
    busy.write_text(yaml.safe_dump(tiny_scenario(duration_s=120.0, rate_rps=12.0).model_dump(mode="json")))
    teachers = ["baseline:aggregated", "baseline:dynamo-legacy", "baseline:vllm-proxy"]
    paths = [str(scenario_path), str(busy)]
    choices = best_teacher_per_scenario(paths, teachers, seed=5, workers=1)
    assert [c.scenario_path for c in choices] == paths
    for choice in choices:
        scores = {t: _goodput(t, Path(choice.scenario_path), 5) for t in teachers}
        assert choice.weighted_goodput_rps == pytest.approx(scores)
        assert choice.teacher == max(teachers, key=lambda t: (scores[t], -teachers.index(t)))
    assert best_teacher_per_scenario(paths, teachers, seed=5, workers=2) == choices  # workers change nothing


def test_the_teacher_acts_and_every_label_is_an_allowed_set_action(scenario_path: Path) -> None:
    episode = set_demo_episode(SetDemoTask(str(scenario_path), 3, "baseline:dynamo-legacy", LAYOUT))
    demos = episode.demonstrations
    intervals = int(resolve_scenario(scenario_path).duration_s // resolve_scenario(scenario_path).control_interval_s)
    assert intervals - 1 <= len(demos) <= intervals
    codec = SetActionCodec(LAYOUT)
    assert demos.actions.shape == (len(demos), len(codec.nvec))
    assert demos.observations.shape[1] == LAYOUT.observation_space().shape[0]
    assert _allowed(demos.actions, demos.masks, codec)
    assert not demos.pool_moves.any()  # the rule never resizes pools
    assert (demos.actions[:, : LAYOUT.max_groups] == HOLD).all()
    # the labelling run is the teacher's own run: the same goodput as evaluating it
    assert episode.weighted_goodput_rps == pytest.approx(_goodput("baseline:dynamo-legacy", scenario_path, 3))
    assert episode.teacher_s_per_interval >= 0


def test_with_a_driver_the_driver_acts_and_the_teacher_labels(scenario_path: Path) -> None:
    labelled = set_demo_episode(SetDemoTask(str(scenario_path), 3, "baseline:dynamo-legacy", LAYOUT))
    driven = set_demo_episode(
        SetDemoTask(str(scenario_path), 3, "baseline:dynamo-legacy", LAYOUT, driver="baseline:aggregated")
    )
    assert driven.weighted_goodput_rps == pytest.approx(_goodput("baseline:aggregated", scenario_path, 3))
    assert driven.weighted_goodput_rps != pytest.approx(labelled.weighted_goodput_rps)
    # same teacher, so the tenant labels agree wherever the states agree (the first interval at least)
    assert driven.demonstrations.actions[0].tolist() == labelled.demonstrations.actions[0].tolist()


def test_cloning_the_demonstrations_reproduces_the_teacher(scenario_path: Path) -> None:
    demos, episodes = collect_set_demonstrations(
        [SetDemoTask(str(scenario_path), seed, "baseline:dynamo-isl-or-load", LAYOUT) for seed in (1, 2)], workers=1
    )
    assert [e.seed for e in episodes] == [1, 2]
    torch.manual_seed(0)
    env = DummyVecEnv([lambda: SetPolicyEnv(ScenarioList((str(scenario_path),)), LAYOUT)])
    model = MaskablePPO(
        SetActorCriticPolicy,
        env,
        n_steps=32,
        batch_size=32,
        seed=0,
        device="cpu",
        policy_kwargs={"max_groups": 3, "max_tenants": 6, "hidden_width": 16, "num_encoder_layers": 1},
    )
    losses = behaviour_clone(model, demos, lambda x: x, epochs=40, batch_size=16, learning_rate=3e-3, seed=0)
    assert losses[-1] < 0.25 * losses[0]
    predicted, _ = model.predict(demos.observations, deterministic=True, action_masks=demos.masks)
    agree = (np.asarray(predicted) == demos.actions).all(axis=1).mean()
    assert agree >= 0.9
