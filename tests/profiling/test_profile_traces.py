"""The profile of every shipped trace matches ../shared/traces/README.md to within rounding."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from livestack.profiling import Decision, ProfileOptions, WorkloadProfile, profile_source
from tests.workloads import readme_stats as readme
from tests.workloads.readme_stats import TraceStats, within_rounding


@pytest.fixture(scope="module")
def profiles(request: pytest.FixtureRequest) -> dict[str, WorkloadProfile]:
    traces_dir = request.getfixturevalue("traces_dir")
    return {stats.file: profile_source(str(traces_dir / stats.file)) for stats in readme.TRACES}


@pytest.fixture(scope="module")
def traces_dir() -> Path:  # module scope for the cached profiles above; ${PDCTL_TRACES} as in tests/conftest.py
    from tests.conftest import SHARED

    path = Path(os.environ["PDCTL_TRACES"]) if os.environ.get("PDCTL_TRACES") else SHARED / "traces"
    if not path.is_dir():
        pytest.skip(f"shared traces folder {path} is absent")
    return path


@pytest.mark.parametrize("stats", readme.TRACES, ids=lambda s: Path(s.file).stem)
def test_profile_matches_readme(profiles: dict[str, WorkloadProfile], stats: TraceStats) -> None:
    p = profiles[stats.file]
    assert p.num_requests == stats.rows
    assert p.arrivals is not None
    assert within_rounding(p.arrivals.span_s, stats.span_s)
    assert within_rounding(p.arrivals.mean_rate_rps, stats.rate_rps)
    for got, mean, p50, p90, p99, top in (
        (p.input, stats.input_mean, stats.input_p50, stats.input_p90, stats.input_p99, stats.input_max),
        (p.output, stats.output_mean, stats.output_p50, stats.output_p90, stats.output_p99, stats.output_max),
    ):
        assert within_rounding(got.mean, mean)
        assert within_rounding(got.p50, p50)
        assert within_rounding(got.p90, p90)
        assert within_rounding(got.p99, p99)
        assert got.max == top
        assert sum(got.histogram_counts) == stats.rows
    assert within_rounding(100 * p.long_context_frac, stats.long_pct)
    if stats.block_reuse_pct is None:
        assert p.prefix_reuse is None
    else:
        assert p.prefix_reuse is not None
        assert within_rounding(100 * (p.prefix_reuse.block_reuse_frac or 0), stats.block_reuse_pct)
        assert within_rounding(100 * p.prefix_reuse.token_reuse_frac, stats.token_reuse_pct or 0)


def test_burstiness_matches_readme(profiles: dict[str, WorkloadProfile]) -> None:
    code = profiles[readme.AZURE_CODE.file].arrivals
    conv = profiles[readme.AZURE_CONV.file].arrivals
    moon = profiles[readme.MOONCAKE_CONVERSATION.file].arrivals
    syn = profiles[readme.MOONCAKE_SYNTHETIC.file].arrivals
    assert code
    assert conv
    assert moon
    assert syn
    assert within_rounding(code.iat_cv or 0, readme.AZURE_CODE_IAT_CV)
    assert within_rounding(code.dispersion_1s or 0, 13.2)
    assert round(code.dispersion_bin or 0, -1) == 160  # README: "160 for per-minute counts" (2 significant figures)
    assert (code.min_full_bin_count, code.max_full_bin_count, code.empty_bins) == (0, 632, 12)
    assert within_rounding(conv.iat_cv or 0, readme.AZURE_CONV_IAT_CV)
    assert within_rounding(conv.dispersion_1s or 0, 1.39)
    assert within_rounding(conv.dispersion_bin or 0, 20.6)
    assert (conv.min_full_bin_count, conv.max_full_bin_count, conv.last_bin_count) == (191, 507, 37)
    assert within_rounding(moon.dispersion_1s or 0, 7.9)
    assert (moon.min_full_bin_count, moon.max_full_bin_count) == (144, 247)
    assert within_rounding(syn.iat_cv or 0, readme.MOONCAKE_SYNTHETIC_IAT_CV)


def test_prefix_hit_shares_match_readme(profiles: dict[str, WorkloadProfile]) -> None:
    conv = profiles[readme.MOONCAKE_CONVERSATION.file].prefix_reuse
    syn = profiles[readme.MOONCAKE_SYNTHETIC.file].prefix_reuse
    assert conv
    assert syn
    assert within_rounding(100 * (conv.hit_any_frac or 0), 99.99)
    assert within_rounding(100 * (conv.hit_2plus_frac or 0), 38.7)
    assert conv.num_blocks == readme.MOONCAKE_CONVERSATION_BLOCKS
    assert conv.unique_blocks == readme.MOONCAKE_CONVERSATION_UNIQUE_BLOCKS
    assert within_rounding(100 * (syn.hit_any_frac or 0), 44.6)
    assert within_rounding(100 * (syn.hit_2plus_frac or 0), 43.8)


def test_8k_shares_match_readme(traces_dir: Path) -> None:
    options = ProfileOptions(long_context_threshold_tokens=8192)
    for stats, pct in ((readme.MOONCAKE_CONVERSATION, 45.0), (readme.MOONCAKE_SYNTHETIC, 53.0),
                       (readme.AZURE_CODE, 0.0), (readme.AZURE_CONV, 0.005)):  # fmt: skip
        profile = profile_source(str(traces_dir / stats.file), options=options)
        decimals = 3 if pct < 0.1 else 1
        assert round(100 * profile.long_context_frac, decimals) == pct


def test_servegen_profile_matches_readme(traces_dir: Path) -> None:
    p = profile_source(str(traces_dir / "servegen_deepseek_r1"))
    assert p.source_kind == "servegen"
    mean, p50, p90, p99 = readme.SERVEGEN_INPUT
    assert (round(p.input.mean), p.input.p50, p.input.p90, p.input.p99) == (mean, p50, p90, p99)
    mean, p50, p90, p99 = readme.SERVEGEN_OUTPUT
    assert (round(p.output.mean), p.output.p50, p.output.p90, p.output.p99) == (mean, p50, p90, p99)
    assert p.output.max == readme.SERVEGEN_OUTPUT_MAX
    assert within_rounding(100 * p.long_context_frac, readme.SERVEGEN_LONG_PCT)
    assert p.arrivals is not None
    assert within_rounding(p.arrivals.mean_rate_rps, readme.SERVEGEN_RATE_MEAN_RPS)
    assert within_rounding(p.extras["aggregate_rate_min_rps"], readme.SERVEGEN_RATE_MIN_RPS)
    assert within_rounding(p.extras["aggregate_rate_max_rps"], readme.SERVEGEN_RATE_MAX_RPS)
    assert within_rounding(p.extras["client_window_iat_cv_p50"], 1.03)
    assert within_rounding(p.extras["client_window_iat_cv_p90"], 3.95)
    assert round(p.num_requests / 1e6, 2) == 1.38  # "about 1.38 M requests/day"
    assert p.verdict.decision is Decision.EVALUATE


def test_profile_of_generated_stream_matches_its_arrays(traces_dir: Path) -> None:
    from env.workloads import generate_requests, parse_workload_config
    from livestack.profiling import RequestRecords, profile_records

    config = parse_workload_config(
        {"kind": "trace_mooncake", "path": str(traces_dir / readme.MOONCAKE_SYNTHETIC.file), "rate_scale": 2}
    )
    specs = generate_requests(config, np.random.default_rng(0), 1e9, "t")
    p = profile_records(RequestRecords.from_specs(specs), source="gen")
    assert p.num_requests == readme.MOONCAKE_SYNTHETIC.rows
    assert p.arrivals is not None
    assert p.arrivals.mean_rate_rps == pytest.approx(2 * (readme.MOONCAKE_SYNTHETIC.rows - 1) / 1_022.025)
    assert p.prefix_reuse is not None
    assert within_rounding(100 * (p.prefix_reuse.block_reuse_frac or 0), 64.0)
    assert [g.name for g in p.by_tenant] == ["t"]
