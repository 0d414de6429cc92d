"""MLflow tracking for training runs: an SB3 logger writer, run naming and provenance.

Every run logs the resolved experiment config, the git commit, the schema version and feature-table hash, the
hyperparameters, the training curves (stable-baselines3's logger → :class:`MlflowWriter`), and the evaluation
tables and plots as artifacts. Run names follow ``{experiment}__{algo}__seed{seed}__{utc_ts}``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mlflow
from stable_baselines3.common.logger import KVWriter

from policies.action_codec import ActionCodec
from policies.features import ObservationLayout, feature_table_hash
from policies.schema import SCHEMA_VERSION

__all__ = ["MlflowWriter", "git_commit", "provenance_tags", "run_name"]


class MlflowWriter(KVWriter):
    """Writes SB3 logger records (``rollout/``, ``train/``, ``time/``, ``eval/`` …) as MLflow metrics."""

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
        """Log every numeric, non-excluded value at ``step``."""
        metrics: dict[str, float] = {}
        for key, value in sorted(key_values.items()):
            excluded = key_excluded.get(key)
            if excluded is not None and "mlflow" in excluded:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            metrics[key] = float(value)
        if metrics:
            mlflow.log_metrics(metrics, step=step)

    def close(self) -> None:
        """Nothing to release (MLflow owns the run)."""


def git_commit(cwd: str | Path | None = None) -> str | None:
    """The current commit, with ``-dirty`` when the tree has changes; ``None`` outside a checkout."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}-dirty" if dirty else sha


def run_name(experiment: str, algo: str, seed: int, now: datetime | None = None) -> str:
    """``{experiment}__{algo}__seed{seed}__{utc_ts}``."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"{experiment}__{algo}__seed{seed}__{stamp}"


def provenance_tags(layout: ObservationLayout, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Tags every training run carries: code version and the contract the policy was trained against."""
    tags = {
        "pdctl.schema_version": str(SCHEMA_VERSION),
        "pdctl.feature_hash": feature_table_hash(),
        "pdctl.codec_hash": ActionCodec(layout).codec_hash(),
        "pdctl.layout": f"{layout.max_groups}x{layout.max_tenants}",
    }
    commit = git_commit()
    if commit is not None:
        tags["pdctl.git_commit"] = commit
    tags.update(extra or {})
    return tags
