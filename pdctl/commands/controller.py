"""``pdctl controller``: run the controller daemon, or print its config schema."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["register"]

EXIT_CONFIG = 2
EXIT_LEASE = 3


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Add the ``controller`` command to ``app``."""

    @app.command(name=name, help=help_text)
    def controller(
        config: Path | None = typer.Option(None, "--config", help="Controller config file (YAML or JSON)."),  # noqa: B008
        print_schema: bool = typer.Option(False, "--print-schema", help="Print the config JSON Schema and exit."),
        log_level: str = typer.Option("INFO", "--log-level", help="Logging level."),
    ) -> None:
        from controller.config import ConfigError, config_schema
        from controller.control_memory import ControlMemoryError
        from controller.daemon import run
        from controller.lease import LeaseHeldError
        from controller.logs import configure_logging
        from controller.runtime import RuntimeConfigError

        if print_schema:
            typer.echo(config_schema())
            return
        if config is None:
            typer.echo("pdctl controller: --config FILE is required (or --print-schema)", err=True)
            raise typer.Exit(code=EXIT_CONFIG)
        configure_logging(log_level)
        try:
            run(config)
        except (ConfigError, RuntimeConfigError, ControlMemoryError) as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(code=EXIT_CONFIG) from None
        except LeaseHeldError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(code=EXIT_LEASE) from None
