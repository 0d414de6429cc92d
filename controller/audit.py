"""The append-only JSONL audit log: one record per decision."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["AuditLog"]


class AuditLog:
    """Appends one JSON line per record (opened in append mode, flushed per line; never rewritten)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: Mapping[str, Any]) -> None:
        """Write ``record`` as one line."""
        if self.path is None:
            return
        line = json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
