"""The rule selector's recipe: rollouts per group, hindsight labels, the fit, and the whole run through pdctl train."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from agents.config import ExperimentError, SelectorConfig, load_experiment
from agents.harness import slo_met
from agents.runs import episode_env, run_episode
from agents.selector_data import (
    GroupRollout,
    RolloutTask,
    cached_rollouts,
    collect_rollouts,
    rule_rollout,
    selector_targets,
    shared_transfer_inputs,
    window_goodput,
)
from agents.selector_fit import FitResult, fit_selector
from agents.train import train
from env.gym_env import resolve_scenario
from policies.artifacts import load_learned
from policies.baselines import make_baseline
from policies.rule_selector import (
    GROUP_INPUT_WIDTH,
    TRANSFER_COLUMNS,
    RuleSelector,
    SelectorBehaviour,
    SelectorManifest,
    SelectorNetwork,
)
from tests.agents.selector_recipes import experiment as _experiment
from tests.agents.selector_recipes import small_family as _small_family

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


def test_balanced_labels_weigh_each_rules_wins_the_same_in_all() -> None:
    """Three groups best under legacy and one under aggregated: balanced, the one weighs what the three do."""
    rollouts = [
        r
        for g, (legacy, aggregated) in enumerate([(4.0, 1.0), (3.0, 2.0), (5.0, 1.0), (1.0, 2.0)])
        for r in (
            _rollout(f"g{g}", "dynamo-legacy", legacy, _inputs(float(g), 2 + g)),
            _rollout(f"g{g}", "aggregated", aggregated, _inputs(float(g), 2 + g)),
        )
    ]
    plain = selector_targets(rollouts, RULES, 0.05)
    balanced = selector_targets(rollouts, RULES, 0.05, balance_best_rules=True)
    assert plain.best_counts == balanced.best_counts == {"dynamo-legacy": 3, "aggregated": 1}
    np.testing.assert_array_equal(plain.inputs, balanced.inputs)
    np.testing.assert_array_equal(plain.ratios, balanced.ratios)
    aggregated_best = balanced.inputs[:, 0] == 3.0
    for data, share in ((plain, 0.25), (balanced, 0.5)):
        assert data.weights.mean() == pytest.approx(1.0)
        assert data.weights[aggregated_best].sum() / data.weights.sum() == pytest.approx(share)
    g0, g1 = (balanced.weights[balanced.inputs[:, 0] == g].sum() for g in (0.0, 1.0))
    assert g0 == pytest.approx(g1)  # within a rule's wins, every group still weighs the same


def test_the_same_group_under_another_link_rate_is_labelled_apart() -> None:
    """Rollouts of one scenario under two bandwidth scales are two labelled groups, each with its own best rule."""
    from dataclasses import replace

    healthy = [_rollout("g1", "dynamo-legacy", 4.0, _inputs(0.0)), _rollout("g1", "aggregated", 2.0, _inputs(0.0))]
    degraded = [
        replace(_rollout("g1", "dynamo-legacy", 1.0, _inputs(1.0)), bandwidth_scale=0.1),
        replace(_rollout("g1", "aggregated", 3.0, _inputs(1.0)), bandwidth_scale=0.1),
    ]
    data = selector_targets(healthy + degraded, RULES, 0.05)
    assert data.groups == 2
    assert data.best_counts == {"dynamo-legacy": 1, "aggregated": 1}
    with pytest.raises(ValueError, match="group g1: no rollout of rule"):
        selector_targets([healthy[0], degraded[1]], RULES, 0.05)  # not each other's siblings


def test_rollout_conditions_cross_rate_and_link_scales_or_rotate_k_of_them_per_scenario() -> None:
    crossed = SelectorConfig(rate_scales=[0.5, 1.0, 1.5], bandwidth_scales=[1.0, 0.1])
    grid = [(0.5, 1.0), (0.5, 0.1), (1.0, 1.0), (1.0, 0.1), (1.5, 1.0), (1.5, 0.1)]
    assert crossed.rollout_conditions(0) == crossed.rollout_conditions(7) == grid
    rotated = crossed.model_copy(update={"conditions_per_scenario": 2})
    assert [rotated.rollout_conditions(i) for i in range(4)] == [grid[0:2], grid[2:4], grid[4:6], grid[0:2]]
    odd = crossed.model_copy(update={"conditions_per_scenario": 4})
    assert odd.rollout_conditions(1) == [grid[4], grid[5], grid[0], grid[1]]  # wraps around the grid
    used = [c for i in range(6) for c in odd.rollout_conditions(i)]
    assert all(used.count(c) == 4 for c in grid)  # every condition equally often over a full cycle
    assert SelectorConfig().rollout_conditions(3) == [(1.0, 1.0)]


def _binned(rule: str, met_per_bin: list[float], inputs: np.ndarray) -> GroupRollout:
    bins = np.asarray(met_per_bin, dtype=np.float64)
    return GroupRollout(
        "s", 0, "g1", rule, inputs.astype(np.float32), float(bins.sum()) / 40.0, 10.0, 0.0,
        decision_s=np.arange(1, len(inputs) + 1) * 10.0, bin_s=10.0, met_weighted_per_bin=bins,
    )  # fmt: skip


def test_a_window_sums_the_goodput_of_the_requests_arriving_in_it_and_stops_at_the_episode_end() -> None:
    rollout = _binned("dynamo-legacy", [1.0, 2.0, 3.0, 4.0], _inputs(0.0, 3))  # decisions at 10, 20, 30 s
    np.testing.assert_allclose(window_goodput(rollout, 1), [2.0, 3.0, 4.0])
    np.testing.assert_allclose(window_goodput(rollout, 2), [5.0, 7.0, 4.0])
    with pytest.raises(ValueError, match="window_intervals must be >= 1"):
        window_goodput(rollout, 0)
    with pytest.raises(ValueError, match="scenario s rule aggregated: the rollout has no per-interval record"):
        window_goodput(_rollout("g1", "aggregated", 1.0, _inputs(0.0)), 2)


def test_windowed_labels_follow_the_rule_that_wins_where_it_happens() -> None:
    """Legacy wins the episode, aggregated the incident in its middle: the episode label says legacy everywhere,
    the windowed label says aggregated during the incident and nothing where no rule met an objective."""
    legacy = _binned("dynamo-legacy", [0.0, 9.0, 1.0, 9.0, 9.0], _inputs(0.0, 4))
    aggregated = _binned("aggregated", [0.0, 5.0, 4.0, 5.0, 5.0], _inputs(1.0, 4))
    whole = selector_targets([legacy, aggregated], RULES, 0.05)
    assert (whole.ratios.argmax(1) == 0).all()
    data = selector_targets([legacy, aggregated], RULES, 0.05, window_intervals=1)
    np.testing.assert_allclose(data.ratios[:4], [[1.0, 5 / 9], [0.25, 1.0], [1.0, 5 / 9], [1.0, 5 / 9]])
    assert len(data.inputs) == 8  # both rules' four decisions; every window has some goodput
    np.testing.assert_allclose(data.weights[:4] / data.weights[0], [1.0, 4 / 9, 1.0, 1.0])  # by the best's goodput
    empty = _binned("dynamo-legacy", [0.0, 0.0, 1.0, 0.0, 0.0], _inputs(0.0, 4))
    data = selector_targets([empty, _binned("aggregated", [0.0] * 5, _inputs(1.0, 4))], RULES, 0.05, 1)
    assert len(data.inputs) == 2  # only the window with goodput is labelled, once per rule's rollout


def test_equal_window_weights_weigh_every_labelled_window_of_a_group_the_same() -> None:
    """The incident window weighs 4/9 of the others by goodput, the same as them with equal weights; the windows
    where nothing met an objective are still left out, and the group still weighs what it did in all."""
    legacy = _binned("dynamo-legacy", [0.0, 9.0, 1.0, 0.0, 9.0], _inputs(0.0, 4))
    aggregated = _binned("aggregated", [0.0, 5.0, 4.0, 0.0, 5.0], _inputs(1.0, 4))
    by_goodput = selector_targets([legacy, aggregated], RULES, 0.05, window_intervals=1)
    equal = selector_targets([legacy, aggregated], RULES, 0.05, window_intervals=1, equal_window_weights=True)
    np.testing.assert_array_equal(by_goodput.ratios, equal.ratios)
    assert len(equal.inputs) == 6  # three labelled windows per rule
    np.testing.assert_allclose(by_goodput.weights[:3] / by_goodput.weights[0], [1.0, 4 / 9, 1.0])
    np.testing.assert_allclose(equal.weights, np.ones(6))


def _transferring(intervals: int, known_at: list[int], value: float) -> np.ndarray:
    x = _inputs(float(value), intervals)
    for column, flag in TRANSFER_COLUMNS:
        x[known_at, column] = value
        x[known_at, flag] = 1.0
    return x


def test_unknown_transfer_features_are_taken_from_a_sibling_rollout_of_the_same_interval() -> None:
    """Aggregated transfers nothing; legacy saw the network at intervals 0 and 2, isl at 1 and 2."""
    aggregated = _transferring(4, [], 0.0)
    legacy = _transferring(4, [0, 2], 3.0)
    isl = _transferring(4, [1, 2], 5.0)
    filled = shared_transfer_inputs([aggregated, legacy, isl])
    value, flag = TRANSFER_COLUMNS[0]
    np.testing.assert_array_equal(filled[0][:, value], [3.0, 5.0, 3.0, 0.0])  # the first rule that knew it
    np.testing.assert_array_equal(filled[0][:, flag], [1.0, 1.0, 1.0, 0.0])  # nobody saw interval 3
    np.testing.assert_array_equal(filled[1][:, value], [3.0, 5.0, 3.0, 0.0])  # what a rollout saw is kept
    np.testing.assert_array_equal(filled[2][:, value], [3.0, 5.0, 5.0, 0.0])
    others = [c for c in range(GROUP_INPUT_WIDTH) if all(c not in pair for pair in TRANSFER_COLUMNS)]
    for before, after in zip([aggregated, legacy, isl], filled, strict=True):
        np.testing.assert_array_equal(before[:, others], after[:, others])  # nothing else is touched
    np.testing.assert_array_equal(aggregated[:, flag], 0.0)  # the inputs themselves are not modified
    # Through the labels: only with share_transfer do the aggregated samples see the network.
    rollouts = [_rollout("g1", "dynamo-legacy", 4.0, legacy), _rollout("g1", "aggregated", 2.0, aggregated)]
    plain = selector_targets(rollouts, RULES, 0.05)
    shared = selector_targets(rollouts, RULES, 0.05, share_transfer=True)
    assert plain.inputs[4:, flag].sum() == 0.0
    np.testing.assert_array_equal(shared.inputs[4:, flag], [1.0, 0.0, 1.0, 0.0])


def test_own_rule_labels_keep_each_rollouts_states_for_its_own_rules_output_only() -> None:
    """The same samples, ratios and weights; the mask leaves out every ratio measured from another rule's state."""
    rollouts = [
        _rollout("g1", "dynamo-legacy", 4.0, _inputs(0.0, 2)),
        _rollout("g1", "aggregated", 2.0, _inputs(1.0, 2)),
        _rollout("g2", "dynamo-legacy", 1.0, _inputs(2.0, 3)),
        _rollout("g2", "aggregated", 3.0, _inputs(3.0, 3)),
    ]
    every = selector_targets(rollouts, RULES, 0.05)
    own = selector_targets(rollouts, RULES, 0.05, own_rule_labels=True)
    for name in ("inputs", "ratios", "targets", "weights"):
        np.testing.assert_array_equal(getattr(every, name), getattr(own, name))
    np.testing.assert_array_equal(every.label_mask, np.ones((10, 2), dtype=np.float32))
    legacy_state = np.isin(own.inputs[:, 0], [0.0, 2.0])  # the states legacy's own rollouts reached
    np.testing.assert_array_equal(own.label_mask[legacy_state], [[1.0, 0.0]] * 5)
    np.testing.assert_array_equal(own.label_mask[~legacy_state], [[0.0, 1.0]] * 5)


