"""Config (YAML/JSON, env overrides, schema, errors), the daemon's HTTP endpoints and reloads, the CLI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from typer.testing import CliRunner

from controller.clock import VirtualClock, WallClock
from controller.config import ConfigError, ControllerConfig, config_schema, load_config
from controller.daemon import Daemon
from controller.runtime import RuntimeConfigError, build_runtime
from pdctl.cli import app
from tests.controller.harness import free_port
from tests.controller.test_loop import POLICY


def write_config(tmp_path: Path, **overrides: Any) -> Path:
    (tmp_path / "policy.yaml").write_text(POLICY)
    data: dict[str, Any] = {
        "mode": "active",
        "interval_s": 1.0,
        "policy": "baseline:queue_kv",
        "policy_file": "policy.yaml",
        "audit_log": "audit.jsonl",
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "source": {"kind": "scrape", "window_s": 5.0, "timeout_s": 0.5},
        "instances": [{"id": "d0", "group": "g", "role": "decode", "url": "http://127.0.0.1:9"}],
        **overrides,
    }
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_load_config_resolves_paths_and_env_overrides_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(tmp_path, guard={"cooldown_s": 5.0, "hysteresis_ticks": 3})
    config = load_config(path)
    assert config.policy_file == tmp_path / "policy.yaml"
    assert config.audit_log == tmp_path / "audit.jsonl"
    monkeypatch.setenv("PDCTL_CONTROLLER_MODE", "advisory")
    monkeypatch.setenv("PDCTL_CONTROLLER_GUARD__COOLDOWN_S", "30")
    config = load_config(path)
    assert config.mode == "advisory"
    assert config.guard.cooldown_s == 30.0
    assert config.guard.hysteresis_ticks == 3, "nested fields the environment does not set keep the file's value"


def test_json_config_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"policy": "baseline:queue_kv", "policy_file": "policy.yaml"}))
    config = load_config(path)
    assert config.mode == "advisory", "advisory is the default"
    assert [a.kind for a in config.actuators] == ["dry_run"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"mode": "yolo"}, "mode"),
        ({"interval_s": 0}, "interval_s"),
        ({"policy": "nonsense"}, "expected one of file:PATH"),
        ({"guard": {"max_step_per_tick": 0}}, "guard.max_step_per_tick"),
        ({"unknown_key": 1}, "unknown_key"),
        ({"instances": [{"id": "a", "group": "g", "role": "decode"}, {"id": "a", "group": "g", "role": "decode"}]},
         "instance ids must be unique"),
        ({"actuators": [{"kind": "dry_run"}, {"kind": "dry_run"}]}, "at most one actuator of each kind"),
        ({"source": {"kind": "scrape", "window_s": 0.5}}, "window_s must be at least interval_s"),
        ({"watchdog": {"fallback": "learned:/x"}}, "fallback: 'learned:/x' is not a rule policy"),
        ({"watchdog": {"fallback": "nope"}}, "watchdog: Value error, fallback: policy spec 'nope': expected one of"),
        ({"watchdog": {"trigger_intervals": 0}}, "watchdog.trigger_intervals"),
        ({"watchdog": {"hold_intervals": 30, "max_hold_intervals": 10}},
         "watchdog max_hold_intervals (10) must be >= hold_intervals (30)"),
        ({"guard": {"threshold_dead_band_frac": 1.0}}, "guard.threshold_dead_band_frac"),
        ({"guard": {"threshold_reversal_hold_s": -1}}, "guard.threshold_reversal_hold_s"),
        ({"guard": {"pool_reversal_hold_s": -1}}, "guard.pool_reversal_hold_s"),
        ({"watchdog": {"load_tolerance_frac": 0}}, "watchdog.load_tolerance_frac"),
        ({"watchdog": {"min_evidence_windows": 5, "max_evidence_windows": 4}},
         "watchdog max_evidence_windows (4) must be >= min_evidence_windows (5)"),
    ],
)  # fmt: skip
def test_invalid_configs_name_the_field(tmp_path: Path, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write_config(tmp_path, **overrides))
    assert message in str(info.value)
    assert str(tmp_path / "controller.yaml") in str(info.value)


def test_runtime_checks_cross_references(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, instances=[{"id": "x", "group": "nope", "role": "decode"}]))
    with pytest.raises(RuntimeConfigError, match="instance 'x' names tenant group 'nope'"):
        build_runtime(config, 1, 0.0)
    config = load_config(write_config(tmp_path, policy="baseline:missing"))
    with pytest.raises(RuntimeConfigError, match="unknown baseline 'missing'"):
        build_runtime(config, 1, 0.0)
    config = load_config(write_config(tmp_path, watchdog={"fallback": "baseline:missing"}))
    with pytest.raises(RuntimeConfigError, match="unknown baseline 'missing'"):
        build_runtime(config, 1, 0.0)
    k8s = {"kind": "kubernetes", "api_url": "http://127.0.0.1:9", "token": "t", "groups": {"h": {
        "prefill": {"name": "p"}, "decode": {"name": "d"}}}}  # fmt: skip
    config = load_config(write_config(tmp_path, actuators=[k8s]))
    with pytest.raises(RuntimeConfigError, match="kubernetes actuator names tenant group 'h'"):
        build_runtime(config, 1, 0.0)


def test_schema_is_json_with_descriptions() -> None:
    schema = json.loads(config_schema())
    assert schema["title"] == "ControllerConfig"
    assert "interval_s" in schema["properties"]
    assert schema["properties"]["mode"]["description"].startswith("advisory")
    assert ControllerConfig.model_json_schema() == schema


def test_virtual_clock_is_refused_outside_tests(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    with pytest.raises(RuntimeError, match="virtual clock is for tests only"):
        Daemon(path, VirtualClock())
    assert Daemon(path, VirtualClock(), allow_virtual_clock=True).clock.production_safe is False
    assert WallClock().production_safe


async def test_daemon_serves_health_ready_metrics_and_reloads(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    clock = VirtualClock()
    daemon = Daemon(path, clock, allow_virtual_clock=True)
    port = daemon.loop.runtime.config.listen.port
    task = asyncio.create_task(daemon.run(install_signals=False))
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:

            async def get(route: str) -> tuple[int, str]:
                for _ in range(100):
                    try:
                        async with session.get(base + route) as response:
                            return response.status, await response.text()
                    except aiohttp.ClientConnectorError:
                        await asyncio.sleep(0.05)
                raise AssertionError("daemon never listened")

            for _ in range(100):
                if daemon.loop.state.ticks >= 1:
                    break
                await asyncio.sleep(0.02)
            assert (await get("/healthz"))[0] == 200
            # The only instance is unreachable: no observation yet, so not ready.
            assert (await get("/readyz"))[0] == 503
            status, metrics = await get("/metrics")
            assert status == 200
            assert "pdctl_controller_tick_duration_seconds_bucket" in metrics
            assert (
                'pdctl_controller_policy_info{generation="1",mode="active",policy_id="baseline:queue_kv"} 1.0'
                in metrics
            )
            # No tick for longer than 3 intervals (the virtual clock jumps, the tick loop is parked) → unhealthy.
            daemon.loop.state.last_tick_s = clock.monotonic() - 10.0
            assert (await get("/healthz"))[0] == 503
            # Reload: a bad file keeps generation 1; a good one swaps to generation 2.
            path.write_text("mode: [\n")
            assert not await daemon.reload()
            assert daemon.loop.runtime.generation == 1
            write_config(tmp_path, mode="advisory", listen={"host": "127.0.0.1", "port": port})
            assert await daemon.reload()
            assert daemon.loop.runtime.generation == 2
            assert daemon.loop.runtime.config.mode == "advisory"
            status, metrics = await get("/metrics")
            assert 'pdctl_controller_config_reloads_total{result="error"} 1.0' in metrics
            assert (
                'pdctl_controller_policy_info{generation="2",mode="advisory",policy_id="baseline:queue_kv"} 1.0'
                in metrics
            )
    finally:
        daemon.signals.stop.set()
        await asyncio.wait_for(task, timeout=10)


def test_cli_prints_schema_and_refuses_bad_config(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["controller", "--print-schema"])
    assert result.exit_code == 0
    assert json.loads(result.output)["title"] == "ControllerConfig"
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: nonsense\npolicy_file: x.yaml\n")
    result = runner.invoke(app, ["controller", "--config", str(bad)])
    assert result.exit_code == 2
    missing = runner.invoke(app, ["controller"])
    assert missing.exit_code == 2


def test_shipped_example_configs_are_valid() -> None:
    examples = Path(__file__).resolve().parents[2] / "controller" / "examples"
    off_cluster = load_config(examples / "controller.yaml")  # tests/integration/test_controller_example.py runs it
    assert [a.kind for a in off_cluster.actuators] == ["router"]
    assert build_runtime(off_cluster, 1, 0.0).policy.policy_id == "baseline:queue_kv"
    config = load_config(examples / "controller-kubernetes.yaml")
    assert config.mode == "advisory"
    assert [a.kind for a in config.actuators] == ["router", "kubernetes"]
    # Outside a pod there is no service-account token: refused with the file named.
    with pytest.raises(RuntimeConfigError, match="cannot read token_file /var/run/secrets"):
        build_runtime(config, 1, 0.0)
    runtime = build_runtime(config.model_copy(update={"actuators": config.actuators[:1]}), 1, 0.0)
    assert runtime.policy.policy_id == "baseline:queue_kv"
    assert {i.group for i in runtime.topology.instances} == {"interactive"}
