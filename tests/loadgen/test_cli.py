"""``pdctl loadgen`` end to end against an emulated instance in its own process, with a trace workload."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from pdctl.commands.loadgen import register

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def emulator_url() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "livestack.emulator", "--prefill", "0", "--decode", "1", "--base-port", "0",
         "--time-scale", "0.2", "--duration-s", "60"],
        stdout=subprocess.PIPE, cwd=REPO, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("emulator d0 "), line
        yield line.split()[2]
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_loadgen_replays_a_mooncake_trace_window(emulator_url: str, traces_dir: Path, tmp_path: Path) -> None:
    workload = tmp_path / "workload.yaml"
    workload.write_text(
        yaml.safe_dump(
            {
                "kind": "trace_mooncake",
                "path": str(traces_dir / "mooncake_fast25" / "conversation_trace.jsonl"),
                "duration_s": 20.0,
                "rate_scale": 4.0,
                "max_requests": 12,
            }
        )
    )
    app = typer.Typer()
    register(app, "loadgen", "Replay.")
    out_json, out_csv = tmp_path / "out.json", tmp_path / "out.csv"
    args = ["--url", emulator_url, "--workload", str(workload), "--duration-s", "5", "--time-scale", "0.2"]
    args += ["--max-requests", "6", "--tenant", "mooncake", "--out-json", str(out_json), "--out-csv", str(out_csv)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "mooncake" in result.output
    assert "TTFT p50" in result.output
    doc = json.loads(out_json.read_text())
    assert 1 <= len(doc["requests"]) <= 6
    for request in doc["requests"]:
        assert request["status"] == 200, request
        assert request["output_tokens"] == request["requested_output_tokens"]
        assert request["ttft_s"] > 0
    assert len(out_csv.read_text().splitlines()) == len(doc["requests"]) + 1


def test_loadgen_refuses_a_bad_workload(tmp_path: Path) -> None:
    workload = tmp_path / "workload.yaml"
    workload.write_text("kind: nonsense\n")
    app = typer.Typer()
    register(app, "loadgen", "Replay.")
    result = CliRunner().invoke(app, ["--workload", str(workload)])
    assert result.exit_code == 2
