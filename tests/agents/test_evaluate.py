from __future__ import annotations

import csv
import hashlib
import itertools
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from agents import evaluate as ev
from agents import grid_search as gs
from agents.planning import PlanConfig
from env.gym_env import resolve_scenario
from env.scenario import Scenario
from policies.base import Policy
from policies.registry import parse_policy_spec
from policies.route_levels import route_thresholds
from policies.schema import PoolTargets
from tests.env.helpers import tiny_scenario


@pytest.fixture
def tiny_path(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(duration_s=90.0).model_dump(mode="json")))
    return path


def test_scale_rates_scales_every_workload_kind() -> None:
    base = resolve_scenario("four-tenants-16")
    doubled = ev.scale_rates(base, 2.0)
    for before, after in zip(base.tenants, doubled.tenants, strict=True):
        assert after.workload.rate_rps == pytest.approx(2 * before.workload.rate_rps)  # type: ignore[union-attr]
    surge = ev.scale_rates(resolve_scenario("rag-surge-8"), 0.5)
    rag = next(t for t in surge.tenants if t.name == "rag").workload
    assert [s.rate_rps for s in rag.segments] == pytest.approx([0.15, 0.75, 0.15])  # type: ignore[union-attr]
    chat = ev.scale_rates(resolve_scenario("chatbot-8"), 0.5).tenants[0].workload
    assert chat.rate_scale == pytest.approx(0.65)  # type: ignore[union-attr]
    diurnal = ev.scale_rates(resolve_scenario("diurnal-chat-rag-8"), 3.0).tenants[0].workload
    assert diurnal.mean_rate_rps == pytest.approx(6.6)  # type: ignore[union-attr]
    assert ev.scale_rates(base, 1.0) is base


def test_scenario_paths_resolve_suites_names_and_refuse_unknowns() -> None:
    assert [p.stem for p in ev.scenario_paths(["suite:static"])][:2] == ["chatbot-8", "agent-tools-8"]
    assert len(ev.scenario_paths(["suite:dynamic", "rag-surge-8"])) == 6
    with pytest.raises(ValueError, match="unknown suite"):
        ev.scenario_paths(["suite:nope"])
    with pytest.raises(ValueError, match="no such file"):
        ev.scenario_paths(["no-such-scenario"])


def test_every_baseline_spec_builds_a_policy() -> None:
    scenario = resolve_scenario("four-tenants-16")
    specs = ev.all_baseline_specs()
    assert "grid:" in specs
    assert ev.SEED_POLICY_SPEC in specs
    for spec in specs:
        if spec == "grid:":
            continue
        assert isinstance(ev.make_policy(spec, scenario), Policy)
    with pytest.raises(ValueError, match="unknown baseline"):
        ev.make_policy("baseline:nope", scenario)


def test_profiled_throughputs_are_positive_and_prefill_heavier() -> None:
    prefill, decode = ev.profiled_throughputs(resolve_scenario("rag-surge-8"))
    assert math.isfinite(prefill)
    assert 0 < decode < prefill


def test_run_scores_tenants_and_total(tiny_path: Path) -> None:
    result = ev.run_one(ev.RunSpec("baseline:vllm-proxy", str(tiny_path), 0, record=True))
    rows = {r["tenant"]: r for r in result.rows}
    assert set(rows) == {"chat0", "rag0", "ALL"}
    total = rows["ALL"]
    assert total["arrived"] == rows["chat0"]["arrived"] + rows["rag0"]["arrived"] > 0
    assert 0.0 <= total["slo_attainment_frac"] <= 1.0
    assert total["weighted_goodput_rps"] == pytest.approx(
        2 * rows["chat0"]["goodput_rps"] + rows["rag0"]["goodput_rps"]
    )
    duration_s = total["gpu_seconds"] / 8
    assert total["offered_weighted_rps"] == pytest.approx(
        (2 * rows["chat0"]["arrived"] + rows["rag0"]["arrived"]) / duration_s
    )
    assert total["offered_weighted_rps"] >= total["weighted_goodput_rps"]
    assert total["gpu_seconds"] == pytest.approx(8 * 90.0)  # pools held: 4 instances x TP2 for the whole episode
    assert total["churn_changes"] == 0
    assert total["transfer_bytes"] > 0  # vllm-proxy ships every prompt
    assert len(result.timeline) == 8
    assert result.samples["chat0/ttft_s"] == sorted(result.samples["chat0/ttft_s"])
    again = ev.run_one(ev.RunSpec("baseline:vllm-proxy", str(tiny_path), 0))
    assert again.rows == result.rows
    other = ev.run_one(ev.RunSpec("baseline:vllm-proxy", str(tiny_path), 1))
    assert other.rows != result.rows


