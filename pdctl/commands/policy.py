"""``pdctl policy``: validate and show policy files; register, evaluate, promote and list registered policies.

The promotion gate judges only evaluation evidence pdctl produced (:mod:`agents.gate`): ``register --scenarios``
or ``evaluate`` runs the evaluation and logs it to the version's run. Numbers typed on the command line are
refused: ``--goodput`` / ``--best-baseline-goodput`` exit 2 with a line saying what to run instead.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from pdctl.commands.lists import parse_seeds, split_list
from policies.policy_file import PolicyFileError, load_policy_file, resolve_policy

__all__ = ["register"]

EXIT_INVALID = 2


def _validate(files: list[Path]) -> None:
    failed = False
    for path in files:
        try:
            resolve_policy(load_policy_file(path), str(path))
        except PolicyFileError as exc:
            failed = True
            for problem in exc.problems:
                typer.echo(str(problem), err=True)
        else:
            typer.echo(f"{path}: ok")
    if failed:
        raise typer.Exit(code=EXIT_INVALID)


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:g} ms"


def _show(path: Path) -> None:
    try:
        resolved = resolve_policy(load_policy_file(path), str(path))
    except PolicyFileError as exc:
        for problem in exc.problems:
            typer.echo(str(problem), err=True)
        raise typer.Exit(code=EXIT_INVALID) from None
    table = Table(title=f"Resolved policy: {path}")
    for column in (
        "tenant",
        "group",
        "mode",
        "local ≤",
        "remote ≥",
        "queue wait ≤",
        "output ≥",
        "pressure",
        "prefix→local",
        "traffic %",
        "models",
        "buckets",
        "fallbacks",
        "SLO ttft/tpot p95",
    ):
        table.add_column(column)
    for name, tp in sorted(resolved.tenants.items()):
        t = tp.thresholds
        buckets = ", ".join(
            f"{b.min_input_tokens}-{'' if b.max_input_tokens is None else b.max_input_tokens}:{b.route.value}"
            for b in t.buckets
        )
        table.add_row(
            name,
            tp.tenant.group,
            "disaggregated" if t.disaggregation_enabled else "aggregated_only",
            str(t.max_local_input_tokens),
            str(t.min_remote_input_tokens),
            _fmt_s(t.max_prefill_queue_wait_s),
            str(t.min_expected_output_tokens),
            f"≥{t.decode_pressure_threshold_frac:.0%}" if t.require_decode_pool_pressure else "not required",
            "yes" if t.prefer_local_on_prefix_hit else "no",
            f"{t.traffic_percent:g}",
            "all" if t.enabled_models is None else ",".join(sorted(t.enabled_models)),
            buckets or "-",
            f"{t.on_kv_transfer_timeout.value} / {t.on_prefill_queue_overload.value}",
            f"{_fmt_s(tp.tenant.slo.ttft_p95_s)} / {_fmt_s(tp.tenant.slo.tpot_p95_s)}",
        )
    console = Console(width=240)
    console.print(table)
    for group in resolved.groups.values():
        console.print(
            f"group {group.name}: {group.gpu_budget} GPUs, "
            f"prefill {group.min_prefill}-{group.max_prefill or 'budget'}, "
            f"decode {group.min_decode}-{group.max_decode or 'budget'}, tenants {', '.join(group.tenants) or '-'}"
        )
    if resolved.expires_at is not None:
        console.print(f"expires at {resolved.expires_at.isoformat()}")


def _check_admission_slack(admission_slack: float | None, command: str) -> None:
    """Refuse a bad ``--admission-slack`` in one line, exit 2."""
    from policies.admission import AdmissionConfig

    try:
        AdmissionConfig(admission_slack)
    except ValueError as exc:
        typer.echo(f"{command}: --admission-slack: {exc}", err=True)
        raise typer.Exit(code=EXIT_INVALID) from None


def _evaluate(
    name: str,
    version: int,
    scenarios: str,
    seeds: str,
    baselines: str,
    alias: str,
    tracking_uri: str | None,
    admission_slack: float | None = None,
) -> None:
    from agents.evaluate import scenario_paths
    from agents.gate import EvidenceError
    from agents.registry import RegistryError, evaluate_version

    try:
        seed_list = parse_seeds(seeds)
    except ValueError as exc:
        typer.echo(f"pdctl policy evaluate: {exc}", err=True)
        raise typer.Exit(code=EXIT_INVALID) from None
    _check_admission_slack(admission_slack, "pdctl policy evaluate")
    try:
        paths = scenario_paths(split_list(scenarios))
        evidence = evaluate_version(
            name,
            version,
            paths,
            seed_list,
            baselines=split_list(baselines),
            alias=alias,
            tracking_uri=tracking_uri,
            admission_ttft_slack_frac=admission_slack,
        )
    except (EvidenceError, RegistryError, ValueError) as exc:
        typer.echo(f"pdctl policy evaluate: {str(exc).splitlines()[0]}", err=True)
        raise typer.Exit(code=EXIT_INVALID) from None
    best = evidence.best_reference()
    champion = evidence.champion_score()
    typer.echo(
        f"{name} v{version}: weighted goodput {evidence.candidate.mean:.4g} req/s on scenario set "
        f"{evidence.scenario_set.sha256[:12]}"
        + ("" if admission_slack is None else f" (behind admission, slack {admission_slack:g})")
        + ("" if best is None else f"; best baseline {best[0]} {best[1].mean:.4g}")
        + ("" if champion is None else f"; {alias} v{champion[0]} {champion[2].mean:.4g}")
    )


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Add the ``policy`` command group to ``app``."""
    group = typer.Typer(help=help_text, no_args_is_help=True)

    @group.command("validate")
    def validate(files: list[Path] = typer.Argument(..., help="Policy files to validate.")) -> None:  # noqa: B008
        """Validate policy files; exit 0 if all are valid, 2 otherwise (one line per problem)."""
        _validate(files)

    @group.command("show")
    def show(file: Path = typer.Argument(..., help="Policy file.")) -> None:  # noqa: B008
        """Print the resolved policy per tenant."""
        _show(file)

    tracking_help = "MLflow tracking URI (default: MLFLOW_TRACKING_URI, else sqlite:///data/mlflow/mlflow.db)."
    admission_help = (
        "Evaluate every policy behind the router's admission stage at this TTFT slack; the evidence records it, and "
        "the gate compares it only with evidence behind the same stage."
    )

    @group.command("register")
    def register(
        path: Path = typer.Argument(..., help="Exported learned-policy directory or a policy file."),  # noqa: B008
        name: str = typer.Option(..., "--name", help="Registered model name."),
        scenarios: str | None = typer.Option(
            None, help="Evaluate at registration for the gate: comma list of scenario names, paths or suite:NAME."
        ),
        seeds: str = typer.Option(
            "0,1,2", help="Evaluation seeds: seeds or ranges A..B, comma-separated (with --scenarios)."
        ),
        baselines: str = typer.Option(
            "baseline:queue_kv", help="Comma list of baseline specs the candidate must beat (with --scenarios)."
        ),
        goodput: float | None = typer.Option(None, hidden=True, help="Refused: the gate reads its own evidence."),
        best_baseline_goodput: float | None = typer.Option(None, hidden=True, help="Refused (see --goodput)."),
        tracking_uri: str | None = typer.Option(None, help=tracking_help),
        admission_slack: float | None = typer.Option(None, "--admission-slack", help=admission_help),
    ) -> None:
        """Register a policy as a new version (alias ``challenger``), optionally evaluated for the gate."""
        from agents.registry import RegistryError, register_policy

        if goodput is not None or best_baseline_goodput is not None:
            typer.echo(
                "pdctl policy register: --goodput/--best-baseline-goodput are refused: the promotion gate judges "
                "only evaluations pdctl ran itself; pass --scenarios/--seeds (or run `pdctl policy evaluate`)",
                err=True,
            )
            raise typer.Exit(code=EXIT_INVALID)
        if admission_slack is not None and scenarios is None:
            typer.echo("pdctl policy register: --admission-slack needs --scenarios (it is how they run)", err=True)
            raise typer.Exit(code=EXIT_INVALID)
        _check_admission_slack(admission_slack, "pdctl policy register")  # before anything is registered
        try:
            registered = register_policy(path, name, tracking_uri=tracking_uri)
        except RegistryError as exc:
            typer.echo(f"pdctl policy register: {exc}", err=True)
            raise typer.Exit(code=EXIT_INVALID) from None
        typer.echo(f"registered {registered.name} v{registered.version} ({registered.kind}) as challenger")
        if scenarios is not None:
            _evaluate(name, registered.version, scenarios, seeds, baselines, "champion", tracking_uri, admission_slack)

    @group.command("evaluate")
    def evaluate_cmd(
        name: str = typer.Argument(..., help="Registered model name."),
        version: int = typer.Option(..., "--version", help="Version to evaluate."),
        scenarios: str = typer.Option(..., help="Comma list of scenario names, paths or suite:NAME."),
        seeds: str = typer.Option("0,1,2", help="Evaluation seeds: a comma list of seeds or ranges A..B."),
        baselines: str = typer.Option("baseline:queue_kv", help="Comma list of baseline specs to beat."),
        alias: str = typer.Option("champion", "--alias", help="The alias holder is evaluated alongside."),
        tracking_uri: str | None = typer.Option(None, help=tracking_help),
        admission_slack: float | None = typer.Option(None, "--admission-slack", help=admission_help),
    ) -> None:
        """Evaluate a version, the alias holder and baselines on one scenario set; log it as the gate's evidence."""
        _evaluate(name, version, scenarios, seeds, baselines, alias, tracking_uri, admission_slack)

    @group.command("promote")
    def promote_cmd(
        name: str = typer.Argument(..., help="Registered model name."),
        version: int = typer.Option(..., "--version", help="Version to promote."),
        alias: str = typer.Option("champion", "--alias", help="Alias to move."),
        margin: float = typer.Option(0.02, help="Required relative improvement over champion and best baseline."),
        force: bool = typer.Option(False, help="Skip the evaluation gate (recorded in the audit trail by MLflow)."),
        confidence: float | None = typer.Option(
            None,
            help="Judge each bar scenario by scenario: the low end of this bootstrap interval (e.g. 0.95) of the "
            "goodput ratio must clear the margin, not the mean alone.",
        ),
        tracking_uri: str | None = typer.Option(None, help=tracking_help),
    ) -> None:
        """Move an alias to a version if it passes the evaluation gate; refusals print the numbers."""
        from agents.registry import RegistryError, promote

        try:
            promoted = promote(
                name,
                version,
                alias=alias,
                margin_frac=margin,
                tracking_uri=tracking_uri,
                force=force,
                confidence=confidence,
            )
        except RegistryError as exc:
            typer.echo(f"pdctl policy promote: {exc}", err=True)
            raise typer.Exit(code=EXIT_INVALID) from None
        typer.echo(f"{promoted.name} v{promoted.version} is now {alias}")

    @group.command("list")
    def list_cmd(
        name: str | None = typer.Argument(None, help="Registered model name (all when omitted)."),
        tracking_uri: str | None = typer.Option(None, help=tracking_help),
    ) -> None:
        """List registered policy versions with their aliases and evaluation numbers."""
        from agents.registry import list_policies

        table = Table(title="Registered policies")
        for column in ("name", "version", "aliases", "kind", "goodput", "best baseline", "run"):
            table.add_column(column)
        for p in list_policies(name, tracking_uri=tracking_uri):
            table.add_row(
                p.name,
                str(p.version),
                ",".join(p.aliases) or "-",
                p.kind,
                "-" if p.goodput is None else f"{p.goodput:.4g}",
                "-" if p.best_baseline_goodput is None else f"{p.best_baseline_goodput:.4g}",
                p.run_id or "-",
            )
        Console(width=200).print(table)

    app.add_typer(group, name=name)
