"""``pdctl demo`` end to end: choose the policy, run the static-baseline and controlled phases, report.

Interrupts (Ctrl-C, SIGTERM) stop the running phase's children before the demo exits (status 130).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from rich.console import Console

from pdctl.demo.config import (
    CHAMPION_SPEC,
    FALLBACK_POLICY_SPEC,
    DemoInputError,
    DemoOptions,
    load_demo_scenario,
    tenant_slos,
)
from pdctl.demo.processes import pdctl_argv
from pdctl.demo.report import build_report
from pdctl.demo.runner import PhaseResult, run_phase
from policies.data_dir import TRACKING_URI_ENV, embedded_tracking_db

__all__ = ["DemoInterrupted", "choose_policy", "default_out_dir", "run_demo"]

PROFILE_TIMEOUT_S = 120.0


class DemoInterrupted(Exception):
    """SIGINT or SIGTERM arrived; the running phase was stopped."""


def default_out_dir() -> Path:
    """``runs/demo-<UTC timestamp>``."""
    return Path("runs") / f"demo-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"


def _champion_available(console: Console) -> bool:
    """Whether the local MLflow registry has ``pdctl-generalist@champion`` and the controller can load it."""
    tracking = os.environ.get(TRACKING_URI_ENV)
    if tracking is None and not embedded_tracking_db().is_file():
        return False
    try:
        from controller.policy_registry import mlflow_resolver
        from pdctl.demo.config import DEFAULT_POLICY_FILE
        from policies.policy_file import load_policy_file, resolve_policy
        from policies.registry import load_policy

        base = resolve_policy(load_policy_file(DEFAULT_POLICY_FILE), str(DEFAULT_POLICY_FILE))
        load_policy(CHAMPION_SPEC, base, resolver=mlflow_resolver(tracking))
    except Exception as exc:  # any failure (no model, no alias, not loadable): the rule policy runs instead
        first = str(exc).splitlines()[0] if str(exc) else ""
        console.print(f"[dim]no usable champion ({type(exc).__name__}: {first}); using {FALLBACK_POLICY_SPEC}[/dim]")
        return False
    return True


def choose_policy(options: DemoOptions, console: Console) -> str:
    """The controlled phase's policy: ``--policy``, else the registered champion, else the rule policy."""
    from policies.policy_file import PolicyFileError, load_policy_file, resolve_policy
    from policies.registry import PolicySpecError, load_policy

    if options.policy is None:
        return CHAMPION_SPEC if _champion_available(console) else FALLBACK_POLICY_SPEC
    try:
        base = resolve_policy(load_policy_file(options.policy_file), str(options.policy_file))
        load_policy(options.policy, base, base_dir=Path.cwd())
    except (PolicySpecError, PolicyFileError, OSError, ValueError) as exc:
        raise DemoInputError(f"--policy {options.policy}: {str(exc).splitlines()[0]}") from None
    return options.policy


@contextlib.contextmanager
def _interrupts_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`DemoInterrupted` in the main thread while inside."""

    def handler(signum: int, frame: FrameType | None) -> None:
        del frame
        for sig in (signal.SIGINT, signal.SIGTERM):  # the cleanup that follows is bounded; let it finish
            signal.signal(sig, signal.SIG_IGN)
        raise DemoInterrupted(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _print_profile(request_log: Path, out_dir: Path, console: Console) -> str:
    """Run ``pdctl profile`` on the router's request log; print and return its report."""
    try:
        done = subprocess.run(
            pdctl_argv("profile", str(request_log)),
            capture_output=True,
            text=True,
            timeout=PROFILE_TIMEOUT_S,
            env={**os.environ, "COLUMNS": "120"},
            start_new_session=True,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "workload profile: timed out"
    text = (
        done.stdout if done.returncode == 0 else f"workload profile failed ({done.returncode}):\n{done.stderr[-2000:]}"
    )
    (out_dir / "workload-profile.txt").write_text(text, encoding="utf-8")
    console.print(f"\n[bold]Workload profile of what the demo replayed[/bold] ({request_log}):")
    console.out(text, highlight=False)
    return text


def run_demo(options: DemoOptions, console: Console, command_line: str) -> Path:
    """Run the demo; return the report path. Raises :class:`DemoInputError` on bad input."""
    options.validate()
    scenario = load_demo_scenario(options)
    slos = tenant_slos(scenario, options.policy_file)
    policy = choose_policy(options, console)
    use_prometheus = options.prometheus if options.prometheus is not None else shutil.which("prometheus") is not None
    if use_prometheus and shutil.which("prometheus") is None:
        raise DemoInputError("--prometheus: prometheus is not on the PATH")
    live = options.live if options.live is not None else console.is_terminal
    out_dir = options.out_dir.resolve()  # children resolve relative paths against their config files
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    group = scenario.tenant_groups[0]
    console.print(
        f"[bold]pdctl demo[/bold]: {scenario.name} — {group.prefill} prefill + {group.decode} decode emulated "
        f"{scenario.cluster.profile} instances, {scenario.duration_s:.0f} s of load per phase at time scale "
        f"{options.time_scale:g}, seed {scenario.seed}; metric source: "
        f"{'Prometheus' if use_prometheus else 'built-in scraper'}; policy: {policy}; output: {out_dir}"
    )
    phases: list[PhaseResult] = []
    plan = [("static", "advisory")] if options.baseline else []
    plan.append(("controlled", "active"))
    with _interrupts_raise():
        for name, mode in plan:
            label = "static baseline (controller advisory)" if mode == "advisory" else f"controlled ({policy})"
            console.rule(f"phase {len(phases) + 1}/{len(plan)}: {label}")
            phases.append(
                run_phase(
                    name=name,
                    mode=mode,
                    policy=policy,
                    options=options,
                    scenario=scenario,
                    slos=slos,
                    directory=out_dir / name,
                    console=console,
                    live=live,
                    use_prometheus=use_prometheus,
                )
            )
    profile_text = _print_profile(phases[-1].request_log, out_dir, console)
    wall_s = time.monotonic() - started
    report = build_report(
        phases=phases, scenario=scenario, slos=slos, options=options, policy=policy, out_dir=out_dir,
        command_line=command_line, wall_s=wall_s, profile_text=profile_text, console=console,
    )  # fmt: skip
    console.print(f"\nreport: {report}   (wall time {wall_s:.0f} s)")
    return report
