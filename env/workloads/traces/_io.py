"""Shared file reading for the trace loaders: one read, clear errors."""

from __future__ import annotations

from pathlib import Path

from env.workloads.errors import TraceFormatError, TraceNotFoundError

__all__ = ["read_text"]


def read_text(path: Path) -> str:
    """Return a text file's content (UTF-8, BOM stripped).

    Raises:
        TraceNotFoundError: the file is missing or unreadable.
        TraceFormatError: the file is not UTF-8 text.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceNotFoundError(path) from None
    except IsADirectoryError:
        raise TraceNotFoundError(path, "is a folder, expected a file") from None
    except OSError as exc:
        raise TraceNotFoundError(path, exc.strerror or "cannot be read") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TraceFormatError(path, "not UTF-8 text", line=line) from None
