from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from env.workloads.config import parse_workload_config
from env.workloads.generate import generate_columns, generate_requests
from env.workloads.traces import apply_window, load_azure_csv, load_mooncake_jsonl, load_servegen_folder
from env.workloads.traces.servegen import SERVEGEN_WINDOW_S, sample_servegen
from tests.workloads import readme_stats as readme
from tests.workloads.readme_stats import TraceStats, within_rounding


def _load(traces_dir: Path, stats: TraceStats):  # type: ignore[no-untyped-def]
    path = traces_dir / stats.file
    return load_azure_csv(path) if path.suffix == ".csv" else load_mooncake_jsonl(path)


@pytest.mark.parametrize("stats", readme.TRACES, ids=lambda s: Path(s.file).stem)
def test_loader_matches_readme(traces_dir: Path, stats: TraceStats) -> None:
    columns = _load(traces_dir, stats)
    assert len(columns) == stats.rows
    span_s = columns.arrival_s[-1] - columns.arrival_s[0]
    assert within_rounding(span_s, stats.span_s)
    assert within_rounding((len(columns) - 1) / span_s, stats.rate_rps)
    for tokens, mean, p50, p90, p99, top in (
        (columns.input_tokens, stats.input_mean, stats.input_p50, stats.input_p90, stats.input_p99, stats.input_max),
        (
            columns.output_tokens,
            stats.output_mean,
            stats.output_p50,
            stats.output_p90,
            stats.output_p99,
            stats.output_max,
        ),
    ):
        assert within_rounding(tokens.mean(), mean)
        for q, stated in ((50, p50), (90, p90), (99, p99)):
            assert within_rounding(float(np.percentile(tokens, q)), stated), (q, np.percentile(tokens, q), stated)
        assert tokens.max() == top
    assert within_rounding(100 * float((columns.input_tokens >= 2048).mean()), stats.long_pct)