def test_aggregated_baseline_moves_pools_through_the_guard(tiny_path: Path) -> None:
    result = ev.run_one(ev.RunSpec("baseline:aggregated", str(tiny_path), 0, record=True))
    prefill = [row["g0/prefill"] for row in result.timeline]
    assert prefill[0] == 2
    assert prefill[-1] == 0
    assert all(a - b in (0, 1) for a, b in itertools.pairwise(prefill))  # one instance per tick at most
    assert next(r for r in result.rows if r["tenant"] == "ALL")["churn_changes"] == 4


def test_crashing_run_is_reported_not_raised(tiny_path: Path) -> None:
    result = ev.run_one_safe(ev.RunSpec("learned:/no/such/artifact", str(tiny_path), 0))
    assert result.rows == []
    assert result.error is not None
    assert result.error.startswith("PolicySpecError: policy spec 'learned:/no/such/artifact': ")
    assert "manifest.json: missing" in result.error


def test_aggregate_mean_and_student_t_interval() -> None:
    rows = []
    for seed, value in enumerate([1.0, 2.0, 3.0]):
        row = {"policy": "p", "scenario": "s", "rate_scale": 1.0, "tenant": "ALL", "seed": seed}
        row.update(dict.fromkeys(ev.METRICS))
        row["goodput_rps"] = value
        rows.append(row)
    (agg,) = ev.aggregate(rows)
    assert agg["num_seeds"] == 3
    assert agg["goodput_rps_mean"] == pytest.approx(2.0)
    assert agg["goodput_rps_ci95"] == pytest.approx(4.302653 / math.sqrt(3), rel=1e-5)
    assert agg["ttft_p95_s_mean"] is None


def test_grid_points_cover_splits_and_levels() -> None:
    scenario = tiny_scenario()
    points = gs.grid_points(scenario)
    assert len(points) == 1 + 3 * (len(gs.ROUTE_LEVELS) - 1)
    assert {"pools": {"g0": [0, 4]}, "route": "aggregated"} in points
    assert all(p["route"] != "aggregated" for p in points if p["pools"]["g0"][0] > 0)
    two = gs.grid_points(tiny_scenario(groups=2))
    assert len(two) == 1 + 15 * (len(gs.ROUTE_LEVELS) - 1)
    assert gs.ROUTE_LEVELS[:2] == ("aggregated", "always_remote")
    # the grid's levels are the planner's: remote>=T is a crisp threshold (policies.route_levels)
    assert all(route_thresholds(level) == PlanConfig(1, 3, level).thresholds() for level in gs.ROUTE_LEVELS[1:])


