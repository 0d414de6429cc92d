from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from env.workloads import generate_columns, parse_workload_config
from pdctl.cli import app
from pdctl.commands.profile import parse_time
from tests.workloads import readme_stats as readme

runner = CliRunner()


def _invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["profile", *args])
    return result.exit_code, result.output


def test_profile_trace_prints_tables_and_verdict(traces_dir: Path) -> None:
    code, output = _invoke(str(traces_dir / readme.AZURE_CODE.file))
    assert code == 0, output
    assert "8,819" in output
    assert "37.5 %" in output
    assert "likely_pays_off" in output


def test_profile_json_to_stdout_and_figures(traces_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "fig"
    code, output = _invoke(str(traces_dir / readme.MOONCAKE_CONVERSATION.file), "--json", "-", "--out", str(out))
    assert code == 0
    document = json.loads(output)
    assert document["num_requests"] == readme.MOONCAKE_CONVERSATION.rows
    assert document["verdict"]["decision"] == "likely_pays_off"
    assert round(100 * document["prefix_reuse"]["block_reuse_frac"], 1) == readme.MOONCAKE_CONVERSATION.block_reuse_pct
    for name in ("lengths.png", "arrival_rate.png", "profile.json"):
        assert (out / name).stat().st_size > 1000
    assert (out / "lengths.png").read_bytes()[:4] == b"\x89PNG"


def test_long_threshold_flag_changes_the_share(traces_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    code, _ = _invoke(str(traces_dir / readme.AZURE_CONV.file), "--long-threshold", "4096", "--json", str(path))
    assert code == 0
    document = json.loads(path.read_text())
    assert document["long_context_threshold_tokens"] == 4096
    assert document["long_context_frac"] < readme.AZURE_CONV.long_pct / 100


def test_short_chat_router_log_is_not_a_priority(tmp_path: Path) -> None:
    config = parse_workload_config(
        {
            "kind": "poisson",
            "rate_rps": 4.0,
            "input_tokens": {"kind": "lognormal", "median_tokens": 250, "sigma": 0.7},
            "output_tokens": {"kind": "lognormal", "median_tokens": 90, "sigma": 0.6},
        }
    )
    columns = generate_columns(config, np.random.default_rng(1), 300)
    log = tmp_path / "chat.jsonl"
    log.write_text(
        "".join(
            json.dumps({"arrival_s": a, "tenant": "chat", "input_tokens": i, "output_tokens": o, "stream": True}) + "\n"
            for a, i, o in zip(
                columns.arrival_s.tolist(), columns.input_tokens.tolist(), columns.output_tokens.tolist(), strict=True
            )
        )
    )
    code, output = _invoke(str(log), "--out", str(tmp_path / "figs"))
    assert code == 0, output
    assert "not_a_priority" in output
    assert "continuous batching" in output
    assert (tmp_path / "figs" / "groups.png").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["{tmp}/missing.csv"], "{tmp}/missing.csv: no such file or folder"),
        (["{tmp}/bad.csv"], "{tmp}/bad.csv:3: column 'GeneratedTokens': not an integer: 'x'"),
        (["{tmp}/bad.jsonl"], "{tmp}/bad.jsonl:2: invalid JSON"),
        (["{tmp}/odd.jsonl"], "{tmp}/odd.jsonl:1: cannot tell the kind"),
        (["{tmp}/bad.jsonl", "--format", "nope"], "--format must be one of"),
        (["http://127.0.0.1:9"], "http://127.0.0.1:9: a Prometheus source needs --start and --end"),
        (["http://127.0.0.1:9", "--start", "now-1h", "--end", "now"], "Prometheus unreachable"),
        (["http://127.0.0.1:9", "--start", "noon", "--end", "now"], "bad --start/--end time"),
        (["{tmp}"], "no chunk-<client>-trace.csv files"),
        (["{tmp}/empty.csv"], "{tmp}/empty.csv: no requests to profile"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], expected: str) -> None:
    (tmp_path / "bad.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,10,1\n2023-11-16 18:17:04.97,10,x\n"
    )
    (tmp_path / "bad.jsonl").write_text(
        '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}\n{x\n'
    )
    (tmp_path / "odd.jsonl").write_text('{"prompt": "hi"}\n')
    (tmp_path / "empty.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    result = runner.invoke(app, ["profile", *(a.format(tmp=tmp_path) for a in args)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(expected.format(tmp=tmp_path)) or expected.format(tmp=tmp_path) in lines[0]
    assert "Traceback" not in result.output


def test_console_script_bad_file_has_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pdctl", "profile", str(tmp_path / "none.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"{tmp_path / 'none.jsonl'}: no such file or folder"
    assert proc.stdout == ""


def test_parse_time_forms() -> None:
    from datetime import UTC, datetime

    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert parse_time("now", now) == now
    assert parse_time("now-1h", now) == datetime(2026, 1, 2, 2, 4, 5, tzinfo=UTC)
    assert parse_time("-30m", now) == datetime(2026, 1, 2, 2, 34, 5, tzinfo=UTC)
    assert parse_time("0") == datetime(1970, 1, 1, tzinfo=UTC)
    assert parse_time("2026-01-01T00:00:00") == datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="isoformat"):
        parse_time("tomorrow")


SCENARIOS = Path(__file__).resolve().parents[2] / "experiments" / "scenarios"


def test_profile_a_scenario_per_tenant(tmp_path: Path) -> None:
    scenario = SCENARIOS / "mixed-chat-rag-aggregated.yaml"
    if not scenario.exists():
        pytest.skip(f"{scenario} is absent")
    path = tmp_path / "s.json"
    code, output = _invoke(str(scenario), "--json", str(path), "--seed", "3")
    assert code == 0, output
    document = json.loads(path.read_text())
    assert document["source_kind"] == "scenario"
    tenants = {g["name"]: g for g in document["by_tenant"]}
    assert set(tenants) == {"chatbot", "rag"}
    assert tenants["rag"]["long_context_frac"] > 0.9
    assert document["prefix_reuse"]["block_reuse_frac"] > 0
    again = tmp_path / "again.json"
    _invoke(str(scenario), "--json", str(again), "--seed", "3")
    assert json.loads(again.read_text()) == document


def test_bad_scenario_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nduration_s: -1\n")
    result = runner.invoke(app, ["profile", str(bad)])
    assert result.exit_code == 2
    assert all(line.startswith(str(bad)) for line in result.output.strip().splitlines())
    assert "Traceback" not in result.output
