"""``pdctl loadgen``: replay a scenario, workload or trace against an OpenAI endpoint; print and save latencies."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

import typer
import yaml
from rich.console import Console
from rich.table import Table

from env.scenario import ScenarioError, load_scenario
from env.workloads import RequestSpec, WorkloadError, parse_workload_config, resolve_paths
from livestack.loadgen import ClientTenantStats, LoadOptions, replay, requests_from_scenario, requests_from_workload
from livestack.loadgen.report import summarize, write_csv, write_json

__all__ = ["register"]

EXIT_INVALID = 2


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _table(summaries: list[ClientTenantStats], time_scale: float) -> Table:
    unit = "ms" if time_scale == 1.0 else "emulated ms"
    table = Table(title=f"Client-side latency ({unit})")
    for column in ("tenant", "requests", "ok", "errors", "out tok", "TTFT p50", "TTFT p95", "TTFT p99", "TPOT p50",
                   "TPOT p95", "TPOT p99", "ITL p99", "E2E p50", "E2E p95"):  # fmt: skip
        table.add_column(column, justify="right")
    for s in summaries:
        table.add_row(
            s.tenant, str(s.num_requests), str(s.num_ok), str(s.num_errors), str(s.output_tokens),
            _ms(s.ttft_p50_s), _ms(s.ttft_p95_s), _ms(s.ttft_p99_s), _ms(s.tpot_p50_s), _ms(s.tpot_p95_s),
            _ms(s.tpot_p99_s), _ms(s.itl_p99_s), _ms(s.e2e_p50_s), _ms(s.e2e_p95_s),
        )  # fmt: skip
    return table


def _load_specs(
    scenario: Path | None, workload: Path | None, duration_s: float | None, tenant: str, seed: int | None
) -> list[RequestSpec]:
    if (scenario is None) == (workload is None):
        raise typer.BadParameter("give exactly one of --scenario and --workload")
    if scenario is not None:
        return requests_from_scenario(load_scenario(scenario), duration_s, seed)
    assert workload is not None
    config = resolve_paths(parse_workload_config(yaml.safe_load(workload.read_text(encoding="utf-8"))), workload.parent)
    return requests_from_workload(config, duration_s or 60.0, tenant, seed or 0)


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Add the ``loadgen`` command to ``app``."""

    @app.command(name=name, help=help_text)
    def loadgen(
        url: str = typer.Option("http://127.0.0.1:8000", help="OpenAI endpoint (router, instance or vLLM)."),
        scenario: Path | None = typer.Option(None, help="Scenario YAML: every tenant's workload."),  # noqa: B008
        workload: Path | None = typer.Option(  # noqa: B008
            None, help="Workload YAML (synthetic, trace_azure, trace_mooncake, servegen)."
        ),
        tenant: str = typer.Option("default", help="Tenant of a --workload load."),
        duration_s: float | None = typer.Option(None, help="Load duration in scenario seconds."),
        time_scale: float = typer.Option(1.0, help="Wall seconds per scenario second (match the emulator's)."),
        max_requests: int | None = typer.Option(None, help="Send at most this many requests."),
        max_in_flight: int = typer.Option(512, help="Concurrent requests at most."),
        max_duration_s: float = typer.Option(3600.0, help="Stop the run after this many wall seconds."),
        request_timeout_s: float = typer.Option(600.0, help="Cut off one request after this many wall seconds."),
        api: str = typer.Option("completions", help="completions or chat."),
        model: str = typer.Option("", help="Model name to send (default: the workload's or none)."),
        api_key: str | None = typer.Option(None, help="Bearer token for the endpoint."),
        seed: int | None = typer.Option(None, help="Override the scenario seed."),
        out_json: Path | None = typer.Option(None, help="Write summary and per-request results (JSON)."),  # noqa: B008
        out_csv: Path | None = typer.Option(None, help="Write per-request results (CSV)."),  # noqa: B008
    ) -> None:
        """Replay requests at their arrival times and report client-side TTFT, TPOT/ITL and E2E per tenant."""
        if api not in ("completions", "chat"):
            raise typer.BadParameter("--api must be completions or chat")
        try:
            specs = _load_specs(scenario, workload, duration_s, tenant, seed)
        except (ScenarioError, WorkloadError, OSError, ValueError) as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(code=EXIT_INVALID) from None
        kind: Literal["completions", "chat"] = "chat" if api == "chat" else "completions"
        options = LoadOptions(
            url=url, model=model, api=kind, time_scale=time_scale, max_requests=max_requests,
            max_in_flight=max_in_flight, request_timeout_s=request_timeout_s, max_duration_s=max_duration_s,
            api_key=api_key,
        )  # fmt: skip
        results = asyncio.run(replay(specs, options))
        summaries = summarize(results)
        Console(width=200).print(_table(summaries, time_scale))
        if out_json is not None:
            write_json(out_json, results, summaries)
        if out_csv is not None:
            write_csv(out_csv, results)
