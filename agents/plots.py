"""PNG plots of an evaluation: goodput per policy and scenario, latency CDFs, decisions over time, rate sweeps.

All functions take the records :mod:`agents.evaluate` produces and write files (matplotlib, Agg backend); they
return the paths written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agents.harness import RunResult
from policies.registry import parse_policy_spec

__all__ = ["label", "plot_cdfs", "plot_decisions", "plot_goodput", "plot_sweep", "write_all"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def label(policy: str) -> str:
    """Short legend label of a policy spec."""
    if policy.startswith("baseline:"):
        return policy.removeprefix("baseline:")
    if policy.startswith("file:"):
        return "file:" + Path(policy.removeprefix("file:")).stem
    if policy.startswith("grid:"):
        return "grid (static optimum)"
    if policy.startswith("learned:"):
        return "learned:" + Path(policy.removeprefix("learned:")).name
    if policy.startswith("expert:"):
        return f"expert (clairvoyant, {policy.removeprefix('expert:')} intervals)"
    if policy.startswith("watchdog"):
        parsed = parse_policy_spec(policy)
        return f"{label(parsed.argument)} + watchdog ({label(str(parsed.fallback))})"
    return policy


def _colors(policies: Sequence[str]) -> dict[str, Any]:
    plt = _pyplot()
    cmap = plt.get_cmap("tab20")
    return {p: cmap(i % 20) for i, p in enumerate(policies)}


def _by_scenario(runs: Sequence[RunResult]) -> list[tuple[str, list[RunResult]]]:
    grouped: dict[str, list[RunResult]] = {}
    for run in runs:
        grouped.setdefault(run.scenario, []).append(run)
    return sorted(grouped.items())


def _save(plt: Any, fig: Any, path: Path, dpi: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot_goodput(aggregate: Sequence[Mapping[str, Any]], out: Path) -> Path | None:
    """Priority-weighted goodput (mean ± 95 % CI over seeds) per policy, one panel per scenario.

    Returns None (and writes nothing) when no run produced a row, e.g. every run was refused.
    """
    rows = [r for r in aggregate if r["tenant"] == "ALL"]
    if not rows:
        return None
    plt = _pyplot()
    scenarios = sorted({r["scenario"] for r in rows})
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    colors = _colors(policies)
    cols = min(len(scenarios), 3)
    nrows = math.ceil(len(scenarios) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 0.28 * len(policies) * nrows + 1.2 * nrows))
    axes = np.atleast_1d(axes).reshape(-1)
    for ax, scenario in zip(axes, scenarios, strict=False):
        mine = sorted(
            (r for r in rows if r["scenario"] == scenario), key=lambda r: r["weighted_goodput_rps_mean"] or 0.0
        )
        y = np.arange(len(mine))
        means = [r["weighted_goodput_rps_mean"] or 0.0 for r in mine]
        errs = [r["weighted_goodput_rps_ci95"] or 0.0 for r in mine]
        ax.barh(y, means, xerr=errs, color=[colors[r["policy"]] for r in mine], capsize=2)
        ax.set_yticks(y, [label(r["policy"]) for r in mine], fontsize=7)
        ax.set_title(scenario, fontsize=9)
        ax.set_xlabel("priority-weighted goodput (req/s)", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
    for ax in axes[len(scenarios) :]:
        ax.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_cdfs(runs: Sequence[RunResult], out_dir: Path) -> list[Path]:
    """TTFT and TPOT CDFs (all tenants pooled, the recorded seed) per policy, one file per scenario."""
    plt = _pyplot()
    written = []
    for scenario, members in _by_scenario([run for run in runs if run.samples]):
        colors = _colors([r.spec.label for r in members])
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        for run in members:
            for ax, metric in zip(axes, ("ttft_s", "tpot_s"), strict=True):
                values = np.sort(np.concatenate([v for k, v in run.samples.items() if k.endswith(metric)] or [[]]))
                if values.size == 0:
                    continue
                frac = np.arange(1, values.size + 1) / values.size
                ax.step(values, frac, where="post", label=label(run.spec.label), color=colors[run.spec.label])
        for ax, title in zip(axes, ("TTFT (s)", "TPOT (s)"), strict=True):
            ax.set_xscale("log")
            ax.set_xlabel(title)
            ax.set_ylabel("fraction of finished requests")
            ax.grid(alpha=0.3)
        axes[1].legend(fontsize=6, loc="lower right")
        fig.suptitle(f"{scenario}: latency CDFs (seed {members[0].spec.seed})", fontsize=10)
        fig.tight_layout()
        written.append(_save(plt, fig, out_dir / f"cdf_{scenario}.png", dpi=100))
    return written


def plot_decisions(runs: Sequence[RunResult], out_dir: Path) -> list[Path]:
    """Per scenario and policy: P/D counts against the request rate, and each tenant's remote threshold."""
    plt = _pyplot()
    written = []
    for scenario, members in _by_scenario([run for run in runs if run.timeline]):
        cols = min(len(members), 4)
        nrows = math.ceil(len(members) / cols)
        fig = plt.figure(figsize=(4.2 * cols, 4.4 * nrows))
        grid = fig.add_gridspec(2 * nrows, cols, height_ratios=[2, 1] * nrows, hspace=0.55, wspace=0.35)
        for i, run in enumerate(members):
            r, c = divmod(i, cols)
            top = fig.add_subplot(grid[2 * r, c])
            bottom = fig.add_subplot(grid[2 * r + 1, c], sharex=top)
            _decision_panel(top, bottom, run)
        fig.suptitle(f"{scenario}: decisions over time (seed {members[0].spec.seed})", fontsize=10)
        written.append(_save(plt, fig, out_dir / f"decisions_{scenario}.png", dpi=90))
    return written


