"""``pdctl plan``: search P:D splits and routing thresholds with the simulator for a workload, SLO and GPU budget.

Prints the searched configurations (sustainable rate, goodput at the workload's own rate), the best one, its
maximum sustainable rate (≥ 90 % SLO attainment) and the Pareto front of goodput per GPU versus rate. With
``--out DIR`` writes ``plan.json``, ``pareto.png`` and ``best_scenario.yaml`` (the searched scenario deployed
as the best configuration: ``pdctl sim --scenario DIR/best_scenario.yaml --policy file:POLICY`` replays it);
``--emit-policy FILE`` writes the best configuration as a per-tenant policy file. Without ``--horizon`` the
probes cover the whole source (or a window holding its peak); the report compares the planned part with the
whole and shows the validation replay of the recommendation; ``--policy SPEC`` adds the GPUs that policy needs
in the loop against the best static split (:mod:`pdctl.commands.plan_policy`). The search itself is
:mod:`agents.planning`. Bad input prints one line naming the file or field and exits 2.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

__all__ = ["register"]

EXIT_INVALID = 2
EXIT_NO_PLAN = 1
DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pdctl" / "plan"


def _fail(message: str) -> typer.Exit:
    typer.echo(f"pdctl plan: {message}", err=True)
    return typer.Exit(code=EXIT_INVALID)


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise _fail(f"--levels: {text!r} is not a comma-separated list of token counts") from None
    if not levels or any(level < 1 for level in levels):
        raise _fail("--levels: give at least one positive token count")
    return levels


def _plot(result: Any, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for label, points in result.curves.items():
        xs = [p["offered_rps"] for p in points]
        ys = [p["goodput_per_gpu_rps"] for p in points]
        ax.plot(xs, ys, marker="o", linewidth=1, alpha=0.6, label=label)
    if result.pareto:
        ax.plot(
            [p["offered_rps"] for p in result.pareto],
            [p["goodput_per_gpu_rps"] for p in result.pareto],
            color="black",
            linewidth=2.5,
            linestyle="--",
            label="Pareto front",
        )
    ax.axvline(result.max_sustainable_rps, color="grey", linestyle=":", label="max sustainable rate (best)")
    ax.set_xlabel("offered rate (requests/s)")
    ax.set_ylabel("goodput per GPU (SLO-meeting requests/s/GPU)")
    ax.set_title(f"pdctl plan: {result.gpus} GPUs, best {result.best.config.label}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _print(result: Any, console: Console, top: int, scope: str = "whole source") -> None:
    table = Table(title=f"Configurations ({result.gpus} GPUs, TP {result.scenario.cluster.tp}), best first")
    for column in ("#", "configuration", "max rate x", "max rate rps", "goodput@max rps", "SLO@max %", "SLO@1x %"):
        table.add_column(column, justify="right" if column != "configuration" else "left")
    ranked = result.ranked()
    for index, cap in enumerate(ranked[:top], start=1):
        at_max = result.at_capacity.get(cap.config)
        at_one = result.at_workload_rate.get(cap.config)
        table.add_row(
            str(index),
            cap.config.label,
            f"{cap.lo:.3g}" if cap.lo > 0 or cap.hi is None else f"<{cap.hi:.3g}",
            f"{result.offered_rps(cap.lo):.2f}" if cap.lo > 0 else "-",
            "-" if at_max is None else f"{at_max.goodput_rps:.1f}",
            "-" if at_max is None else f"{100 * at_max.slo_attainment_frac:.1f}",
            "-" if at_one is None else f"{100 * at_one.slo_attainment_frac:.1f}",
        )
    console.print(table)
    if len(ranked) > top:
        console.print(f"({len(ranked) - top} more configurations in plan.json)")
    if result.pareto:
        front = Table(title="Pareto front: best goodput per GPU at each offered rate")
        for column in ("offered rps", "goodput/GPU rps", "SLO %", "configuration"):
            front.add_column(column)
        for point in result.pareto:
            front.add_row(
                f"{point['offered_rps']:.1f}",
                f"{point['goodput_per_gpu_rps']:.2f}",
                f"{100 * point['slo_attainment_frac']:.1f}",
                point["label"],
            )
        console.print(front)
    _print_coverage(result, console)
    _print_validation(result, console, scope)
    best = result.best
    console.print(
        f"[bold]best:[/bold] {best.config.label}  max sustainable rate {result.max_sustainable_rps:.2f} req/s "
        f"(x{best.lo:.3g} the workload's rate of {result.base_rate_rps:.2f} req/s over the planned part) at >= "
        f"{result.target_frac:.0%} SLO attainment"
        + ("" if result.validated else " [bold red](NOT validated)[/bold red]")
    )
    if result.validated:
        replay = result.validation.replays[-1]
        console.print(
            f"[bold]validated:[/bold] {scope} at x{replay.rate_scale:.3g} ({replay.offered_rps:.2f} req/s, "
            f"{replay.num_arrived} requests) meets the SLO for {100 * replay.slo_attainment_frac:.1f} % of requests"
        )
    stages = ", ".join(f"{s['stage']} {s['configs']} configs/{s['probes']} probes" for s in result.stages)
    console.print(
        f"searched in {result.wall_s:.1f} s wall: {result.num_probes} probes ({result.num_cache_hits} cached); {stages}"
    )


def _print_coverage(result: Any, console: Console) -> None:
    coverage = result.coverage
    if coverage is None:
        return
    console.print(f"[bold]planned part:[/bold] {coverage.description}")
    table = Table(title="Planned part vs the whole source (source time, x1)")
    for column in ("", "requests", "rate rps", "CV/min", "peak/mean", "in p50/p90/p99", "out p50/p90/p99"):
        table.add_column(column, justify="left" if not column else "right")
    for name, stats in (("planned part", coverage.covered), ("whole source", coverage.whole)):
        table.add_row(
            name,
            str(stats.requests),
            f"{stats.rate_rps:.3g}",
            f"{stats.minute_cv:.2f}",
            f"{stats.peak_to_mean:.2f}",
            f"{stats.input_p50_tokens:.0f}/{stats.input_p90_tokens:.0f}/{stats.input_p99_tokens:.0f}",
            f"{stats.output_p50_tokens:.0f}/{stats.output_p90_tokens:.0f}/{stats.output_p99_tokens:.0f}",
        )
    console.print(table)
    for line in coverage.warnings:
        console.print(f"[bold yellow]warning:[/bold yellow] {line}")


def _print_validation(result: Any, console: Console, scope: str = "whole source") -> None:
    checked = result.validation
    if checked is None:
        console.print("validation replay: skipped (--no-validate)")
        return
    for replay in checked.replays:
        verdict = "passes" if replay.slo_attainment_frac >= checked.target_frac else "MISSES the target"
        console.print(
            f"validation replay ({scope}, seed {checked.seed}): {replay.config.label} at x{replay.rate_scale:.3g} "
            f"({replay.offered_rps:.2f} req/s, {replay.num_arrived} requests): SLO attainment "
            f"{100 * replay.slo_attainment_frac:.1f} % -> {verdict}"
        )
    if not checked.passed:
        console.print(
            f"[bold red]warning:[/bold red] none of the {len(checked.replays)} leading configurations meets "
            f"{checked.target_frac:.0%} on the whole source at its searched rate; the recommendation is unvalidated"
        )
    elif result.search_best is not None and checked.recommended is not result.search_best:
        console.print(
            f"[bold yellow]fallback:[/bold yellow] the search's best ({result.search_best.config.label}) failed its "
            f"validation replay; recommending {checked.recommended.config.label}, the next that passes"
        )


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise _fail(f"{path}: cannot write ({exc.strerror or exc})") from None


def _run(
    source: Path,
    slo_text: str | None,
    gpus: int | None,
    options: dict[str, Any],
    out: Path | None,
    emit_policy: Path | None,
) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agents.planning import PlanInputError, best_scenario, load_plan_source, parse_slo, plan, policy_document
    from agents.planning.coverage import coverage_of, covered_interval_s
    from policies.policy_file import PolicyFileError, dump_policy_yaml, load_policy_text, resolve_policy

    try:
        slo = parse_slo(slo_text) if slo_text is not None else None
        planned = load_plan_source(
            source,
            gpus=gpus,
            slo=slo,
            model_profile=options["model_profile"],
            tp=options["tp"],
            horizon_s=options["horizon_s"],
            seed=options["seed"],
            traces_dir=options["traces"],
            max_whole_requests=options["max_whole_requests"],
        )
    except PlanInputError as exc:
        raise _fail(str(exc)) from None
    scenario = planned.scenario
    make = None
    if options["policy"] is not None:
        from pdctl.commands.plan_policy import policy_maker

        make = policy_maker(options["policy"], planned.whole, _fail)
    console = Console(stderr=False, width=140)
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not sys.stderr.isatty() or options["quiet"],
    ) as progress:
        task = progress.add_task("plan", total=None)

        def on_progress(done: int, submitted: int, stage: str) -> None:
            progress.update(task, completed=done, total=submitted, description=f"plan: {stage}")

        try:
            result = plan(
                scenario,
                levels_tokens=options["levels"],
                target_frac=options["target_frac"],
                workers=options["workers"],
                cache_dir=options["cache_dir"],
                exhaustive=options["exhaustive"],
                progress=on_progress,
                whole=planned.whole,
                validation=options["validate"],
            )
            result.coverage = coverage_of(planned, result.best.lo if result.best.lo > 0 else 1.0)
        except (ValueError, OSError) as exc:
            raise _fail(f"{source}: {str(exc).splitlines()[0]}") from None
    resampled = planned.mode == "peak-window" and planned.observed is not None
    _print(result, console, options["top"], "the same window resampled" if resampled else "whole source")
    if result.best.lo <= 0:
        typer.echo(
            f"pdctl plan: no configuration reaches {result.target_frac:.0%} SLO attainment even at 1/64 of the "
            "workload's rate; loosen --slo or raise --gpus (no policy written)",
            err=True,
        )
        raise typer.Exit(code=EXIT_NO_PLAN)
    found = None
    if make is not None:
        from agents.planning.policy_loop import policy_capacity
        from pdctl.commands.plan_policy import print_policy

        found = policy_capacity(
            planned.whole,
            options["policy"],
            make,
            budget_instances=result.gpus // scenario.cluster.tp,
            target_frac=options["target_frac"],
            levels_tokens=options["levels"],
            workers=options["workers"],
            cache_dir=options["cache_dir"],
        )
        print_policy(found, result.best.lo, result.max_sustainable_rps, console)
    if emit_policy is not None:
        text = f"# Written by `pdctl plan {source}`.\n" + dump_policy_yaml(
            load_policy_text(yaml.safe_dump(policy_document(result, str(source)), sort_keys=False), str(emit_policy))
        )
        try:
            resolve_policy(load_policy_text(text, str(emit_policy)), str(emit_policy))
        except PolicyFileError as exc:  # pragma: no cover - the planner writes only valid files
            raise _fail(str(exc.problems[0])) from None
        _write(emit_policy, text)
        console.print(f"policy file: {emit_policy}")
    if out is not None:
        document = result.as_dict()
        document["policy"] = None if found is None else found.as_dict()
        for probe in document["probes"]:
            probe["covered_source_s"] = list(covered_interval_s(planned, probe["rate_scale"]))
        document["command"] = "pdctl plan " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["plan"] else sys.argv[1:])
        _write(out / "plan.json", json.dumps(document, indent=1, default=str) + "\n")
        deployed = best_scenario(result).model_dump(mode="json", exclude_none=True)
        _write(out / "best_scenario.yaml", yaml.safe_dump(deployed, sort_keys=False))
        if result.curves:
            _plot(result, out / "pareto.png")
        console.print(f"results: {out}/plan.json, {out}/best_scenario.yaml" + (", pareto.png" if result.curves else ""))


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Add the ``plan`` command to ``app``."""

    @app.command(name=name, help=help_text)
    def plan_command(
        workload: Path = typer.Option(  # noqa: B008
            ...,
            "--workload",
            help="Scenario YAML, fitted-workload YAML (pdctl profile --emit-workload), Azure CSV, Mooncake JSONL, "
            "router JSONL log or ServeGen folder.",
        ),
        slo: str | None = typer.Option(
            None, "--slo", help="Objectives, e.g. ttft_p95=2s,tpot_p95=80ms (default: the scenario's)."
        ),
        gpus: int | None = typer.Option(None, "--gpus", help="GPU budget (default: a scenario's total)."),
        model_profile: str | None = typer.Option(
            None, "--model-profile", help="Performance profile, e.g. h200-llama3-8b (default: scenario's or 8b)."
        ),
        tp: int | None = typer.Option(None, "--tp", help="Tensor-parallel degree of every instance."),
        levels: str = typer.Option(
            "512,1024,2048,4096,8192", "--levels", help="Remote-prefill min_input_tokens levels to try."
        ),
        horizon_s: float | None = typer.Option(
            None,
            "--horizon",
            help="Quick look: simulated seconds of arrivals per probe, from the source's start (default: the whole "
            "source, or a window around its peak).",
        ),
        policy: str | None = typer.Option(
            None,
            "--policy",
            help="A policy in the loop (baseline:NAME, file:PATH, learned:PATH|default, registry:...): the GPUs it "
            "needs at the workload's rate vs the best static split, and its sustainable rate at --gpus.",
        ),
        max_whole_requests: int = typer.Option(
            50_000,
            "--max-whole-requests",
            help="A trace with more requests is planned over the window of this many around its busiest minute.",
        ),
        no_validate: bool = typer.Option(
            False, "--no-validate", help="Skip the validation replay of the recommendation over the whole source."
        ),
        target: float = typer.Option(0.9, "--target", help="SLO attainment that counts as sustainable."),
        seed: int = typer.Option(0, "--seed", help="Workload seed (every probe uses it)."),
        workers: int = typer.Option(0, "--workers", help="Processes (0 = the CPUs available)."),
        cache_dir: Path = typer.Option(DEFAULT_CACHE_DIR, "--cache-dir", help="Probe cache."),  # noqa: B008
        no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the cache."),
        exhaustive: bool = typer.Option(False, "--exhaustive", help="Search every configuration (slow)."),
        top: int = typer.Option(15, "--top", help="Configurations to print."),
        out: Path | None = typer.Option(None, "--out", help="Write plan.json, pareto.png here."),  # noqa: B008
        emit_policy: Path | None = typer.Option(  # noqa: B008
            None, "--emit-policy", help="Write the best configuration as a per-tenant policy file."
        ),
        traces: Path | None = typer.Option(  # noqa: B008
            None, "--traces", help="Trace folder for ${PDCTL_TRACES} in scenarios."
        ),
        quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    ) -> None:
        """Search aggregated vs disaggregated P:D splits and routing thresholds for a workload and SLO."""
        if horizon_s is not None and horizon_s <= 0:
            raise _fail("--horizon: must be positive")
        if not 0 < target <= 1:
            raise _fail("--target: must be within (0, 1]")
        if max_whole_requests < 1:
            raise _fail("--max-whole-requests: must be at least 1")
        if tp is not None and tp < 1:
            raise _fail("--tp: must be at least 1")
        options = {
            "model_profile": model_profile,
            "tp": tp,
            "levels": _levels(levels),
            "horizon_s": horizon_s,
            "target_frac": target,
            "seed": seed,
            "workers": workers if workers > 0 else max(len(os.sched_getaffinity(0)), 1),
            "cache_dir": None if no_cache else cache_dir,
            "exhaustive": exhaustive,
            "top": top,
            "traces": traces,
            "quiet": quiet,
            "validate": not no_validate,
            "policy": policy,
            "max_whole_requests": max_whole_requests,
        }
        _run(workload, slo, gpus, options, out, emit_policy)
