"""Where pdctl keeps its local data, and the MLflow tracking URI it uses when none is given: one definition.

``$PDCTL_DATA_DIR`` (default ``./data``) holds the fetched traces, the controller's default lease files and the
embedded MLflow registry, a SQLite file at ``$PDCTL_DATA_DIR/mlflow/mlflow.db``. Every part that talks to MLflow
(training, ``pdctl policy``, the controller's ``registry:`` policies, the demo) resolves its tracking URI with
:func:`tracking_uri`: the URI it was given, else ``MLFLOW_TRACKING_URI``, else that file, so that MLflow's own
default (``./mlflow.db`` in the working directory) is never used.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DATA_DIR_ENV", "TRACKING_URI_ENV", "data_dir", "embedded_tracking_db", "tracking_uri"]

DATA_DIR_ENV = "PDCTL_DATA_DIR"
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"


def data_dir() -> Path:
    """``$PDCTL_DATA_DIR``, else ``data`` (relative to the working directory)."""
    return Path(os.environ.get(DATA_DIR_ENV) or "data")


def embedded_tracking_db() -> Path:
    """The embedded MLflow registry's SQLite file, absolute (it may not exist yet)."""
    return (data_dir() / "mlflow" / "mlflow.db").absolute()


def tracking_uri(explicit: str | None = None) -> str:
    """``explicit``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///`` + :func:`embedded_tracking_db`."""
    if explicit:
        return explicit
    from_env = os.environ.get(TRACKING_URI_ENV)
    if from_env:
        return from_env
    return f"sqlite:///{embedded_tracking_db()}"
