"""``pdctl evaluate``: every policy × scenario × seed through the gym env, tables and plots.

``--policies baselines`` (the default) expands to every baseline of :mod:`policies.baselines`, ``queue_kv``,
the seed rule file and ``grid:`` (the grid-searched static optimum). ``--scenarios`` takes names, paths and
``suite:NAME`` (``experiments/scenarios/suites.yaml``). Runs go to parallel processes with a progress bar; the
output folder gets ``results.csv`` (means and 95 % CIs over seeds), ``results_seeds.csv``, ``results.json``,
``ranking.md``, ``goodput.png`` and per-scenario CDF and decision plots. ``expert:H`` (the clairvoyant lookahead
expert of :mod:`agents.lookahead`) gets its own section in ``ranking.md``: how far switching between the baselines
and the static configurations could go on each scenario. ``watchdog:PRIMARY`` runs a policy under the SLO
watchdog of :mod:`policies.watchdog` (rows in the same section). ``--sweep-rate`` also finds, per policy
and scenario, the highest request-rate multiplier at which ≥ 90 % of requests meet both SLOs
(``sweep.json``, ``sweep.png``). Bad input prints one line and exits 2. A run that raises (e.g. a learned
policy refusing a scenario larger than its slot layout) is left out and reported in one line on stderr; when no
run ran at all the command exits 1.
"""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pdctl.commands.guard_option import GUARD_HELP, read_guard_option
from pdctl.commands.lists import parse_seeds, split_list

if TYPE_CHECKING:
    from policies.guard import GuardLimits

__all__ = ["register"]

EXIT_INVALID = 2
EXIT_NOTHING_RAN = 1


def _fail(message: str) -> typer.Exit:
    typer.echo(f"pdctl evaluate: {message}", err=True)
    return typer.Exit(code=EXIT_INVALID)


def _policies(text: str) -> list[str]:
    from agents.evaluate import all_baseline_specs

    out: list[str] = []
    for spec in split_list(text):
        out.extend(all_baseline_specs() if spec == "baselines" else [spec])
    return list(dict.fromkeys(out))


def _check_policies(
    policies: Sequence[str], scenario_path: Path, traces: str | None, admission_slack: float | None = None
) -> None:
    """Build every policy once, so a bad spec fails in one line.

    Warn about a selector fitted behind the admission stage that would run here without it.
    """
    from agents.evaluate import make_policy
    from env.gym_env import resolve_scenario
    from policies.registry import fitted_admission_slack

    scenario = resolve_scenario(scenario_path, traces)
    for spec in policies:
        if spec.startswith("grid:"):
            continue
        try:
            policy = make_policy(spec, scenario)
        except Exception as exc:  # one line per bad spec, whatever the loader raised
            raise _fail(f"policy {spec!r}: {str(exc).splitlines()[0]}") from None
        fitted_slack = fitted_admission_slack(policy)
        if fitted_slack is not None and admission_slack != fitted_slack:
            here = "without it" if admission_slack is None else f"behind slack {admission_slack:g}"
            typer.echo(
                f"pdctl evaluate: warning: policy {spec!r} was fitted behind the admission stage (slack"
                f" {fitted_slack:g}) and runs here {here}; --admission-slack {fitted_slack:g} runs it as it is"
                " meant to",
                err=True,
            )


