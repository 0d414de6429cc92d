"""Training sweeps: the sweep block, the grid, the local process backend and Ray, against a real MLflow server."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from agents.config import ExperimentConfig, ExperimentError, load_experiment
from agents.sweep import SweepError, plan_trials, run_sweep
from pdctl.cli import app

SMOKE = Path(__file__).resolve().parents[2] / "experiments" / "smoke.yaml"
LEARNING_RATES = [1.0e-4, 3.0e-4]
runner = CliRunner()


def _write(tmp_path: Path, sweep: dict[str, Any] | None, **changes: Any) -> Path:
    data = yaml.safe_load(SMOKE.read_text())
    data.update(changes)
    if sweep is not None:
        data["sweep"] = sweep
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _tiny(tmp_path: Path, sweep: dict[str, Any]) -> Path:
    """The smoke experiment cut to one 64-step rollout per trial."""
    return _write(tmp_path, sweep, total_timesteps=64)


@pytest.mark.parametrize(
    ("sweep", "field"),
    [
        ({"hyperparameters": {"learning_rat": [1e-4]}}, "sweep.hyperparameters.learning_rat:"),
        ({"hyperparameters": {"learning_rate": [1e-4, -1.0]}}, "sweep.hyperparameters.learning_rate.1:"),
        ({"hyperparameters": {"n_steps": 64}}, "sweep.hyperparameters.n_steps:"),
        ({"hyperparameters": {"net_arch": [[64, 0]]}}, "sweep.hyperparameters.net_arch.0.1:"),
        ({"hyperparameters": {"activation": []}}, "sweep.hyperparameters.activation:"),
        ({"seeds": [1000]}, "sweep.seeds.0:"),
        ({"seeds": [1, 1]}, "sweep.seeds:"),
        ({"scenarios": [[]]}, "sweep.scenarios.0:"),
        ({"max_parallel": 0}, "sweep.max_parallel:"),
        ({"num_cpus_per_trial": 0}, "sweep.num_cpus_per_trial:"),
        ({"vec_env": "fork"}, "sweep.vec_env:"),
        ({"trials": 3}, "sweep.trials:"),
    ],
)
def test_a_bad_sweep_block_is_refused_naming_the_field(tmp_path: Path, sweep: dict[str, Any], field: str) -> None:
    path = _write(tmp_path, sweep)
    with pytest.raises(ExperimentError) as info:
        load_experiment(path)
    lines = str(info.value).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{path}: {field}")


def test_the_grid_is_the_cartesian_product_of_seeds_scenario_sets_and_values(tmp_path: Path) -> None:
    sweep = {
        "seeds": [0, 1, 2],
        "scenarios": ["rag-surge-8", ["rag-surge-8", "chatbot-8"]],
        "hyperparameters": {"learning_rate": LEARNING_RATES, "net_arch": [[64, 64], [128, 128]]},
    }
    config = load_experiment(_write(tmp_path, sweep, n_envs=2, vec_env="subprocess"))
    trials = plan_trials(config)
    assert len(trials) == 3 * 2 * 2 * 2
    assert [t.index for t in trials] == list(range(24))
    combos = {
        (t.seed, t.scenarios, t.hyperparameters["learning_rate"], tuple(t.hyperparameters["net_arch"])) for t in trials
    }
    assert len(combos) == 24
    for trial in trials:
        c = trial.config
        assert c.seed == trial.seed
        assert tuple(c.scenarios) == trial.scenarios
        assert c.hyperparameters.learning_rate == trial.hyperparameters["learning_rate"]
        assert c.hyperparameters.net_arch == trial.hyperparameters["net_arch"]
        assert c.hyperparameters.n_steps == 64  # untouched base values stay
        assert c.eval_scenarios == ["rag-surge-8"]  # every trial judged on the same held-out set
        assert c.register_as is None
        assert c.sweep is None
        assert (c.vec_env, c.n_envs) == ("dummy", 2)
    assert trials[0].scenarios == ("rag-surge-8",)
    assert trials[-1].scenarios == ("rag-surge-8", "chatbot-8")
    assert trials[-1].label == "seed=2 scenarios=rag-surge-8+chatbot-8 learning_rate=0.0003 net_arch=[128,128]"


def test_defaults_make_a_one_trial_grid_from_the_experiment(tmp_path: Path) -> None:
    config = load_experiment(_write(tmp_path, {}, seed=7))
    (trial,) = plan_trials(config)
    assert (trial.seed, trial.scenarios, trial.hyperparameters) == (7, ("rag-surge-8",), {})


def test_trials_the_schema_refuses_or_unknown_scenarios_fail_before_anything_runs(tmp_path: Path) -> None:
    sweep = {"scenarios": ["rag-surge-8", "no-such-scenario"], "hyperparameters": {"batch_size": [32, 512]}}
    path = _write(tmp_path, sweep)
    config = load_experiment(path)
    with pytest.raises(ExperimentError) as info:
        plan_trials(config, str(path))
    lines = str(info.value).splitlines()
    assert lines[0].startswith(f"{path}: sweep.scenarios.1: scenario 'no-such-scenario'")
    bad = [line for line in lines[1:] if "batch_size=512" in line]
    assert len(bad) == 2  # one per scenario set
    assert all("exceeds n_steps × n_envs" in line for line in bad)
    with pytest.raises(ExperimentError, match="no sweep block"):
        plan_trials(ExperimentConfig.model_validate(yaml.safe_load(SMOKE.read_text())), "smoke.yaml")


def test_cli_sweep_input_errors_exit_2_with_one_line(tmp_path: Path) -> None:
    bad = _write(tmp_path, {"hyperparameters": {"learning_rat": [1e-4]}})
    result = runner.invoke(app, ["train", "--experiment", str(bad), "--sweep"])
    assert result.exit_code == 2
    assert result.output.strip() == f"{bad}: sweep.hyperparameters.learning_rat: Extra inputs are not permitted"
    result = runner.invoke(app, ["train", "--experiment", str(SMOKE), "--sweep"])
    assert result.exit_code == 2
    assert result.output.strip().startswith(f"{SMOKE}: sweep: no sweep block")
    result = runner.invoke(app, ["train", "--experiment", str(SMOKE), "--ray-address", "local"])
    assert result.exit_code == 2
    assert result.output.strip() == "--ray-address and --max-parallel need --sweep"


def test_without_ray_the_ray_backend_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    config = load_experiment(_tiny(tmp_path, {"hyperparameters": {"learning_rate": LEARNING_RATES}}))
    db = tmp_path / "mlflow.db"
    with pytest.raises(SweepError) as info:
        run_sweep(config, tmp_path / "out", tracking_uri=f"sqlite:///{db}", ray_address="local")
    assert str(info.value) == "--ray-address needs Ray, which is not installed: pip install 'pdctl[ray]'"
    assert not db.exists()  # refused before any MLflow run was made


def _children(client: Any, parent_id: str) -> list[Any]:
    parent = client.get_run(parent_id)
    runs = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'", max_results=100
    )
    return sorted(runs, key=lambda r: int(r.data.tags["pdctl.sweep.trial"]))


def _artifact_json(client: Any, run_id: str, name: str, dst: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(client.download_artifacts(run_id, name, str(dst))).read_text())
    return data


def _check_logged(client: Any, parent_id: str, finished: list[int], failed: list[int], dst: Path) -> dict[int, float]:
    """The parent records the grid and the ranking; each child its trial; returns goodput per finished trial."""
    parent = client.get_run(parent_id)
    assert parent.data.tags["pdctl.sweep"] == "parent"
    assert parent.info.status == "FINISHED"
    assert json.loads(parent.data.params["sweep.hp.learning_rate"]) == LEARNING_RATES
    assert parent.data.metrics["sweep/finished"] == len(finished)
    assert parent.data.metrics["sweep/failed"] == len(failed)
    children = _children(client, parent_id)
    assert [int(c.data.tags["pdctl.sweep.trial"]) for c in children] == sorted(finished + failed)
    goodput: dict[int, float] = {}
    for child in children:
        index = int(child.data.tags["pdctl.sweep.trial"])
        assert child.data.tags["mlflow.parentRunId"] == parent_id
        assert float(child.data.params["hp.learning_rate"]) == LEARNING_RATES[index % 2]
        assert child.data.params["seed"] == "0"
        if index in finished:
            assert child.info.status == "FINISHED"
            assert child.data.tags["pdctl.sweep.status"] == "finished"
            assert "time/env_steps_per_s" in child.data.metrics  # train() logged into the child run
            goodput[index] = child.data.metrics["eval/learned_weighted_goodput_rps"]
        else:
            assert child.info.status == "FAILED"
            assert child.data.tags["pdctl.sweep.error"].startswith("ScenarioError: ")
    summary = _artifact_json(client, parent_id, "sweep_summary.json", dst)
    rows = summary["trials"]
    ranked = sorted(finished, key=lambda i: (-goodput[i], i))
    assert [row["trial"] for row in rows[: len(finished)]] == ranked
    assert [row["rank"] for row in rows] == [*range(1, len(finished) + 1), *([None] * len(failed))]
    assert [row["weighted_goodput_rps"] for row in rows[: len(finished)]] == [goodput[i] for i in ranked]
    assert all(row["status"] == "failed" and row["error"] for row in rows[len(finished) :])
    assert parent.data.params["best_trial.index"] == str(ranked[0])
    assert parent.data.params["best_trial.run_id"] == rows[0]["run_id"]
    assert parent.data.metrics["sweep/best_weighted_goodput_rps"] == goodput[ranked[0]]
    md = Path(client.download_artifacts(parent_id, "sweep_summary.md", str(dst))).read_text()
    assert md.index(rows[0]["run_id"]) < md.index(rows[1]["run_id"])
    return goodput


@pytest.fixture(scope="module")
def local_sweep(mlflow_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Through the CLI on the process backend: 2 learning rates × a good and a broken training set (2 trials fail)."""
    tmp = tmp_path_factory.mktemp("local-sweep")
    broken = tmp / "broken.yaml"
    broken.write_text("name: broken\ntenants: 3\n")  # exists (so planning passes) but does not load
    sweep = {"scenarios": ["rag-surge-8", str(broken)], "hyperparameters": {"learning_rate": LEARNING_RATES}}
    path = _tiny(tmp, sweep)
    out = tmp / "out"
    args = ["train", "--experiment", str(path), "--sweep", "--tracking-uri", mlflow_server, "--out", str(out)]
    result = runner.invoke(app, [*args, "--max-parallel", "2"])
    assert result.exit_code == 0, result.output
    assert "mlflow parent run: " in result.output
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    summary["out"] = out
    summary["stdout"] = result.output
    return summary