def test_a_fit_on_own_rule_labels_ignores_the_ratios_it_leaves_out() -> None:
    """Rewriting every masked-out ratio changes nothing in the fit; rewriting a kept one does."""
    rollouts = []
    for i in range(8):
        rollouts += [
            _rollout(f"g{i}", "dynamo-legacy", 1.0 + i % 3, _inputs(float(i), 2)),
            _rollout(f"g{i}", "aggregated", 2.0, _inputs(float(i) + 0.5, 2)),
        ]
    data = selector_targets(rollouts, RULES, 0.05, own_rule_labels=True)
    kwargs = {"hidden_width": 8, "epochs": 5, "learning_rate": 1e-2, "weight_decay": 0.0, "batch_size": 4, "seed": 0}
    base = fit_selector(data, **kwargs)  # type: ignore[arg-type]
    masked_out = data.ratios.copy()
    masked_out[data.label_mask == 0] = 0.123
    same = fit_selector(replace(data, ratios=masked_out), **kwargs)  # type: ignore[arg-type]
    kept = data.ratios.copy()
    kept[data.label_mask == 1] = 0.123
    other = fit_selector(replace(data, ratios=kept), **kwargs)  # type: ignore[arg-type]
    for name, value in base.tensors.items():
        np.testing.assert_array_equal(same.tensors[name], value)
    assert not np.array_equal(other.tensors["out.bias"], base.tensors["out.bias"])
    plain = fit_selector(replace(data, label_mask=np.ones_like(data.label_mask)), **kwargs)  # type: ignore[arg-type]
    assert not np.array_equal(plain.tensors["out.bias"], base.tensors["out.bias"])


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


