"""The ``pdctl`` command line.

Each command lives in its own module under :mod:`pdctl.commands` and exposes ``register(app)``; this module
only assembles them, so commands import their heavy dependencies (simulator, training stack, servers) only
when they run.
"""

from __future__ import annotations

import importlib

import typer

__all__ = ["COMMANDS", "app", "main", "register_commands"]

COMMANDS: dict[str, str] = {
    "sim": "Run a scenario in the discrete-event simulator and print per-tenant latency and goodput.",
    "evaluate": "Evaluate policies over scenarios and seeds; write tables and plots.",
    "scenarios": "Generate scenario files from a scenario family (one per seed; train/validation/test splits).",
    "train": "Train a learned policy from an experiment file (stable-baselines3, MLflow).",
    "profile": "Profile a workload (trace, router log or Prometheus) and say whether P/D pays off.",
    "plan": "Search P:D splits and thresholds with the simulator for a workload and SLO.",
    "perf": "Query the calibrated performance model (step times).",
    "emulate": "Start emulated vLLM instances (real HTTP servers timed by the performance model).",
    "router": "Run the P/D router (OpenAI-compatible proxy).",
    "controller": "Run the controller daemon (observe, decide, guard, actuate).",
    "loadgen": "Replay a scenario or trace against an OpenAI endpoint.",
    "launch": "Start real vLLM prefill/decode instances with NixlConnector (GPU machines).",
    "demo": "Start an emulated cluster, the router, the controller and a load, and report.",
    "policy": "Validate, show, register and promote policies.",
    "traces": "List, fetch (pinned upstream commits, SHA-256 verified) and locate the public request traces.",
}

app = typer.Typer(
    name="pdctl",
    help="Control plane for prefill/decode-disaggregated LLM serving on vLLM.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _not_available(target: typer.Typer, name: str, help_text: str) -> None:
    @target.command(
        name=name,
        help=f"{help_text} (not available yet)",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def _command() -> None:
        typer.echo(f"pdctl {name}: not available yet in this version of pdctl.", err=True)
        raise typer.Exit(code=3)


def register_commands(target: typer.Typer, commands: dict[str, str]) -> None:
    """Add every command module to ``target``; a command without a module says "not available yet"."""
    for name, help_text in commands.items():
        try:
            module = importlib.import_module(f"pdctl.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"pdctl.commands.{name}":
                raise
            _not_available(target, name, help_text)
            continue
        module.register(target, name, help_text)


register_commands(app, COMMANDS)


def main() -> None:
    """Entry point of the ``pdctl`` console script."""
    app(prog_name="pdctl")


if __name__ == "__main__":  # pragma: no cover
    main()
