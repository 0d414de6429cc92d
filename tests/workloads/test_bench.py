"""Load and generation speed (``make bench``: ``pytest -m benchmark``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from env.workloads import generate_columns, generate_requests, parse_workload_config
from env.workloads.traces import load_azure_csv, load_mooncake_jsonl, load_servegen_folder

pytestmark = pytest.mark.benchmark


@pytest.mark.parametrize(
    "relative",
    [
        "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
        "azure_llm_2023/AzureLLMInferenceTrace_code.csv",
        "mooncake_fast25/conversation_trace.jsonl",
        "mooncake_fast25/synthetic_trace.jsonl",
    ],
)
def test_load_trace(benchmark: BenchmarkFixture, traces_dir: Path, relative: str) -> None:
    path = traces_dir / relative
    loader = load_azure_csv if path.suffix == ".csv" else load_mooncake_jsonl
    columns = benchmark(loader, path)
    assert len(columns) > 0


def test_load_servegen(benchmark: BenchmarkFixture, traces_dir: Path) -> None:
    assert len(benchmark(load_servegen_folder, traces_dir / "servegen_deepseek_r1")) == 73


def test_azure_hour_as_request_specs(benchmark: BenchmarkFixture, traces_dir: Path) -> None:
    config = parse_workload_config(
        {"kind": "trace_azure", "path": str(traces_dir / "azure_llm_2023/AzureLLMInferenceTrace_conv.csv")}
    )
    specs = benchmark(generate_requests, config, np.random.default_rng(0), 3_600, "conv")
    assert len(specs) == 19_366


def test_poisson_hour_columns(benchmark: BenchmarkFixture) -> None:
    config = parse_workload_config(
        {
            "kind": "poisson",
            "rate_rps": 50,
            "input_tokens": {"kind": "lognormal", "median_tokens": 500, "sigma": 1},
            "output_tokens": {"kind": "lognormal", "median_tokens": 200, "sigma": 0.8},
        }
    )
    columns = benchmark(generate_columns, config, np.random.default_rng(0), 3_600)
    assert len(columns) == pytest.approx(180_000, rel=0.02)
