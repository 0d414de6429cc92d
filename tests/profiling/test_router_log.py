from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from env.workloads.errors import TraceFormatError
from livestack.profiling import profile_records, profile_source
from livestack.profiling.router_log import load_router_log


def _record(i: int, tenant: str, route: str, input_tokens: int, **extra: object) -> dict[str, object]:
    row: dict[str, object] = {
        "request_id": f"r{i}",
        "arrival_ts": 1_700_000_000.0 + i * 0.5,
        "tenant": tenant,
        "route": route,
        "stream": i % 4 != 0,
        "status": 200,
        "input_tokens": input_tokens,
        "expected_output_tokens": 100,
        "output_tokens": 50 + i % 7,
        "prefix_hit_tokens": input_tokens // 2 if tenant == "rag" else 0,
        "ttft_s": 0.1 + 0.001 * i,
        "tpot_s": 0.02,
        "e2e_s": 1.0,
        "stages": {"request_queue_wait": 0.001, "prefill_compute_time": 0.05},
    }
    row.update(extra)
    return row


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_router_log_profile(tmp_path: Path) -> None:
    rows = [_record(i, "chat", "local_prefill", 300) for i in range(60)]
    rows += [_record(60 + i, "rag", "remote_prefill", 6000) for i in range(40)]
    rows[5]["status"] = 500
    rows[6]["ttft_s"] = None
    path = _write(tmp_path / "router.jsonl", rows[::-1])  # out of order on purpose
    records = load_router_log(path)
    assert len(records) == 100
    assert records.arrival_s is not None
    assert records.arrival_s[0] == 0.0
    assert np.all(np.diff(records.arrival_s) >= 0)
    profile = profile_source(str(path))
    assert profile.source_kind == "router_log"
    assert {g.name for g in profile.by_tenant} == {"chat", "rag"}
    assert {g.name for g in profile.by_route} == {"local_prefill", "remote_prefill"}
    rag = next(g for g in profile.by_tenant if g.name == "rag")
    assert rag.share_frac == pytest.approx(0.4)
    assert rag.long_context_frac == 1.0
    assert profile.streaming_frac == pytest.approx(0.75)
    assert profile.success_frac == pytest.approx(0.99)
    assert profile.latency["ttft"].count == 99
    assert profile.latency["tpot"].p50_s == pytest.approx(0.02)
    assert set(profile.stages) == {"request_queue_wait", "prefill_compute_time"}
    assert profile.prefix_reuse is not None
    assert profile.prefix_reuse.source == "prefix_hit_tokens"
    assert profile.prefix_reuse.token_reuse_frac == pytest.approx(40 * 3000 / (60 * 300 + 40 * 6000))
    assert profile.uncached_long_context_frac == pytest.approx(0.4)  # 3000 uncached tokens still ≥ 2048
    assert profile.long_context_frac == pytest.approx(0.4)


def test_router_log_minimal_fields_and_iso_times(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "min.jsonl",
        [
            {"ts": "2026-01-01T00:00:00Z", "input_tokens": 10, "output_tokens": 5},
            {"ts": "2026-01-01T00:00:02+00:00", "input_tokens": 20, "output_tokens": 5},
            {"ts": "2026-01-01T00:00:03Z", "input_tokens": 30, "output_tokens": 5},
        ],
    )
    records = load_router_log(path)
    assert records.arrival_s is not None
    assert records.arrival_s.tolist() == [0.0, 2.0, 3.0]
    assert records.tenant is None
    profile = profile_records(records, source="min")
    assert profile.by_tenant == []
    assert profile.streaming_frac is None
    assert profile.latency == {}


@pytest.mark.parametrize(
    ("row", "column", "problem"),
    [
        ({"input_tokens": "many", "output_tokens": 1}, "input_tokens", "token count"),
        ({"output_tokens": 1}, "input_tokens", "missing field"),
        ({"input_tokens": 1, "output_tokens": 1, "ttft_s": "fast"}, "ttft_s", "non-negative number"),
        ({"input_tokens": 1, "output_tokens": 1, "ts": "noon"}, "ts", "bad time"),
        ({"input_tokens": 1, "output_tokens": 1, "stages": [1]}, "stages", "stage"),
    ],
)
def test_router_log_errors_name_line_and_field(
    tmp_path: Path, row: dict[str, object], column: str, problem: str
) -> None:
    path = _write(tmp_path / "bad.jsonl", [{"input_tokens": 5, "output_tokens": 5}, row])
    with pytest.raises(TraceFormatError) as info:
        load_router_log(path)
    assert (info.value.line, info.value.column) == (2, column)
    assert problem in str(info.value)
    assert str(path) in str(info.value)
