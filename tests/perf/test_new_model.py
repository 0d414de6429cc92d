"""A model the code does not name: its operator folder plus its Hugging Face config, and the measure command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from env.perf.model import InterpolatedExecutionTimeModel
from env.perf.profile import MODELS, ProfileError, load_operator_profile, model_spec_from_hf_config
from env.sim.build import load_profile
from env.sim.simulator import ClusterSimulator
from pdctl.cli import app
from tests.sim.helpers import REMOTE_ALWAYS, columns, model, profile, scenario

runner = CliRunner()

LLAMA3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "rope_theta": 500000.0,
}


def _config(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA3_8B, **changes}))
    return path


def test_hf_config_gives_the_same_architecture_as_the_named_model(tmp_path: Path) -> None:
    spec = model_spec_from_hf_config(_config(tmp_path), "llama3-8b")
    assert spec == MODELS["llama3-8b"]
    loaded = load_operator_profile("llama3-8b", profile().source, model_config=_config(tmp_path))
    ours = InterpolatedExecutionTimeModel(loaded, 1)
    for kwargs in ({"prefill_tokens": 3000}, {"decode_batch": 40, "decode_context_tokens_each": 5000}):
        assert ours.breakdown(**kwargs).step_time_s == pytest.approx(model().breakdown(**kwargs).step_time_s)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"hidden_size": None}, "hidden_size"),
        ({"num_key_value_heads": 0}, "num_key_value_heads"),
        ({"num_key_value_heads": 5}, "num_key_value_heads"),
        ({"intermediate_size": "big"}, "intermediate_size"),
    ],
)
def test_bad_config_fails_in_one_line_naming_file_and_field(
    tmp_path: Path, changes: dict[str, Any], field: str
) -> None:
    config = _config(tmp_path, **changes)
    args = ["perf", "predict", "--profile-dir", profile().source, "--model-config", str(config), "--decode-batch", "1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert str(config) in lines[0]
    assert field in lines[0]
    assert "Traceback" not in result.output


def test_bad_profile_folder_fails_naming_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "gpu"
    shutil.copytree(profile().source, folder)
    (folder / "attn_decode.csv").unlink()
    args = ["perf", "predict", "--profile-dir", str(folder), "--model-config", str(_config(tmp_path))]
    result = runner.invoke(app, [*args, "--profile", "llama3-8b"])
    assert result.exit_code == 2
    assert "attn_decode.csv" in result.output
    assert "Traceback" not in result.output
    with pytest.raises(ProfileError, match="column 'model'"):
        load_operator_profile("nonesuch", folder, model_config=_config(tmp_path))


@pytest.mark.parametrize("table", ["gemm.csv", "attn_prefill.csv", "attn_decode.csv"])
def test_a_bad_cell_names_its_file_not_the_folder(tmp_path: Path, table: str) -> None:
    folder = tmp_path / "gpu"
    shutil.copytree(profile().source, folder)
    lines = (folder / table).read_text().splitlines()
    header = lines[0].split(",")
    model_column = header.index("model")
    row = lines[1].split(",")
    row[header.index("ms")] = "fast"
    (folder / table).write_text("\n".join([lines[0], ",".join(row), *lines[2:]]) + "\n")
    with pytest.raises(ProfileError, match=rf"{table}: column 'ms' missing or not a number"):
        load_operator_profile(row[model_column], folder)


def test_measure_tiny_writes_a_folder_that_loads_and_predicts(tmp_path: Path) -> None:
    out = tmp_path / "measured"
    config = _config(tmp_path)
    result = runner.invoke(
        app, ["perf", "measure", "--model-config", str(config), "--tp", "2", "--out", str(out), "--tiny"]
    )
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} >= {
        "gemm.csv",
        "attn_prefill.csv",
        "attn_decode.csv",
        "ceilings.csv",
        "env.txt",
        "config.json",
    }
    loaded = load_operator_profile("ignored", out, model_config=out / "config.json")
    assert loaded.tp_degrees == (1, 2)
    assert loaded.model.name == tmp_path.name  # the model column: the config's folder
    args = ["perf", "predict", "--profile-dir", str(out), "--model-config", str(out / "config.json"), "--tp", "2"]
    predicted = runner.invoke(
        app, [*args, "--prefill-tokens", "128", "--decode-batch", "2", "--decode-context", "100", "--json"]
    )
    assert predicted.exit_code == 0, predicted.output
    payload = json.loads(predicted.output)
    assert payload["step_time_s"] > 0
    twice = runner.invoke(app, [*args, "--prefill-tokens", "128", "--prefill-sequences", "2", "--json"])
    assert json.loads(twice.output)["breakdown"]["lm_head_s"] > 0
    assert payload["step_time_s"] == pytest.approx(sum(payload["breakdown"].values()))


def test_measure_without_a_gpu_says_so(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["perf", "measure", "--model-config", str(_config(tmp_path)), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2
    assert "no CUDA device" in result.output
    assert "--tiny" in result.output


def test_a_scenario_names_a_folder_and_config(tmp_path: Path) -> None:
    cluster = {"profile": "llama3-8b", "profile_dir": profile().source, "hf_config": str(_config(tmp_path))}
    built = scenario(cluster=cluster)
    loaded = load_profile(built)
    assert loaded.model == MODELS["llama3-8b"]
    workloads = {"t": columns([0.0, 0.5], [300, 300], [20, 20])}
    sim = ClusterSimulator(built, loaded, workloads, {"t": REMOTE_ALWAYS}, np.random.default_rng(0))
    sim.run()
    assert sim.num_finished == 2


def test_emulator_refuses_a_bad_profile_in_one_line(tmp_path: Path) -> None:
    from livestack.emulator.cli import main

    with pytest.raises(SystemExit, match=r"config\.json: field 'vocab_size'"):
        main(["--profile-dir", profile().source, "--model-config", str(_config(tmp_path, vocab_size=-1))])
