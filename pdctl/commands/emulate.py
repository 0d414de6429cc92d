"""``pdctl emulate``: start emulated vLLM instances (all options: ``pdctl emulate --help``)."""

from __future__ import annotations

import typer

from livestack.emulator.cli import main as emulator_main

__all__ = ["register"]


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Add the ``emulate`` command; its options are parsed by :mod:`livestack.emulator.cli`."""

    @app.command(
        name=name,
        help=f"{help_text} Run `pdctl emulate --help` for the options.",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    )
    def emulate(ctx: typer.Context) -> None:
        emulator_main(list(ctx.args))
