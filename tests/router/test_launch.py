from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from pdctl.commands.launch import register, router_config, vllm_commands
from router.config import load_router_config


def test_commands_follow_the_nixl_usage() -> None:
    specs = vllm_commands("m", "0", "1,2+3", side_channel_host="10.0.0.5")
    assert [(s.instance_id, s.role, s.port) for s in specs] == [
        ("p0", "prefill", 8100),
        ("d0", "decode", 8200),
        ("d1", "decode", 8201),
    ]
    assert [s.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for s in specs] == ["5600", "5601", "5602"]
    assert specs[2].env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert all(s.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.5" for s in specs)
    argv = specs[2].argv
    assert argv[:3] == ["vllm", "serve", "m"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv["kv_connector"] == "NixlConnector"
    assert kv["kv_role"] == "kv_both"
    explicit = vllm_commands("m", "0", "1", kv_role="explicit")
    roles = [json.loads(s.argv[s.argv.index("--kv-transfer-config") + 1])["kv_role"] for s in explicit]
    assert roles == ["kv_producer", "kv_consumer"]


def test_router_config_is_valid(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(router_config(vllm_commands("m", "0,1", "2"))))
    config = load_router_config(path)
    assert [(i.id, i.role, i.url) for i in config.instances] == [
        ("p0", "prefill", "http://127.0.0.1:8100"),
        ("p1", "prefill", "http://127.0.0.1:8101"),
        ("d0", "decode", "http://127.0.0.1:8200"),
    ]


def test_dry_run_prints_commands_and_writes_the_router_config(tmp_path: Path) -> None:
    app = typer.Typer()
    register(app, "launch", "Start vLLM instances.")
    out = tmp_path / "router.yaml"
    result = CliRunner().invoke(app, ["--model", "m", "--decode-gpus", "1,2", "--router-config", str(out), "--dry-run"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 3
    assert all("vllm serve m" in line and "NixlConnector" in line for line in lines)
    assert len(load_router_config(out).instances) == 3