def test_grid_search_is_cached_and_picks_the_best(
    tiny_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = gs.search(tiny_path, seeds=(0,), workers=1, cache_dir=tmp_path / "cache")
    scores = [p["weighted_goodput_rps"] for p in result["points"]]
    assert result["best_score"]["weighted_goodput_rps"] == max(scores)
    assert len(result["points"]) + len(result["errors"]) == len(gs.grid_points(resolve_scenario(tiny_path)))

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cache should have answered")

    monkeypatch.setattr(gs, "run_many", boom)
    assert gs.search(tiny_path, seeds=(0,), workers=1, cache_dir=tmp_path / "cache") == result
    top = gs.best_points(tiny_path, 3, seeds=(0,), workers=1, cache_dir=tmp_path / "cache")
    score = {(json.dumps(p["pools"]), p["route"]): p["weighted_goodput_rps"] for p in result["points"]}
    assert sorted((score[json.dumps(p["pools"]), p["route"]] for p in top), reverse=True) == sorted(scores)[-3:][::-1]
    # the grid policy starts from the scenario's deployment like every policy and walks (guarded) to its split
    point = {"pools": {"g0": [0, 4]}, "route": "local"}
    timeline = ev.run_one(ev.RunSpec("grid:", str(tiny_path), 0, record=True, grid_point=point)).timeline
    assert timeline[0]["g0/prefill"] == 2
    assert timeline[-1]["g0/prefill"] == 0


def test_a_grid_of_several_groups_is_searched_group_by_group_above_the_exhaustive_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = tiny_scenario(duration_s=60.0), tiny_scenario(duration_s=60.0, groups=2, name="tiny2")
    assert gs.search_method(two) == "exhaustive"  # 91 configurations: within the limit
    monkeypatch.setattr(gs, "MAX_EXHAUSTIVE_POINTS", 20)
    assert gs.search_method(one) == "exhaustive"  # one group: never split up
    assert gs.search_method(two) == "per_group"
    assert gs.search_method(two, "exhaustive") == "exhaustive"
    # a cached exhaustive search is never answered for a per-group one, nor the other way round
    assert gs._cache_key(two, (0,), "exhaustive") != gs._cache_key(two, (0,), "per_group")

    path = tmp_path / "tiny2.yaml"
    path.write_text(yaml.safe_dump(two.model_dump(mode="json")))
    progress: list[tuple[int, int]] = []
    result = gs.search(
        path, seeds=(0,), workers=1, cache_dir=tmp_path / "cache", progress=lambda d, t: progress.append((d, t))
    )
    assert result["method"] == "per_group"
    levels = len(gs.ROUTE_LEVELS) - 1
    # the scan (4 splits per group, every level), 4 combinations per level run whole, and aggregated serving
    most = levels * 4 + levels * gs.CONFIRMED_PER_LEVEL + 1
    assert levels * 4 < result["runs"] <= most == gs._per_group_runs(two, (0,))
    assert result["runs"] < len(gs.grid_points(two))
    assert progress[-1] == (result["runs"], result["runs"])
    assert result["best_score"]["weighted_goodput_rps"] == max(p["weighted_goodput_rps"] for p in result["points"])
    assert {"pools": {"g0": [0, 4], "g1": [0, 4]}, "route": "aggregated"} in [
        {"pools": p["pools"], "route": p["route"]} for p in result["points"]
    ]
    # with no transfer failures to draw, the groups are independent: every configuration run whole scores exactly
    # the sum of its groups' scan estimates, and each level's first candidate combines each group's best split
    scan = result["scan"]
    for point in result["points"]:
        if point["route"] == "aggregated":
            continue
        estimate = sum(
            next(e["weighted_goodput_rps"] for e in scan[point["route"]][g] if e["split"] == split)
            for g, split in point["pools"].items()
        )
        assert point["weighted_goodput_rps"] == pytest.approx(estimate, rel=1e-9, abs=1e-9), point
    for level, by_group in scan.items():
        best = {g: ranked[0]["split"] for g, ranked in by_group.items()}
        if any(split[0] for split in best.values()):
            assert next(p for p in result["points"] if p["route"] == level)["pools"] == best
        else:  # without a prefill instance the combination is aggregated serving, as in the exhaustive grid
            assert all(
                p["route"] == "aggregated" for p in result["points"] if not any(s[0] for s in p["pools"].values())
            )


def test_sweep_brackets_the_target(tiny_path: Path) -> None:
    (record,) = ev.sweep_rate([tiny_path], ["baseline:vllm-proxy"], [0], iterations=1, workers=1)
    points = dict(record["points"])
    assert record["max_rate_scale"] > 0
    assert points[record["max_rate_scale"]] >= 0.9
    assert record["first_failing_scale"] is None or points[record["first_failing_scale"]] < 0.9
    assert record["simulator_sha256"] == ev.simulator_digest()  # capacity_table.py refuses to pool two simulators


def test_cli_writes_tables_and_refuses_bad_specs(tiny_path: Path, tmp_path: Path) -> None:
    from pdctl.cli import app

    out = tmp_path / "out"
    runner = CliRunner()
    args = ["evaluate", "--scenarios", str(tiny_path), "--seeds", "0,1", "--out", str(out), "--workers", "1"]
    result = runner.invoke(app, [*args, "--policies", "baseline:vllm-proxy,baseline:aggregated", "--no-plots"])
    assert result.exit_code == 0, result.output
    payload = json.loads((out / "results.json").read_text())
    assert {r["policy"] for r in payload["aggregate"]} == {"baseline:vllm-proxy", "baseline:aggregated"}
    assert payload["command"].startswith("pdctl evaluate")
    assert (out / "results.csv").read_text().startswith("policy,scenario,rate_scale,tenant,num_seeds")
    assert "best baseline" in (out / "ranking.md").read_text()
    # every row names the exact scenario file it was measured on
    with (out / "results.csv").open(newline="") as handle:
        written = list(csv.DictReader(handle))
    assert {row["scenario_sha256"] for row in written} == {hashlib.sha256(tiny_path.read_bytes()).hexdigest()}
    # ... and the simulator that measured it
    assert {row["simulator_sha256"] for row in written} == {ev.simulator_digest()}
    assert len(ev.simulator_digest()) == 16
    bad = runner.invoke(app, [*args, "--policies", "baseline:nope"])
    assert bad.exit_code == 2
    assert "unknown baseline" in bad.output
    # --seeds takes ranges as `pdctl scenarios generate` does, and a bad one is named in one line
    ranged = runner.invoke(app, [*args[:3], "--seeds", "0..1", *args[5:], "--policies", "baseline:aggregated"])
    assert ranged.exit_code == 0, ranged.output
    assert {r["num_seeds"] for r in json.loads((out / "results.json").read_text())["aggregate"]} == {2}
    bad_seeds = runner.invoke(app, [*args[:3], "--seeds", "0,x", *args[5:], "--policies", "baseline:aggregated"])
    assert bad_seeds.exit_code == 2
    assert "pdctl evaluate: --seeds: 'x' is not a seed or a range A..B" in bad_seeds.output


SUMMARIZE = Path(__file__).resolve().parents[2] / "experiments" / "results" / "families" / "summarize.py"
TABLE_HEADER = "policy,scenario,rate_scale,tenant,weighted_goodput_rps_mean,gpu_seconds_mean"


def _summarize(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SUMMARIZE), *map(str, args)], capture_output=True, text=True)


