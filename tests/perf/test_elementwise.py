"""The element-wise table (``elementwise.csv``): measured, loaded, turned into a rate, used by operator-only runs."""

from __future__ import annotations

import csv
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from env.perf.derive import ELEMENTWISE_MIN_TOKENS, elementwise_bandwidth_frac
from env.perf.elementwise import ELEMENTWISE_OPS
from env.perf.fidelity import load_e2e_points, relative_errors
from env.perf.model import InterpolatedExecutionTimeModel, StepOverheads, elementwise_bytes_per_token
from env.perf.profile import MODELS, ModelSpec, OperatorProfile, ProfileError, load_operator_profile
from pdctl.cli import app
from tests.perf.test_new_model import _config
from tests.sim.helpers import profile

runner = CliRunner()

GPU_TOKENS = (1, 16, 256, 1024, 4096, 16384)


def _write_table(folder: Path, model: ModelSpec, frac_of: dict[int, float], base: OperatorProfile) -> Path:
    """``elementwise.csv`` whose rows at ``m`` take ``delta + bytes / (copy x frac_of[m])`` (TP 1)."""
    path = folder / "elementwise.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["model", "tp", "op", "m", "bytes", "ms"])
        for m, frac in frac_of.items():
            for op in ELEMENTWISE_OPS:
                nbytes = round(m * op.bytes_per_token(model, 1))
                seconds = base.launch_overhead_s + nbytes / (base.copy_bandwidth_bytes_per_s * frac)
                writer.writerow([model.name, 1, op.name, m, nbytes, f"{seconds * 1e3:.6f}"])
    return path


def _folder_with_table(tmp_path: Path, frac_of: dict[int, float]) -> Path:
    folder = tmp_path / "h200"
    shutil.copytree(profile().source, folder)
    _write_table(folder, MODELS["llama3-8b"], frac_of, profile())
    return folder


