"""The demo's phases: start the stack, replay the load with a live dashboard, stop everything.

One phase = the emulated instances (one process), the router, the metric source (a real Prometheus, or the
controller's built-in scraper), the controller, and the load generator, each a child in its own process
group (see :mod:`pdctl.demo.processes`). The static-baseline phase runs the controller in advisory mode
(it observes and logs what it would do, and changes nothing); the controlled phase runs it active. Both
phases start from the same split and thresholds and replay the same requests (same scenario, same seed).
Every child is stopped when the phase ends, fails, or the demo is interrupted.
"""

from __future__ import annotations

import json
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.live import Live

from env.scenario import Scenario
from pdctl.demo.config import (
    DemoOptions,
    RequestSloBounds,
    controller_config,
    instance_roles,
    prometheus_config,
    router_config,
    scaled_policy_document,
    scenario_document,
)
from pdctl.demo.dashboard import plain_line, render
from pdctl.demo.monitor import Monitor, Snapshot
from pdctl.demo.processes import ChildProcess, ProcessSet, StartupError, free_port, http_get, pdctl_argv

__all__ = ["PhaseResult", "run_phase"]

STARTUP_TIMEOUT_S = 60.0
LOAD_DRAIN_S = 30.0
"""Emulated seconds the load generator may take after the last arrival before it is cut off."""
POLL_INTERVAL_S = 1.0


@dataclass
class PhaseResult:
    """Where one phase left its files, and what it used."""

    name: str
    directory: Path
    load_json: Path
    request_log: Path
    audit_log: Path
    timeline: list[dict[str, Any]]
    load_offset_s: float
    """Emulated seconds between the monitor's clock origin and the load generator's (timeline alignment)."""
    metric_source: str
    controller_mode: str
    policy: str
    wall_s: float
    logs: dict[str, Path] = field(default_factory=dict)


def _read_emulator_urls(path: Path) -> dict[str, str]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {str(i["id"]): str(i["url"]) for i in data["instances"]}


