"""The calibrated step-time model: composition from the measured operators, its terms and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from env.perf.model import InterpolatedExecutionTimeModel, StepOverheads
from env.perf.profile import MODELS, ProfileError, available_profiles, load_operator_profile, split_profile_name
from pdctl.cli import app
from tests.sim.helpers import model, profile

runner = CliRunner()


def test_profiles_ship_with_the_package() -> None:
    assert "h200-llama3-8b" in available_profiles()
    assert "h200-llama3-70b" in available_profiles()
    assert split_profile_name("h200-llama3-70b") == ("h200-llama3", "llama3-70b")
    with pytest.raises(ProfileError, match="expected"):
        split_profile_name("nonsense")
    with pytest.raises(ProfileError, match="not found"):
        load_operator_profile("h100-llama3-8b")


def test_model_constants() -> None:
    m = MODELS["llama3-8b"]
    assert m.kv_bytes_per_token() == 131_072  # 2 x 32 layers x 8 KV heads x 128 x 2 bytes
    assert m.kv_bytes_per_token(2) == 65_536
    assert MODELS["llama3-70b"].kv_bytes_per_token() == 327_680
    assert 8.0e9 < m.num_params < 8.1e9
    assert profile().gpu_memory_bytes == pytest.approx(139.8e9)


def test_gemm_term_is_the_measured_rows_less_the_dispatch_latency() -> None:
    p = profile()
    mdl = model()
    assert 15e-6 < p.launch_overhead_s < 30e-6  # derived from the memory-bound GEMM rows
    assert 3.5e12 < p.stream_bandwidth_bytes_per_s < 4.8e12  # H200 HBM3e: 4.8 TB/s peak
    for m_tokens in (1, 64, 512, 2048, 8192):
        kernels = []
        for op in ("qkv", "o", "gate_up", "down"):
            table = p.gemm[(1, op)]
            measured = float(table.time_s[list(table.m_tokens).index(m_tokens)])
            weight_floor = 2 * table.k * table.n / p.stream_bandwidth_bytes_per_s
            kernels.append(max(measured - p.launch_overhead_s, weight_floor))
            assert kernels[-1] < measured
        assert mdl.breakdown(prefill_tokens=m_tokens).gemm_s == pytest.approx(32 * sum(kernels), rel=0.02)


def test_step_time_is_monotone_and_sums_its_parts() -> None:
    mdl = model()
    prefill = [mdl.breakdown(prefill_tokens=n).step_time_s for n in (128, 512, 2048, 8192, 16384)]
    assert prefill == sorted(prefill)
    ctx = [mdl.breakdown(decode_batch=32, decode_context_tokens_each=c).step_time_s for c in (512, 2048, 8192)]
    assert ctx == sorted(ctx)
    batch = [mdl.breakdown(decode_batch=b, decode_context_tokens_each=2048).step_time_s for b in (1, 16, 64, 256)]
    assert batch == sorted(batch)
    b = mdl.breakdown(prefill_tokens=2048, decode_batch=64, decode_context_tokens_each=2048)
    assert b.step_time_s == pytest.approx(sum(b.as_dict().values()))
    assert b.step_time_s == pytest.approx(mdl.step_time_s(2048 + 64, 65, 64, 64 * 2048, [(2048, 0)]))


def test_unmeasured_terms_are_a_10_to_30_percent_share_at_typical_points() -> None:
    mdl = model()
    shares = []
    for kwargs in (
        {"prefill_tokens": 512},
        {"prefill_tokens": 2048},
        {"decode_batch": 16, "decode_context_tokens_each": 2048},
        {"decode_batch": 64, "decode_context_tokens_each": 2048},
        {"prefill_tokens": 2048, "decode_batch": 64, "decode_context_tokens_each": 2048},
    ):
        d = mdl.breakdown(**kwargs).as_dict()
        naive = d["gemm_s"] + d["lm_head_s"] + d["prefill_attention_s"] + d["decode_attention_s"]
        shares.append(1 - naive / sum(d.values()))
    assert 0.10 <= float(np.median(shares)) <= 0.30


def test_decode_step_is_affine_in_context() -> None:
    mdl = model()
    for batch in (1, 7, 64, 200):
        a, k = mdl.decode_coefficients(batch)
        for ctx in (batch * 100, batch * 3000):
            assert mdl.step_time_s(batch, batch, batch, ctx) == pytest.approx(a + k * ctx, rel=1e-12)


def test_chunked_prefill_costs_at_least_one_pass() -> None:
    mdl = model()
    whole = mdl.prefill_attention_s(8192, 0)
    chunks = sum(mdl.prefill_attention_s(2048, c) for c in (0, 2048, 4096, 6144))
    assert chunks >= whole * 0.95
    assert mdl.prefill_attention_s(2048, 6144) > mdl.prefill_attention_s(2048, 0)


def test_tensor_parallel_adds_allreduce_and_shards_compute() -> None:
    tp1, tp2 = model(1), InterpolatedExecutionTimeModel(profile(), 2)
    b1, b2 = tp1.breakdown(prefill_tokens=4096), tp2.breakdown(prefill_tokens=4096)
    assert b1.tp_allreduce_s == 0.0
    assert b2.tp_allreduce_s > 0.0
    assert b2.gemm_s < b1.gemm_s
    tp8 = InterpolatedExecutionTimeModel(profile(), 8)
    assert tp8.measured_tp == 2  # derived from the nearest measured degree
    assert tp8.breakdown(prefill_tokens=4096).gemm_s == pytest.approx(b2.gemm_s / 4)


def test_overheads_are_parameters() -> None:
    slow = InterpolatedExecutionTimeModel(profile(), 1, StepOverheads(step_overhead_s=0.01))
    assert slow.decode_step_time_s(8, 8000) - model().decode_step_time_s(8, 8000) == pytest.approx(0.01)


def test_cli_predict_json() -> None:
    args = ["perf", "predict", "--profile", "h200-llama3-8b", "--prefill-tokens", "2048", "--decode-batch", "64"]
    result = runner.invoke(app, [*args, "--decode-context", "2048", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert set(payload["breakdown"]) >= {"gemm_s", "prefill_attention_s", "decode_attention_s", "tp_allreduce_s"}
    assert payload["step_time_s"] == pytest.approx(sum(payload["breakdown"].values()))
    only_decode = runner.invoke(app, ["perf", "predict", "--decode-batch", "8", "--decode-context", "1000", "--json"])
    assert json.loads(only_decode.output)["breakdown"]["prefill_attention_s"] == 0.0
    bad = runner.invoke(app, ["perf", "predict", "--profile", "a100-llama3-8b", "--prefill-tokens", "10"])
    assert bad.exit_code == 2
    assert "Traceback" not in bad.output


def test_allreduce_assumption_can_be_varied() -> None:
    base = InterpolatedExecutionTimeModel(profile(), 2).breakdown(decode_batch=1, decode_context_tokens_each=2048)
    slow = InterpolatedExecutionTimeModel(
        profile(), 2, StepOverheads(allreduce_latency_s=20e-6, allreduce_bandwidth_bytes_per_s=120e9)
    ).breakdown(decode_batch=1, decode_context_tokens_each=2048)
    assert slow.tp_allreduce_s == pytest.approx(2 * 32 * (20e-6 + 4096 * 2 / 120e9))
    assert slow.tp_allreduce_s > 2 * base.tp_allreduce_s
    args = ["perf", "predict", "--profile", "h200-llama3-70b", "--tp", "2", "--decode-batch", "1", "--json"]
    fast = json.loads(runner.invoke(app, [*args, "--allreduce-latency-us", "3"]).output)
    default = json.loads(runner.invoke(app, args).output)
    assert fast["breakdown"]["tp_allreduce_s"] < default["breakdown"]["tp_allreduce_s"]