def test_an_ensemble_fit_is_its_members_fits_and_scores_by_their_mean_predicted_ratio() -> None:
    rollouts = []
    for i in range(12):
        high = i % 2 == 1
        x = _inputs(1.0 if high else 0.0)
        rollouts += [
            _rollout(f"g{i}", "dynamo-legacy", 1.0 if not high else 0.2, x),
            _rollout(f"g{i}", "aggregated", 1.0 if high else 0.1, x),
        ]
    data = selector_targets(rollouts, RULES, 0.05)
    kwargs = {"hidden_width": 8, "epochs": 30, "learning_rate": 1e-2, "weight_decay": 0.0, "batch_size": 16}
    ensemble = fit_selector(data, seed=3, members=2, **kwargs)  # type: ignore[arg-type]
    singles = [fit_selector(data, seed=s, **kwargs) for s in (3, 4)]  # type: ignore[arg-type]
    for k, single in enumerate(singles):  # member k is the single fit from seed 3 + k, tensor for tensor
        for name, value in single.tensors.items():
            np.testing.assert_array_equal(ensemble.tensors[f"m{k}.{name}"], value)
    network = SelectorNetwork.from_tensors(ensemble.tensors, len(RULES))
    assert network.num_members == 2
    x = np.vstack([_inputs(1.0, 1), _inputs(0.0, 1)])
    members = [SelectorNetwork.from_tensors(s.tensors, len(RULES)).scores(x) for s in singles]
    mean_ratio = np.mean([1.0 / (1.0 + np.exp(-m.astype(np.float64))) for m in members], axis=0)
    np.testing.assert_allclose(1.0 / (1.0 + np.exp(-network.scores(x))), mean_ratio, rtol=1e-6)
    assert list(network.scores(x).argmax(1)) == [1, 0]
    assert ensemble.agreement_frac == pytest.approx(1.0)
    with pytest.raises(ValueError, match="members must be >= 1"):
        fit_selector(data, seed=0, members=0, **kwargs)  # type: ignore[arg-type]


