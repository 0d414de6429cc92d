"""``pdctl sim``: run a scenario in the discrete-event simulator and print per-tenant results.

The policy is given by name: ``file:PATH.yaml`` (a policy file: thresholds per tenant; pools stay as the
scenario starts them) runs the simulator straight through; ``baseline:NAME``, ``learned:PATH`` and
``registry:models:/NAME@ALIAS`` decide every control interval through the same loop the evaluation harness and
the gym env use (observation → policy → safety guard → simulator).
Bad input (missing file, bad YAML, unknown field) prints one line naming the file and field and exits 2.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["register"]

EXIT_INVALID = 2


def _fail(message: str) -> typer.Exit:
    typer.echo(f"pdctl sim: {message}", err=True)
    return typer.Exit(code=EXIT_INVALID)


def _thresholds(spec: str, tenants: list[str]) -> dict[str, object]:
    from policies.policy_file import PolicyFileError, load_policy_file, resolve_policy

    kind, _, value = spec.partition(":")
    if kind != "file" or not value:
        raise _fail(f"policy {spec!r}: expected file:PATH.yaml, baseline:NAME, learned:PATH or registry:models:/N@A")
    try:
        resolved = resolve_policy(load_policy_file(Path(value)), value)
    except PolicyFileError as exc:
        raise _fail(str(exc.problems[0]) if exc.problems else str(exc)) from None
    return {name: resolved.thresholds_for(name) for name in tenants}


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 1000:.1f}"


def _run(scenario_path: Path, policy: str, seed: int | None, json_out: Path | None, traces: Path | None) -> None:
    from env.perf.profile import ProfileError
    from env.scenario import ScenarioError, load_scenario
    from env.sim.build import build_simulator, generate_workloads, load_profile
    from env.workloads.errors import WorkloadError

    try:
        scenario = load_scenario(scenario_path, traces_dir=traces)
    except ScenarioError as exc:
        raise _fail(exc.problems[0]) from None
    run_seed = scenario.seed if seed is None else seed
    if policy.partition(":")[0] in ("baseline", "learned", "registry"):
        sim, wall = _run_controlled(scenario, policy, run_seed, traces)
        _report(sim, wall, scenario, policy, run_seed, json_out)
        return
    thresholds = _thresholds(policy, [t.name for t in scenario.tenants])
    try:
        profile = load_profile(scenario)
        workloads = generate_workloads(scenario, run_seed)
    except (ProfileError, WorkloadError) as exc:
        raise _fail(f"{scenario_path}: {exc}") from None
    sim = build_simulator(scenario, thresholds, run_seed, profile=profile, workloads=workloads)  # type: ignore[arg-type]
    start = time.perf_counter()
    t = 0.0
    while t < scenario.duration_s:
        t = min(t + scenario.control_interval_s, scenario.duration_s)
        sim.run_until(t)
        sim.snapshot()
    sim.run(max_time_s=scenario.duration_s + scenario.drain_s)
    _report(sim, time.perf_counter() - start, scenario, policy, run_seed, json_out)


def _run_controlled(scenario: Any, policy_spec: str, seed: int, traces: Path | None) -> tuple[Any, float]:
    """Drive the scenario with a deciding policy through the env's observe → decide → guard → simulate loop."""
    from agents.evaluate import make_policy
    from env.gym_env import PDClusterEnv
    from policies.base import Policy
    from policies.learned import LearnedPolicy, PolicyLoadError
    from policies.registry import PolicySpecError

    try:
        policy: Policy
        if policy_spec.startswith("registry:"):
            from controller.policy_registry import mlflow_resolver
            from policies.policy_file import PolicyFile, resolve_policy
            from policies.registry import load_policy

            policy = load_policy(policy_spec, resolve_policy(PolicyFile()), resolver=mlflow_resolver())
        else:
            policy = make_policy(policy_spec, scenario)
    except (ValueError, PolicySpecError, PolicyLoadError) as exc:
        raise _fail(str(exc).splitlines()[0]) from None
    layout = policy.manifest.layout if isinstance(policy, LearnedPolicy) else None
    try:
        env = PDClusterEnv(scenario, layout=layout, traces_dir=traces)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    from env.workloads.errors import WorkloadError

    start = time.perf_counter()
    try:
        env.reset(seed=seed)
    except WorkloadError as exc:
        raise _fail(f"{scenario.name}: {exc}") from None
    while env.sim.now_s < scenario.duration_s - 1e-9:
        env.control(policy.decide(env.observation(), env.policy_context()))
    sim = env.drain()
    return sim, time.perf_counter() - start


