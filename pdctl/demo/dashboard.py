"""The live terminal dashboard (rich) and its plain one-line form for runs without a terminal."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pdctl.demo.monitor import Snapshot

__all__ = ["plain_line", "render"]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _vs(value: float | None, target: float | None) -> Text:
    text = _ms(value)
    if target is not None:
        text += f" / {_ms(target)}"
    style = "" if value is None or target is None else ("green" if value <= target else "bold red")
    return Text(text, style=style)


def render(snap: Snapshot) -> Panel:
    """One dashboard frame."""
    tenants = Table(
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        title="per tenant, last 20 s (emulated ms, observed / objective; good/s = requests meeting both objectives "
        "per second; remote = remote-prefill share; remote≥ = remote-prefill threshold, tokens; fb = fallbacks)",
    )
    tenants.add_column("tenant", no_wrap=True, min_width=7)
    for column in ("done", "TTFT p95", "TPOT p95", "good/s", "remote", "remote≥", "fb", "err"):
        tenants.add_column(column, justify="right")
    for t in snap.tenants:
        tenants.add_row(
            t.tenant,
            str(t.num_finished),
            _vs(t.ttft_p95_s, t.slo.ttft_s),
            _vs(t.tpot_p95_s, t.slo.tpot_s),
            "-" if t.goodput_rps is None else f"{t.goodput_rps:.2f}",
            "-" if t.remote_frac is None else f"{100 * t.remote_frac:.0f}%",
            "-" if t.remote_min_input_tokens is None else str(t.remote_min_input_tokens),
            str(t.num_fallbacks_total),
            str(t.num_errors_total),
        )
    routes = ", ".join(f"{k} {v}" for k, v in sorted(snap.route_counts.items())) or "-"
    cluster = Text.assemble(
        ("instances ", "bold"),
        f"prefill {snap.num_prefill}  decode {snap.num_decode}",
        f"  ({snap.num_pending} changing role)" if snap.num_pending else "",
        ("   routes ", "bold"),
        routes,
        ("   KV transfer ", "bold"),
        "-" if snap.transfer_mean_s is None else f"{snap.transfer_mean_s * 1000:.1f} ms mean",
        ("   requests ", "bold"),
        str(snap.num_requests_total),
    )
    c = snap.controller
    if c is None:
        controller = Text("controller: no decision yet", style="dim")
    else:
        controller = Text.assemble(
            ("controller ", "bold"),
            f"[{c.mode}] {c.policy_id}  tick {c.tick}  applied {c.num_actuations_applied}\n",
            ("  last decision: ", "bold"),
            c.reason or "hold",
            ("  → ", "bold"),
            c.outcome or "-",
        )
    title = f"pdctl demo — {snap.phase} — t = {snap.t_s:.0f} / {snap.duration_s:.0f} s (emulated)"
    if not snap.router_reachable:
        title += "  [router not answering]"
    return Panel(Group(tenants, cluster, controller), title=title)


def plain_line(snap: Snapshot) -> str:
    """One progress line (no terminal)."""
    parts = [f"[{snap.phase} t={snap.t_s:.0f}/{snap.duration_s:.0f}s]", f"P/D {snap.num_prefill}/{snap.num_decode}"]
    for t in snap.tenants:
        remote = "-" if t.remote_min_input_tokens is None else str(t.remote_min_input_tokens)
        parts.append(
            f"{t.tenant}: TTFTp95 {_ms(t.ttft_p95_s)}/{_ms(t.slo.ttft_s)}ms TPOTp95 {_ms(t.tpot_p95_s)}/"
            f"{_ms(t.slo.tpot_s)}ms remote>={remote}"
        )
    if snap.controller is not None:
        parts.append(f"controller[{snap.controller.mode}]: {snap.controller.reason or 'hold'}")
    return "  ".join(parts)
