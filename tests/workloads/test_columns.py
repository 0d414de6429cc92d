from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from env.workloads.columns import RequestColumns
from env.workloads.traces.window import apply_window, repeat_window


@st.composite
def columns(draw: st.DrawFn) -> RequestColumns:
    n = draw(st.integers(0, 40))
    gaps = draw(st.lists(st.floats(0, 10), min_size=n, max_size=n))
    arrival = np.cumsum(np.array(gaps, dtype=np.float64))
    blocks = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    offsets = np.concatenate(([0], np.cumsum(blocks))).astype(np.int64)
    ids = np.arange(offsets[-1], dtype=np.int64) * 3
    inputs = np.array(blocks, dtype=np.int64) * 512 + 1
    return RequestColumns.from_arrays(arrival, inputs, np.arange(n, dtype=np.int64), hash_ids=ids, hash_offsets=offsets)


@settings(max_examples=60, deadline=None)
@given(
    cols=columns(),
    start=st.floats(0, 100),
    duration=st.one_of(st.none(), st.floats(0.1, 200)),
    scale=st.floats(0.1, 10),
    horizon=st.one_of(st.none(), st.floats(0, 100)),
    cap=st.one_of(st.none(), st.integers(1, 50)),
)
def test_apply_window_equals_naive_filter(
    cols: RequestColumns, start: float, duration: float | None, scale: float, horizon: float | None, cap: int | None
) -> None:
    window = apply_window(
        cols, start_s=start, duration_s=duration, rate_scale=scale, horizon_s=horizon, max_requests=cap
    )
    end = np.inf if duration is None else start + duration
    rows = [i for i in range(len(cols)) if start <= cols.arrival_s[i] < end]
    rows = [i for i in rows if horizon is None or (cols.arrival_s[i] - start) / scale < horizon]
    rows = rows[:cap] if cap is not None else rows
    assert len(window) == len(rows)
    for j, i in enumerate(rows):
        assert window.arrival_s[j] == pytest.approx((cols.arrival_s[i] - start) / scale)
        assert window.output_tokens[j] == cols.output_tokens[i]
        np.testing.assert_array_equal(window.hash_ids_of(j), cols.hash_ids_of(i))
    specs = window.to_specs("t", "p/")
    assert [s.request_id for s in specs] == [f"p/t-{j}" for j in range(len(rows))]


@settings(max_examples=40, deadline=None)
@given(cols=columns(), horizon=st.floats(0, 2000), cap=st.one_of(st.none(), st.integers(1, 200)))
def test_repeat_window_is_sorted_and_periodic(cols: RequestColumns, horizon: float, cap: int | None) -> None:
    period = float(cols.arrival_s[-1]) + 1.0 if len(cols) else 1.0
    tiled = repeat_window(cols, period, horizon, cap)
    assert np.all(np.diff(tiled.arrival_s) >= 0)
    assert np.all(tiled.arrival_s < max(horizon, period)) or len(tiled) == 0
    if cap is not None:
        assert len(tiled) <= cap
    if len(cols):
        for j in range(min(len(tiled), 3 * len(cols))):
            k, i = divmod(j, len(cols))
            assert tiled.arrival_s[j] == pytest.approx(cols.arrival_s[i] + k * period)
            assert tiled.input_tokens[j] == cols.input_tokens[i]


def test_columns_reject_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="lengths differ"):
        RequestColumns(
            np.zeros(2),
            np.zeros(1, dtype=np.int64),
            np.zeros(2, dtype=np.int64),
            np.zeros(0, dtype=np.int64),
            np.zeros(3, dtype=np.int64),
        )