def _tables(tmp_path: Path, column: str) -> tuple[Path, Path, Path]:
    """A rule's row and a policy's row digest ``aaaa`` in ``column`` (1.5x), and the policy's row digest ``bbbb``."""
    header = f"{TABLE_HEADER},{column}\n"
    rules, same, other = tmp_path / "rules.csv", tmp_path / "same.csv", tmp_path / "other.csv"
    rules.write_text(header + "baseline:aggregated,default-1,1.0,ALL,2.0,3600,aaaa\n")
    same.write_text(header + "learned:x,default-1,1.0,ALL,3.0,3600,aaaa\n")
    other.write_text(header + "learned:x,default-1,1.0,ALL,3.0,3600,bbbb\n")
    ok = _summarize(rules, same, "--policy", "learned:x")
    assert ok.returncode == 0, ok.stderr
    assert "| learned:x | 1.500 |" in ok.stdout
    return rules, same, other


def test_summaries_refuse_to_compare_results_of_different_scenario_files(tmp_path: Path) -> None:
    """Two result tables that measured default-1 on different files (a regenerated family) are not compared."""
    rules, same, other = _tables(tmp_path, "scenario_sha256")
    # a second seed's runs of the same files: pooled with --pool-seeds (mean goodput 2.0 / 2.0 = 1.0)
    seed1 = tmp_path / "seed1.csv"
    seed1.write_text(
        f"{TABLE_HEADER},scenario_sha256\n"
        "learned:x,default-1,1.0,ALL,1.0,3600,aaaa\nbaseline:aggregated,default-1,1.0,ALL,2.0,3600,aaaa\n"
    )
    pooled = _summarize(rules, same, seed1, "--pool-seeds", "--policy", "learned:x")
    assert pooled.returncode == 0, pooled.stderr
    assert "| learned:x | 1.000 |" in pooled.stdout
    refused = _summarize(rules, other, "--policy", "learned:x")
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines() == [
        f"{other}: scenario default-1 was measured on another file than in {rules} (sha256 bbbb vs aaaa); "
        "regenerate and re-run one of them"
    ]


def test_summaries_refuse_to_compare_results_of_different_simulators(tmp_path: Path) -> None:
    """Rows measured by two simulators (an engine fix in between) are not compared, nor with unrecorded ones."""
    rules, _, other = _tables(tmp_path, "simulator_sha256")
    refused = _summarize(rules, other, "--policy", "learned:x")
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines() == [
        f"{other}: measured by simulator bbbb, {rules} by aaaa (the simulator_sha256 column); "
        "results of two simulators are not compared"
    ]
    unrecorded = tmp_path / "unrecorded.csv"
    unrecorded.write_text(f"{TABLE_HEADER}\nlearned:x,default-1,1.0,ALL,3.0,3600\n")
    mixed = _summarize(rules, unrecorded, "--policy", "learned:x")
    assert mixed.returncode != 0
    assert "measured by simulator unrecorded" in mixed.stderr