@pytest.mark.parametrize(
    ("stats", "blocks", "unique"),
    [
        (readme.MOONCAKE_CONVERSATION, readme.MOONCAKE_CONVERSATION_BLOCKS, readme.MOONCAKE_CONVERSATION_UNIQUE_BLOCKS),
        (readme.MOONCAKE_SYNTHETIC, readme.MOONCAKE_SYNTHETIC_BLOCKS, readme.MOONCAKE_SYNTHETIC_UNIQUE_BLOCKS),
    ],
    ids=["conversation", "synthetic"],
)
def test_mooncake_keeps_hash_ids(traces_dir: Path, stats: TraceStats, blocks: int, unique: int) -> None:
    columns = load_mooncake_jsonl(traces_dir / stats.file)
    assert len(columns.hash_ids) == blocks
    assert len(np.unique(columns.hash_ids)) == unique
    np.testing.assert_array_equal(np.diff(columns.hash_offsets), -(-columns.input_tokens // 512))
    assert columns.hash_block_tokens == 512
    specs = generate_requests(
        parse_workload_config({"kind": "trace_mooncake", "path": str(traces_dir / stats.file), "max_requests": 3}),
        np.random.default_rng(0),
        1e9,
        "kimi",
    )
    assert specs[0].hash_ids == tuple(columns.hash_ids_of(0).tolist())
    assert specs[0].hash_ids[0] == 0


def test_window_and_rate_scale(traces_dir: Path) -> None:
    path = traces_dir / readme.AZURE_CONV.file
    full = load_azure_csv(path)
    config = parse_workload_config(
        {"kind": "trace_azure", "path": str(path), "start_s": 600, "duration_s": 1200, "rate_scale": 4}
    )
    window = generate_columns(config, np.random.default_rng(0), 10_000)
    inside = (full.arrival_s >= 600) & (full.arrival_s < 1800)
    assert len(window) == inside.sum()
    np.testing.assert_allclose(window.arrival_s, (full.arrival_s[inside] - 600) / 4)
    np.testing.assert_array_equal(window.input_tokens, full.input_tokens[inside])
    assert window.arrival_s[-1] < 300
    rate_full = inside.sum() / 1200
    rate_window = len(window) / 300
    assert rate_window == pytest.approx(4 * rate_full, rel=0.01)
    # the horizon cuts the compressed window; max_requests keeps the earliest
    short = generate_columns(config, np.random.default_rng(0), 100)
    assert len(short) == (window.arrival_s < 100).sum()
    capped = generate_columns(config.model_copy(update={"max_requests": 10}), np.random.default_rng(0), 1e9)
    np.testing.assert_array_equal(capped.arrival_s, window.arrival_s[:10])


def test_window_keeps_hash_ids_per_row(traces_dir: Path) -> None:
    full = load_mooncake_jsonl(traces_dir / readme.MOONCAKE_CONVERSATION.file)
    window = apply_window(full, start_s=1000, duration_s=300, rate_scale=0.5)
    first = int(np.searchsorted(full.arrival_s, 1000))
    assert window.arrival_s[0] == pytest.approx((full.arrival_s[first] - 1000) / 0.5)
    for row in (0, len(window) // 2, len(window) - 1):
        np.testing.assert_array_equal(window.hash_ids_of(row), full.hash_ids_of(first + row))


def test_azure_folder_form(traces_dir: Path) -> None:
    config = parse_workload_config({"kind": "trace_azure", "path": str(traces_dir / "azure_llm_2023"), "file": "code"})
    assert len(generate_columns(config, np.random.default_rng(0), 1e9)) == readme.AZURE_CODE.rows


def test_servegen_folder_matches_readme(traces_dir: Path) -> None:
    clients = load_servegen_folder(traces_dir / "servegen_deepseek_r1")
    assert len(clients) == readme.SERVEGEN_CLIENTS
    assert all(len(c.window_start_s) == readme.SERVEGEN_WINDOWS for c in clients)
    aggregate = np.sum([c.rate_rps for c in clients], axis=0)
    assert within_rounding(aggregate.mean(), readme.SERVEGEN_RATE_MEAN_RPS)
    assert within_rounding(aggregate.min(), readme.SERVEGEN_RATE_MIN_RPS)
    assert within_rounding(aggregate.max(), readme.SERVEGEN_RATE_MAX_RPS)


def test_servegen_sampling_follows_rates(traces_dir: Path) -> None:
    clients = load_servegen_folder(traces_dir / "servegen_deepseek_r1")
    start_s, duration_s = 36_000.0, 7_200.0
    columns = sample_servegen(clients, np.random.default_rng(11), start_s=start_s, duration_s=duration_s, rate_scale=2)
    windows = slice(int(start_s / SERVEGEN_WINDOW_S), int((start_s + duration_s) / SERVEGEN_WINDOW_S))
    expected = sum(float(c.rate_rps[windows].sum()) * SERVEGEN_WINDOW_S for c in clients)
    assert len(columns) == pytest.approx(expected, rel=0.1)
    assert columns.arrival_s[-1] < duration_s / 2
    assert np.all(np.diff(columns.arrival_s) >= 0)
    assert columns.output_tokens.max() <= readme.SERVEGEN_OUTPUT_MAX
    again = sample_servegen(clients, np.random.default_rng(11), start_s=start_s, duration_s=duration_s, rate_scale=2)
    np.testing.assert_array_equal(columns.input_tokens, again.input_tokens)


def test_servegen_config_and_client_subset(traces_dir: Path) -> None:
    config = parse_workload_config(
        {
            "kind": "servegen",
            "path": str(traces_dir / "servegen_deepseek_r1"),
            "clients": ["1", "5"],
            "start_s": 43_200,
            "max_requests": 50,
        }
    )
    columns = generate_columns(config, np.random.default_rng(0), 3_600)
    assert len(columns) == 50
    assert columns.input_tokens.min() >= 1


def test_repeat_tiles_the_window_with_fresh_hash_ids(traces_dir: Path) -> None:
    path = traces_dir / readme.MOONCAKE_SYNTHETIC.file
    base = {"kind": "trace_mooncake", "path": str(path), "start_s": 100, "duration_s": 200, "rate_scale": 2}
    once = generate_columns(parse_workload_config(base), np.random.default_rng(0), 1e9)
    tiled = generate_columns(parse_workload_config({**base, "repeat": True}), np.random.default_rng(0), 350)
    period_s = 100.0
    assert np.all(np.diff(tiled.arrival_s) >= 0)
    assert tiled.arrival_s[-1] < 350
    second = (tiled.arrival_s >= period_s) & (tiled.arrival_s < 2 * period_s)
    np.testing.assert_allclose(tiled.arrival_s[second] - period_s, once.arrival_s)
    np.testing.assert_array_equal(tiled.input_tokens[second], once.input_tokens)
    rows = np.flatnonzero(second)
    span = int(once.hash_ids.max()) + 1
    np.testing.assert_array_equal(tiled.hash_ids_of(int(rows[0])), once.hash_ids_of(0) + span)
    assert len(tiled) == pytest.approx(3.5 * len(once), rel=0.1)
    capped = generate_columns(
        parse_workload_config({**base, "repeat": True, "max_requests": len(once) + 5}), np.random.default_rng(0), 1e9
    )
    assert len(capped) == len(once) + 5


def test_repeat_without_duration_uses_the_trace_span(traces_dir: Path) -> None:
    path = traces_dir / readme.AZURE_CODE.file
    config = parse_workload_config({"kind": "trace_azure", "path": str(path), "repeat": True})
    columns = generate_columns(config, np.random.default_rng(0), 7_200)
    assert len(columns) == pytest.approx(2.1 * readme.AZURE_CODE.rows, rel=0.1)
    assert np.all(np.diff(columns.arrival_s) > -1e-9)
