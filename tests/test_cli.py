from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from pdctl.cli import COMMANDS, app

EXAMPLES = Path(__file__).resolve().parents[1] / "policies" / "examples"
runner = CliRunner()


def test_help_lists_every_command() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        assert name in result.output


def test_validate_ok_and_invalid(tmp_path: Path) -> None:
    ok = runner.invoke(app, ["policy", "validate", *map(str, sorted(EXAMPLES.glob("*.yaml")))])
    assert ok.exit_code == 0, ok.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  traffic_percent: 150\nfallback:\n  on_kv_transfer_timeout: nope\n")
    result = runner.invoke(app, ["policy", "validate", str(EXAMPLES / "seed_pd_policy.yaml"), str(bad)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.startswith(str(bad))]
    assert len(lines) == 2
    assert f"{bad}:2: rollout.traffic_percent:" in lines[0] or f"{bad}:2: rollout.traffic_percent:" in lines[1]
    assert any("fallback.on_kv_transfer_timeout" in line for line in lines)
    assert "Traceback" not in result.output


def test_show_prints_every_tenant() -> None:
    result = runner.invoke(app, ["policy", "show", str(EXAMPLES / "multi_tenant.yaml")])
    assert result.exit_code == 0, result.output
    for tenant in ("chatbot", "agent", "rag", "batch-summarization", "default"):
        assert tenant in result.output


def test_show_invalid_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("[1, 2\n")
    result = runner.invoke(app, ["policy", "show", str(bad)])
    assert result.exit_code == 2
    assert "not valid YAML" in result.output


def test_a_command_without_a_module_says_not_available_yet() -> None:
    import typer

    from pdctl.cli import register_commands

    target = typer.Typer()
    register_commands(target, {"policy": "Policies.", "nosuchcommand": "Something for later."})
    result = runner.invoke(target, ["nosuchcommand", "--anything"])
    assert result.exit_code == 3
    assert "not available yet" in result.output
    assert "Traceback" not in result.output


def test_every_listed_command_is_built() -> None:
    import importlib.util

    missing = [name for name in COMMANDS if importlib.util.find_spec(f"pdctl.commands.{name}") is None]
    assert missing == []


def test_console_script_runs_as_a_module() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pdctl", "policy", "validate", str(EXAMPLES / "seed_rollout.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout


def test_sim_runs_deciding_policies() -> None:
    scenario = str(Path(__file__).resolve().parents[1] / "experiments" / "scenarios" / "short-flood-8.yaml")
    ok = runner.invoke(app, ["sim", "--scenario", scenario, "--policy", "baseline:dynamo-legacy"])
    assert ok.exit_code == 0, ok.output
    assert "requests/s" in ok.output
    bad = runner.invoke(app, ["sim", "--scenario", scenario, "--policy", "baseline:nope"])
    assert bad.exit_code == 2
    assert "unknown baseline 'nope'" in bad.output


def test_sim_runs_the_guard_of_a_controller_configuration(tmp_path: Path) -> None:
    """``--guard FILE``: the keda sizer's flood response is held when the hold covers a growing pool too (a cooldown
    of a day: one pool change, then none), and the run is named after the guard it ran."""
    scenario = str(Path(__file__).resolve().parents[1] / "experiments" / "scenarios" / "short-flood-8.yaml")
    args = ["sim", "--scenario", scenario, "--policy", "baseline:keda-queue", "--seed", "1000"]
    frozen = tmp_path / "controller.yaml"
    frozen.write_text("mode: active\nguard:\n  cooldown_s: 86400\n")
    default = runner.invoke(app, [*args, "--json", str(tmp_path / "default.json")])
    held = runner.invoke(app, [*args, "--guard", str(frozen), "--json", str(tmp_path / "held.json")])
    assert default.exit_code == 0, default.output
    assert held.exit_code == 0, held.output
    assert "baseline:keda-queue+guard[cooldown_s=86400]" in held.output
    goodput = {
        name: sum(t["goodput_rps"] or 0.0 for t in json.loads((tmp_path / f"{name}.json").read_text())["tenants"])
        for name in ("default", "held")
    }
    assert goodput["held"] < goodput["default"]
    bad = tmp_path / "guard.yaml"
    bad.write_text("max_step_per_tick: 0\n")
    refused = runner.invoke(app, [*args, "--guard", str(bad)])
    assert refused.exit_code == 2
    assert f"pdctl sim: --guard {bad}: guard.max_step_per_tick: Input should be greater than or equal to 1" in (
        refused.output.replace("\n", " ")
    )
