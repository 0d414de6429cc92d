"""Reading one integer column of a CSV (with header) or a field of a JSONL file, for empirical distributions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from env.workloads.errors import TraceFormatError
from env.workloads.traces._io import read_text

__all__ = ["read_int_column"]


def _csv_column(path: Path, text: str, column: str) -> NDArray[np.int64]:
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise TraceFormatError(path, "empty file", line=1)
    header = [name.strip() for name in lines[0].split(",")]
    if column not in header:
        raise TraceFormatError(path, f"no such column (header: {','.join(header)})", line=1, column=column)
    index = header.index(column)
    cells: list[str] = []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split(",")
        if len(fields) != len(header):
            raise TraceFormatError(path, f"{len(fields)} fields, expected {len(header)}", line=number)
        cells.append(fields[index].strip())
    try:
        return np.array(cells).astype(np.int64) if cells else np.zeros(0, dtype=np.int64)
    except ValueError:
        for number, cell in enumerate(cells, start=2):
            if not cell.lstrip("-").isdigit():
                raise TraceFormatError(path, f"not an integer: {cell!r}", line=number, column=column) from None
        raise  # pragma: no cover - unreachable: one cell above failed


def _jsonl_field(path: Path, text: str, field: str) -> NDArray[np.int64]:
    values: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(path, f"invalid JSON ({exc.msg})", line=number) from None
        if not isinstance(row, dict) or field not in row:
            raise TraceFormatError(path, "missing field", line=number, column=field)
        value = row[field]
        if isinstance(value, bool) or not isinstance(value, int | float) or not float(value).is_integer():
            raise TraceFormatError(path, f"not an integer: {value!r}", line=number, column=field)
        values.append(int(value))
    return np.array(values, dtype=np.int64)


def read_int_column(path: Path, column: str) -> NDArray[np.int64]:
    """Return the integer values of ``column``: a CSV header name, or a JSONL field when the file ends in ``.jsonl``.

    Raises:
        TraceNotFoundError: the file is missing.
        TraceFormatError: no such column, or a value that is not an integer (with its line).
    """
    text = read_text(path)
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        return _jsonl_field(path, text, column)
    return _csv_column(path, text, column)
