from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from env.workloads.arrivals import diurnal_rate_rps
from env.workloads.config import EmpiricalLength, LognormalLength, parse_workload_config
from env.workloads.generate import generate_columns, generate_requests
from env.workloads.lengths import sample_lengths

FIXED = {"kind": "fixed", "tokens": 64}


def _cv(x: np.ndarray) -> float:
    return float(np.std(x) / np.mean(x))


def test_same_seed_same_requests_other_seed_differs() -> None:
    config = parse_workload_config(
        {
            "kind": "gamma",
            "rate_rps": 20,
            "cv": 2,
            "input_tokens": {"kind": "lognormal", "median_tokens": 500, "sigma": 1},
            "output_tokens": {"kind": "lognormal", "mean_tokens": 200, "p95_tokens": 500},
            "prefix": {"prefix_tokens": 1024, "num_prefixes": 4, "share_frac": 0.5},
        }
    )
    a = generate_requests(config, np.random.default_rng(7), 300, "chat", id_prefix="s0/")
    b = generate_requests(config, np.random.default_rng(7), 300, "chat", id_prefix="s0/")
    c = generate_requests(config, np.random.default_rng(8), 300, "chat", id_prefix="s0/")
    assert a == b
    assert a != c
    assert a[0].request_id == "s0/chat-0"
    assert len({r.request_id for r in a}) == len(a)
    arrivals = [r.arrival_s for r in a]
    assert arrivals == sorted(arrivals)
    assert arrivals[0] >= 0
    assert arrivals[-1] < 300


def test_length_streams_do_not_move_arrivals() -> None:
    base = {"kind": "poisson", "rate_rps": 5, "output_tokens": FIXED}
    one = generate_columns(parse_workload_config({**base, "input_tokens": FIXED}), np.random.default_rng(3), 100)
    other = generate_columns(
        parse_workload_config({**base, "input_tokens": {"kind": "lognormal", "median_tokens": 9, "sigma": 2}}),
        np.random.default_rng(3),
        100,
    )
    np.testing.assert_array_equal(one.arrival_s, other.arrival_s)


def test_poisson_interarrival_statistics() -> None:
    config = parse_workload_config({"kind": "poisson", "rate_rps": 50, "input_tokens": FIXED, "output_tokens": FIXED})
    arrival = generate_columns(config, np.random.default_rng(0), 2_000).arrival_s
    gaps = np.diff(arrival)
    assert len(arrival) == pytest.approx(100_000, rel=0.02)
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.02)
    assert _cv(gaps) == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_interarrival_statistics(cv: float) -> None:
    config = parse_workload_config(
        {"kind": "gamma", "rate_rps": 40, "cv": cv, "input_tokens": FIXED, "output_tokens": FIXED}
    )
    gaps = np.diff(generate_columns(config, np.random.default_rng(1), 2_500).arrival_s)
    assert gaps.mean() == pytest.approx(1 / 40, rel=0.03)
    assert _cv(gaps) == pytest.approx(cv, rel=0.06)


