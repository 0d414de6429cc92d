"""The demo's comparison: per-tenant SLO attainment and latency under the static baseline and the controller.

Numbers come from the load generator's per-request results (what a client saw, emulated seconds), scored as
:mod:`policies.scoring` defines it: a request meets its TTFT (TPOT) objective when its TTFT (mean TPOT) is at
most the tenant's per-request bound (:class:`pdctl.demo.config.RequestSloBounds`); a failed request meets neither; a
one-token request has no TPOT and meets that objective. Attainment is over every request sent in the phase;
goodput = requests meeting both objectives per second of load.

Writes ``report.md``, ``summary.json`` and PNG plots (TTFT and TPOT over time, P/D counts and thresholds over
time, CDFs) into the output folder and prints the comparison table.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from env.scenario import Scenario
from env.workloads.config import StepWorkload
from pdctl.demo.config import DemoOptions, RequestSloBounds
from pdctl.demo.runner import PhaseResult
from policies.scoring import meets_slo, quantile, slo_attainment_frac

__all__ = ["TenantOutcome", "build_report", "surge_tenants", "tenant_outcomes"]

NO_HARM_TOLERANCE_FRAC = 0.01
"""The chat tenant's TPOT attainment may drop by at most this much for the controller to count as not hurting it."""


@dataclass(frozen=True, slots=True)
class TenantOutcome:
    """One tenant in one phase (latencies in emulated seconds; ``None`` = no sample)."""

    tenant: str
    num_requests: int
    num_ok: int
    ttft_attainment_frac: float | None
    tpot_attainment_frac: float | None
    slo_attainment_frac: float | None
    goodput_rps: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None


def load_requests(path: Path) -> list[dict[str, Any]]:
    """Per-request results of a load run (``pdctl loadgen --out-json``)."""
    requests: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))["requests"]
    return requests


def _succeeded(request: Mapping[str, Any]) -> bool:
    return bool(request["status"] == 200 and request["error"] is None)


def _num_met(
    requests: Sequence[Mapping[str, Any]], ttft_objective_s: float | None, tpot_objective_s: float | None
) -> int:
    return sum(
        meets_slo(r["ttft_s"], r["tpot_s"], ttft_objective_s, tpot_objective_s, succeeded=_succeeded(r))
        for r in requests
    )


def tenant_outcomes(
    requests: Sequence[Mapping[str, Any]], slos: Mapping[str, RequestSloBounds], duration_s: float
) -> dict[str, TenantOutcome]:
    """Per-tenant attainment, goodput and percentiles of one phase."""
    out: dict[str, TenantOutcome] = {}
    for tenant, slo in slos.items():
        mine = [r for r in requests if r["tenant"] == tenant]
        ok = [r for r in mine if _succeeded(r)]
        both = _num_met(mine, slo.ttft_s, slo.tpot_s)
        ttft = [float(r["ttft_s"]) for r in ok if r["ttft_s"] is not None]
        tpot = [float(r["tpot_s"]) for r in ok if r["tpot_s"] is not None]
        out[tenant] = TenantOutcome(
            tenant=tenant,
            num_requests=len(mine),
            num_ok=len(ok),
            ttft_attainment_frac=slo_attainment_frac(_num_met(mine, slo.ttft_s, None), len(mine)),
            tpot_attainment_frac=slo_attainment_frac(_num_met(mine, None, slo.tpot_s), len(mine)),
            slo_attainment_frac=slo_attainment_frac(both, len(mine)),
            goodput_rps=both / duration_s,
            ttft_p50_s=quantile(ttft, 0.5),
            ttft_p95_s=quantile(ttft, 0.95),
            tpot_p50_s=quantile(tpot, 0.5),
            tpot_p95_s=quantile(tpot, 0.95),
        )
    return out


def surge_tenants(scenario: Scenario) -> tuple[str, list[str]]:
    """The surging tenant (the one with the largest step-rate ratio) and the others."""
    best, ratio = scenario.tenants[0].name, 0.0
    for tenant in scenario.tenants:
        workload = tenant.workload
        if isinstance(workload, StepWorkload):
            rates = [s.rate_rps for s in workload.segments]
            r = max(rates) / max(min(rates), 1e-9)
            if r > ratio:
                best, ratio = tenant.name, r
    return best, [t.name for t in scenario.tenants if t.name != best]


