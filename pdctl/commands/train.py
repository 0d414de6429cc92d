"""``pdctl train``: run a training experiment (stable-baselines3 + MLflow)."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["register"]


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Add the ``train`` command to ``app``."""

    @app.command(name=name, help=help_text)
    def train_cmd(
        experiment: Path = typer.Option(..., "--experiment", help="Experiment YAML (experiments/NAME.yaml)."),  # noqa: B008
        out: Path | None = typer.Option(None, help="Output folder (default: runs/<experiment name>)."),  # noqa: B008
        tracking_uri: str | None = typer.Option(None, help="MLflow tracking URI (default: local SQLite)."),
        timesteps: int | None = typer.Option(None, help="Override total_timesteps."),
        seed: int | None = typer.Option(None, help="Override the experiment's seed."),
        no_baselines: bool = typer.Option(False, help="Skip evaluating the experiment's baselines at the end."),
        quiet: bool = typer.Option(False, help="No progress bar."),
    ) -> None:
        """Train, evaluate against the baselines on held-out seeds, export and (optionally) register."""
        from agents.config import ExperimentError, load_experiment

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
        from agents.train import train

        result = train(
            config,
            out or Path("runs") / config.name,
            tracking_uri=tracking_uri,
            progress=not quiet,
            evaluate_baselines=not no_baselines,
        )
        typer.echo(f"artifact: {result.artifact}")
        typer.echo(f"mlflow run: {result.run_id}")
        typer.echo(f"wall: {result.wall_s:.1f} s for {result.timesteps} steps ({result.env_steps_per_s:.1f} steps/s)")
        for spec, values in result.evaluation.items():
            cells = ", ".join(f"{k}={v:.3f}" for k, v in values.items())
            typer.echo(f"  {spec}: {cells}")
        if result.registered_version is not None:
            typer.echo(f"registered {config.register_as} v{result.registered_version} (challenger)")
