"""``pdctl router``: run the P/D router (OpenAI-compatible proxy) from a configuration file."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import typer

from policies.policy_file import PolicyFileError
from router.config import RouterConfigError, load_router_config
from router.server import serve

__all__ = ["register"]

EXIT_INVALID = 2


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Add the ``router`` command to ``app``."""

    @app.command(name=name, help=help_text)
    def router(
        config: Path = typer.Option(..., "--config", help="Router configuration (YAML)."),  # noqa: B008
        port: int | None = typer.Option(None, help="Override listen.port."),
        log_level: str = typer.Option("INFO", help="Logging level."),
    ) -> None:
        """Run the router until SIGINT/SIGTERM."""
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            cfg = load_router_config(config)
            if port is not None:
                cfg = cfg.model_copy(update={"listen": cfg.listen.model_copy(update={"port": port})})
            asyncio.run(serve(cfg))
        except (RouterConfigError, PolicyFileError) as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(code=EXIT_INVALID) from None
