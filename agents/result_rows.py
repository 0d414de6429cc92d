"""The rows of ``pdctl evaluate`` results files, read back by scripts that compare them with this checkout's runs."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

from agents.evaluate import ALL_TENANTS, simulator_digest

__all__ = ["read_rows"]


def read_rows(paths: list[Path]) -> dict[str, dict[str, tuple[float, float]]]:
    """Scenario → policy → (weighted goodput, offered weighted load), req/s: the ``ALL`` rows at rate 1.0.

    Refuses, in one line, rows of a simulator other than this checkout's (``simulator_sha256``).
    """
    here = simulator_digest()
    out: dict[str, dict[str, tuple[float, float]]] = defaultdict(dict)
    for path in paths:
        with path.open(newline="") as handle:
            for row in csv.DictReader(handle):
                if row["tenant"] != ALL_TENANTS or float(row.get("rate_scale") or 1.0) != 1.0:
                    continue
                measured_by = row.get("simulator_sha256") or "unrecorded"
                if measured_by != here:
                    raise SystemExit(
                        f"{path}: measured by simulator {measured_by[:12]}, this checkout's is {here[:12]} "
                        "(the simulator_sha256 column); re-run the rules on this simulator"
                    )
                offered = float(row.get("offered_weighted_rps_mean") or "nan")
                out[row["scenario"]][row["policy"]] = (float(row["weighted_goodput_rps_mean"]), offered)
    return out
