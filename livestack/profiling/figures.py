"""PNG figures of a :class:`WorkloadProfile` (matplotlib's object API on an Agg canvas: no global pyplot state).

Written by :func:`write_figures`: ``lengths.png`` (input and output length histograms, log2 bins),
``arrival_rate.png`` (rate curve, when known), ``latency.png`` (TTFT/TPOT/E2E quantiles, when known) and
``groups.png`` (input and output length histograms per tenant and per route, when known).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from livestack.profiling.profile import GroupStats, LengthStats, WorkloadProfile

__all__ = ["write_figures"]


def _save(figure: Figure, path: Path) -> Path:
    FigureCanvasAgg(figure)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path


def _histogram(ax: Axes, stats: LengthStats, title: str, threshold: float | None) -> None:
    edges = np.array(stats.histogram_edges)
    counts = np.array(stats.histogram_counts)
    total = counts.sum() or 1.0
    lefts = np.maximum(edges[:-1], 0.5)
    ax.bar(lefts, counts / total, width=edges[1:] - lefts, align="edge", edgecolor="black", linewidth=0.4)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens")
    ax.set_ylabel("share of requests")
    ax.set_title(f"{title}: mean {stats.mean:.0f}, p50 {stats.p50:.0f}, p99 {stats.p99:.0f}")
    if threshold is not None:
        ax.axvline(threshold, color="red", linestyle="--", linewidth=1, label=f"{threshold:g} tokens")
        ax.legend()


def _group_histograms(ax: Axes, groups: list[GroupStats], which: str) -> None:
    for group in groups:
        stats: LengthStats = getattr(group, which)
        edges = np.maximum(np.array(stats.histogram_edges), 0.5)
        counts = np.array(stats.histogram_counts)
        share = counts / (counts.sum() or 1.0)
        ax.stairs(share, edges, label=f"{group.name} ({100 * group.share_frac:.0f} %)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"{which} tokens")
    ax.set_ylabel("share of the group's requests")
    ax.legend(fontsize="small")


def _groups_figure(profile: WorkloadProfile, path: Path) -> Path | None:
    sets = [(label, groups) for label, groups in (("tenant", profile.by_tenant), ("route", profile.by_route)) if groups]
    if not sets:
        return None
    figure = Figure(figsize=(12, 4 * len(sets)))
    for row, (label, groups) in enumerate(sets):
        for column, which in enumerate(("input", "output"), start=1):
            ax = figure.add_subplot(len(sets), 2, 2 * row + column)
            _group_histograms(ax, groups, which)
            ax.set_title(f"{which} length by {label}")
    return _save(figure, path)


def write_figures(profile: WorkloadProfile, out_dir: Path) -> list[Path]:
    """Write the profile's PNG figures into ``out_dir`` (created if needed); return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    figure = Figure(figsize=(11, 4))
    _histogram(figure.add_subplot(1, 2, 1), profile.input, "input", float(profile.long_context_threshold_tokens))
    _histogram(figure.add_subplot(1, 2, 2), profile.output, "output", float(profile.short_output_max_tokens))
    written.append(_save(figure, out_dir / "lengths.png"))
    if profile.arrivals is not None and profile.arrivals.rate_curve_rps:
        arrivals = profile.arrivals
        figure = Figure(figsize=(11, 3.5))
        ax = figure.add_subplot(1, 1, 1)
        edges = np.arange(len(arrivals.rate_curve_rps) + 1) * arrivals.bin_s
        ax.stairs(arrivals.rate_curve_rps, edges)
        ax.axhline(arrivals.mean_rate_rps, color="grey", linestyle="--", linewidth=1, label="mean")
        cv = "n/a" if arrivals.iat_cv is None else f"{arrivals.iat_cv:.2f}"
        ax.set_title(
            f"arrival rate per {arrivals.bin_s:g} s: mean {arrivals.mean_rate_rps:.2f} req/s, "
            f"peak/mean {arrivals.peak_to_mean:.2f}, inter-arrival CV {cv}"
        )
        ax.set_xlabel("time (s)")
        ax.set_ylabel("requests / s")
        ax.legend()
        written.append(_save(figure, out_dir / "arrival_rate.png"))
    if profile.latency:
        figure = Figure(figsize=(4 * len(profile.latency), 3.5))
        for column, (name, stats) in enumerate(sorted(profile.latency.items()), start=1):
            ax = figure.add_subplot(1, len(profile.latency), column)
            labels = ["p50", "p90", "p95", "p99"]
            ax.bar(labels, [stats.p50_s, stats.p90_s, stats.p95_s, stats.p99_s])
            ax.set_title(f"{name.upper()} (s), mean {stats.mean_s:.3g}")
        written.append(_save(figure, out_dir / "latency.png"))
    groups = _groups_figure(profile, out_dir / "groups.png")
    if groups is not None:
        written.append(groups)
    return written
