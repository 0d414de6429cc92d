"""``pdctl train``: run a training experiment (stable-baselines3 + MLflow), or its sweep with ``--sweep``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from agents.config import ExperimentConfig

__all__ = ["register"]


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Add the ``train`` command to ``app``."""

    @app.command(name=name, help=help_text)
    def train_cmd(
        experiment: Path = typer.Option(..., "--experiment", help="Experiment YAML (experiments/NAME.yaml)."),  # noqa: B008
        out: Path | None = typer.Option(None, help="Output folder (default: runs/<experiment name>)."),  # noqa: B008
        tracking_uri: str | None = typer.Option(
            None, help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else sqlite:///data/mlflow/mlflow.db)."
        ),
        timesteps: int | None = typer.Option(None, help="Override total_timesteps."),
        seed: int | None = typer.Option(None, help="Override the experiment's seed."),
        no_baselines: bool = typer.Option(False, help="Skip evaluating the experiment's baselines at the end."),
        quiet: bool = typer.Option(False, help="No progress bar."),
        sweep: bool = typer.Option(False, "--sweep", help="Run the experiment's 'sweep:' grid (agents.sweep)."),
        ray_address: str | None = typer.Option(
            None, help="With --sweep: run trials on Ray ('local' = an in-process local instance, 'auto', HOST:PORT)."
        ),
        max_parallel: int | None = typer.Option(None, min=1, help="With --sweep: trials at once (default: CPUs)."),
    ) -> None:
        """Train, evaluate against the baselines on held-out seeds, export and (optionally) register; or sweep."""
        from agents.config import ExperimentError, load_experiment

        if not sweep and (ray_address is not None or max_parallel is not None):
            typer.echo("--ray-address and --max-parallel need --sweep", err=True)
            raise typer.Exit(code=2)
        overrides: dict[str, object] = {}
        if timesteps is not None:
            overrides["total_timesteps"] = timesteps
        if seed is not None:
            overrides["seed"] = seed
        try:
            config = load_experiment(experiment, overrides)
        except ExperimentError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(code=2) from None
        if sweep:
            _run_sweep(config, experiment, out, tracking_uri, ray_address, max_parallel, no_baselines, quiet)
            return
        from agents.train import train
        from env.families import FamilyError

        try:
            result = train(
                config,
                out or Path("runs") / config.name,
                tracking_uri=tracking_uri,
                progress=not quiet,
                evaluate_baselines=not no_baselines,
            )
        except FamilyError as exc:  # the recipe's family file, read when training starts
            typer.echo(f"pdctl train: {experiment}: family.path: {exc}", err=True)
            raise typer.Exit(code=2) from None
        typer.echo(f"artifact: {result.artifact}")
        typer.echo(f"mlflow run: {result.run_id}")
        typer.echo(f"wall: {result.wall_s:.1f} s for {result.timesteps} steps ({result.env_steps_per_s:.1f} steps/s)")
        for spec, values in result.evaluation.items():
            cells = ", ".join(f"{k}={v:.3f}" for k, v in values.items())
            typer.echo(f"  {spec}: {cells}")
        if result.registered_version is not None:
            typer.echo(f"registered {config.register_as} v{result.registered_version} (challenger)")


def _run_sweep(
    config: ExperimentConfig,
    experiment: Path,
    out: Path | None,
    tracking_uri: str | None,
    ray_address: str | None,
    max_parallel: int | None,
    no_baselines: bool,
    quiet: bool,
) -> None:
    from agents.config import ExperimentError
    from agents.sweep import SweepError, Trial, TrialOutcome, run_sweep

    def report(trial: Trial, outcome: TrialOutcome) -> None:
        if quiet:
            return
        value = f"{outcome.goodput:.4f} req/s" if outcome.goodput is not None else outcome.error
        typer.echo(f"trial {trial.index} ({trial.label}): {outcome.status}: {value}")

    try:
        result = run_sweep(
            config,
            out or Path("runs") / f"{config.name}-sweep",
            tracking_uri=tracking_uri,
            ray_address=ray_address,
            max_parallel=max_parallel,
            evaluate_baselines=False if no_baselines else None,
            source=str(experiment),
            on_trial=report,
        )
    except (ExperimentError, SweepError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(code=2) from None
    typer.echo(result.summary_md.read_text(encoding="utf-8"))
    typer.echo(f"summary: {result.summary_md} ({result.summary_json.name})")
    typer.echo(f"mlflow parent run: {result.parent_run_id}")
    if result.best is None:
        typer.echo(f"every trial failed ({len(result.failed)})", err=True)
        raise typer.Exit(code=1)