@pytest.mark.parametrize("model", list(MODELS.values()), ids=list(MODELS))
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_the_op_table_counts_the_documented_bytes(model: ModelSpec, tp: int) -> None:
    """2 x 36 d + 2 x 6 d + 10 d_ff / tp + 8 d_q / tp + 8 d_kv: the figure the composition has always used."""
    d = model.hidden_size
    q = model.num_q_heads * model.head_dim / tp
    kv = max(model.num_kv_heads // tp, 1) * model.head_dim
    documented = 2 * 36 * d + 2 * 6 * d + 10 * model.ffn_size / tp + 8 * q + 8 * kv
    assert elementwise_bytes_per_token(model, tp) == pytest.approx(documented, rel=1e-12)


def test_derive_recovers_a_known_fraction() -> None:
    rng = np.random.default_rng(0)
    nbytes = rng.uniform(1e7, 1e9, 40)
    calls = rng.integers(1, 3, 40)
    delta, copy_bw = 20e-6, 4e12
    times = delta + nbytes / (copy_bw * 0.63)
    assert elementwise_bandwidth_frac(nbytes, times, calls, delta, copy_bw) == pytest.approx(0.63)
    # a row faster than the copy rate counts at the roofline: never above 1
    assert elementwise_bandwidth_frac(nbytes, np.full(40, delta), calls, delta, copy_bw) == pytest.approx(1.0)
    # calls weight the rows: two ops at 0.5 and 1.0 of the copy rate, the first run twice
    two = elementwise_bandwidth_frac([1e9, 1e9], [delta + 0.5, delta + 0.25], [2, 1], delta, 4e9)
    assert two == pytest.approx(3 * 0.25 / (2 * 0.5 + 0.25))
    with pytest.raises(ValueError, match="positive"):
        elementwise_bandwidth_frac([1e9], [0.0], [1], delta, copy_bw)
    with pytest.raises(ValueError, match="at least one row"):
        elementwise_bandwidth_frac([], [], [], delta, copy_bw)


def test_tiny_measure_writes_a_table_that_loads(tmp_path: Path) -> None:
    out = tmp_path / "measured"
    args = ["perf", "measure", "--model-config", str(_config(tmp_path)), "--tp", "2", "--out", str(out), "--tiny"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    with (out / "elementwise.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["model", "tp", "op", "m", "bytes", "ms"]
    loaded = load_operator_profile("ignored", out, model_config=out / "config.json")
    keys = {(int(r["tp"]), r["op"], int(r["m"])) for r in rows}
    assert keys == {(tp, op.name, m) for tp in (1, 2) for op in ELEMENTWISE_OPS for m in (1, 16, 256, 1024)}
    for r in rows:
        assert float(r["ms"]) > 0
        op = next(o for o in ELEMENTWISE_OPS if o.name == r["op"])
        assert int(r["bytes"]) == round(int(r["m"]) * op.bytes_per_token(loaded.model, int(r["tp"])))
    assert loaded.elementwise_bandwidth_frac is not None
    assert 0 < loaded.elementwise_bandwidth_frac <= 1.0


def test_only_elementwise_measures_that_table_alone(tmp_path: Path) -> None:
    out = tmp_path / "ew"
    base = ["perf", "measure", "--model-config", str(_config(tmp_path)), "--out", str(out), "--tiny"]
    result = runner.invoke(app, [*base, "--only", "elementwise"])
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} == {"elementwise.csv", "env.txt", "config.json"}
    bad = runner.invoke(app, [*base, "--only", "softmax"])
    assert bad.exit_code == 2
    assert "--only softmax" in bad.output
    assert "elementwise" in bad.output


def test_shipped_folder_has_no_table_and_keeps_the_prior() -> None:
    assert profile().elementwise_bandwidth_frac is None
    assert StepOverheads.operator_only_for(profile()) == StepOverheads.operator_only()


def test_a_measured_table_sets_the_operator_only_rate(tmp_path: Path) -> None:
    """Rows at 0.7 of the copy rate from 1 Ki tokens up (and far slower below the cut): frac 0.7, not the prior."""
    frac_of = {m: (0.7 if m >= ELEMENTWISE_MIN_TOKENS else 0.1) for m in GPU_TOKENS}
    loaded = load_operator_profile("h200-llama3-8b", _folder_with_table(tmp_path, frac_of))
    assert loaded.elementwise_bandwidth_frac == pytest.approx(0.7, rel=1e-4)
    derived = StepOverheads.operator_only_for(loaded)
    assert derived == replace(
        StepOverheads.operator_only(), elementwise_bandwidth_frac=derived.elementwise_bandwidth_frac
    )

    prior = InterpolatedExecutionTimeModel(loaded, 1, StepOverheads.operator_only()).breakdown(prefill_tokens=4096)
    ours = InterpolatedExecutionTimeModel(loaded, 1, derived).breakdown(prefill_tokens=4096)
    assert ours.elementwise_s == pytest.approx(prior.elementwise_s / 0.7, rel=1e-4)
    assert ours.step_time_s > prior.step_time_s
    assert ours.gemm_s == prior.gemm_s

    points = load_e2e_points(loaded.source, "llama3-8b")
    median_prior = float(
        np.median([abs(e) for _, _, e in relative_errors(loaded, points, StepOverheads.operator_only())])
    )
    median_ours = float(np.median([abs(e) for _, _, e in relative_errors(loaded, points, derived)]))
    assert median_ours < median_prior
    assert median_ours <= 0.05


def test_check_operator_only_uses_the_table(tmp_path: Path) -> None:
    folder = _folder_with_table(tmp_path, dict.fromkeys(GPU_TOKENS, 0.7))
    args = ["perf", "check", "--profile", "h200-llama3-8b", "--operator-only"]
    result = runner.invoke(app, [*args, "--profile-dir", str(folder)])
    assert result.exit_code == 0, result.output
    assert "element-wise rate from elementwise.csv" in result.output
    assert "elementwise_bandwidth_frac 0.700" in result.output
    plain = runner.invoke(app, args)
    assert "elementwise_bandwidth_frac 1.000" in plain.output


@pytest.mark.parametrize(
    ("column", "value", "field"),
    [
        ("op", "softmax", "'op'"),
        ("ms", "fast", "'ms'"),
        ("ms", "-1", "'ms'"),
        ("tp", "0", "'tp'"),
        ("bytes", "12345", "'bytes'"),
        ("m", "", "'m'"),
    ],
)
def test_a_bad_table_fails_in_one_line_naming_file_and_field(
    tmp_path: Path, column: str, value: str, field: str
) -> None:
    folder = _folder_with_table(tmp_path, dict.fromkeys(GPU_TOKENS, 0.7))
    path = folder / "elementwise.csv"
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    rows[5][column] = value
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(ProfileError, match=r"elementwise\.csv"):
        load_operator_profile("h200-llama3-8b", folder)
    args = ["perf", "predict", "--profile", "h200-llama3-8b", "--profile-dir", str(folder), "--decode-batch", "1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert "elementwise.csv" in lines[0]
    assert f"column {field}" in lines[0]
    assert "Traceback" not in result.output