def _decision_panel(top: Any, bottom: Any, run: RunResult) -> None:
    timeline = run.timeline
    t = np.array([row["t_s"] for row in timeline]) / 60.0
    keys = timeline[0].keys()
    prefill = np.sum([[row[k] for k in keys if k.endswith("/prefill")] for row in timeline], axis=1)
    decode = np.sum([[row[k] for k in keys if k.endswith("/decode")] for row in timeline], axis=1)
    top.step(t, prefill, where="post", color="tab:blue", lw=2.6, label="prefill")
    top.step(t, decode, where="post", color="tab:orange", lw=1.4, ls="--", label="decode")
    top.set_ylim(-0.3, max(float(np.max(prefill + decode)), 1.0) + 0.5)
    top.set_ylabel("instances", fontsize=7)
    title = label(run.spec.label)
    if run.spec.grid_point is not None:
        pools = ",".join(f"{p[0]}P{p[1]}D" for p in run.spec.grid_point["pools"].values())
        title += f"\n{pools} {run.spec.grid_point['route']}"
    top.set_title(title, fontsize=8)
    top.tick_params(labelsize=6)
    load = top.twinx()
    rate = np.array([sum(row[k] or 0.0 for k in keys if k.endswith("/rate_rps")) for row in timeline], dtype=np.float64)
    load.fill_between(t, rate, step="post", color="grey", alpha=0.2)
    load.set_ylabel("req/s", fontsize=7)
    load.tick_params(labelsize=6)
    top.legend(fontsize=6, loc="upper left")
    for key in keys:
        if key.endswith("/min_remote_input_tokens"):
            values = np.array([np.nan if row[key] is None else row[key] for row in timeline], dtype=np.float64)
            values[values > 1e8] = np.nan  # "never remote"
            bottom.step(t, values, where="post", label=key.split("/")[0])
    rules = sorted({str(row[k]) for row in timeline for k in keys if k.endswith("/rule")})
    bottom.text(0.01, 0.05, "rule: " + ", ".join(rules), transform=bottom.transAxes, fontsize=6)
    bottom.set_yscale("log")
    bottom.set_ylabel("remote ≥ tokens", fontsize=7)
    bottom.set_xlabel("minutes", fontsize=7)
    bottom.tick_params(labelsize=6)
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(fontsize=5, loc="upper right")


def plot_sweep(records: Sequence[Mapping[str, Any]], out: Path) -> Path:
    """SLO attainment against the rate multiplier per policy (one panel per scenario), with the 90 % line."""
    plt = _pyplot()
    scenarios = sorted({r["scenario"] for r in records})
    policies = list(dict.fromkeys(r["policy"] for r in records))
    colors = _colors(policies)
    cols = min(len(scenarios), 3)
    nrows = math.ceil(len(scenarios) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 4.0 * nrows), squeeze=False)
    flat = axes.reshape(-1)
    for ax, scenario in zip(flat, scenarios, strict=False):
        for rec in (r for r in records if r["scenario"] == scenario):
            points = sorted(rec["points"])
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            ax.plot(
                xs, ys, marker="o", ms=3, color=colors[rec["policy"]],
                label=f"{label(rec['policy'])} ({rec['max_rate_scale']:.2f}x)",
            )  # fmt: skip
        ax.axhline(records[0]["target_frac"], color="black", ls="--", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("request-rate multiplier")
        ax.set_ylabel("SLO attainment (both objectives)")
        ax.set_title(scenario, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in flat[len(scenarios) :]:
        ax.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_all(aggregate: Sequence[Mapping[str, Any]], runs: Sequence[RunResult], out_dir: Path) -> list[Path]:
    """Every evaluation plot into ``out_dir`` (none for scenarios without a finished run)."""
    goodput = plot_goodput(aggregate, out_dir / "goodput.png")
    paths = [goodput] if goodput is not None else []
    paths += plot_cdfs(runs, out_dir / "plots")
    paths += plot_decisions(runs, out_dir / "plots")
    return paths
