"""Loader of the Azure LLM inference traces 2023 (Splitwise): ``TIMESTAMP,ContextTokens,GeneratedTokens``.

Parsing is vectorised (numpy datetime64 and integer conversion of whole columns); only when that fails is the file
scanned row by row to name the first bad line and column. One hour of the conversation trace (19,366 rows) loads in
a few tens of milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from env.workloads.columns import RequestColumns
from env.workloads.errors import MAX_TOKEN_COUNT, TraceFormatError
from env.workloads.traces._io import read_text

__all__ = ["AZURE_COLUMNS", "load_azure_csv"]

#: The header of both Azure 2023 files.
AZURE_COLUMNS: tuple[str, str, str] = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _first_bad_row(path: Path, rows: list[list[str]]) -> TraceFormatError:
    for i, fields in enumerate(rows):
        line = i + 2  # 1-based, after the header
        try:
            np.datetime64(fields[0].strip().replace(" ", "T"), "ns")
        except ValueError:
            return TraceFormatError(path, f"bad timestamp {fields[0]!r}", line=line, column=AZURE_COLUMNS[0])
        for value, name in zip(fields[1:], AZURE_COLUMNS[1:], strict=True):
            try:
                number = int(value)
            except ValueError:
                return TraceFormatError(path, f"not an integer: {value!r}", line=line, column=name)
            if number < 0:
                return TraceFormatError(path, f"negative token count {number}", line=line, column=name)
            if number > MAX_TOKEN_COUNT:
                return TraceFormatError(path, f"token count {number} is implausibly large", line=line, column=name)
    return TraceFormatError(path, "cannot parse the file")


def load_azure_csv(path: Path) -> RequestColumns:
    """Load an Azure 2023 CSV; arrivals are seconds after the first row, in file order (which must be sorted).

    Raises:
        TraceNotFoundError: the file is missing.
        TraceFormatError: wrong header, wrong field count, bad timestamp or count, or rows out of time order.
    """
    text = read_text(path)
    lines = text.splitlines()
    if not lines:
        raise TraceFormatError(path, "empty file, expected header " + ",".join(AZURE_COLUMNS), line=1)
    header = tuple(name.strip() for name in lines[0].split(","))
    if header != AZURE_COLUMNS:
        raise TraceFormatError(path, f"header is {lines[0]!r}, expected {','.join(AZURE_COLUMNS)!r}", line=1)
    while lines and not lines[-1].strip():
        lines.pop()
    rows = [line.split(",") for line in lines[1:]]
    for i, fields in enumerate(rows):
        if len(fields) != len(AZURE_COLUMNS):
            raise TraceFormatError(path, f"{len(fields)} fields, expected {len(AZURE_COLUMNS)}", line=i + 2)
    if not rows:
        return RequestColumns.empty()
    try:
        stamps = np.array([f[0].replace(" ", "T", 1) for f in rows], dtype="datetime64[ns]")
        inputs: NDArray[np.int64] = np.array([f[1] for f in rows]).astype(np.int64)
        outputs: NDArray[np.int64] = np.array([f[2] for f in rows]).astype(np.int64)
    except (ValueError, OverflowError):
        raise _first_bad_row(path, rows) from None
    if np.isnat(stamps).any():
        line = int(np.flatnonzero(np.isnat(stamps))[0]) + 2
        raise TraceFormatError(path, "missing timestamp", line=line, column=AZURE_COLUMNS[0])
    if ((inputs < 0) | (inputs > MAX_TOKEN_COUNT) | (outputs < 0) | (outputs > MAX_TOKEN_COUNT)).any():
        raise _first_bad_row(path, rows)
    offsets_ns = (stamps - stamps[0]).astype(np.int64)
    if (np.diff(offsets_ns) < 0).any():
        line = int(np.flatnonzero(np.diff(offsets_ns) < 0)[0]) + 3
        raise TraceFormatError(path, "timestamp earlier than the previous row", line=line, column=AZURE_COLUMNS[0])
    return RequestColumns.from_arrays(offsets_ns / 1e9, inputs, outputs, hash_block_tokens=512)
