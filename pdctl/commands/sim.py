"""``pdctl sim``: run a scenario in the discrete-event simulator and print per-tenant results.

The policy is given by name, in the grammar of every command (:mod:`policies.registry`): ``file:PATH.yaml``
(a policy file: thresholds per tenant, in force from the first simulated second; pools stay as the scenario
starts them), ``baseline:NAME``, ``learned:PATH``, ``registry:models:/NAME@ALIAS`` or
``watchdog[FALLBACK]:PRIMARY``. Every policy runs through the one episode loop the evaluation harness uses
(:func:`agents.runs.run_episode`: observation → policy → safety guard → simulator, then the drain); ``--seed``
seeds the episode as ``pdctl evaluate`` does; ``--guard FILE`` runs the safety guard of a controller configuration
instead of the defaults (:mod:`pdctl.commands.guard_option`).
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
from rich.markup import escape
from rich.table import Table

from pdctl.commands.guard_option import GUARD_HELP, read_guard_option

__all__ = ["register"]

EXIT_INVALID = 2


def _fail(message: str) -> typer.Exit:
    typer.echo(f"pdctl sim: {message}", err=True)
    return typer.Exit(code=EXIT_INVALID)


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 1000:.1f}"


def _policy(spec: str, scenario: Any) -> Any:
    from agents.policy_specs import make_policy
    from policies.policy_file import PolicyFileError
    from policies.registry import PolicySpecError

    resolver = None
    if "registry:" in spec:
        from controller.policy_registry import mlflow_resolver

        resolver = mlflow_resolver()
    try:
        return make_policy(spec, scenario, resolver=resolver)
    except PolicyFileError as exc:
        raise _fail(str(exc.problems[0]) if exc.problems else str(exc)) from None
    except PolicySpecError as exc:
        raise _fail(str(exc).splitlines()[0]) from None


def _run(
    scenario_path: Path,
    policy_spec: str,
    seed: int | None,
    json_out: Path | None,
    traces: Path | None,
    guard_file: Path | None = None,
) -> None:
    """Run the scenario under the policy through the one episode loop (:func:`agents.runs.run_episode`)."""
    from agents.harness import run_label
    from agents.runs import episode_env, run_episode
    from env.perf.profile import ProfileError
    from env.scenario import ScenarioError, load_scenario
    from env.workloads.errors import WorkloadError

    try:
        scenario = load_scenario(scenario_path, traces_dir=traces)
    except ScenarioError as exc:
        raise _fail(exc.problems[0]) from None
    try:
        guard = read_guard_option(guard_file)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    run_seed = scenario.seed if seed is None else seed
    policy = _policy(policy_spec, scenario)
    try:
        env = episode_env(scenario, policy, traces, guard_limits=guard)
    except ValueError as exc:
        raise _fail(f"policy {policy_spec}: {str(exc).splitlines()[0]}") from None
    start = time.perf_counter()
    try:
        sim = run_episode(env, policy, run_seed).sim
    except (ProfileError, WorkloadError) as exc:
        raise _fail(f"{scenario_path}: {exc}") from None
    _report(sim, time.perf_counter() - start, scenario, run_label(policy_spec, None, guard), run_seed, json_out)


def _report(sim: Any, wall: float, scenario: Any, policy: str, run_seed: int, json_out: Path | None) -> None:
    from env.sim.summary import summarize

    summary = summarize(sim, wall, scenario.name, policy, run_seed, horizon_s=scenario.duration_s)

    table = Table(title=escape(f"{scenario.name} — {policy} (seed {run_seed})"))  # SPEC+guard[...] is not markup
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
            ...,
            "--policy",
            help="Policy: file:PATH.yaml, baseline:NAME, learned:PATH, registry:models:/NAME@ALIAS or "
            "watchdog[FALLBACK]:PRIMARY.",
        ),
        seed: int | None = typer.Option(None, "--seed", help="Seed (default: the scenario's)."),
        json_out: Path | None = typer.Option(None, "--json", help="Write the summary as JSON here."),  # noqa: B008
        traces: Path | None = typer.Option(  # noqa: B008
            None, "--traces", help="Trace folder for ${PDCTL_TRACES} (default: env PDCTL_TRACES or ../shared/traces)."
        ),
        guard_file: Path | None = typer.Option(None, "--guard", help=GUARD_HELP),  # noqa: B008
    ) -> None:
        """Run a scenario under a policy and print per-tenant TTFT/TPOT, SLO attainment, goodput and cost."""
        _run(scenario, policy, seed, json_out, traces, guard_file)
