"""Any file content gives a loaded trace or a one-line TraceFormatError, never another exception."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from env.workloads.errors import TraceFormatError
from env.workloads.traces import load_azure_csv, load_mooncake_jsonl
from livestack.profiling.router_log import load_router_log

AZURE_LINES = [
    "TIMESTAMP,ContextTokens,GeneratedTokens",
    "2023-11-16 18:17:03.9799600,4808,10",
    "2023-11-16 18:17:04.0319600,3180,8",
    "2023-11-16 18:17:05,1,1",
]
MOONCAKE_LINES = [
    '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}',
    '{"timestamp": 3000, "input_length": 10, "output_length": 1, "hash_ids": [0]}',
    '{"timestamp": 6000, "input_length": 1024, "output_length": 7, "hash_ids": [0, 2]}',
]
ROUTER_LINES = [
    '{"arrival_ts": 1.5, "tenant": "a", "input_tokens": 10, "output_tokens": 3, "ttft_s": 0.1, "stream": true}',
    '{"ts": "2026-01-01T00:00:00Z", "input_tokens": 5, "output_tokens": 1, "stages": {"x": 0.1}}',
]
_JUNK_NUMBERS = ["-1", "0", "0.5", "1e30", "1e309", "NaN", "99999999999999999999999", "-99999999999999999999"]
JUNK = st.sampled_from(["", ",", "{", "}", "[", "]", '"', ":", "null", "true", " ", "\t", "x", "é", *_JUNK_NUMBERS])


def _mutated(lines: list[str]) -> st.SearchStrategy[str]:
    line = st.one_of(
        st.sampled_from(lines),
        st.builds(lambda a, j, k: a[:k] + j + a[k:], st.sampled_from(lines), JUNK, st.integers(0, 80)),
        st.builds(lambda a, k: a[:k], st.sampled_from(lines), st.integers(0, 80)),
        st.text(max_size=30),
    )
    return st.lists(line, max_size=6).map("\n".join)


def _check(loader: object, content: str, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"t{suffix}"
        path.write_text(content, encoding="utf-8", errors="surrogatepass")
        error: TraceFormatError | None = None
        try:
            loader(path)  # type: ignore[operator]
        except TraceFormatError as exc:
            error = exc
        if error is not None:
            assert "\n" not in str(error)
            assert str(path) in str(error)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(_mutated(AZURE_LINES))
def test_azure_loader_never_crashes(content: str) -> None:
    _check(load_azure_csv, content, ".csv")


@SETTINGS
@given(_mutated(MOONCAKE_LINES))
def test_mooncake_loader_never_crashes(content: str) -> None:
    _check(load_mooncake_jsonl, content, ".jsonl")


@SETTINGS
@given(_mutated(ROUTER_LINES))
def test_router_log_loader_never_crashes(content: str) -> None:
    _check(load_router_log, content, ".jsonl")