def _fmt(value: float | None, ci: float | None = None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    text = f"{value:.{digits}f}"
    if ci is not None and not math.isnan(ci):
        text += f" ± {ci:.{digits}f}"
    return text


_COLUMNS: tuple[tuple[str, str, str, int], ...] = (
    ("w. goodput rps", "weighted_goodput_rps", "ci", 2),
    ("SLO %", "slo_attainment_frac", "pct", 1),
    ("TTFT p95 s", "ttft_p95_s", "", 2),
    ("TPOT p95 ms", "tpot_p95_s", "ms", 1),
    ("GPU-h", "gpu_seconds", "h", 2),
    ("churn", "churn_changes", "", 1),
    ("failed", "failed", "", 0),
    ("return", "episode_return", "", 0),
)


def _cell(row: Mapping[str, Any], metric: str, kind: str, digits: int) -> str:
    value = row.get(f"{metric}_mean")
    ci = row.get(f"{metric}_ci95")
    if value is None:
        return "-"
    if kind == "pct":
        return _fmt(100 * value, None if ci is None else 100 * ci, digits)
    if kind == "ms":
        return _fmt(1000 * value, None, digits)
    if kind == "h":
        return _fmt(value / 3600, None, digits)
    return _fmt(value, ci if kind == "ci" else None, digits)


def _ranking(ranked: Mapping[str, Sequence[Mapping[str, Any]]], console: Console) -> str:
    from agents.plots import label

    lines: list[str] = []
    for scenario, rows in sorted(ranked.items()):
        table = Table(title=f"{scenario}: ranked by priority-weighted goodput (mean ± 95 % CI over seeds)")
        table.add_column("#")
        table.add_column("policy")
        for title, *_ in _COLUMNS:
            table.add_column(title, justify="right")
        lines += [f"### {scenario}", "", "| # | policy | " + " | ".join(c[0] for c in _COLUMNS) + " |"]
        lines.append("|---|---|" + "---:|" * len(_COLUMNS))
        for rank, row in enumerate(rows, 1):
            cells = [_cell(row, metric, kind, digits) for _, metric, kind, digits in _COLUMNS]
            table.add_row(str(rank), escape(label(row["policy"])), *cells)
            lines.append(f"| {rank} | {label(row['policy'])} | " + " | ".join(cells) + " |")
        lines.append("")
        console.print(table)
    return "\n".join(lines)


_NOT_BASELINES = ("grid:", "learned:", "expert:", "watchdog")
"""Specs that are not baselines (the best baseline is the best of the others)."""


def _summary(ranked: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """Per scenario: best baseline, margin over the runner-up, grid optimum's headroom, and the SLO ceiling.

    The ceiling is the weighted goodput if every arrival met both SLOs; no policy can pass it.
    """
    from agents.plots import label

    lines = [
        "| scenario | best baseline | w. goodput | runner-up | margin | grid optimum | headroom over best baseline "
        "| SLO ceiling | ceiling / best baseline |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for scenario, rows in sorted(ranked.items()):
        baselines = [r for r in rows if not r["policy"].startswith(_NOT_BASELINES)]
        grid = next((r for r in rows if r["policy"].startswith("grid:")), None)
        if not baselines:
            continue
        best = baselines[0]
        best_v = best["weighted_goodput_rps_mean"] or 0.0
        second = baselines[1] if len(baselines) > 1 else None
        second_v = (second["weighted_goodput_rps_mean"] or 0.0) if second else math.nan
        margin = 100 * (best_v - second_v) / second_v if second and second_v > 0 else math.nan
        grid_v = (grid["weighted_goodput_rps_mean"] or 0.0) if grid else math.nan
        headroom = 100 * (grid_v - best_v) / best_v if grid and best_v > 0 else math.nan
        ceiling_v = best.get("offered_weighted_rps_mean")
        ceiling = f"{ceiling_v:.2f} | {ceiling_v / best_v:.3f}× |" if ceiling_v and best_v > 0 else "- | - |"
        lines.append(
            f"| {scenario} | {label(best['policy'])} | {best_v:.2f} | "
            f"{label(second['policy']) if second else '-'} ({second_v:.2f}) | {margin:+.1f} % | "
            f"{grid_v:.2f} | {headroom:+.1f} % | {ceiling}"
        )
    return "\n".join(lines)


def _learned_summary(ranked: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """Per learned policy and scenario: its goodput against the best baseline, the grid optimum and the ceiling."""
    from agents.evaluate import load_suites
    from agents.plots import label

    suites = load_suites()
    kind = {name: k for k in ("static", "dynamic") for name in suites.get(k) or []}
    lines = [
        "| policy | scenario | kind | w. goodput (± 95 % CI) | best baseline | × best baseline | grid optimum "
        "| × grid optimum | share of SLO ceiling |",
        "|---|---|---|---:|---|---:|---:|---:|---:|",
    ]
    own_rows = ("learned:", "expert:", "watchdog")
    learned_specs = sorted({r["policy"] for rs in ranked.values() for r in rs if r["policy"].startswith(own_rows)})
    for spec in learned_specs:
        for scenario, rows in sorted(ranked.items(), key=lambda kv: (kind.get(kv[0], "~"), kv[0])):
            own = next((r for r in rows if r["policy"] == spec), None)
            baselines = [r for r in rows if not r["policy"].startswith(_NOT_BASELINES)]
            if own is None or not baselines:
                continue
            grid = next((r for r in rows if r["policy"].startswith("grid:")), None)
            value = own["weighted_goodput_rps_mean"] or 0.0
            ci = own.get("weighted_goodput_rps_ci95")
            best_v = baselines[0]["weighted_goodput_rps_mean"] or 0.0
            grid_v = (grid["weighted_goodput_rps_mean"] or 0.0) if grid else math.nan
            ceiling_v = own.get("offered_weighted_rps_mean") or math.nan
            lines.append(
                f"| {label(spec)} | {scenario} | {kind.get(scenario, '-')} | {value:.2f}"
                f"{f' ± {ci:.2f}' if ci is not None else ''} | {label(baselines[0]['policy'])} {best_v:.2f} | "
                f"{value / best_v if best_v > 0 else math.nan:.3f}× | {grid_v:.2f} | "
                f"{value / grid_v if grid_v > 0 else math.nan:.3f}× | {100 * value / ceiling_v:.1f} % |"
            )
    return "\n".join(lines) if learned_specs else ""


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def _run(
    scenarios: str,
    policies: str,
    seeds: str,
    out: Path,
    workers: int | None,
    traces: Path | None,
    grid_cache: Path | None,
    plots: bool,
    sweep: bool,
    sweep_target: float,
    sweep_iterations: int,
    admission_slack: float | None = None,
    guard_file: Path | None = None,
) -> None:
    from agents import evaluate as ev
    from env.scenario import ScenarioError

    try:
        paths = ev.scenario_paths(split_list(scenarios))
        seed_list = parse_seeds(seeds)
    except (ValueError, OSError) as exc:
        raise _fail(str(exc)) from None
    if not paths or not seed_list:
        raise _fail("need at least one scenario and one seed")
    policy_list = _policies(policies)
    if admission_slack is not None:
        from policies.admission import AdmissionConfig

        try:
            AdmissionConfig(admission_slack)
        except ValueError as exc:
            raise _fail(f"--admission-slack: {exc}") from None
    guard = _guard(guard_file, policy_list)
    if sweep and any(p.startswith("expert:") for p in policy_list):
        raise _fail("--sweep-rate does not take expert:H policies (every probe would rerun the lookahead expert)")
    traces_dir = str(traces) if traces is not None else None
    try:
        _check_policies(policy_list, paths[0], traces_dir, admission_slack)
    except ScenarioError as exc:
        raise _fail(exc.problems[0]) from None
    n_workers = workers or min(ev.default_workers(), 2)
    console = Console(width=170)
    command = "pdctl evaluate " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    with _progress(console) as progress:
        grid_task = progress.add_task(
            "grid search", total=None, visible=any(p.startswith("grid:") for p in policy_list)
        )
        runs_task = progress.add_task("evaluation", total=len(paths) * len(policy_list) * len(seed_list))

        def grid_tick(done: int, total: int) -> None:
            progress.update(grid_task, completed=done, total=total)

        evaluation = ev.evaluate(
            paths,
            policy_list,
            seed_list,
            workers=n_workers,
            traces_dir=traces_dir,
            grid_cache=grid_cache,
            on_done=lambda _: progress.advance(runs_task),
            on_grid_progress=grid_tick,
            admission_ttft_slack_frac=admission_slack,
            guard=guard,
        )
    ev.write_results(evaluation, out, command)
    ranked = ev.ranked(evaluation.aggregate)
    ranking = _ranking(ranked, console)
    summary = _summary(ranked)
    console.print(summary, markup=False)  # policy names may hold brackets (SPEC+guard[...])
    errors = [r for r in evaluation.runs if r.error is not None]
    notes = ""
    if errors:
        notes = f"\n\n{len(errors)} of {len(evaluation.runs)} runs raised and are left out (results.json: errors)."
        _report_refused(errors, len(evaluation.runs))
    learned = _learned_summary(ranked)
    if learned:
        console.print(learned, markup=False)
        learned = f"## Learned policies\n\n{learned}\n\n"
    (out / "ranking.md").write_text(
        f"# Evaluation\n\nCommand: `{command}`{notes}\n\n## Best baseline and headroom\n\n{summary}\n\n"
        f"{learned}## Rankings\n\n{ranking}\n"
    )
    if plots:
        from agents.plots import write_all

        write_all(evaluation.aggregate, evaluation.runs, out)
    nothing_ran = len(errors) == len(evaluation.runs)
    if sweep and not nothing_ran:
        _sweep(ev, paths, policy_list, seed_list, n_workers, traces_dir, evaluation.grid_points, out, console, plots,
               sweep_target, sweep_iterations, admission_slack, guard)  # fmt: skip
    console.print(f"wrote {out}/results.csv, results.json, ranking.md" + (" and plots" if plots else ""))
    if nothing_ran:
        typer.echo(f"pdctl evaluate: none of the {len(errors)} runs ran (see above)", err=True)
        raise typer.Exit(code=EXIT_NOTHING_RAN)


def _guard(guard_file: Path | None, policies: Sequence[str]) -> GuardLimits | None:
    """The guard limits of ``--guard FILE`` (None without it), or one line naming the file and field."""
    try:
        limits = read_guard_option(guard_file)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if limits is None:
        return None
    if any(p.startswith(("grid:", "expert:")) for p in policies):
        raise _fail("--guard does not take grid: or expert: policies (their searches rank under the default guard)")
    return limits


def _report_refused(errors: Sequence[Any], total: int) -> None:
    """One line per refused or crashed run on stderr: policy, scenario, seed and the first line of the error."""
    typer.echo(f"pdctl evaluate: {len(errors)} of {total} runs raised and are left out:", err=True)
    for run in errors:
        first = str(run.error).splitlines()[0] if run.error else "?"
        typer.echo(f"  {run.spec.policy} on {run.scenario} seed {run.spec.seed}: {first}", err=True)


def _sweep(
    ev: Any,
    paths: list[Path],
    policies: list[str],
    seeds: list[int],
    workers: int,
    traces_dir: str | None,
    grid_points: Mapping[str, Mapping[str, Any]],
    out: Path,
    console: Console,
    plots: bool,
    target: float,
    iterations: int,
    admission_slack: float | None,
    guard: GuardLimits | None,
) -> None:
    import json

    from agents.plots import label, plot_sweep

    with _progress(console) as progress:
        task = progress.add_task("rate sweep (runs)", total=None)
        records = ev.sweep_rate(
            paths, policies, seeds, target_frac=target, iterations=iterations, workers=workers,
            traces_dir=traces_dir, grid_points=grid_points, on_done=lambda _: progress.advance(task),
            admission_ttft_slack_frac=admission_slack, guard=guard,
        )  # fmt: skip
    (out / "sweep.json").write_text(json.dumps(records, indent=1) + "\n")
    table = Table(title=f"highest rate multiplier with ≥ {100 * target:.0f} % of requests meeting both SLOs")
    for column in ("scenario", "policy", "max rate x", "first failing x"):
        table.add_column(column)
    lines = ["| scenario | policy | max rate × | first failing × |", "|---|---|---:|---:|"]
    for rec in sorted(records, key=lambda r: (r["scenario"], -r["max_rate_scale"])):
        hi = "-" if rec["first_failing_scale"] is None else f"{rec['first_failing_scale']:.3f}"
        table.add_row(rec["scenario"], escape(label(rec["policy"])), f"{rec['max_rate_scale']:.3f}", hi)
        lines.append(f"| {rec['scenario']} | {label(rec['policy'])} | {rec['max_rate_scale']:.3f} | {hi} |")
    console.print(table)
    (out / "sweep.md").write_text("\n".join(lines) + "\n")
    if plots:
        plot_sweep(records, out / "sweep.png")


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Add the ``evaluate`` command to ``app``."""

    @app.command(name=name, help=help_text)
    def evaluate(
        out: Path = typer.Option(..., "--out", help="Output folder."),  # noqa: B008
        scenarios: str = typer.Option("suite:all", "--scenarios", help="Comma list: names, paths, suite:NAME."),
        policies: str = typer.Option(
            "baselines",
            "--policies",
            help="Comma list of specs (baseline:NAME, file:PATH, grid:, learned:PATH, expert:H, watchdog:PRIMARY).",
        ),
        seeds: str = typer.Option("0,1,2", "--seeds", help="Seeds: a comma list of seeds or ranges A..B."),
        workers: int | None = typer.Option(None, "--workers", help="Processes (default: min(CPUs, 2))."),
        traces: Path | None = typer.Option(None, "--traces", help="Trace folder for ${PDCTL_TRACES}."),  # noqa: B008
        grid_cache: Path | None = typer.Option(  # noqa: B008
            None, "--grid-cache", help="Grid-search cache folder (default experiments/results/grid_cache)."
        ),
        plots: bool = typer.Option(True, "--plots/--no-plots", help="Write PNG plots."),
        sweep_rate: bool = typer.Option(False, "--sweep-rate", help="Also find the max rate meeting 90 % SLO."),
        sweep_target: float = typer.Option(0.9, "--sweep-target", help="Attainment target of the sweep."),
        sweep_iterations: int = typer.Option(4, "--sweep-iterations", help="Bisection steps after bracketing."),
        admission_slack: float | None = typer.Option(
            None,
            "--admission-slack",
            help="Run every policy behind the router's admission stage: refuse a request whose estimated TTFT "
            "exceeds this multiple of its tenant's TTFT objective (rows name the policy SPEC+admission).",
        ),
        guard_file: Path | None = typer.Option(None, "--guard", help=GUARD_HELP),  # noqa: B008
    ) -> None:
        """Evaluate policies over scenarios and seeds; write tables and plots."""
        _run(scenarios, policies, seeds, out, workers, traces, grid_cache, plots, sweep_rate, sweep_target,
             sweep_iterations, admission_slack, guard_file)  # fmt: skip