def _report(sim: Any, wall: float, scenario: Any, policy: str, run_seed: int, json_out: Path | None) -> None:
    from env.sim.summary import summarize

    summary = summarize(sim, wall, scenario.name, policy, run_seed, horizon_s=scenario.duration_s)

    table = Table(title=f"{scenario.name} — {policy} (seed {run_seed})")
    for column in (
        "tenant", "arrived", "finished", "failed", "remote %",
        "TTFT p50/p95/p99 ms", "TPOT p50/p95/p99 ms", "SLO %", "goodput rps",
    ):  # fmt: skip
        table.add_column(column)
    for ts in summary.tenants:
        table.add_row(
            ts.tenant,
            str(ts.arrived),
            str(ts.finished),
            str(ts.failed),
            "-" if ts.remote_prefill_frac is None else f"{100 * ts.remote_prefill_frac:.1f}",
            f"{_ms(ts.ttft_p50_s)} / {_ms(ts.ttft_p95_s)} / {_ms(ts.ttft_p99_s)}",
            f"{_ms(ts.tpot_p50_s)} / {_ms(ts.tpot_p95_s)} / {_ms(ts.tpot_p99_s)}",
            "-" if ts.slo_attainment_frac is None else f"{100 * ts.slo_attainment_frac:.1f}",
            "-" if ts.goodput_rps is None else f"{ts.goodput_rps:.3f}",
        )
    console = Console(width=160)
    console.print(table)
    console.print(
        f"GPU-seconds {summary.gpu_seconds:.0f}  transfers {summary.num_transfers} "
        f"({summary.transfer_bytes / 1e9:.2f} GB, {summary.transfer_failures} failed)  "
        f"requests {summary.num_requests} (finished {summary.num_finished}, failed {summary.num_failed}, "
        f"in flight {summary.num_in_flight})"
    )
    console.print(
        f"simulated {summary.simulated_s:.0f} s in {summary.wall_s:.3f} s wall: "
        f"{summary.requests_per_wall_s:,.0f} requests/s, {summary.simulated_s_per_wall_s:,.0f}x real time"
    )
    if json_out is not None:
        try:
            json_out.write_text(json.dumps(summary.as_dict(), indent=2) + "\n")
        except OSError as exc:
            raise _fail(f"{json_out}: cannot write ({exc.strerror or exc})") from None


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Add the ``sim`` command to ``app``."""

    @app.command(name=name, help=help_text)
    def sim(
        scenario: Path = typer.Option(..., "--scenario", help="Scenario YAML file."),  # noqa: B008
        policy: str = typer.Option(
            ..., "--policy", help="Policy: file:PATH.yaml, baseline:NAME, learned:PATH or registry:models:/NAME@ALIAS."
        ),
        seed: int | None = typer.Option(None, "--seed", help="Seed (default: the scenario's)."),
        json_out: Path | None = typer.Option(None, "--json", help="Write the summary as JSON here."),  # noqa: B008
        traces: Path | None = typer.Option(  # noqa: B008
            None, "--traces", help="Trace folder for ${PDCTL_TRACES} (default: env PDCTL_TRACES or ../shared/traces)."
        ),
    ) -> None:
        """Run a scenario under a policy and print per-tenant TTFT/TPOT, SLO attainment, goodput and cost."""
        _run(scenario, policy, seed, json_out, traces)
