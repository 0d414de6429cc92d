"""``pdctl demo``: start an emulated cluster, the router, the metric source, the controller and a load; report.

Runs the scenario twice with the same seed — first with the controller in advisory mode (the static baseline),
then with it active — shows a live dashboard (plain progress lines without a terminal), prints the
comparison table and the workload profile, and writes a Markdown report with PNG plots under ``--out``.
Every process it starts is stopped at the end, on failure and on Ctrl-C. Bad input prints one line and
exits 2; an interrupted demo exits 130; a phase that fails exits 1.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

__all__ = ["register"]

EXIT_INVALID = 2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Add the ``demo`` command to ``app``."""

    @app.command(name=name, help=help_text)
    def demo(
        duration: float | None = typer.Option(
            None, "--duration", help="Emulated seconds of load per phase (default: the scenario's, 120)."
        ),
        scenario: Path | None = typer.Option(  # noqa: B008
            None, "--scenario", help="Scenario YAML (default experiments/scenarios/demo-rag-surge-8.yaml)."
        ),
        policy: str | None = typer.Option(
            None,
            "--policy",
            help="Controller policy spec (default: registry:models:/pdctl-generalist@champion if registered, "
            "else learned:default, the shipped learned policy).",
        ),
        policy_file: Path | None = typer.Option(  # noqa: B008
            None, "--policy-file", help="Base policy file (default pdctl/demo/demo-policy.yaml)."
        ),
        no_baseline: bool = typer.Option(False, "--no-baseline", help="Skip the static-baseline phase."),
        out: Path | None = typer.Option(None, "--out", help="Output folder (default runs/demo-<UTC time>)."),  # noqa: B008
        time_scale: float = typer.Option(1.0, "--time-scale", help="Wall seconds per emulated second."),
        seed: int | None = typer.Option(None, "--seed", help="Workload seed (default: the scenario's)."),
        live: bool | None = typer.Option(
            None, "--live/--plain", help="Rich live dashboard or plain lines (default: live on a terminal)."
        ),
        prometheus: bool | None = typer.Option(
            None, "--prometheus/--scraper", help="Metric source (default: Prometheus when it is on the PATH)."
        ),
    ) -> None:
        """Run the demo end to end and print the static-vs-controller comparison."""
        from rich.console import Console

        from pdctl.demo.config import DEFAULT_POLICY_FILE, DEFAULT_SCENARIO, DemoInputError, DemoOptions
        from pdctl.demo.main import DemoInterrupted, default_out_dir, run_demo
        from pdctl.demo.processes import StartupError

        options = DemoOptions(
            scenario_path=scenario or DEFAULT_SCENARIO,
            policy=policy,
            policy_file=policy_file or DEFAULT_POLICY_FILE,
            duration_s=duration,
            time_scale=time_scale,
            seed=seed,
            baseline=not no_baseline,
            out_dir=out or default_out_dir(),
            live=live,
            prometheus=prometheus,
        )
        console = Console()
        command_line = "pdctl " + shlex.join(sys.argv[1:])
        try:
            run_demo(options, console, command_line)
        except DemoInputError as exc:
            typer.echo(f"pdctl demo: {exc}", err=True)
            raise typer.Exit(code=EXIT_INVALID) from None
        except DemoInterrupted as exc:
            typer.echo(f"pdctl demo: interrupted ({exc}); every process it started was stopped", err=True)
            raise typer.Exit(code=EXIT_INTERRUPTED) from None
        except StartupError as exc:
            typer.echo(f"pdctl demo: {exc}", err=True)
            raise typer.Exit(code=EXIT_FAILED) from None
