"""The rule selector's recipe: rollouts per group, hindsight labels, the fit, and the whole run through pdctl train."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from agents.config import ExperimentError, load_experiment
from agents.runs import episode_env, run_episode
from agents.selector_data import GroupRollout, RolloutTask, rule_rollout, selector_targets
from agents.selector_fit import fit_selector
from agents.train import train
from env.gym_env import resolve_scenario
from policies.artifacts import load_learned
from policies.baselines import make_baseline
from policies.rule_selector import GROUP_INPUT_WIDTH, RuleSelector, SelectorNetwork

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FAMILY = ROOT / "experiments" / "families" / "default.yaml"
RULES = ["dynamo-legacy", "aggregated"]


def _rollout(group: str, rule: str, goodput: float, inputs: np.ndarray, scenario: str = "s") -> GroupRollout:
    return GroupRollout(scenario, 0, group, rule, inputs.astype(np.float32), goodput, 10.0, 0.0)


def _inputs(value: float, intervals: int = 3) -> np.ndarray:
    x = np.zeros((intervals, GROUP_INPUT_WIDTH), dtype=np.float32)
    x[:, 0] = value
    return x


# ------------------------------------------------------------------------------------------- labels


def test_targets_are_each_rules_goodput_over_the_best_and_every_group_weighs_one_in_all() -> None:
    rollouts = [
        _rollout("g1", "dynamo-legacy", 4.0, _inputs(0.0, 2)),
        _rollout("g1", "aggregated", 2.0, _inputs(0.0, 2)),
        _rollout("g2", "dynamo-legacy", 1.0, _inputs(1.0, 6)),
        _rollout("g2", "aggregated", 3.0, _inputs(1.0, 6)),
        _rollout("g3", "dynamo-legacy", 0.0, _inputs(2.0)),  # nothing could meet its objectives: no label
        _rollout("g3", "aggregated", 0.0, _inputs(2.0)),
    ]
    data = selector_targets(rollouts, RULES, 0.05)
    assert data.groups == 2
    assert data.best_counts == {"dynamo-legacy": 1, "aggregated": 1}
    assert data.inputs.shape == (16, GROUP_INPUT_WIDTH)  # every rule's intervals of a labelled group
    np.testing.assert_allclose(data.ratios[0], [1.0, 0.5])
    np.testing.assert_allclose(data.ratios[-1], [1 / 3, 1.0])
    soft = np.exp([0.0, -0.5 / 0.05])
    np.testing.assert_allclose(data.targets[0], soft / soft.sum(), rtol=1e-5)
    g1, g2 = data.weights[:4].sum(), data.weights[4:].sum()
    assert g1 == pytest.approx(g2)  # 4 and 12 samples, one group each


def test_a_group_without_a_rollout_of_every_rule_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="scenario s seed 0 group g1: no rollout of rule aggregated"):
        selector_targets([_rollout("g1", "dynamo-legacy", 1.0, _inputs(0.0))], RULES, 0.05)


# ------------------------------------------------------------------------------------------- fit


@pytest.mark.parametrize("loss", ["ratio", "soft_best"])
def test_the_numpy_runtime_picks_what_the_fit_learned_on_separable_data(loss: str) -> None:
    rollouts = []
    for i in range(12):
        high = i % 2 == 1  # feature 0 high → aggregated is best, else legacy
        x = _inputs(1.0 if high else 0.0)
        rollouts += [
            _rollout(f"g{i}", "dynamo-legacy", 1.0 if not high else 0.2, x),
            _rollout(f"g{i}", "aggregated", 1.0 if high else 0.1, x),
        ]
    data = selector_targets(rollouts, RULES, 0.05)
    fit = fit_selector(
        data, hidden_width=8, epochs=60, learning_rate=1e-2, weight_decay=0.0, batch_size=16, seed=0, loss=loss
    )
    assert fit.losses[-1] < fit.losses[0]
    network = SelectorNetwork.from_tensors(fit.tensors, len(RULES))
    assert network.scores(_inputs(1.0, 1)).argmax() == 1
    assert network.scores(_inputs(0.0, 1)).argmax() == 0
    assert fit.agreement_frac == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------- rollouts


def _small_family(tmp_path: Path) -> Path:
    """The default family cut to one or two 4-GPU groups of one or two tenants and 2-minute episodes."""
    data = yaml.safe_load(DEFAULT_FAMILY.read_text())
    data["name"] = "small"
    data["groups"] = {"count": {"min": 2, "max": 2}, "gpu_budget": {4: 1}}
    data["tenants"]["count"] = {"min": 2, "max": 2}
    data["episode"]["duration_s"] = {"min": 120, "max": 120}
    data["cluster"]["profiles"] = {"h200-llama3-8b": 1}
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _experiment(tmp_path: Path, family: Path, **selector: object) -> Path:
    data = {
        "name": "selector-smoke",
        "algorithm": "rule_selector",
        "family": {"path": str(family), "validation_scenarios": 1},
        "eval_seeds": [1000],
        "layout": {"kind": "set"},
        "normalize_observations": False,
        "selector": {"family_scenarios": 2, "epochs": 3, "hidden_width": 8, "workers": 1, **selector},
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.train
def test_pdctl_train_runs_the_selector_recipe_end_to_end(tmp_path: Path) -> None:
    config = load_experiment(_experiment(tmp_path, _small_family(tmp_path)))
    result = train(config, tmp_path / "run", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", progress=False)
    policy = load_learned(result.artifact)
    assert isinstance(policy, RuleSelector)
    assert policy.manifest.trained_on == ["family:small#train"]
    assert policy.manifest.mlflow_run_id == result.run_id
    assert result.timesteps > 0
    assert set(result.evaluation) == {f"learned:{result.artifact}"}
    assert result.evaluation[f"learned:{result.artifact}"]["mean"] >= 0.0


def test_a_rollout_records_each_groups_inputs_every_interval_and_its_goodput(tmp_path: Path) -> None:
    from agents.set_training import family_split_paths

    config = load_experiment(_experiment(tmp_path, _small_family(tmp_path)))
    (path,) = family_split_paths(config, tmp_path / "scenarios", "train", 1)
    scenario = resolve_scenario(path)
    legacy = make_baseline("dynamo-legacy")
    intervals = run_episode(episode_env(scenario, legacy), legacy, 0).intervals  # the episode loop's own count
    rollouts = rule_rollout(RolloutTask(str(path), "dynamo-legacy", 0))
    assert [r.group for r in rollouts] == ["g1", "g2"]
    for r in rollouts:
        assert r.inputs.shape == (intervals, GROUP_INPUT_WIDTH)
        assert 0.0 <= r.weighted_goodput_rps <= r.offered_weighted_rps
    again = rule_rollout(RolloutTask(str(path), "dynamo-legacy", 0))
    np.testing.assert_array_equal(again[0].inputs, rollouts[0].inputs)  # seeded: the same run twice


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ({"rules": ["dynamo-legacy", "nope"]}, "unknown baseline 'nope'"),
        ({"rules": ["aggregated"]}, "rules"),
        ({"seeds": [1000]}, "selector.seeds"),
    ],
)
def test_a_bad_selector_section_is_refused_naming_the_field(
    tmp_path: Path, selector: dict[str, object], message: str
) -> None:
    with pytest.raises(ExperimentError, match=message):
        load_experiment(_experiment(tmp_path, _small_family(tmp_path), **selector))
