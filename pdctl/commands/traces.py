"""``pdctl traces``: the public request traces the scenarios replay (list, fetch, where they are read from).

``pdctl traces fetch [NAME…]`` downloads the named traces (all when none is named) from their published upstream
locations at pinned commits, verifies every file's SHA-256 and stores them under ``--dest`` (default
``$PDCTL_DATA_DIR/traces``, i.e. ``./data/traces``), where scenarios then find them as ``${PDCTL_TRACES}``.
A checksum mismatch or an unreachable host prints one line naming the file and the URL and exits 2; nothing
half-written is left behind. ``--base-url`` reads from a mirror laid out like the trace folder.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TransferSpeedColumn
from rich.table import Table

from env.workloads.trace_catalog import CATALOG, TraceFile, data_dir, default_traces_dir
from env.workloads.trace_fetch import TraceFetchError, fetch_traces

__all__ = ["EXIT_FETCH_FAILED", "register"]

EXIT_FETCH_FAILED = 2


def _list(console: Console) -> None:
    table = Table(title=f"traces (read from {default_traces_dir()})")
    for column in ("name", "files", "source", "licence", "present"):
        table.add_column(column)
    root = default_traces_dir()
    for name, source in sorted(CATALOG.items()):
        files = source.files()
        present = sum((root / f.relative_path).is_file() for f in files)
        table.add_row(
            name,
            str(len(files)),
            f"{source.repository}@{source.commit[:8]}:{source.upstream_folder}",
            source.license,
            f"{present}/{len(files)}",
        )
    console.print(table)


def _fetch(names: list[str], dest: Path, base_url: str | None, quiet: bool) -> None:
    err = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        disable=quiet,
        transient=True,
    ) as progress:
        tasks: dict[str, TaskID] = {}

        def on_progress(file: TraceFile, done_bytes: int, total_bytes: int | None) -> None:
            if file.relative_path not in tasks:
                tasks[file.relative_path] = progress.add_task(file.relative_path, total=total_bytes)
            progress.update(tasks[file.relative_path], completed=done_bytes, total=total_bytes)

        try:
            results = fetch_traces(names, dest, base_url=base_url, on_progress=on_progress)
        except TraceFetchError as exc:
            progress.stop()
            typer.echo(f"pdctl traces fetch: {exc}", err=True)
            raise typer.Exit(code=EXIT_FETCH_FAILED) from None
    downloaded = sum(r.outcome == "downloaded" for r in results)
    present = len(results) - downloaded
    typer.echo(f"{len(results)} files verified in {dest} ({downloaded} downloaded, {present} already present)")


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Add the ``traces`` command group to ``app``."""
    group = typer.Typer(help=help_text, no_args_is_help=True)

    @group.command("list")
    def list_() -> None:
        """List the known traces, their pinned sources and how many of their files are present."""
        _list(Console())

    @group.command("path")
    def path() -> None:
        """Print the folder ``${PDCTL_TRACES}`` resolves to."""
        typer.echo(str(default_traces_dir()))

    @group.command("fetch")
    def fetch(
        names: list[str] = typer.Argument(None, help="Trace names (`pdctl traces list`); all when none."),  # noqa: B008
        dest: Path | None = typer.Option(None, "--dest", help="Trace folder (default: $PDCTL_DATA_DIR/traces)."),  # noqa: B008
        base_url: str | None = typer.Option(None, "--base-url", help="A mirror laid out like the trace folder."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    ) -> None:
        """Download traces at their pinned upstream commits and verify each file's SHA-256."""
        _fetch(names or [], dest if dest is not None else data_dir() / "traces", base_url, quiet)

    app.add_typer(group, name=name)
