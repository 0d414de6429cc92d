from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from env.workloads import generate_columns, parse_workload_config
from env.workloads.config import FixedLength, GammaWorkload, LognormalLength, PoissonWorkload
from livestack.profiling import RequestRecords, profile_records
from livestack.profiling.fit import fit_lengths, fit_workload
from pdctl.cli import app
from tests.workloads import readme_stats as readme


def test_fit_lengths_matches_median_and_p90() -> None:
    values = np.random.default_rng(0).lognormal(np.log(700), 0.9, 50_000).round().astype(np.int64)
    fitted = fit_lengths(values)
    assert isinstance(fitted, LognormalLength)
    assert fitted.median_tokens == pytest.approx(700, rel=0.02)
    assert fitted.sigma == pytest.approx(0.9, rel=0.03)
    assert (fitted.min_tokens, fitted.max_tokens) == (int(values.min()), int(values.max()))
    assert fit_lengths(np.array([5, 5, 5])) == FixedLength(tokens=5)
    with pytest.raises(ValueError, match="positive"):
        fit_lengths(np.array([0, 0]))


@pytest.mark.parametrize("cv", [1.0, 3.0])
def test_fit_round_trip(cv: float) -> None:
    source = parse_workload_config(
        {
            "kind": "gamma",
            "rate_rps": 20,
            "cv": cv,
            "input_tokens": {"kind": "lognormal", "median_tokens": 1500, "sigma": 0.8},
            "output_tokens": {"kind": "lognormal", "median_tokens": 200, "sigma": 0.5},
        }
    )
    original = generate_columns(source, np.random.default_rng(1), 3_000)
    fitted = fit_workload(RequestRecords.from_columns(original))
    assert isinstance(fitted, PoissonWorkload if cv == 1.0 else GammaWorkload)
    assert fitted.rate_rps == pytest.approx(20, rel=0.05)
    if isinstance(fitted, GammaWorkload):
        assert fitted.cv == pytest.approx(cv, rel=0.1)
    again = generate_columns(fitted, np.random.default_rng(2), 3_000)
    a = profile_records(RequestRecords.from_columns(original), source="a")
    b = profile_records(RequestRecords.from_columns(again), source="b")
    assert b.input.p50 == pytest.approx(a.input.p50, rel=0.05)
    assert b.input.p90 == pytest.approx(a.input.p90, rel=0.05)
    assert b.long_context_frac == pytest.approx(a.long_context_frac, abs=0.02)


def test_quantised_timestamps_fit_poisson(traces_dir: Path) -> None:
    from env.workloads.traces import load_mooncake_jsonl

    columns = load_mooncake_jsonl(traces_dir / readme.MOONCAKE_CONVERSATION.file)
    fitted = fit_workload(RequestRecords.from_columns(columns))
    assert isinstance(fitted, PoissonWorkload)
    assert fitted.rate_rps == pytest.approx(readme.MOONCAKE_CONVERSATION.rate_rps, abs=0.005)


def test_emit_workload_cli_writes_valid_configs(traces_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "fitted.yaml"
    result = CliRunner().invoke(app, ["profile", str(traces_dir / readme.AZURE_CODE.file), "--emit-workload", str(out)])
    assert result.exit_code == 0, result.output
    fitted = yaml.safe_load(out.read_text())
    assert list(fitted) == ["default"]
    config = parse_workload_config(fitted["default"])
    assert isinstance(config, GammaWorkload)  # the code trace is bursty (CV 13)
    assert config.cv == pytest.approx(readme.AZURE_CODE_IAT_CV, abs=0.05)
    assert isinstance(config.input_tokens, LognormalLength)
    assert config.input_tokens.median_tokens == readme.AZURE_CODE.input_p50
    refused = CliRunner().invoke(
        app, ["profile", str(traces_dir / "servegen_deepseek_r1"), "--emit-workload", str(tmp_path / "x.yaml")]
    )
    assert refused.exit_code == 2
    assert "per-request records" in refused.output
