"""The lookahead expert: its choice rule, and ``expert:H`` as an evaluation policy."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from agents import evaluate as ev
from agents.lookahead import LookaheadChooser, LookaheadPolicy, StepFn
from env.gym_env import PDClusterEnv, resolve_scenario
from policies.base import Policy
from tests.env.helpers import tiny_scenario

INCIDENT = {
    "link_bandwidth_bytes_per_s": 4.5e10,
    "incidents": [{"start_s": 30, "end_s": 70, "link_bandwidth_bytes_per_s": 1.0e9, "failure_prob": 0.2}],
}
POINTS = ({"pools": {"g0": [2, 2]}, "route": "remote"}, {"pools": {"g0": [1, 3]}, "route": "remote>=4096"})


@pytest.fixture
def incident_path(tmp_path: Path) -> Path:
    """Nine control intervals; the KV-transfer network is congested and failing in the middle four."""
    path = tmp_path / "incident.yaml"
    scenario = tiny_scenario(duration_s=90.0, rate_rps=2.0, network=INCIDENT)
    path.write_text(yaml.safe_dump(scenario.model_dump(mode="json")))
    return path


Ends = list[tuple[tuple[str, int, int], ...]]


class _Scripted(LookaheadChooser):
    """The choice rule over prescribed horizon returns (one array per call) and end pool sizes."""

    def __init__(self, returns: Sequence[Sequence[float]], ends: Ends | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._script = [np.asarray(r, dtype=float) for r in returns]
        self._ends = ends

    def horizon_rollouts(self, env: PDClusterEnv, policies: Sequence[Policy], step: StepFn) -> tuple[np.ndarray, Ends]:
        returns = self._script.pop(0)
        return returns, self._ends or [(("g", 2, 2),)] * len(returns)


def _choices(chooser: LookaheadChooser, calls: int) -> list[int]:
    env = object.__new__(PDClusterEnv)
    return [chooser.choose(env, [], lambda e, p: 0.0) for _ in range(calls)]


def test_ties_keep_the_previous_choice_and_a_clear_gain_switches() -> None:
    chooser = _Scripted([[5, 4, 3], [5, 5, 3], [5, 6, 3], [6, 6, 3]], horizon_intervals=1)
    assert _choices(chooser, 4) == [0, 0, 1, 1]


def test_margin_and_default_make_the_expert_sticky() -> None:
    returns: list[list[float]] = [[10, 10.5, 3], [10, 10.9, 3], [10, 12, 3], [10, 10.2, 3]]
    sticky = _Scripted(returns, horizon_intervals=1, switch_margin_frac=0.1, default=0)
    # within 10 % of the best the default holds; a 20 % gain moves it, and it comes back as soon as it ties
    assert _choices(sticky, 4) == [0, 0, 1, 0]
    assert _choices(_Scripted(returns, horizon_intervals=1), 4) == [1, 1, 1, 1]


def test_route_margin_lets_threshold_switches_through_and_holds_pool_moves() -> None:
    """Candidates 0 and 1 keep the pools where they are; candidate 2 moves an instance."""
    ends: Ends = [(("g", 2, 2),), (("g", 2, 2),), (("g", 1, 3),)]
    returns: list[list[float]] = [[10, 10.5, 3], [10, 10.2, 11], [10, 9, 12.5], [10, 11, 10]]
    chooser = _Scripted(returns, ends, horizon_intervals=1, switch_margin_frac=0.15, route_switch_margin_frac=0.0)
    chooser.default = chooser.chosen = 0
    # a threshold-only gain is taken at once; an 8 % pool-move gain is not, a 39 % one is; moving back to the
    # default's split is a pool move too, so a 10 % gain does not undo it
    assert _choices(chooser, 4) == [1, 1, 2, 2]


def test_chooser_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="horizon_intervals"):
        LookaheadChooser(0)
    with pytest.raises(ValueError, match="switch_margin_frac"):
        LookaheadChooser(3, switch_margin_frac=1.5)
    with pytest.raises(ValueError, match="route_switch_margin_frac"):
        LookaheadChooser(3, route_switch_margin_frac=-0.1)


def _episode_return(spec: ev.RunSpec) -> float:
    result = ev.run_one(spec)
    assert result.error is None, result.error
    return float(next(r for r in result.rows if r["tenant"] == ev.ALL_TENANTS)["episode_return"])


def test_expert_with_a_whole_episode_horizon_beats_every_candidate_alone(incident_path: Path) -> None:
    """Policy improvement by rollout: with the horizon covering the episode, no candidate alone does better."""
    expert = _episode_return(ev.RunSpec("expert:9", str(incident_path), 0, candidate_points=POINTS))
    alone = [_episode_return(ev.RunSpec(name, str(incident_path), 0)) for name in ev.EXPERT_TEACHERS]
    alone += [_episode_return(ev.RunSpec("grid:", str(incident_path), 0, grid_point=p)) for p in POINTS]
    assert max(alone) - min(alone) > 5.0  # the candidates really differ on this episode
    assert expert >= max(alone) - 1e-6


def test_expert_spec_builds_its_candidates_and_refuses_to_run_unbound(incident_path: Path) -> None:
    scenario = resolve_scenario(incident_path)
    policy = ev.make_policy("expert:4", scenario, candidate_points=POINTS)
    assert isinstance(policy, LookaheadPolicy)
    assert policy.candidates == [*ev.EXPERT_TEACHERS, "grid:g0=2P2D/remote", "grid:g0=1P3D/remote>=4096"]
    env = PDClusterEnv(scenario)
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match="only in the simulator"):
        policy.decide(env.observation(), env.policy_context())
    policy.bind(env)
    for _ in range(3):
        decision = policy.decide(env.observation(), env.policy_context())
        assert decision.policy_id == "expert:4"
        assert any(decision.reason.startswith(f"{name}: ") for name in policy.candidates)  # who it acted as
        env.control(decision)
    assert sum(policy.chosen_intervals.values()) == 3
    assert set(policy.chosen_intervals) <= set(policy.candidates)
    for bad in ("expert:0", "expert:soon", "expert:500"):
        with pytest.raises(ValueError, match=f"^policy spec '{bad}': expert:H takes a horizon of 1-120"):
            ev.make_policy(bad, scenario)
    with pytest.raises(ValueError, match=r"^policy spec 'expert:': expected one of .* expert:H"):
        ev.make_policy("expert:", scenario)


def test_evaluate_gives_the_expert_its_section_and_the_best_baseline_excludes_it(
    incident_path: Path, tmp_path: Path
) -> None:
    from pdctl.cli import app

    out = tmp_path / "out"
    args = ["evaluate", "--scenarios", str(incident_path), "--seeds", "0", "--out", str(out), "--workers", "1"]
    args += ["--grid-cache", str(tmp_path / "grid"), "--no-plots"]
    runner = CliRunner()
    result = runner.invoke(app, [*args, "--policies", "baseline:vllm-proxy,expert:3"])
    assert result.exit_code == 0, result.output
    payload = json.loads((out / "results.json").read_text())
    assert {r["policy"] for r in payload["aggregate"]} == {"baseline:vllm-proxy", "expert:3"}
    (choices,) = payload["expert_choices"].values()  # the expert's run only: which candidate, how many intervals
    assert sum(choices.values()) == 8  # one per decision of the 90-s run (the first at 10 s)
    assert all(name in ev.EXPERT_TEACHERS or name.startswith("grid:g0=") for name in choices)
    ranking = (out / "ranking.md").read_text()
    summary = ranking.split("## Best baseline and headroom")[1].split("##")[0]
    assert "| tiny | vllm-proxy |" in summary  # the expert is never the "best baseline"
    assert "| expert (clairvoyant, 3 intervals) | tiny |" in ranking
    refused = runner.invoke(app, [*args, "--policies", "expert:3", "--sweep-rate"])
    assert refused.exit_code == 2
    assert "--sweep-rate does not take expert:H" in refused.output
    bad = runner.invoke(app, [*args, "--policies", "expert:x"])
    assert bad.exit_code == 2
    assert "horizon of 1-120" in bad.output


def test_imitation_expert_applies_the_route_margin_to_switches_that_keep_the_pools(incident_path: Path) -> None:
    """The ISL-or-load rule and the vLLM proxy never move pools: between them only the route margin counts."""
    from agents.pretrain import LookaheadTask, lookahead_episode
    from policies import ObservationLayout

    def chosen(margin: float, route: float | None) -> dict[str, int]:
        task = LookaheadTask(
            str(incident_path), 0, ("baseline:dynamo-isl-or-load", "baseline:vllm-proxy"), (), ObservationLayout(), 3,
            score_candidates=False, switch_margin_frac=margin, route_switch_margin_frac=route,
        )  # fmt: skip
        return lookahead_episode(task).chosen_intervals

    free = chosen(0.0, None)
    assert len(free) == 2  # the two candidates take turns on this episode
    assert chosen(1.0, None) == {"baseline:dynamo-isl-or-load": sum(free.values())}  # never leaves the first
    assert chosen(1.0, 0.0) == free
