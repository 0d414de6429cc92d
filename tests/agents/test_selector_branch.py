"""DAgger for the rule selector: each rule branched from the selector's own states, and those samples in the fit."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from agents.config import load_experiment
from agents.policy_specs import make_policy
from agents.runs import control_interval, episode_env, run_episode, scale_rates
from agents.selector_branch import (
    BranchedGroup,
    BranchTask,
    branch,
    branched_rollout,
    find_selector,
    latest_finish_s,
    with_branches,
)
from agents.selector_data import GroupRollout, SelectorDataset, selector_targets
from agents.train import train
from env.gym_env import resolve_scenario
from policies.artifacts import load_learned
from policies.registry import DEFAULT_LEARNED_ARTIFACT
from policies.rule_selector import GROUP_INPUT_WIDTH, RuleSelector
from tests.agents.selector_recipes import experiment, small_family

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = DEFAULT_LEARNED_ARTIFACT
RULES = ("dynamo-legacy", "aggregated", "dynamo-isl-bounding", "dynamo-isl-or-load")


def _scenario(tmp_path: Path) -> Path:
    from agents.set_training import family_split_paths

    config = load_experiment(experiment(tmp_path, small_family(tmp_path)))
    (path,) = family_split_paths(config, tmp_path / "scenarios", "train", 1)
    return path


def _inputs_read(path: Path, seed: int) -> tuple[dict[int, np.ndarray], int, float]:
    """What the shipped selector's network reads, by decision index, in an unbranched run; the number of decisions
    and the simulated time of the first."""
    scenario = resolve_scenario(path)
    policy = make_policy(f"learned:{SHIPPED}", scenario, None, ())
    selector = find_selector(policy)
    scores = selector.network.scores
    read: dict[int, np.ndarray] = {}
    decided = [0]

    def recorded(inputs: np.ndarray) -> np.ndarray:
        read[decided[0]] = np.array(inputs, copy=True)
        return scores(inputs)

    def count(*_: object) -> None:
        decided[0] += 1

    object.__setattr__(selector.network, "scores", recorded)
    env = episode_env(scenario, policy)
    env.reset(seed=seed)
    first_s = env.sim.now_s
    episode = run_episode(env, policy, seed, count)
    return read, episode.intervals, first_s


def test_branch_points_keep_the_selectors_own_run_and_label_every_rule_from_its_state(tmp_path: Path) -> None:
    path = _scenario(tmp_path)
    task = BranchTask(str(path), f"learned:{SHIPPED}", "digest", RULES, 0, every_intervals=2, window_intervals=1)
    groups = branched_rollout(task)
    assert [g.group for g in groups] == ["g1", "g2"]
    scenario = resolve_scenario(path)
    interval_s = scenario.control_interval_s
    read, decisions, first_s = _inputs_read(path, 0)  # the same run without branches
    # the middle decision of every block of two (decisions 1, 3, 5, ...), if its one-interval window ends by the
    # episode's end and the network reads it (the guard asks the policy)
    points = [k for k in range(1, decisions, 2) if first_s + (k + 1) * interval_s <= scenario.duration_s + 1e-9]
    points = [k for k in points if k in read]
    assert len(points) >= 2
    for gi, group in enumerate(groups):
        np.testing.assert_allclose(group.decision_s, [first_s + k * interval_s for k in points])
        assert group.met_weighted.shape == (len(points), len(RULES))
        assert (group.met_weighted >= 0).all()
        # the branches left the selector's own run untouched: it read the same states as without them
        np.testing.assert_array_equal(group.inputs, np.stack([read[k][gi] for k in points]))
    assert max(g.met_weighted.max() for g in groups) > 0  # some rule meets some request of some window
    # the copies ran at least the window of each rule at each point, besides the selector's own run
    assert groups[0].intervals >= decisions + len(points) * len(RULES)


@pytest.mark.slow
def test_a_branched_run_behind_admission_runs_the_selector_and_every_branch_behind_it(tmp_path: Path) -> None:
    from dataclasses import replace

    path = _scenario(tmp_path)
    task = BranchTask(
        str(path), f"learned:{SHIPPED}", "digest", RULES, 0, every_intervals=2, window_intervals=1, rate_scale=6.0
    )
    admitted = branched_rollout(task)
    behind = branched_rollout(replace(task, admission_ttft_slack_frac=1.0))
    # refusing some of this overload's requests changes what the rules' branches meet
    assert not all(np.array_equal(a.met_weighted, b.met_weighted) for a, b in zip(admitted, behind, strict=True))


def _dataset() -> tuple[np.ndarray, SelectorDataset]:
    x = np.zeros((2, GROUP_INPUT_WIDTH), dtype=np.float32)
    rollouts = [
        GroupRollout("s", 0, "g1", "dynamo-legacy", x, 4.0, 10.0, 0.0),
        GroupRollout("s", 0, "g1", "aggregated", x, 2.0, 10.0, 0.0),
        GroupRollout("s", 0, "g2", "dynamo-legacy", x + 1, 1.0, 10.0, 0.0),
        GroupRollout("s", 0, "g2", "aggregated", x + 1, 3.0, 10.0, 0.0),
    ]
    return x, selector_targets(rollouts, ["dynamo-legacy", "aggregated"], 0.05)


def _branched(met: list[list[float]], value: float = 5.0) -> BranchedGroup:
    inputs = np.full((len(met), GROUP_INPUT_WIDTH), value, dtype=np.float32)
    return BranchedGroup("b", 0, "g1", 1.0, 1.0, inputs, np.asarray(met), np.arange(len(met)) * 10.0, 1.0, 10)


def test_a_branched_group_weighs_what_a_rollout_group_weighs_and_its_rows_are_its_branches_ratios() -> None:
    _, data = _dataset()
    assert isinstance(data.weights, np.ndarray)
    branched = _branched([[6.0, 2.0], [0.0, 0.0], [1.0, 3.0]])  # the middle point met nothing: no label
    out = with_branches(data, [branched], 0.05, group_weight=2.0)
    n = len(data.inputs)
    assert out.groups == data.groups + 1
    assert len(out.inputs) == n + 2
    np.testing.assert_array_equal(out.targets[:n], data.targets)  # the rollouts' samples are unchanged
    np.testing.assert_array_equal(out.ratios[:n], data.ratios)
    np.testing.assert_allclose(out.ratios[n:], [[1.0, 1 / 3], [1 / 3, 1.0]], rtol=1e-6)
    assert (out.label_mask == 1).all()
    assert out.weights.mean() == pytest.approx(1.0)
    rollout_group = out.weights[: n // 2].sum()  # g1's samples under both rules: one group
    assert out.weights[n:].sum() == pytest.approx(2.0 * rollout_group, rel=1e-5)
    # within the group, each point in proportion to its best rule's count
    assert out.weights[n] / out.weights[n + 1] == pytest.approx(6.0 / 3.0, rel=1e-5)


def test_with_branches_refuses_bad_settings_naming_them() -> None:
    _, data = _dataset()
    with pytest.raises(ValueError, match="group_weight must be > 0"):
        with_branches(data, [], 0.05, group_weight=0.0)
    with pytest.raises(ValueError, match="temperature_frac must be > 0"):
        with_branches(data, [], 0.0)
    with pytest.raises(ValueError, match="scenario b group g1: 3 rules, the dataset has 2"):
        with_branches(data, [_branched([[1.0, 2.0, 3.0]])], 0.05)


@pytest.mark.train
def test_a_dagger_round_branches_the_first_fit_and_fits_again_on_those_samples(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    config = load_experiment(
        experiment(
            tmp_path,
            small_family(tmp_path),
            label_window_intervals=2,
            branch_rounds=1,
            branch_every_intervals=3,
            branch_scenarios=1,
        )
    )
    result = train(config, tmp_path / "run", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", progress=False)
    run = tmp_path / "run"
    assert isinstance(load_learned(run / "policy-round1"), RuleSelector)
    assert isinstance(load_learned(result.artifact), RuleSelector)
    first = load_file(str(run / "policy-round1" / "weights.safetensors"))
    final = load_file(str(result.artifact / "weights.safetensors"))
    assert any(not np.array_equal(first[k], final[k]) for k in first)  # fitted again, on more samples
    fit = json.loads((run / "selector-fit.json").read_text())
    assert fit["branch_s"] > 0
    assert result.wall_s == pytest.approx(fit["rollout_s"] + fit["branch_s"] + fit["fit_s"])
    assert (run / "branches.pkl").exists()
    # A rerun reads the rollouts and the branches from the caches and reports the same run from scratch: the time
    # spent branching counts once, as branch time, and not again inside the fit time of the run that branched.
    train(config, run, tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", progress=False)
    refit = json.loads((run / "selector-fit.json").read_text())
    assert refit["branch_s"] == pytest.approx(fit["branch_s"])
    assert fit["fit_s"] < refit["fit_s"] + 0.75 * fit["branch_s"], (fit, refit)


def test_the_latest_end_that_meets_both_objectives_is_the_ttft_bound_then_one_tpot_per_further_token() -> None:
    assert latest_finish_s(10.0, 101, 2.0, 0.05) == pytest.approx(10.0 + 2.0 + 100 * 0.05)
    assert latest_finish_s(10.0, 1, 2.0, 0.05) == pytest.approx(12.0)
    assert latest_finish_s(10.0, 101, None, 0.05) == math.inf


def test_a_branch_that_stops_once_the_windows_requests_have_missed_counts_what_a_full_one_does(
    traces_dir: Path,
) -> None:
    chatbot = resolve_scenario(ROOT / "experiments" / "scenarios" / "chatbot-8.yaml", traces_dir)
    scenario = scale_rates(chatbot, 2.2)  # overloaded: requests of the window miss while still in flight
    legacy = make_policy("baseline:dynamo-legacy", scenario)
    env = episode_env(scenario, legacy, traces_dir)
    env.reset(seed=1000)
    while env.sim.now_s < 60.0 - 1e-9:
        control_interval(env, legacy)
    capped, _, capped_intervals = branch(env, RULES, 2)
    full, _, full_intervals = branch(env, RULES, 2, margin_intervals=math.inf)
    np.testing.assert_array_equal(capped, full)
    assert capped.max() > 0
    assert capped_intervals < full_intervals  # the copies stopped before the window's last request ended