@pytest.mark.slow
def test_plots_are_written(tiny_path: Path, tmp_path: Path) -> None:
    from agents.plots import plot_sweep, write_all

    evaluation = ev.evaluate([tiny_path], ["baseline:vllm-proxy", "baseline:aggregated"], [0, 1], workers=1)
    paths = write_all(evaluation.aggregate, evaluation.runs, tmp_path)
    names = sorted(p.name for p in paths)
    assert names == ["cdf_tiny.png", "decisions_tiny.png", "goodput.png"]
    assert all(p.stat().st_size > 5_000 for p in paths)
    records = ev.sweep_rate([tiny_path], ["baseline:vllm-proxy"], [0], iterations=1, workers=1)
    assert plot_sweep(records, tmp_path / "sweep.png").stat().st_size > 5_000


def test_tiny_fixture_is_a_scenario() -> None:
    assert isinstance(tiny_scenario(), Scenario)


def _random_artifact(root: Path) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    from policies.action_codec import ActionCodec
    from policies.features import ObservationLayout, feature_table_hash
    from policies.learned import MANIFEST_NAME, WEIGHTS_NAME
    from policies.schema import SCHEMA_VERSION

    layout = ObservationLayout()
    codec = ActionCodec(layout)
    rng = np.random.default_rng(5)
    outputs = int(codec.nvec.sum())
    tensors = {
        "hidden.0.weight": rng.normal(size=(16, layout.size)).astype(np.float32),
        "hidden.0.bias": rng.normal(size=16).astype(np.float32),
        "action.weight": rng.normal(size=(outputs, 16)).astype(np.float32),
        "action.bias": rng.normal(size=outputs).astype(np.float32),
    }
    root.mkdir(parents=True)
    save_file(tensors, str(root / WEIGHTS_NAME))
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "feature_hash": feature_table_hash(),
        "codec_hash": codec.codec_hash(),
        "max_groups": layout.max_groups,
        "max_tenants": layout.max_tenants,
        "num_hidden_layers": 1,
    }
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    return root


def test_learned_policy_is_judged_like_the_gym_agent(tiny_path: Path, tmp_path: Path) -> None:
    """The evaluation loop (decide → guard) and the gym loop (encoded action → step) give the same episode."""
    from env.gym_env import PDClusterEnv
    from policies.learned import LearnedPolicy

    artifact = _random_artifact(tmp_path / "artifact")
    policy = LearnedPolicy.load(artifact)
    scenario = resolve_scenario(tiny_path)
    via_decide, via_step = PDClusterEnv(scenario), PDClusterEnv(scenario)
    via_decide.reset(seed=3)
    obs, _ = via_step.reset(seed=3)
    for _ in range(via_step.num_steps):
        a = via_decide.control(policy.decide(via_decide.observation(), via_decide.policy_context()))
        obs, reward, _, _, _ = via_step.step(policy.act(obs, via_step.action_masks()))
        assert reward == pytest.approx(a.reward)
        assert via_step.current_pools() == via_decide.current_pools()
        assert via_step.thresholds == via_decide.thresholds
    # the random network does act: thresholds and pools move away from the start
    assert via_decide.thresholds != via_decide.base_thresholds
    assert via_decide.current_pools()["g0"] != PoolTargets(2, 2)
    result = ev.run_one(ev.RunSpec(f"learned:{artifact}", str(tiny_path), 3))
    assert result.error is None
    assert next(r for r in result.rows if r["tenant"] == "ALL")["arrived"] > 0


def test_learned_policy_refuses_a_scenario_larger_than_its_layout_in_one_line(tmp_path: Path) -> None:
    """Rule policies run three groups / six tenants; the learned policy (2 / 4 slots) is refused, clearly."""
    artifact = _random_artifact(tmp_path / "artifact")
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(duration_s=30.0, groups=3, name="big").model_dump(mode="json")))
    rule = ev.run_one(ev.RunSpec("baseline:dynamo-legacy", str(path), 0))
    assert rule.error is None
    assert next(r for r in rule.rows if r["tenant"] == "ALL")["arrived"] > 0
    for spec in (f"learned:{artifact}", f"watchdog:learned:{artifact}"):
        refused = ev.run_one_safe(ev.RunSpec(spec, str(path), 0))
        assert refused.rows == []
        assert refused.error == (
            f"ValueError: policy {spec}: scenario big: 3 groups / 6 tenants exceed the layout's 2 / 4 slots"
        )