def _load_offset_s(load_json: Path, request_log: Path, monitor: Monitor) -> float:
    """Monitor time of the load generator's t = 0, from requests seen by both (median; 0 if none)."""
    try:
        requests = json.loads(load_json.read_text(encoding="utf-8"))["requests"]
        scheduled = {r["request_id"]: float(r["arrival_s"]) for r in requests}
        offsets = []
        for line in request_log.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("request_id") in scheduled:
                offsets.append(monitor.elapsed_s(float(rec["arrival_ts"])) - scheduled[rec["request_id"]])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0
    if not offsets:
        return 0.0
    offsets.sort()
    return offsets[len(offsets) // 2]


def run_phase(
    *,
    name: str,
    mode: str,
    policy: str,
    options: DemoOptions,
    scenario: Scenario,
    slos: dict[str, RequestSloBounds],
    directory: Path,
    console: Console,
    live: bool,
    use_prometheus: bool,
    on_snapshot: Callable[[Snapshot], None] | None = None,
) -> PhaseResult:
    """Run one phase to completion (or failure) and stop every child it started."""
    started = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    ts = options.time_scale
    seed = scenario.seed
    group = scenario.tenant_groups[0].name
    roles = instance_roles(scenario)
    num_prefill = sum(1 for r in roles.values() if r == "prefill")
    token = secrets.token_hex(16)
    scenario_path = directory / "scenario.yaml"
    scenario_path.write_text(yaml.safe_dump(scenario_document(scenario), sort_keys=False), encoding="utf-8")
    policy_path = directory / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(scaled_policy_document(options.policy_file, ts), sort_keys=False))
    request_log = directory / "router-requests.jsonl"
    audit_log = directory / "controller-audit.jsonl"
    load_json = directory / "load.json"
    override_dir = directory / "overrides"
    override_dir.mkdir(exist_ok=True)
    # The router and the controller append to their logs, and the controller reads the override folder and its
    # control memory (controller.control_memory): what an earlier run left in this folder would be
    # counted in this run's report, override its policy, or start this fresh deployment from its thresholds.
    memory = directory / "controller.memory.json"
    for stale in (request_log, audit_log, memory, *override_dir.iterdir()):
        if stale.is_file():
            stale.unlink()
    children = ProcessSet()
    logs: dict[str, Path] = {}

    def child(label: str, argv: list[str]) -> ChildProcess:
        logs[label] = directory / f"{label}.log"
        return children.start(ChildProcess(label, argv, logs[label], env=dict(options.extra_env)))

    metric_source = "prometheus" if use_prometheus else "built-in scraper"
    tsdb = tempfile.TemporaryDirectory(prefix="pdctl-demo-tsdb-")
    try:
        # 1. emulated instances (one process, free ports), then the router in front of them
        emulator_routes = directory / "emulator-instances.yaml"
        emulator_routes.unlink(missing_ok=True)  # a file left by an earlier run in this folder is not this one's
        emulator = child("emulator", pdctl_argv(
            "emulate", "--prefill", str(num_prefill), "--decode", str(len(roles) - num_prefill), "--base-port", "0",
            "--scenario", str(scenario_path), "--time-scale", repr(ts), "--seed", str(seed),
            "--router-config", str(emulator_routes),
        ))  # fmt: skip
        emulator.wait_ready(emulator_routes.is_file, STARTUP_TIMEOUT_S)
        urls = _read_emulator_urls(emulator_routes)
        router_port = free_port()
        router_url = f"http://127.0.0.1:{router_port}"
        router_path = directory / "router.yaml"
        router_path.write_text(yaml.safe_dump(
            router_config(router_port, urls, roles, policy_path, request_log, token, scenario), sort_keys=False
        ))  # fmt: skip
        router = child("router", pdctl_argv("router", "--config", str(router_path), "--log-level", "WARNING"))
        router.wait_ready(lambda: http_get(f"{router_url}/health", 1.0)[0] == 200, STARTUP_TIMEOUT_S)
        # 2. the metric source
        prometheus_url: str | None = None
        if use_prometheus:
            binary = shutil.which("prometheus")
            assert binary is not None
            prom_port = free_port()
            prometheus_url = f"http://127.0.0.1:{prom_port}"
            prom_config = directory / "prometheus.yml"
            prom_config.write_text(yaml.safe_dump(prometheus_config(router_url, urls, group)))
            prom = child("prometheus", [
                binary, f"--config.file={prom_config}", f"--storage.tsdb.path={tsdb.name}",
                f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn",
                "--storage.tsdb.retention.time=1d",
            ])  # fmt: skip
            prom.wait_ready(lambda: http_get(f"{prometheus_url}/-/ready", 1.0)[0] == 200, STARTUP_TIMEOUT_S)
        # 3. the controller
        controller_port = free_port()
        controller_path = directory / "controller.yaml"
        controller_path.write_text(yaml.safe_dump(controller_config(
            mode=mode, policy=policy, policy_path=policy_path, port=controller_port, router_url=router_url,
            token=token, urls=urls, roles=roles, group=group, audit_log=audit_log, override_dir=override_dir,
            prometheus_url=prometheus_url, time_scale=ts, interval_s=options.controller_interval_s,
        ), sort_keys=False))  # fmt: skip
        controller = child("controller", pdctl_argv("controller", "--config", str(controller_path),
                                                    "--log-level", "WARNING"))  # fmt: skip
        controller.wait_ready(
            lambda: http_get(f"http://127.0.0.1:{controller_port}/healthz", 1.0)[0] == 200, STARTUP_TIMEOUT_S
        )
        # 4. the load
        max_wall_s = (scenario.duration_s + LOAD_DRAIN_S) * ts + 15.0
        load = child("loadgen", pdctl_argv(
            "loadgen", "--url", router_url, "--scenario", str(scenario_path), "--time-scale", repr(ts),
            "--seed", str(seed), "--max-duration-s", f"{max_wall_s:.1f}",
            "--request-timeout-s", f"{(LOAD_DRAIN_S + 60.0) * ts:.1f}", "--out-json", str(load_json),
            "--out-csv", str(directory / "load.csv"),
        ))  # fmt: skip
        monitor = Monitor(
            phase=name, router_url=router_url, admin_token=token, request_log=request_log, audit_log=audit_log,
            instance_urls=urls, slos=slos, time_scale=ts, duration_s=scenario.duration_s,
        )  # fmt: skip
        _watch(load, children, monitor, console, live, max_wall_s + 30.0, on_snapshot)
        if load.proc is not None and load.proc.returncode != 0:
            raise StartupError(f"loadgen exited with status {load.proc.returncode}; log {load.log_path}:\n"
                               f"{load.log_tail()}")  # fmt: skip
        monitor.poll()
    finally:
        children.stop_all()
        tsdb.cleanup()
    timeline = [p.as_dict() for p in monitor.timeline]
    (directory / "timeline.json").write_text(json.dumps(timeline) + "\n", encoding="utf-8")
    return PhaseResult(
        name=name,
        directory=directory,
        load_json=load_json,
        request_log=request_log,
        audit_log=audit_log,
        timeline=timeline,
        load_offset_s=_load_offset_s(load_json, request_log, monitor),
        metric_source=metric_source,
        controller_mode=mode,
        policy=policy,
        wall_s=time.monotonic() - started,
        logs=logs,
    )


def _watch(
    load: ChildProcess,
    children: ProcessSet,
    monitor: Monitor,
    console: Console,
    live: bool,
    timeout_s: float,
    on_snapshot: Callable[[Snapshot], None] | None,
) -> None:
    """Poll and show the dashboard until the load generator exits; fail if another child dies."""
    deadline = time.monotonic() + timeout_s
    last_plain = 0.0

    def step() -> Snapshot | None:
        dead = [c for c in children.dead() if c is not load]
        if dead:
            raise StartupError(f"{dead[0].name} exited during the run; log {dead[0].log_path}:\n{dead[0].log_tail()}")
        if time.monotonic() > deadline:
            raise StartupError(f"the load did not finish within {timeout_s:.0f} s")
        snap = monitor.poll()
        if on_snapshot is not None:
            on_snapshot(snap)
        return snap

    if live:
        with Live(console=console, refresh_per_second=2, transient=False) as view:
            while load.wait(POLL_INTERVAL_S) is None:
                snap = step()
                if snap is not None:
                    view.update(render(snap))
        return
    while load.wait(POLL_INTERVAL_S) is None:
        snap = step()
        now = time.monotonic()
        if snap is not None and now - last_plain >= 10.0:
            last_plain = now
            print(plain_line(snap), flush=True, file=sys.stdout)