def surge_window_s(scenario: Scenario, tenant: str) -> tuple[float, float] | None:
    """Start and end of the highest-rate segment of ``tenant`` (emulated seconds)."""
    for t in scenario.tenants:
        if t.name == tenant and isinstance(t.workload, StepWorkload):
            segments = list(t.workload.segments)
            k = max(range(len(segments)), key=lambda i: segments[i].rate_rps)
            end = segments[k + 1].start_s if k + 1 < len(segments) else scenario.duration_s
            return segments[k].start_s, end
    return None


def _f(value: float | None, scale: float = 1.0, digits: int = 0, suffix: str = "") -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}{suffix}"


def _rows(
    outcomes: Mapping[str, Mapping[str, TenantOutcome]], phases: Sequence[str]
) -> list[tuple[str, str, list[str]]]:
    rows: list[tuple[str, str, list[str]]] = []
    tenants = list(next(iter(outcomes.values())).keys())
    metrics: tuple[tuple[str, Callable[[TenantOutcome], str]], ...] = (
        ("TTFT SLO attainment", lambda o: _f(o.ttft_attainment_frac, 100, 1, " %")),
        ("TPOT SLO attainment", lambda o: _f(o.tpot_attainment_frac, 100, 1, " %")),
        ("both SLOs (goodput frac)", lambda o: _f(o.slo_attainment_frac, 100, 1, " %")),
        ("goodput (req/s)", lambda o: f"{o.goodput_rps:.2f}"),
        ("TTFT p50 / p95 (ms)", lambda o: f"{_f(o.ttft_p50_s, 1000)} / {_f(o.ttft_p95_s, 1000)}"),
        ("TPOT p50 / p95 (ms)", lambda o: f"{_f(o.tpot_p50_s, 1000, 1)} / {_f(o.tpot_p95_s, 1000, 1)}"),
        ("requests (ok)", lambda o: f"{o.num_requests} ({o.num_ok})"),
    )
    for tenant in tenants:
        for label, getter in metrics:
            rows.append((tenant, label, [getter(outcomes[p][tenant]) for p in phases]))
    return rows


def _verdict(
    outcomes: Mapping[str, Mapping[str, TenantOutcome]], surge: str, others: Sequence[str]
) -> tuple[bool | None, str]:
    if "static" not in outcomes or "controlled" not in outcomes:
        return None, "no static baseline phase (--no-baseline): nothing to compare"
    s, c = outcomes["static"], outcomes["controlled"]
    sa, ca = s[surge].ttft_attainment_frac, c[surge].ttft_attainment_frac
    parts = [f"{surge} TTFT SLO attainment {_f(sa, 100, 1, ' %')} (static) → {_f(ca, 100, 1, ' %')} (controller)"]
    wins = sa is not None and ca is not None and ca > sa
    for other in others:
        so, co = s[other].tpot_attainment_frac, c[other].tpot_attainment_frac
        parts.append(f"{other} TPOT SLO attainment {_f(so, 100, 1, ' %')} → {_f(co, 100, 1, ' %')}")
        wins = wins and so is not None and co is not None and co >= so - NO_HARM_TOLERANCE_FRAC
    verdict = "the controller beats the static baseline" if wins else "the controller does NOT beat the static baseline"
    return wins, f"{verdict}: " + "; ".join(parts)


def _print_table(rows: Sequence[tuple[str, str, list[str]]], phases: Sequence[str], console: Console) -> None:
    table = Table(title="Same workload, same seed: static baseline vs controller (emulated time)")
    table.add_column("tenant")
    table.add_column("metric")
    for phase in phases:
        table.add_column(phase, justify="right")
    for tenant, label, values in rows:
        table.add_row(tenant, label, *values)
    console.print(table)


def _markdown_table(rows: Sequence[tuple[str, str, list[str]]], phases: Sequence[str]) -> str:
    lines = ["| tenant | metric | " + " | ".join(phases) + " |", "|---|---|" + "---:|" * len(phases)]
    lines += [f"| {t} | {label} | " + " | ".join(values) + " |" for t, label, values in rows]
    return "\n".join(lines)


def _controller_summary(audit_log: Path) -> tuple[int, int, dict[str, int]]:
    """Ticks, applied actuations, and how many ticks asked for each kind of change (numbers stripped)."""
    ticks = applied = 0
    reasons: dict[str, int] = {}
    try:
        lines = audit_log.read_text(encoding="utf-8").splitlines()
    except OSError:
        return 0, 0, {}
    for line in lines:
        if not line.strip():
            continue
        rec = json.loads(line)
        ticks += 1
        applied += sum(1 for r in rec.get("actuation", []) or [] if r.get("outcome") == "applied")
        for part in str((rec.get("decision") or {}).get("reason", "")).split(";"):
            kind = part.split(" ", 1)[0]
            if kind and not kind.endswith(("within_marks", "unknown")) and kind != "hold":
                reasons[kind] = reasons.get(kind, 0) + 1
    return ticks, applied, reasons