def test_cli_reports_refused_runs_and_exits_non_zero_when_nothing_ran(tmp_path: Path) -> None:
    from pdctl.cli import app

    artifact = _random_artifact(tmp_path / "artifact")
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(duration_s=30.0, groups=3, name="big").model_dump(mode="json")))
    args = ["evaluate", "--scenarios", str(path), "--seeds", "0", "--workers", "1"]
    refused = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "none"), "--policies", f"learned:{artifact}"])
    assert refused.exit_code == 1, refused.output
    assert refused.exception is None or isinstance(refused.exception, SystemExit)
    assert f"learned:{artifact} on big seed 0: ValueError: policy learned:" in refused.output
    assert "none of the 1 runs ran" in refused.output
    assert not (tmp_path / "none" / "goodput.png").exists()
    mixed = CliRunner().invoke(
        app, [*args, "--out", str(tmp_path / "some"), "--policies", f"baseline:aggregated,learned:{artifact}"]
    )
    assert mixed.exit_code == 0, mixed.output
    assert "1 of 2 runs raised" in mixed.output
    assert (tmp_path / "some" / "goodput.png").exists()


def test_learned_summary_compares_with_best_baseline_grid_and_ceiling() -> None:
    from pdctl.commands.evaluate import _learned_summary

    def row(policy: str, goodput: float) -> dict[str, Any]:
        return {
            "policy": policy,
            "weighted_goodput_rps_mean": goodput,
            "weighted_goodput_rps_ci95": 0.1,
            "offered_weighted_rps_mean": 10.0,
        }

    rows = [row("grid:", 6.0), row("learned:/x/my-policy", 5.5), row("baseline:a", 5.0), row("baseline:b", 4.0)]
    table = _learned_summary({"rag-surge-8": rows, "chatbot-8": rows})
    lines = table.splitlines()
    assert len(lines) == 4  # header, rule, one row per scenario (dynamic first)
    assert "rag-surge-8 | dynamic" in lines[2]
    assert "chatbot-8 | static" in lines[3]
    assert "| 5.50 ± 0.10 |" in lines[2]
    assert "| 1.100× |" in lines[2]  # 5.5 / best baseline 5.0
    assert "| 0.917× |" in lines[2]  # 5.5 / grid 6.0
    assert lines[2].endswith("| 55.0 % |")  # of the ceiling 10.0
    assert _learned_summary({"rag-surge-8": [row("baseline:a", 5.0)]}) == ""


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("watchdog:learned:/x/p", ("baseline:dynamo-legacy", "learned:/x/p")),
        ("watchdog[baseline:aggregated]:baseline:vllm-proxy", ("baseline:aggregated", "baseline:vllm-proxy")),
        ("watchdog[file:a.yaml]:file:b.yaml", ("file:a.yaml", "file:b.yaml")),
    ],
)
def test_watchdog_specs_parse(spec: str, expected: tuple[str, str]) -> None:
    parsed = parse_policy_spec(spec)
    assert (parsed.kind, parsed.fallback, parsed.argument) == ("watchdog", *expected)


PRIMARY_MUST = "the watchdog's primary must be baseline:NAME, file:PATH, learned:PATH or registry:models:/NAME@ALIAS"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("watchdog", "expected watchdog:PRIMARY or watchdog[FALLBACK]:PRIMARY"),
        ("watchdog[baseline:aggregated]learned:x", "expected watchdog:PRIMARY or watchdog[FALLBACK]:PRIMARY"),
        ("watchdog:expert:12", PRIMARY_MUST),
        ("watchdog:grid:", PRIMARY_MUST),
        ("watchdog:baseline:", PRIMARY_MUST),
        ("watchdog[learned:x]:baseline:aggregated", "the watchdog's fallback must be baseline:NAME or file:PATH"),
    ],
)
def test_bad_watchdog_specs_are_refused_in_one_line(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(f'policy spec {spec!r}: {message}')}$"):
        parse_policy_spec(spec)


