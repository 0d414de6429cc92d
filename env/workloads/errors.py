"""Errors raised by workload sources; each renders as one line naming the file and, where known, line and column."""

from __future__ import annotations

from pathlib import Path

from env.workloads.trace_catalog import fetch_hint

__all__ = ["MAX_TOKEN_COUNT", "TraceFormatError", "TraceNotFoundError", "WorkloadError"]

#: Largest token count a trace may state; anything above is taken as a malformed value.
MAX_TOKEN_COUNT = 1_000_000_000


class WorkloadError(Exception):
    """Base class of workload errors; ``str(error)`` is one line fit for a terminal."""


class TraceNotFoundError(WorkloadError):
    """A trace file or folder does not exist or cannot be read."""

    def __init__(self, path: Path | str, problem: str = "no such file or folder") -> None:
        self.path = Path(path)
        self.problem = problem
        hint = fetch_hint(self.path)
        super().__init__(f"{self.path}: {problem}" + (f"; {hint}" if hint else ""))


class TraceFormatError(WorkloadError):
    """A trace file is malformed.

    Attributes:
        path: the file.
        problem: what is wrong, one phrase.
        line: 1-based line number in the file, when known.
        column: column or field name, when known.
    """

    def __init__(self, path: Path | str, problem: str, *, line: int | None = None, column: str | None = None) -> None:
        self.path = Path(path)
        self.problem = problem
        self.line = line
        self.column = column
        where = f"{self.path}"
        if line is not None:
            where += f":{line}"
        if column is not None:
            where += f": column {column!r}"
        super().__init__(f"{where}: {problem}")