def build_report(
    *,
    phases: Sequence[PhaseResult],
    scenario: Scenario,
    slos: Mapping[str, RequestSloBounds],
    options: DemoOptions,
    policy: str,
    out_dir: Path,
    command_line: str,
    wall_s: float,
    profile_text: str,
    console: Console,
) -> Path:
    """Compare the phases, print the table, write ``report.md``, ``summary.json`` and the plots."""
    from pdctl.demo.plots import write_plots

    requests = {p.name: load_requests(p.load_json) for p in phases}
    outcomes = {name: tenant_outcomes(reqs, slos, scenario.duration_s) for name, reqs in requests.items()}
    names = [p.name for p in phases]
    rows = _rows(outcomes, names)
    _print_table(rows, names, console)
    surge, others = surge_tenants(scenario)
    wins, verdict = _verdict(outcomes, surge, others)
    console.print(("[bold green]" if wins else "[bold yellow]") + verdict + "[/]")
    window = surge_window_s(scenario, surge)
    plots = write_plots(phases, requests, slos, window, out_dir)
    summary = {
        "command": command_line,
        "wall_s": round(wall_s, 1),
        "scenario": scenario.name,
        "duration_s": scenario.duration_s,
        "time_scale": options.time_scale,
        "seed": scenario.seed,
        "policy": policy,
        "surge_tenant": surge,
        "surge_window_s": window,
        "controller_wins": wins,
        "verdict": verdict,
        "slos": {t: asdict(s) for t, s in slos.items()},
        "phases": {
            p.name: {
                "controller_mode": p.controller_mode,
                "metric_source": p.metric_source,
                "wall_s": round(p.wall_s, 1),
                "tenants": {t: asdict(o) for t, o in outcomes[p.name].items()},
            }
            for p in phases
        },
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    group = scenario.tenant_groups[0]
    lines = [
        f"# pdctl demo — {scenario.name}",
        "",
        f"Command: `{command_line}`  ",
        f"Wall time: {wall_s:.0f} s on this machine; {scenario.duration_s:.0f} s of load per phase (emulated), "
        f"time scale {options.time_scale:g}, seed {scenario.seed}.",
        "",
        f"Cluster: {group.prefill} prefill + {group.decode} decode emulated vLLM instances "
        f"({scenario.cluster.profile}, TP {scenario.cluster.tp}) behind the pdctl router; metric source: "
        f"{phases[0].metric_source}; base policy file `{_rel(options.policy_file)}`.",
        "",
        "Phases (same scenario, same seed, same starting split and thresholds):",
        "",
    ]
    for p in phases:
        what = "controller in advisory mode (observes and logs, changes nothing)" if p.controller_mode == "advisory" \
            else f"controller active with `{p.policy}`"  # fmt: skip
        lines.append(f"* **{p.name}** — {what}; {p.wall_s:.0f} s wall.")
    lines += ["", "## Comparison", "", _markdown_table(rows, names), "", f"**{verdict}.**", ""]
    slo_text = ", ".join(
        f"{t}: TTFT ≤ {_f(s.ttft_s, 1000)} ms, TPOT ≤ {_f(s.tpot_s, 1000)} ms" for t, s in slos.items()
    )
    lines += [f"Per-request objectives ({_rel(options.policy_file)}): {slo_text}. A failed request meets neither.", ""]
    if window is not None:
        lines += [f"The {surge} surge runs from t = {window[0]:.0f} s to t = {window[1]:.0f} s.", ""]
    lines += ["## Controller", ""]
    for p in phases:
        ticks, applied, reasons = _controller_summary(p.audit_log)
        asked = ", ".join(f"`{r}` x{n}" for r, n in reasons.items()) or "none"
        lines.append(f"* {p.name}: {ticks} ticks, {applied} actuations applied; ticks asking for a change: {asked}")
    lines += ["", "## Plots", ""]
    lines += [f"![{path.stem}]({path.name})" for path in plots]
    lines += ["", "## Workload profile of the replayed requests (controlled phase, router log)", "", "```",
              profile_text.rstrip(), "```", ""]  # fmt: skip
    report = out_dir / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return report


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