def test_diurnal_curve_shape() -> None:
    period_s, mean_rps, peak_to_mean, phase_s = 1_000.0, 40.0, 1.8, 250.0
    config = parse_workload_config(
        {
            "kind": "diurnal",
            "mean_rate_rps": mean_rps,
            "peak_to_mean": peak_to_mean,
            "period_s": period_s,
            "phase_s": phase_s,
            "input_tokens": FIXED,
            "output_tokens": FIXED,
        }
    )
    duration_s = 10 * period_s
    arrival = generate_columns(config, np.random.default_rng(2), duration_s).arrival_s
    assert len(arrival) == pytest.approx(mean_rps * duration_s, rel=0.02)
    # fold onto one period: counts per 20 bins follow the cosine curve
    bins = 20
    phase_bin = np.floor((arrival % period_s) / (period_s / bins)).astype(int)
    observed_rps = np.bincount(phase_bin, minlength=bins) / (10 * period_s / bins)
    centres = (np.arange(bins) + 0.5) * period_s / bins
    expected_rps = diurnal_rate_rps(centres, mean_rps, peak_to_mean, period_s, phase_s)
    assert np.corrcoef(observed_rps, expected_rps)[0, 1] > 0.99
    assert np.abs(observed_rps - expected_rps).max() < 0.1 * mean_rps
    assert observed_rps.argmax() == int(phase_s // (period_s / bins))


def test_step_changes_rate_and_mix() -> None:
    config = parse_workload_config(
        {
            "kind": "step",
            "segments": [
                [0, 10.0],
                {"start_s": 500, "rate_rps": 40.0, "input_tokens": {"kind": "fixed", "tokens": 4000}},
            ],
            "input_tokens": FIXED,
            "output_tokens": FIXED,
        }
    )
    columns = generate_columns(config, np.random.default_rng(4), 1_000)
    first = columns.arrival_s < 500
    assert first.sum() == pytest.approx(5_000, rel=0.05)
    assert (~first).sum() == pytest.approx(20_000, rel=0.05)
    assert set(columns.input_tokens[first].tolist()) == {64}
    assert set(columns.input_tokens[~first].tolist()) == {4000}
    assert np.all(np.diff(columns.arrival_s) >= 0)


def test_step_zero_rate_segment_is_silent() -> None:
    config = parse_workload_config(
        {"kind": "step", "segments": [[0, 5.0], [100, 0.0], [200, 5.0]], "input_tokens": FIXED, "output_tokens": FIXED}
    )
    arrival = generate_columns(config, np.random.default_rng(0), 300).arrival_s
    assert not ((arrival >= 100) & (arrival < 200)).any()
    assert (arrival >= 200).any()


def test_lognormal_lengths_match_parameters() -> None:
    rng = np.random.default_rng(5)
    by_median = sample_lengths(LognormalLength(median_tokens=800, sigma=0.7), rng, 200_000)
    assert np.median(by_median) == pytest.approx(800, rel=0.02)
    assert np.std(np.log(by_median)) == pytest.approx(0.7, rel=0.02)
    by_mean = sample_lengths(LognormalLength(mean_tokens=1_000, p95_tokens=3_000), rng, 200_000)
    assert by_mean.mean() == pytest.approx(1_000, rel=0.02)
    assert np.percentile(by_mean, 95) == pytest.approx(3_000, rel=0.02)


def test_lengths_clipped_to_bounds() -> None:
    dist = LognormalLength(median_tokens=1_000, sigma=2, min_tokens=50, max_tokens=4_000)
    values = sample_lengths(dist, np.random.default_rng(0), 50_000)
    assert values.min() == 50
    assert values.max() == 4_000
    assert values.dtype == np.int64


def test_empirical_from_inline_values_and_csv(tmp_path: Path) -> None:
    inline = sample_lengths(EmpiricalLength(values=(3, 5, 7)), np.random.default_rng(0), 3_000)
    assert set(inline.tolist()) == {3, 5, 7}
    path = tmp_path / "lengths.csv"
    path.write_text("a,tokens\nx,10\ny,20\nz,30\n")
    from_csv = sample_lengths(EmpiricalLength(path=path, column="tokens", max_tokens=25), np.random.default_rng(0), 900)
    assert set(from_csv.tolist()) == {10, 20, 25}
    jsonl = tmp_path / "lengths.jsonl"
    jsonl.write_text('{"n": 4}\n{"n": 6}\n')
    assert set(sample_lengths(EmpiricalLength(path=jsonl, column="n"), np.random.default_rng(0), 100).tolist()) == {
        4,
        6,
    }


def test_prefix_sharing_hash_ids() -> None:
    config = parse_workload_config(
        {
            "kind": "poisson",
            "rate_rps": 50,
            "input_tokens": {"kind": "lognormal", "median_tokens": 3000, "sigma": 0.5, "min_tokens": 1},
            "output_tokens": FIXED,
            "prefix": {"prefix_tokens": 2048, "num_prefixes": 2, "share_frac": 0.6, "block_tokens": 512},
        }
    )
    columns = generate_columns(config, np.random.default_rng(9), 200)
    counts = np.diff(columns.hash_offsets)
    np.testing.assert_array_equal(counts, -(-columns.input_tokens // 512))
    first_blocks = np.array([columns.hash_ids_of(i)[0] for i in range(len(columns))])
    shared = np.isin(first_blocks, [0, 4])  # prefix k starts at id 4k
    long_enough = columns.input_tokens >= 2048
    assert shared[long_enough].mean() == pytest.approx(0.6, abs=0.05)
    row = int(np.flatnonzero(shared & long_enough & (first_blocks == 4))[0])
    assert columns.hash_ids_of(row)[:4].tolist() == [4, 5, 6, 7]
    unique = columns.hash_ids[columns.hash_ids >= 8]
    assert len(np.unique(unique)) == len(unique)


@settings(max_examples=30, deadline=None)
@given(
    rate=st.floats(0.1, 50),
    duration=st.floats(0, 200),
    seed=st.integers(0, 2**32 - 1),
    kind=st.sampled_from(["poisson", "gamma", "diurnal"]),
)
def test_arrivals_sorted_inside_horizon(rate: float, duration: float, seed: int, kind: str) -> None:
    data: dict[str, object] = {"kind": kind, "input_tokens": FIXED, "output_tokens": FIXED}
    if kind == "diurnal":
        data.update(mean_rate_rps=rate, peak_to_mean=1.5, period_s=60)
    else:
        data["rate_rps"] = rate
        if kind == "gamma":
            data["cv"] = 2.0
    columns = generate_columns(parse_workload_config(data), np.random.default_rng(seed), duration)
    assert np.all(np.diff(columns.arrival_s) >= 0)
    assert np.all((columns.arrival_s >= 0) & (columns.arrival_s < max(duration, 1e-300)))
    assert len(columns.to_specs("t")) == len(columns)
