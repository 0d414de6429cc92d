"""``pdctl profile SOURCE``: portrait of a workload and whether P/D disaggregation is likely to pay off.

SOURCE is an Azure 2023 CSV, a Mooncake JSONL trace, a ServeGen folder, a router JSONL request log, a Prometheus
URL (with ``--start``/``--end``), or a scenario YAML (its tenants' workloads are generated with the scenario's
seed, or ``--seed``, and profiled together, per tenant). Prints rich tables and the verdict; ``--json`` writes the
profile as JSON (``-`` for stdout, then nothing else is printed); ``--out DIR`` writes PNG figures and
``profile.json``; ``--emit-workload FILE`` writes, per tenant, a synthetic workload fitted to the requests
(:func:`livestack.profiling.fit.fit_workload`). Bad input prints one line naming the file (or URL) and the problem, and
exits 2.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import typer
import yaml
from rich.console import Console
from rich.table import Table

from env.workloads.errors import WorkloadError
from livestack.profiling import (
    Decision,
    ProfileOptions,
    RequestRecords,
    WorkloadProfile,
    profile_records,
    profile_source,
)
from livestack.profiling.fit import fit_workload
from livestack.profiling.profile import GroupStats, LatencyStats, LengthStats
from livestack.profiling.sources import PER_REQUEST_KINDS, SourceKind, detect_source_kind, load_records
from livestack.profiling.verdict import LONG_CONTEXT_THRESHOLD_TOKENS, SHORT_OUTPUT_MAX_TOKENS

__all__ = ["EXIT_BAD_INPUT", "parse_time", "register"]

EXIT_BAD_INPUT = 2
_KINDS = ("auto", "azure", "mooncake", "router", "servegen", "prometheus", "scenario")
_RELATIVE = re.compile(r"^(?:now)?-(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_time(text: str, now: datetime | None = None) -> datetime:
    """Parse ``now``, ``now-1h`` / ``-30m``, Unix seconds or ISO-8601 (UTC when no zone is given).

    Raises:
        ValueError: none of these forms.
    """
    now = now or datetime.now(UTC)
    value = text.strip()
    if value == "now":
        return now
    match = _RELATIVE.match(value)
    if match:
        return now - timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2)])
    try:
        return datetime.fromtimestamp(float(value), tz=UTC)
    except ValueError:
        pass
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _n(value: float | None, digits: int = 0) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    return f"{value:,.{digits}f}"


def _pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or value != value else f"{100 * value:.{digits}f} %"


def _summary_table(p: WorkloadProfile) -> Table:
    table = Table(title=f"Workload profile: {p.source} ({p.source_kind})", show_header=False)
    table.add_column("figure")
    table.add_column("value")
    table.add_row("requests", _n(p.num_requests))
    a = p.arrivals
    if a is not None:
        table.add_row("span", f"{_n(a.span_s)} s")
        table.add_row("mean rate", f"{_n(a.mean_rate_rps, 2)} req/s")
        table.add_row("inter-arrival CV", _n(a.iat_cv, 2))
        table.add_row(f"peak-to-mean (bins of {a.bin_s:g} s)", _n(a.peak_to_mean, 2))
        if a.dispersion_1s is not None:
            table.add_row(
                "variance/mean of counts",
                f"{_n(a.dispersion_1s, 2)} at 1 s, {_n(a.dispersion_bin, 2)} at {a.bin_s:g} s",
            )
        table.add_row(
            f"requests per {a.bin_s:g} s bin", f"{_n(a.min_full_bin_count)}–{_n(a.max_full_bin_count)} (full bins)"
        )
    t = p.long_context_threshold_tokens
    table.add_row(f"long context (input ≥ {t})", _pct(p.long_context_frac))
    if p.uncached_long_context_frac is not None:
        table.add_row(f"uncached input ≥ {t}", _pct(p.uncached_long_context_frac))
    table.add_row(f"short in (< {t}) and out (< {p.short_output_max_tokens})", _pct(p.short_short_frac))
    r = p.prefix_reuse
    if r is not None:
        if r.block_reuse_frac is not None:
            table.add_row(
                "prefix reuse (blocks seen before)",
                f"{_pct(r.block_reuse_frac)} of {_n(r.num_blocks)} {r.block_tokens}-token blocks "
                f"({_n(r.unique_blocks)} unique)",
            )
        table.add_row("prefix reuse (prompt tokens)", _pct(r.token_reuse_frac))
        if r.hit_2plus_frac is not None:
            table.add_row(
                "requests reusing ≥1 / ≥2 leading blocks", f"{_pct(r.hit_any_frac, 2)} / {_pct(r.hit_2plus_frac)}"
            )
    table.add_row("streaming", _pct(p.streaming_frac))
    if p.success_frac is not None:
        table.add_row("succeeded", _pct(p.success_frac))
    for key, value in p.extras.items():
        table.add_row(key.replace("_", " "), _n(value, 0 if float(value).is_integer() else 2))
    return table


def _lengths_table(p: WorkloadProfile) -> Table:
    table = Table(title="Token lengths")
    for column in ("", "mean", "p50", "p90", "p95", "p99", "max"):
        table.add_column(column, justify="right")
    rows: tuple[tuple[str, LengthStats], ...] = (("input", p.input), ("output", p.output))
    for name, s in rows:
        table.add_row(name, _n(s.mean, 1), _n(s.p50), _n(s.p90), _n(s.p95), _n(s.p99), _n(s.max))
    return table


def _latency_table(title: str, latency: dict[str, LatencyStats]) -> Table:
    table = Table(title=title)
    for column in ("", "count", "mean s", "p50 s", "p90 s", "p95 s", "p99 s"):
        table.add_column(column, justify="right")
    for name, s in latency.items():
        table.add_row(
            name, _n(s.count), _n(s.mean_s, 4), _n(s.p50_s, 4), _n(s.p90_s, 4), _n(s.p95_s, 4), _n(s.p99_s, 4)
        )
    return table


def _groups_table(label: str, groups: list[GroupStats], threshold: int) -> Table:
    table = Table(title=f"By {label}")
    for column in (label, "requests", "share", "in mean", "in p50", "in p99", "out mean", "out p50", "out p99",
                   f"in ≥ {threshold}", "TTFT p50/p99 s", "TPOT p50/p99 s"):  # fmt: skip
        table.add_column(column, justify="right", no_wrap=column == label)
    for g in groups:
        ttft, tpot = g.latency.get("ttft"), g.latency.get("tpot")
        table.add_row(
            g.name, _n(g.num_requests), _pct(g.share_frac), _n(g.input.mean), _n(g.input.p50), _n(g.input.p99),
            _n(g.output.mean), _n(g.output.p50), _n(g.output.p99), _pct(g.long_context_frac),
            "-" if ttft is None else f"{ttft.p50_s:.3f}/{ttft.p99_s:.3f}",
            "-" if tpot is None else f"{tpot.p50_s:.4f}/{tpot.p99_s:.4f}",
        )  # fmt: skip
    return table


def _print(p: WorkloadProfile, console: Console) -> None:
    console.print(_summary_table(p))
    console.print(_lengths_table(p))
    if p.latency:
        console.print(_latency_table("Latency", p.latency))
    if p.stages:
        console.print(_latency_table("Per-request stages", p.stages))
    for label, groups in (("tenant", p.by_tenant), ("route", p.by_route)):
        if groups:
            console.print(_groups_table(label, groups, p.long_context_threshold_tokens))
    for note in p.notes:
        console.print(f"[dim]note: {note}[/dim]")
    colour = {Decision.PAYS_OFF: "green", Decision.EVALUATE: "yellow", Decision.NOT_A_PRIORITY: "red"}
    v = p.verdict
    console.print(f"\n[bold {colour[v.decision]}]Verdict ({v.decision.value}): {v.headline}[/]")
    for reason in v.reasons:
        console.print(f"  • {reason}")
    if v.first_steps:
        console.print("[bold]What to do first:[/bold]")
        for number, step in enumerate(v.first_steps, start=1):
            console.print(f"  {number}. {step}")


def _scenario_records(source: str, seed: int | None) -> RequestRecords:
    # the scenario and simulator modules are imported only for this kind of source
    from env.scenario import ScenarioError, load_scenario
    from env.sim.build import generate_workloads

    try:
        scenario = load_scenario(source)
    except ScenarioError as exc:
        raise _fail(str(exc)) from None
    try:
        streams = generate_workloads(scenario, seed)
    except (WorkloadError, ValueError) as exc:
        raise _fail(f"{source}: {exc}") from None
    return RequestRecords.from_tenant_columns(streams)


def _emit_workloads(records: RequestRecords, source: str, path: Path) -> None:
    tenants = ["default"] if records.tenant is None else sorted(set(records.tenant.tolist()))
    fitted: dict[str, object] = {}
    for tenant in tenants:
        part = records if records.tenant is None else records.take(records.tenant == tenant)
        try:
            dumped = fit_workload(part).model_dump(mode="json", exclude_none=True)
            fitted[tenant] = {"kind": dumped.pop("kind"), **dumped}
        except ValueError as exc:
            raise _fail(f"{source}: cannot fit a workload for tenant {tenant!r} ({exc})") from None
    header = f"# Workloads fitted by `pdctl profile {source}`: tenant -> WorkloadConfig (env/workloads/config.py).\n"
    try:
        path.write_text(header + yaml.safe_dump(fitted, sort_keys=False))
    except OSError as exc:
        raise _fail(f"{path}: cannot write ({exc.strerror or exc})") from None


def _load(
    source: str, kind: str, options: ProfileOptions, start: str | None, end: str | None, seed: int | None
) -> tuple[WorkloadProfile, RequestRecords | None]:
    try:
        start_at = None if start is None else parse_time(start)
        end_at = None if end is None else parse_time(end)
    except ValueError as exc:
        raise _fail(f"bad --start/--end time: {exc}") from None
    try:
        if kind == "scenario" or (kind == "auto" and source.lower().endswith((".yaml", ".yml"))):
            records = _scenario_records(source, seed)
            return profile_records(records, source=source, source_kind="scenario", options=options), records
        resolved = detect_source_kind(source) if kind == "auto" else cast(SourceKind, kind)
        if resolved in PER_REQUEST_KINDS:
            records, _ = load_records(source, resolved)
            return profile_source(source, kind=resolved, options=options), records
        return profile_source(source, kind=resolved, options=options, start=start_at, end=end_at), None
    except WorkloadError as exc:
        raise _fail(str(exc)) from None


def _fail(message: str) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code=EXIT_BAD_INPUT)


def _run(
    source: str,
    kind: str,
    start: str | None,
    end: str | None,
    options: ProfileOptions,
    out: Path | None,
    json_path: str | None,
    seed: int | None = None,
    emit_workload: Path | None = None,
) -> None:
    if kind not in _KINDS:
        raise _fail(f"--format must be one of {', '.join(_KINDS)}, not {kind!r}")
    profile, records = _load(source, kind, options, start, end, seed)
    if emit_workload is not None:
        if records is None:
            raise _fail(f"{source}: --emit-workload needs per-request records (a trace, router log or scenario)")
        _emit_workloads(records, source, emit_workload)
    document = json.dumps(profile.to_dict(), indent=2)
    if json_path == "-":
        typer.echo(document)
    else:
        _print(profile, Console())
        if json_path is not None:
            try:
                Path(json_path).write_text(document + "\n")
            except OSError as exc:
                raise _fail(f"{json_path}: cannot write ({exc.strerror or exc})") from None
    if out is not None:
        from livestack.profiling.figures import write_figures

        try:
            written = write_figures(profile, out)
            (out / "profile.json").write_text(document + "\n")
        except OSError as exc:
            raise _fail(f"{out}: cannot write figures ({exc.strerror or exc})") from None
        if json_path != "-":
            typer.echo(f"wrote {', '.join(str(p) for p in [*written, out / 'profile.json'])}")


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Register ``pdctl profile``."""

    @app.command(name=name, help=help_text)
    def profile(
        source: str = typer.Argument(
            ..., help="Azure CSV, Mooncake JSONL, ServeGen folder, router log or Prometheus URL."
        ),
        kind: str = typer.Option("auto", "--format", help="Source kind: " + ", ".join(_KINDS) + "."),
        start: str | None = typer.Option(None, "--start", help="Prometheus range start: ISO-8601, Unix s, now-1h."),
        end: str | None = typer.Option(None, "--end", help="Prometheus range end: ISO-8601, Unix s, now."),
        long_threshold: int = typer.Option(
            LONG_CONTEXT_THRESHOLD_TOKENS, "--long-threshold", min=1, help="Long-context threshold (input tokens)."
        ),
        short_output: int = typer.Option(
            SHORT_OUTPUT_MAX_TOKENS, "--short-output", min=1, help="Outputs below this many tokens are short."
        ),
        bin_s: float = typer.Option(60.0, "--bin", min=0.001, help="Arrival-rate bin (s) for the curve and peak/mean."),
        max_groups: int = typer.Option(12, "--max-groups", min=1, help="Tenants/routes listed before 'other'."),
        out: Path | None = typer.Option(None, "--out", help="Folder for PNG figures and profile.json."),  # noqa: B008
        json_path: str | None = typer.Option(None, "--json", help="Write the profile as JSON here ('-': stdout)."),
        seed: int | None = typer.Option(None, "--seed", help="Scenario sources: seed instead of the scenario's."),
        emit_workload: Path | None = typer.Option(  # noqa: B008
            None, "--emit-workload", help="Write fitted synthetic workloads (YAML, one per tenant) here."
        ),
    ) -> None:
        """Profile a workload and say whether P/D disaggregation pays off."""
        options = ProfileOptions(
            long_context_threshold_tokens=long_threshold,
            short_output_max_tokens=short_output,
            bin_s=bin_s,
            max_groups=max_groups,
        )
        _run(source, kind, start, end, options, out, json_path, seed, emit_workload)