def test_a_low_ratio_expectile_scores_a_spread_rule_below_a_steady_one_as_good_on_average() -> None:
    rollouts = []
    rules = ["dynamo-legacy", "aggregated", "dynamo-isl-bounding"]
    for i in range(24):  # one state; isl-bounding best (1.0), legacy 0.6 of it, aggregated 0.9 or 0.4 (mean 0.65)
        x = _inputs(0.0)
        spread = 0.9 if i % 2 == 0 else 0.4
        rollouts += [
            _rollout(f"g{i}", "dynamo-legacy", 0.6, x),
            _rollout(f"g{i}", "aggregated", spread, x),
            _rollout(f"g{i}", "dynamo-isl-bounding", 1.0, x),
        ]
    data = selector_targets(rollouts, rules, 0.05)
    kwargs = {"hidden_width": 8, "epochs": 80, "learning_rate": 2e-2, "weight_decay": 0.0, "batch_size": 24}

    def ratios(fit: FitResult) -> np.ndarray:
        scores = SelectorNetwork.from_tensors(fit.tensors, len(rules)).scores(_inputs(0.0, 1))[0]
        out: np.ndarray = 1.0 / (1.0 + np.exp(-scores.astype(np.float64)))
        return out

    plain = fit_selector(data, seed=0, **kwargs)  # type: ignore[arg-type]
    mean_fit, low_fit = ratios(plain), ratios(fit_selector(data, seed=0, ratio_expectile=0.2, **kwargs))  # type: ignore[arg-type]
    assert mean_fit[1] > mean_fit[0]  # the mean fit prefers the spread rule (0.65 against 0.6 of the best) ...
    assert low_fit[1] < low_fit[0]  # ... a low expectile the steady one
    assert low_fit[0] == pytest.approx(mean_fit[0], abs=0.03)  # a steady rule's expectiles are its mean
    for name, value in fit_selector(data, seed=0, ratio_expectile=0.5, **kwargs).tensors.items():  # type: ignore[arg-type]
        np.testing.assert_array_equal(value, plain.tensors[name])
    assert SelectorConfig().algorithm_name() == "rule_selector/ratio"  # what the manifest records
    assert SelectorConfig(ratio_expectile=0.2).algorithm_name() == "rule_selector/ratio-expectile-0.2"
    with pytest.raises(ValueError, match="ratio_expectile must be in"):
        fit_selector(data, seed=0, ratio_expectile=0.0, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ratio_expectile needs loss 'ratio'"):
        fit_selector(data, seed=0, ratio_expectile=0.3, loss="soft_best", **kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- rollouts


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


@pytest.mark.train
def test_a_rerun_with_another_label_window_refits_from_the_cached_rollouts(tmp_path: Path) -> None:
    import json

    family = _small_family(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = train(
        load_experiment(_experiment(tmp_path, family, rate_scales=[1.0, 2.0])),
        tmp_path / "run",
        tracking_uri=uri,
        progress=False,
    )
    fit = json.loads((tmp_path / "run" / "selector-fit.json").read_text())
    assert 2 * 2 < fit["labelled_groups"] <= 2 * 2 * 2  # two scenarios at two loads, two groups each, labelled apart
    config = load_experiment(
        _experiment(
            tmp_path,
            family,
            rate_scales=[1.0, 2.0],
            label_window_intervals=2,
            patience_streak="any_better",
            share_transfer=True,
            transfer_memory_s=600.0,
        )
    )
    second = train(config, tmp_path / "run", tracking_uri=uri, progress=False)
    again = json.loads((tmp_path / "run" / "selector-fit.json").read_text())
    assert again["rollout_s"] == fit["rollout_s"]  # read from OUT/rollouts.pkl, not simulated again
    assert second.wall_s >= again["rollout_s"]  # the reported time is still that of a run from scratch
    assert second.timesteps == first.timesteps
    policy = load_learned(second.artifact)
    assert isinstance(policy, RuleSelector)
    assert policy.manifest.patience_streak == "any_better"
    assert policy.manifest.transfer_memory_s == 600.0


def test_a_rollout_records_each_groups_inputs_every_interval_and_its_goodput(tmp_path: Path) -> None:
    from agents.set_training import family_split_paths

    config = load_experiment(_experiment(tmp_path, _small_family(tmp_path)))
    (path,) = family_split_paths(config, tmp_path / "scenarios", "train", 1)
    scenario = resolve_scenario(path)
    legacy = make_baseline("dynamo-legacy")
    episode = run_episode(episode_env(scenario, legacy), legacy, 0)
    intervals = episode.intervals  # the episode loop's own count
    rollouts = rule_rollout(RolloutTask(str(path), "dynamo-legacy", 0))
    assert [r.group for r in rollouts] == ["g1", "g2"]
    for r in rollouts:
        assert r.inputs.shape == (intervals, GROUP_INPUT_WIDTH)
        assert 0.0 <= r.weighted_goodput_rps <= r.offered_weighted_rps
    again = rule_rollout(RolloutTask(str(path), "dynamo-legacy", 0))
    np.testing.assert_array_equal(again[0].inputs, rollouts[0].inputs)  # seeded: the same run twice
    for r in rollouts:  # the per-interval record adds up to the episode's goodput
        assert r.decision_s is not None
        assert r.met_weighted_per_bin is not None
        assert len(r.decision_s) == intervals
        assert np.all(np.diff(r.decision_s) == scenario.control_interval_s)
        met = sum(t.priority * slo_met(episode.sim, ti) for ti, t in enumerate(scenario.tenants) if t.group == r.group)
        assert r.met_weighted_per_bin.sum() == pytest.approx(met)  # the harness's own count, request by request
        assert r.weighted_goodput_rps == pytest.approx(met / scenario.duration_s)
    doubled = rule_rollout(RolloutTask(str(path), "dynamo-legacy", 0, rate_scale=2.0))
    offered = sum(r.offered_weighted_rps for r in rollouts)
    assert sum(r.offered_weighted_rps for r in doubled) == pytest.approx(2 * offered, rel=0.2)
    assert {r.rate_scale for r in doubled} == {2.0}
    slow = rule_rollout(RolloutTask(str(path), "dynamo-legacy", 0, bandwidth_scale=0.01))
    assert {r.bandwidth_scale for r in slow} == {0.01}
    assert {r.scenario for r in slow} == {f"{scenario.name}@bw0.01"}
    assert sum(r.offered_weighted_rps for r in slow) == pytest.approx(offered)  # the same arrivals
    transfer = [value for value, _known in TRANSFER_COLUMNS]
    assert not np.array_equal(slow[0].inputs[:, transfer], rollouts[0].inputs[:, transfer])  # the link is seen


def test_rollouts_are_cached_per_task_in_the_run_folder_and_only_new_tasks_are_simulated(tmp_path: Path) -> None:
    config = load_experiment(_experiment(tmp_path, _small_family(tmp_path)))
    from agents.set_training import family_split_paths

    (path,) = family_split_paths(config, tmp_path / "scenarios", "train", 1)
    legacy = RolloutTask(str(path), "dynamo-legacy", 0)
    aggregated = RolloutTask(str(path), "aggregated", 0)
    cache = tmp_path / "run" / "rollouts.pkl"
    simulated: list[int] = []

    def count(done: int, total: int) -> None:
        simulated.append(done)

    first: list[GroupRollout]
    again: list[GroupRollout]
    both: list[GroupRollout]
    first, first_s = cached_rollouts(cache, [legacy], 1, count)
    assert cache.exists()
    assert first_s > 0
    assert simulated == [1]
    again, again_s = cached_rollouts(cache, [legacy], 1, count)
    assert simulated == [1]  # read, not simulated
    assert again_s == first_s
    np.testing.assert_array_equal(again[0].inputs, first[0].inputs)
    both, both_s = cached_rollouts(cache, [legacy, aggregated], 1, count)
    assert simulated == [1, 1]  # only the new task ran
    assert [r.rule for r in both] == ["dynamo-legacy"] * len(first) + ["aggregated"] * len(first)
    assert both_s > first_s
    assert cached_rollouts(cache, [aggregated, legacy], 1, count)[1] == pytest.approx(both_s)
    assert simulated == [1, 1]
    cache.write_bytes(b"not a pickle")
    assert cached_rollouts(cache, [aggregated], 1, count)[0][0].rule == "aggregated"
    assert simulated == [1, 1, 1]  # an unreadable cache is replaced


def test_a_stopped_run_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    config = load_experiment(_experiment(tmp_path, _small_family(tmp_path)))
    from agents.set_training import family_split_paths

    (path,) = family_split_paths(config, tmp_path / "scenarios", "train", 1)
    tasks = [RolloutTask(str(path), rule, 0) for rule in RULES]
    cache = tmp_path / "run" / "rollouts.pkl"

    def stop_after_the_first(done: int, total: int) -> None:
        if done == 1:
            raise KeyboardInterrupt  # what stopping a run by hand raises

    with pytest.raises(KeyboardInterrupt):
        cached_rollouts(cache, tasks, 1, stop_after_the_first, checkpoint_s=0.0)
    simulated: list[int] = []
    rollouts: list[GroupRollout]
    rollouts, rollout_s = cached_rollouts(cache, tasks, 1, lambda done, total: simulated.append(done))
    assert simulated == [1]  # only the task the stopped run had not finished
    assert [r.rule for r in rollouts] == [RULES[0]] * 2 + [RULES[1]] * 2
    assert rollout_s > 0


def _marking_rollout(task: RolloutTask) -> list[GroupRollout]:
    """A stand-in task for the pool's bookkeeping: marks that it started (a file), takes a moment, yields nothing."""
    Path(task.scenario_path).touch()
    time.sleep(0.5)
    return []


def test_a_stopped_pool_starts_none_of_its_queued_tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during a parallel run: the queued tasks are cancelled, not run to the end before the stop is seen."""
    monkeypatch.setattr("agents.selector_data.rule_rollout", _marking_rollout)  # forked workers inherit it
    tasks = [RolloutTask(str(tmp_path / f"task-{i}"), "dynamo-legacy", 0) for i in range(40)]

    def stop(index: int, rollouts: list[GroupRollout]) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        collect_rollouts(tasks, 2, on_task=stop)
    started = len(list(tmp_path.glob("task-*")))
    assert 1 <= started < 10  # the running ones and the few already handed to a worker, not all 40


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ({"rules": ["dynamo-legacy", "nope"]}, "unknown baseline 'nope'"),
        ({"rules": ["aggregated"]}, "rules"),
        ({"seeds": [1000]}, "selector.seeds"),
        ({"rate_scales": [0.0]}, "selector.rate_scales"),
        ({"rate_scales": [1.0, 1.0]}, "rate_scales: a scale is listed twice"),
        ({"bandwidth_scales": [0.0]}, "selector.bandwidth_scales"),
        ({"bandwidth_scales": [1.0, 0.1], "conditions_per_scenario": 3}, "conditions_per_scenario: 3 exceeds the 2"),
        ({"label_window_intervals": 0}, "selector.label_window_intervals"),
        ({"transfer_memory_s": -1}, "selector.transfer_memory_s"),
        ({"switch_patience_intervals": 101}, "selector.switch_patience_intervals"),
        ({"move_dwell_s": 60.0}, "move_dwell_s needs settle_before_judging"),
        ({"own_rule_labels": True, "loss": "soft_best"}, "own_rule_labels: needs loss: ratio"),
        ({"equal_window_weights": True}, "equal_window_weights: needs label_window_intervals"),
        ({"branch_rounds": 1}, "branch_rounds: needs label_window_intervals"),
        ({"branch_rounds": 4, "label_window_intervals": 2}, "selector.branch_rounds"),
        ({"branch_group_weight": 0.0, "label_window_intervals": 2}, "selector.branch_group_weight"),
        ({"admission_ttft_slack_frac": 0.0}, "selector.admission_ttft_slack_frac"),
        ({"ratio_expectile": 1.0}, "selector.ratio_expectile"),
        ({"ratio_expectile": 0.3, "loss": "soft_best"}, "ratio_expectile: needs loss: ratio"),
        ({"admission_ttft_slack_frac": float("nan")}, "selector.admission_ttft_slack_frac"),
    ],
)
def test_a_bad_selector_section_is_refused_naming_the_field(
    tmp_path: Path, selector: dict[str, object], message: str
) -> None:
    with pytest.raises(ExperimentError, match=message):
        load_experiment(_experiment(tmp_path, _small_family(tmp_path), **selector))


def test_a_rollout_behind_admission_is_labelled_by_what_the_rule_achieves_behind_it(tmp_path: Path) -> None:
    from agents.set_training import family_split_paths

    config = load_experiment(_experiment(tmp_path, _small_family(tmp_path)))
    (path,) = family_split_paths(config, tmp_path / "scenarios", "train", 1)
    task = RolloutTask(str(path), "dynamo-isl-bounding", 0, rate_scale=6.0)
    admitted = rule_rollout(task)
    behind = rule_rollout(replace(task, admission_ttft_slack_frac=1.0))
    # the same arrivals; refusing some of them under this overload changes what the others achieve
    assert [r.offered_weighted_rps for r in behind] == pytest.approx([r.offered_weighted_rps for r in admitted])
    assert [r.weighted_goodput_rps for r in behind] != [r.weighted_goodput_rps for r in admitted]
    assert not all(np.array_equal(a.inputs, b.inputs) for a, b in zip(admitted, behind, strict=True))
    # a slack no estimate reaches refuses nothing: the rollout is the one without the stage, interval by interval
    lenient = rule_rollout(replace(task, admission_ttft_slack_frac=1e9))
    for a, b in zip(admitted, lenient, strict=True):
        np.testing.assert_array_equal(a.inputs, b.inputs)
        assert a.weighted_goodput_rps == b.weighted_goodput_rps


@pytest.mark.train
def test_a_selector_recipe_behind_admission_runs_rolls_out_and_evaluates_behind_it(tmp_path: Path) -> None:
    import json

    import yaml
    from mlflow import MlflowClient

    from agents.gate import EVIDENCE_PATH

    path = _experiment(tmp_path, _small_family(tmp_path), admission_ttft_slack_frac=1.0)
    data = yaml.safe_load(path.read_text())
    data["register_as"] = "pdctl-selector-admission"
    path.write_text(yaml.safe_dump(data))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = train(load_experiment(path), tmp_path / "run", tracking_uri=uri, progress=False)
    assert result.registered_version == 1
    evidence = Path(MlflowClient(tracking_uri=uri).download_artifacts(result.run_id, EVIDENCE_PATH))
    # the gate's evidence says the held-out evaluation ran behind the admission stage
    assert json.loads(evidence.read_text())["scenario_set"]["admission_ttft_slack_frac"] == 1.0
    policy = load_learned(result.artifact)
    assert isinstance(policy, RuleSelector)
    assert policy.manifest.trained_behind_admission_slack_frac == 1.0
    from agents.selector_data import ROLLOUT_CACHE_NAME, _read_cache

    tasks = list(_read_cache(tmp_path / "run" / ROLLOUT_CACHE_NAME))
    assert tasks
    assert {t.admission_ttft_slack_frac for t in tasks} == {1.0}


def test_the_recipe_and_the_manifest_share_one_definition_of_how_the_selector_acts() -> None:
    """SelectorConfig and SelectorManifest both take SelectorBehaviour's fields (one set of bounds and meanings);
    a trained selector's manifest copies them from its recipe."""
    fields = set(SelectorBehaviour.model_fields)
    assert fields == {
        "switch_patience_intervals",
        "patience_streak",
        "transfer_memory_s",
        "settle_before_judging",
        "move_dwell_s",
        "routing_follows_pools",
        "switch_margin_frac",
        "switch_evidence",
        "transfer_fallback",
        "hold_while_objectives_met",
        "dwell_after_start",
        "first_decision",
        "failed_rule_bar_s",
        "trial_check_windows",
    }
    assert fields <= set(SelectorConfig.model_fields)
    assert fields <= set(SelectorManifest.model_fields)
    recipe = SelectorConfig(
        settle_before_judging=True,
        move_dwell_s=120.0,
        patience_streak="any_better",
        switch_margin_frac=0.05,
        switch_evidence="since_switch",
        transfer_fallback=True,
        hold_while_objectives_met=True,
        dwell_after_start=True,
        failed_rule_bar_s=300.0,
        trial_check_windows=6,
    )
    manifest = SelectorManifest(
        schema_version=1, feature_hash="x", rules=recipe.rules, hidden_width=4, **recipe.behaviour()
    )
    assert manifest.behaviour() == recipe.behaviour()
    with pytest.raises(ValueError, match="transfer_fallback needs the aggregated rule"):
        SelectorConfig(rules=["dynamo-legacy", "dynamo-isl-bounding"], transfer_fallback=True)
    with pytest.raises(ValueError, match="trial_check_windows needs failed_rule_bar_s"):
        SelectorConfig(trial_check_windows=6)