def test_watchdog_runs_hand_a_failing_primary_to_the_fallback(tiny_path: Path, tmp_path: Path) -> None:
    from pdctl.cli import app

    # Overload the tiny scenario so that every policy misses objectives: the watchdog must trip over the
    # primary and its runs differ from the primary's own.
    scenario = tiny_scenario(duration_s=180.0, rate_rps=30.0)
    path = tmp_path / "hot.yaml"
    path.write_text(yaml.safe_dump(scenario.model_dump(mode="json")))
    spec = "watchdog[baseline:aggregated]:baseline:vllm-proxy"
    policy = ev.make_policy(spec, resolve_scenario(path))
    assert policy.policy_id == "watchdog[baseline:aggregated]:baseline:vllm-proxy"
    plain = ev.run_one(ev.RunSpec("baseline:vllm-proxy", str(path), 0, record=True))
    watched = ev.run_one(ev.RunSpec(spec, str(path), 0, record=True))
    plain_all = next(r for r in plain.rows if r["tenant"] == "ALL")
    watched_all = next(r for r in watched.rows if r["tenant"] == "ALL")
    # After the trip, aggregated routes every prompt locally: far fewer KV bytes cross the network.
    assert watched_all["transfer_bytes"] < 0.8 * plain_all["transfer_bytes"]
    assert watched.watchdog["trips"] >= 1
    assert 0 < watched.watchdog["fallback_intervals"] < len(watched.timeline)  # after the first 4 + 1 intervals
    assert plain.watchdog == {}
    out = tmp_path / "out"
    args = ["evaluate", "--scenarios", str(path), "--seeds", "0", "--out", str(out), "--workers", "1", "--no-plots"]
    result = CliRunner().invoke(app, [*args, "--policies", f"baseline:vllm-proxy,{spec}"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "results.json").read_text())["watchdog"] == {f"{spec}|tiny|0": watched.watchdog}
    ranking = (out / "ranking.md").read_text()
    assert "| vllm-proxy + watchdog (aggregated) | tiny |" in ranking  # its own row in "Learned policies"
    assert "| tiny | vllm-proxy |" in ranking  # never the best baseline
    bad = CliRunner().invoke(app, [*args, "--policies", "watchdog:expert:3"])
    assert bad.exit_code == 2
    assert "the watchdog's primary must be" in bad.output


def test_admission_runs_are_labelled_and_refuse_at_the_door(tiny_path: Path, tmp_path: Path) -> None:
    from pdctl.cli import app

    heavy = tmp_path / "heavy.yaml"
    heavy.write_text(yaml.safe_dump(ev.scale_rates(resolve_scenario(tiny_path), 16.0).model_dump(mode="json")))
    off = ev.run_one(ev.RunSpec("baseline:aggregated", str(heavy), 0))
    on = ev.run_one(ev.RunSpec("baseline:aggregated", str(heavy), 0, admission_ttft_slack_frac=1.0))
    total_off = next(r for r in off.rows if r["tenant"] == "ALL")
    total_on = next(r for r in on.rows if r["tenant"] == "ALL")
    assert total_off["policy"] == "baseline:aggregated"
    assert total_on["policy"] == "baseline:aggregated+admission"
    assert total_off["failed"] == 0
    assert total_on["failed"] > 0  # refused at arrival, counted as missing their objectives
    assert total_on["arrived"] == total_off["arrived"]
    assert ev.RunSpec("x:y", "s", 0, admission_ttft_slack_frac=2.0).label == "x:y+admission2"
    runner = CliRunner()
    args = ["evaluate", "--scenarios", str(tiny_path), "--seeds", "0", "--out", str(tmp_path / "o"), "--no-plots"]
    bad = runner.invoke(app, [*args, "--policies", "baseline:aggregated", "--admission-slack", "0"])
    assert bad.exit_code == 2
    assert "--admission-slack" in bad.output


