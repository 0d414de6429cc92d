from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from env.workloads.config import (
    AzureTraceWorkload,
    EmpiricalLength,
    LognormalLength,
    PoissonWorkload,
    StepWorkload,
    WorkloadConfig,
    parse_workload_config,
    resolve_paths,
)

SHORT = {"kind": "fixed", "tokens": 100}


def test_discriminated_union_picks_kind() -> None:
    config = parse_workload_config({"kind": "poisson", "rate_rps": 2, "input_tokens": SHORT, "output_tokens": SHORT})
    assert isinstance(config, PoissonWorkload)
    assert config.rate_rps == 2


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "poisson", "rate_rps": 2, "input_tokens": SHORT, "output_tokens": SHORT, "extra": 1},
        {"kind": "poisson", "rate_rps": 0, "input_tokens": SHORT, "output_tokens": SHORT},
        {"kind": "nope", "rate_rps": 1},
        {"kind": "gamma", "rate_rps": 1, "input_tokens": SHORT, "output_tokens": SHORT},  # cv missing
        {"kind": "diurnal", "mean_rate_rps": 1, "peak_to_mean": 2.5, "input_tokens": SHORT, "output_tokens": SHORT},
        {"kind": "step", "segments": [[5, 1.0]], "input_tokens": SHORT, "output_tokens": SHORT},
        {"kind": "step", "segments": [[0, 1.0], [0, 2.0]], "input_tokens": SHORT, "output_tokens": SHORT},
        {"kind": "trace_azure", "path": "x.csv", "rate_scale": 0},
        {"kind": "trace_mooncake", "path": "x.jsonl", "max_requests": 0},
    ],
)
def test_invalid_configs_are_refused(data: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        parse_workload_config(data)


def test_models_are_frozen() -> None:
    config = PoissonWorkload(rate_rps=1, input_tokens=SHORT, output_tokens=SHORT)
    with pytest.raises(ValidationError):
        config.rate_rps = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "data",
    [
        {"median_tokens": 100},  # sigma missing
        {"median_tokens": 100, "sigma": 1, "mean_tokens": 100, "p95_tokens": 200},  # both forms
        {"mean_tokens": 100, "p95_tokens": 90},  # p95 below mean
        {"mean_tokens": 100, "p95_tokens": 10_000},  # no log-normal fits
        {"median_tokens": 100, "sigma": 1, "min_tokens": 10, "max_tokens": 5},
    ],
)
def test_lognormal_parametrisations_validated(data: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        LognormalLength(kind="lognormal", **data)


def test_lognormal_mean_p95_solution() -> None:
    dist = LognormalLength(mean_tokens=1000, p95_tokens=3000)
    mu, sigma = dist.log_params()
    assert math.exp(mu + sigma**2 / 2) == pytest.approx(1000)
    assert math.exp(mu + 1.6448536269514722 * sigma) == pytest.approx(3000)


def test_empirical_needs_one_source() -> None:
    with pytest.raises(ValidationError):
        EmpiricalLength(path=Path("a.csv"))
    with pytest.raises(ValidationError):
        EmpiricalLength(path=Path("a.csv"), column="x", values=(1, 2))
    assert EmpiricalLength(values=(1, 2)).values == (1, 2)


def test_step_segments_accept_pairs_and_mix_overrides() -> None:
    config = parse_workload_config(
        {
            "kind": "step",
            "segments": [[0, 1.0], {"start_s": 60, "rate_rps": 3.0, "input_tokens": {"kind": "fixed", "tokens": 9}}],
            "input_tokens": SHORT,
            "output_tokens": SHORT,
        }
    )
    assert isinstance(config, StepWorkload)
    assert [(s.start_s, s.rate_rps) for s in config.segments] == [(0.0, 1.0), (60.0, 3.0)]
    assert config.segments[1].input_tokens is not None


def test_azure_folder_and_file() -> None:
    config = AzureTraceWorkload(path=Path("/t/azure"), file="code")
    assert config.csv_path() == Path("/t/azure/AzureLLMInferenceTrace_code.csv")
    assert AzureTraceWorkload(path=Path("/t/x.csv")).csv_path() == Path("/t/x.csv")


def test_resolve_paths_makes_relative_paths_absolute(tmp_path: Path) -> None:
    trace = parse_workload_config({"kind": "trace_mooncake", "path": "traces/m.jsonl"})
    assert resolve_paths(trace, tmp_path).path == tmp_path / "traces/m.jsonl"  # type: ignore[union-attr]
    step = parse_workload_config(
        {
            "kind": "step",
            "segments": [
                [0, 1],
                {"start_s": 5, "rate_rps": 1, "input_tokens": {"kind": "empirical", "path": "b.csv", "column": "c"}},
            ],
            "input_tokens": {"kind": "empirical", "path": "a.csv", "column": "c"},
            "output_tokens": {"kind": "empirical", "path": "/abs/a.csv", "column": "c"},
        }
    )
    resolved = resolve_paths(step, tmp_path)
    assert isinstance(resolved, StepWorkload)
    assert resolved.input_tokens.path == tmp_path / "a.csv"  # type: ignore[union-attr]
    assert resolved.output_tokens.path == Path("/abs/a.csv")  # type: ignore[union-attr]
    assert resolved.segments[1].input_tokens.path == tmp_path / "b.csv"  # type: ignore[union-attr]


def test_json_schema_has_descriptions() -> None:
    schema = TypeAdapter(WorkloadConfig).json_schema()
    assert "discriminator" in schema
    poisson = schema["$defs"]["PoissonWorkload"]["properties"]["rate_rps"]
    assert poisson["description"]


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "poisson", "rate_rps": 2, "input_tokens": SHORT, "output_tokens": SHORT, "model": "llama"},
        {
            "kind": "gamma",
            "rate_rps": 2,
            "cv": 3,
            "input_tokens": {"kind": "lognormal", "mean_tokens": 900, "p95_tokens": 2500, "max_tokens": 8192},
            "output_tokens": {"kind": "empirical", "values": [1, 2, 3]},
            "prefix": {"prefix_tokens": 1024, "num_prefixes": 3, "share_frac": 0.5},
        },
        {
            "kind": "diurnal",
            "mean_rate_rps": 4,
            "peak_to_mean": 1.5,
            "period_s": 3600,
            "phase_s": 900,
            "input_tokens": {"kind": "empirical", "path": "/t/a.csv", "column": "ContextTokens"},
            "output_tokens": SHORT,
        },
        {"kind": "step", "segments": [[0, 1], [60, 2]], "input_tokens": SHORT, "output_tokens": SHORT},
        {"kind": "trace_azure", "path": "/t", "file": "code", "start_s": 60, "duration_s": 600, "rate_scale": 2},
        {"kind": "trace_mooncake", "path": "/t/m.jsonl", "repeat": True, "max_requests": 10, "keep_hash_ids": False},
        {"kind": "servegen", "path": "/t/sg", "clients": ["1", "2"], "start_s": 3600, "duration_s": 7200},
    ],
)
def test_config_round_trips_through_json(data: dict[str, object]) -> None:
    config = parse_workload_config(data)
    assert parse_workload_config(config.model_dump(mode="json")) == config
    assert config.kind == data["kind"]
