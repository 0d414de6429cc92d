from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from env.workloads import TraceFormatError, TraceNotFoundError, WorkloadError
from env.workloads.config import parse_workload_config
from env.workloads.generate import generate_columns
from env.workloads.traces import load_azure_csv, load_mooncake_jsonl, load_servegen_folder

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:17:03.9799600,4808,10\n"
ROW2 = "2023-11-16 18:17:04.0319600,3180,8\n"


def _one_line(error: WorkloadError, path: Path) -> str:
    text = str(error)
    assert "\n" not in text
    assert str(path) in text
    return text


def test_missing_files_name_the_path(tmp_path: Path) -> None:
    for loader, name in ((load_azure_csv, "a.csv"), (load_mooncake_jsonl, "m.jsonl")):
        with pytest.raises(TraceNotFoundError) as info:
            loader(tmp_path / name)
        assert "no such file" in _one_line(info.value, tmp_path / name)
    with pytest.raises(TraceNotFoundError) as info:
        load_servegen_folder(tmp_path / "sg")
    _one_line(info.value, tmp_path / "sg")
    with pytest.raises(TraceNotFoundError):
        load_azure_csv(tmp_path)  # a folder


def test_missing_trace_via_config(tmp_path: Path) -> None:
    config = parse_workload_config({"kind": "trace_azure", "path": str(tmp_path / "gone.csv")})
    with pytest.raises(TraceNotFoundError, match=r"gone\.csv"):
        generate_columns(config, np.random.default_rng(0), 10)


@pytest.mark.parametrize(
    ("content", "line", "column", "problem"),
    [
        ("time,a,b\n" + ROW, 1, None, "header"),
        (HEADER + ROW + "2023-11-16 18:17:04.0,12\n", 3, None, "2 fields"),
        (HEADER + ROW + "2023-11-16 18:17:04.0,12x,5\n", 3, "ContextTokens", "not an integer"),
        (HEADER + ROW + "2023-11-16 18:17:04.0,12,-5\n", 3, "GeneratedTokens", "negative"),
        (HEADER + ROW + "yesterday,12,5\n", 3, "TIMESTAMP", "bad timestamp"),
        (HEADER + ROW2 + ROW, 3, "TIMESTAMP", "earlier"),
    ],
)
def test_azure_malformed(tmp_path: Path, content: str, line: int, column: str | None, problem: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(TraceFormatError) as info:
        load_azure_csv(path)
    text = _one_line(info.value, path)
    assert info.value.line == line
    assert info.value.column == column
    assert problem in text
    assert f"{path}:{line}" in text


def _jsonl(rows: list[object]) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}


@pytest.mark.parametrize(
    ("rows", "line", "column", "problem"),
    [
        ([GOOD, '{"timestamp": 1, "input_length": 2'], 2, None, "invalid JSON"),
        ([GOOD, GOOD, {"timestamp": 5, "output_length": 1, "hash_ids": []}], 3, "input_length", "missing field"),
        ([GOOD, {**GOOD, "output_length": "many"}], 2, "output_length", "non-negative token count"),
        ([GOOD, {**GOOD, "input_length": 1.5}], 2, "input_length", "non-negative token count"),
        ([GOOD, {**GOOD, "hash_ids": [0]}], 2, "hash_ids", "expected 2"),
        ([GOOD, {**GOOD, "hash_ids": "0,1"}], 2, "hash_ids", "list of 64-bit integers"),
        ([{**GOOD, "timestamp": 9}, GOOD], 2, "timestamp", "earlier"),
        ([GOOD, [1, 2]], 2, None, "not a JSON object"),
    ],
)
def test_mooncake_malformed(tmp_path: Path, rows: list[object], line: int, column: str | None, problem: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(_jsonl(rows))
    with pytest.raises(TraceFormatError) as info:
        load_mooncake_jsonl(path)
    text = _one_line(info.value, path)
    assert (info.value.line, info.value.column) == (line, column)
    assert problem in text


def test_mooncake_blank_lines_keep_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "gaps.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n\n" + '{"timestamp": oops}\n')
    with pytest.raises(TraceFormatError) as info:
        load_mooncake_jsonl(path)
    assert info.value.line == 4
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps({**GOOD, "timestamp": 3000}) + "\n")
    columns = load_mooncake_jsonl(path)
    assert columns.arrival_s.tolist() == [0.0, 3.0]


def _servegen(folder: Path, trace: str, dataset: object) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "chunk-7-trace.csv").write_text(trace)
    (folder / "chunk-7-dataset.json").write_text(dataset if isinstance(dataset, str) else json.dumps(dataset))


def test_servegen_malformed(tmp_path: Path) -> None:
    folder = tmp_path / "sg"
    pmf = {"0": {"input_tokens": "{10: 0.5, 20: 0.5}", "output_tokens": "{5: 1.0}"}}
    _servegen(folder, "0,0.5,1.0,Gamma,1.0,2.0\n600,0.5,1.0,Zeta,1,2\n", pmf)
    with pytest.raises(TraceFormatError) as info:
        load_servegen_folder(folder)
    assert (info.value.line, info.value.column) == (2, "fit_family")
    _servegen(folder, "0,0.5,1.0,Gamma,1.0,2.0\n600,fast,1.0,,0,0\n", pmf)
    with pytest.raises(TraceFormatError) as info:
        load_servegen_folder(folder)
    assert (info.value.line, info.value.column) == (2, "rate_req_per_s")
    _servegen(folder, "0,0.5,1.0,Gamma,1.0,2.0\n", {"0": {"input_tokens": "{10: x}", "output_tokens": "{5: 1}"}})
    with pytest.raises(TraceFormatError, match=r"0\.input_tokens"):
        load_servegen_folder(folder)
    (folder / "chunk-7-dataset.json").unlink()
    with pytest.raises(TraceNotFoundError, match=r"chunk-7-dataset\.json"):
        load_servegen_folder(folder)
    with pytest.raises(TraceNotFoundError, match="no such ServeGen client"):
        load_servegen_folder(folder, ("99",))


def test_servegen_small_folder_samples(tmp_path: Path) -> None:
    folder = tmp_path / "sg"
    pmfs = {
        "0": {"input_tokens": "{10: 0.5, 20: 0.5}", "output_tokens": "{5: 1.0}"},
        "600": {"input_tokens": "{}", "output_tokens": "{}"},
    }
    _servegen(folder, "0,2.0,1.0,Gamma,1.0,0.5\n600,1.0,2.0,,0,0\n1200,0,0,,0,0\n", pmfs)
    (client,) = load_servegen_folder(folder)
    assert len(client.input_pmfs) == 1  # the empty window is skipped
    config = parse_workload_config({"kind": "servegen", "path": str(folder)})
    columns = generate_columns(config, np.random.default_rng(0), 10_000)
    assert len(columns) == pytest.approx(1800, rel=0.15)
    assert set(columns.input_tokens.tolist()) == {10, 20}
    assert not (columns.arrival_s >= 1200).any()