def test_a_selector_fitted_behind_admission_is_flagged_when_run_without_it(tiny_path: Path, tmp_path: Path) -> None:
    from pdctl.cli import app

    runner = CliRunner()
    args = ["evaluate", "--scenarios", str(tiny_path), "--seeds", "0", "--no-plots", "--policies"]
    without = runner.invoke(app, [*args, "learned:admission", "--out", str(tmp_path / "a")])
    assert without.exit_code == 0, without.output
    assert "'learned:admission' was fitted behind the admission stage" in without.output
    assert "runs here without it; --admission-slack 1 runs it as it is meant to" in without.output
    other = runner.invoke(app, [*args, "learned:admission", "--admission-slack", "2", "--out", str(tmp_path / "d")])
    assert "runs here behind slack 2" in other.output
    behind = runner.invoke(app, [*args, "learned:admission", "--admission-slack", "1", "--out", str(tmp_path / "b")])
    assert behind.exit_code == 0, behind.output
    assert "fitted behind the admission stage" not in behind.output
    default = runner.invoke(app, [*args, "learned:default", "--out", str(tmp_path / "c")])
    assert "fitted behind the admission stage" not in default.output


def test_another_guard_runs_in_the_simulator_and_names_its_rows(tiny_path: Path, tmp_path: Path) -> None:
    """``--guard FILE`` runs every policy under the limits of an operator's controller configuration."""
    from pdctl.cli import app
    from policies.guard import GuardLimits

    frozen = GuardLimits(cooldown_s=1e6)  # one pool change, then none
    default = next(
        r for r in ev.run_one(ev.RunSpec("baseline:aggregated", str(tiny_path), 0)).rows if r["tenant"] == "ALL"
    )
    held = next(
        r
        for r in ev.run_one(ev.RunSpec("baseline:aggregated", str(tiny_path), 0, guard=frozen)).rows
        if r["tenant"] == "ALL"
    )
    assert default["policy"] == "baseline:aggregated"
    assert held["policy"] == "baseline:aggregated+guard[cooldown_s=1e+06]"
    assert (default["churn_changes"], held["churn_changes"]) == (4, 2)  # two paced moves toward aggregated, then one
    swept = ev.sweep_rate(
        [tiny_path], ["baseline:aggregated"], [0], iterations=0, max_scale=2.0, workers=1, guard=frozen
    )
    assert [r["policy"] for r in swept] == ["baseline:aggregated+guard[cooldown_s=1e+06]"]
    assert ev.RunSpec("x:y", "s", 0, guard=GuardLimits()).label == "x:y"  # the defaults are not another guard
    both = ev.RunSpec("x:y", "s", 0, admission_ttft_slack_frac=1.0, guard=GuardLimits(pool_reversal_hold_s=0.0))
    assert both.label == "x:y+admission+guard[pool_reversal_hold_s=0]"

    runner = CliRunner()
    args = ["evaluate", "--scenarios", str(tiny_path), "--seeds", "0", "--no-plots", "--workers", "1"]
    controller_config = tmp_path / "controller.yaml"  # a controller configuration: its guard block is read
    controller_config.write_text(yaml.safe_dump({"mode": "active", "guard": {"cooldown_s": 1e6}}))
    out = tmp_path / "o"
    result = runner.invoke(
        app, [*args, "--policies", "baseline:aggregated", "--guard", str(controller_config), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "aggregated+guard[cooldown_s=1e+06]" in result.output  # printed as text, not read as console markup
    rows = [r for r in csv.DictReader((out / "results.csv").read_text().splitlines()) if r["tenant"] == "ALL"]
    assert [(r["policy"], float(r["churn_changes_mean"])) for r in rows] == [
        ("baseline:aggregated+guard[cooldown_s=1e+06]", 2.0)
    ]
    block = tmp_path / "guard.yaml"  # a file with only the block
    for text, message in (
        ("pool_reversal_hold_s: -1\n", "guard.pool_reversal_hold_s: Input should be greater than or equal to 0"),
        ("cooldown: 5\n", "guard.cooldown: Extra inputs are not permitted"),
        ("- 1\n", "expected a mapping of guard limits"),
    ):
        block.write_text(text)
        bad = runner.invoke(app, [*args, "--policies", "baseline:aggregated", "--guard", str(block), "--out", str(out)])
        assert bad.exit_code == 2, bad.output
        assert f"--guard {block}: {message}" in bad.output.replace("\n", " ")
    missing = runner.invoke(
        app, [*args, "--policies", "baseline:aggregated", "--guard", str(tmp_path / "no.yaml"), "--out", str(out)]
    )
    assert missing.exit_code == 2
    assert "cannot read" in missing.output
    block.write_text("hysteresis_ticks: 1\n")
    grid = runner.invoke(app, [*args, "--policies", "grid:", "--guard", str(block), "--out", str(out)])
    assert grid.exit_code == 2
    assert "--guard does not take grid: or expert: policies" in grid.output
