"""Shared plumbing of the benchmarks: spread statistics, machine description, JSON fragments.

Each benchmark module measures with its own method and hands its figures to :func:`write_fragment`, which
writes ``benchmarks/results/raw/<name>.json``; :mod:`summary` merges every fragment into
``benchmarks/results/summary.json`` and ``summary.md`` (run at the end of ``make bench`` by
``benchmarks/conftest.py``, or by hand: ``python benchmarks/summary.py``).

A figure is one measured quantity under one configuration with the spread over its repeats: the samples'
median, quartiles, minimum and maximum, and how many repeats there were.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
RAW = RESULTS / "raw"


def machine() -> dict[str, Any]:
    """What the figures were measured on (the load average says how shared the machine was)."""
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "load_avg_1m": round(load[0], 2),
    }


def spread(samples: Iterable[float]) -> dict[str, float | int]:
    """Median, quartiles, min and max of the samples (one sample per repeat)."""
    values = np.asarray(list(samples), dtype=np.float64)
    if values.size == 0:
        raise ValueError("no samples")
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    return {
        "median": float(median),
        "q1": float(q1),
        "q3": float(q3),
        "min": float(values.min()),
        "max": float(values.max()),
        "n": int(values.size),
    }


def figure(
    metric: str,
    config: str,
    unit: str,
    samples: Sequence[float],
    *,
    repeat: str,
    target: str = "",
    better: str = "higher",
) -> dict[str, Any]:
    """One figure: ``metric`` under ``config`` in ``unit``; ``repeat`` says what one sample is."""
    return {
        "metric": metric,
        "config": config,
        "unit": unit,
        "repeat": repeat,
        "target": target,
        "better": better,
        **spread(samples),
    }


def write_fragment(name: str, title: str, command: str, figures: Sequence[dict[str, Any]], notes: str = "") -> Path:
    """Write ``raw/<name>.json`` (one per benchmark module; a rerun replaces it)."""
    RAW.mkdir(parents=True, exist_ok=True)
    path = RAW / f"{name}.json"
    doc = {
        "name": name,
        "title": title,
        "command": command,
        "run": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "figures": list(figures),
        "notes": notes,
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path
