"""PNG plots of the demo (matplotlib, Agg backend): latency over time, P/D counts and thresholds, CDFs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pdctl.demo.config import RequestSloBounds
from pdctl.demo.runner import PhaseResult
from policies.scoring import quantile

__all__ = ["write_plots"]

_COLORS = {"static": "tab:gray", "controlled": "tab:blue"}
_ROLLING_S = 10.0


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _rolling_p95(t: np.ndarray, v: np.ndarray, horizon_s: float) -> tuple[np.ndarray, np.ndarray]:
    if t.size == 0:
        return t, v
    grid = np.arange(0.0, float(t.max()) + 1.0, 1.0)
    out = np.full(grid.shape, np.nan)
    for k, g in enumerate(grid):
        mask = (t > g - horizon_s) & (t <= g)
        if mask.any():
            out[k] = quantile(v[mask], 0.95)
    return grid, out


def _series(requests: Sequence[Mapping[str, Any]], tenant: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    rows = [(float(r["arrival_s"]), float(r[key])) for r in requests if r["tenant"] == tenant and r[key] is not None]
    if not rows:
        return np.zeros(0), np.zeros(0)
    arr = np.asarray(sorted(rows))
    return arr[:, 0], arr[:, 1]


def _over_time(
    plt: Any,
    requests: Mapping[str, Sequence[Mapping[str, Any]]],
    slos: Mapping[str, RequestSloBounds],
    key: str,
    label: str,
    window: tuple[float, float] | None,
    path: Path,
) -> Path:
    tenants = list(slos)
    fig, axes = plt.subplots(len(tenants), 1, figsize=(10, 3.2 * len(tenants)), sharex=True, squeeze=False)
    for ax, tenant in zip(axes[:, 0], tenants, strict=True):
        for phase, reqs in requests.items():
            t, v = _series(reqs, tenant, key)
            color = _COLORS.get(phase)
            ax.scatter(t, v * 1000, s=4, alpha=0.25, color=color)
            g, p95 = _rolling_p95(t, v, _ROLLING_S)
            ax.plot(g, p95 * 1000, color=color, label=f"{phase} (rolling p95, {_ROLLING_S:.0f} s)")
        bound = slos[tenant].ttft_s if key == "ttft_s" else slos[tenant].tpot_s
        if bound is not None:
            ax.axhline(bound * 1000, color="tab:red", linestyle="--", label="objective")
        if window is not None:
            ax.axvspan(window[0], window[1], color="tab:orange", alpha=0.08, label="surge")
        ax.set_yscale("log")
        ax.set_ylabel(f"{tenant} {label} (ms)")
        ax.legend(fontsize=8, loc="upper left")
    axes[-1, 0].set_xlabel("request arrival (emulated s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _pd_counts(plt: Any, phases: Sequence[PhaseResult], tenants: Sequence[str], path: Path) -> Path:
    fig, (ax_counts, ax_thr) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for phase in phases:
        points = phase.timeline
        if not points:
            continue
        t = np.asarray([p["t_s"] for p in points]) - phase.load_offset_s
        color = _COLORS.get(phase.name)
        ax_counts.step(t, [p["num_prefill"] for p in points], where="post", color=color, label=f"{phase.name} prefill")
        ax_counts.step(t, [p["num_decode"] for p in points], where="post", color=color, linestyle=":",
                       label=f"{phase.name} decode")  # fmt: skip
        for k, tenant in enumerate(tenants):
            values = [p["remote_min_input_tokens"].get(tenant) for p in points]
            y = np.asarray([np.nan if v is None else float(v) for v in values])
            ax_thr.step(t, y, where="post", color=color, linestyle=("-", "--", ":")[k % 3],
                        label=f"{phase.name} {tenant}")  # fmt: skip
    ax_counts.set_ylabel("instances")
    ax_counts.legend(fontsize=8)
    ax_thr.set_ylabel("remote prefill ≥ tokens")
    ax_thr.set_xlabel("emulated s since the load started")
    ax_thr.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cdfs(
    plt: Any, requests: Mapping[str, Sequence[Mapping[str, Any]]], slos: Mapping[str, RequestSloBounds], path: Path
) -> Path:
    tenants = list(slos)
    fig, axes = plt.subplots(2, len(tenants), figsize=(5 * len(tenants), 7), squeeze=False)
    for col, tenant in enumerate(tenants):
        for row, (key, label) in enumerate((("ttft_s", "TTFT"), ("tpot_s", "TPOT"))):
            ax = axes[row, col]
            for phase, reqs in requests.items():
                _, v = _series(reqs, tenant, key)
                if v.size:
                    xs = np.sort(v) * 1000
                    ax.plot(xs, np.arange(1, xs.size + 1) / xs.size, color=_COLORS.get(phase), label=phase)
            bound = slos[tenant].ttft_s if key == "ttft_s" else slos[tenant].tpot_s
            if bound is not None:
                ax.axvline(bound * 1000, color="tab:red", linestyle="--", label="objective")
            ax.set_xscale("log")
            ax.set_xlabel(f"{tenant} {label} (ms)")
            ax.set_ylabel("fraction of requests")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(
    phases: Sequence[PhaseResult],
    requests: Mapping[str, Sequence[Mapping[str, Any]]],
    slos: Mapping[str, RequestSloBounds],
    window: tuple[float, float] | None,
    out_dir: Path,
) -> list[Path]:
    """Write the four plots into ``out_dir``; return their paths."""
    plt = _pyplot()
    return [
        _over_time(plt, requests, slos, "ttft_s", "TTFT", window, out_dir / "ttft_over_time.png"),
        _over_time(plt, requests, slos, "tpot_s", "TPOT", window, out_dir / "tpot_over_time.png"),
        _pd_counts(plt, phases, list(slos), out_dir / "pd_counts_thresholds.png"),
        _cdfs(plt, requests, slos, out_dir / "cdfs.png"),
    ]