@pytest.mark.integration
def test_local_sweep_logs_a_parent_and_ranked_children_and_survives_failed_trials(
    local_sweep: dict[str, Any], mlflow_server: str, tmp_path: Path
) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server)
    goodput = _check_logged(client, local_sweep["parent_run_id"], finished=[0, 1], failed=[2, 3], dst=tmp_path)
    assert local_sweep["baselines"]["baseline:vllm-proxy"] > 0
    assert client.get_run(local_sweep["parent_run_id"]).data.metrics["eval/best_baseline_weighted_goodput_rps"] > 0
    out: Path = local_sweep["out"]
    for index in (0, 1):
        assert (out / f"trial-{index:03d}" / "policy" / "manifest.json").is_file()
    assert "duration_s" in (out / "trial-002" / "error.txt").read_text()
    assert (out / "summary.md").read_text() in local_sweep["stdout"]
    assert set(goodput) == {0, 1}


@pytest.fixture(scope="module")
def ray_module() -> Iterator[Any]:
    """Ray for this module; whatever session a test leaves behind is shut down at the end."""
    ray = pytest.importorskip("ray")
    yield ray
    if ray.is_initialized():
        ray.shutdown()


@pytest.mark.integration
def test_ray_sweep_on_a_local_instance_matches_the_process_backend(
    ray_module: Any, local_sweep: dict[str, Any], mlflow_server: str, tmp_path: Path
) -> None:
    from mlflow import MlflowClient

    config = load_experiment(_tiny(tmp_path, {"hyperparameters": {"learning_rate": LEARNING_RATES}}))
    result = run_sweep(
        config, tmp_path / "out", tracking_uri=mlflow_server, ray_address="local", evaluate_baselines=False
    )
    assert not ray_module.is_initialized()  # the sweep started its local instance and shut it down
    assert result.baselines == {}
    goodput = _check_logged(MlflowClient(mlflow_server), result.parent_run_id, finished=[0, 1], failed=[], dst=tmp_path)
    # the same trials (seed 0, same training set and learning rate) give the same numbers on either backend
    local = {row["trial"]: row["weighted_goodput_rps"] for row in local_sweep["trials"] if row["trial"] in (0, 1)}
    assert goodput == local
    assert {o.index: o.goodput for o in result.ranked} == local


def test_trials_run_their_expert_episodes_in_their_own_worker(tmp_path: Path) -> None:
    pretrain = {"teachers": ["baseline:aggregated"], "expert": "lookahead"}
    (trial,) = plan_trials(load_experiment(_write(tmp_path, {}, pretrain=pretrain)))
    assert trial.config.pretrain is not None
    assert trial.config.pretrain.workers == 1
    pinned = {**pretrain, "workers": 2}
    (trial,) = plan_trials(load_experiment(_write(tmp_path, {}, pretrain=pinned)))
    assert trial.config.pretrain is not None
    assert trial.config.pretrain.workers == 2
