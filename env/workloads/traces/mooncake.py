"""Loader of the Mooncake FAST'25 JSONL traces: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``.

The whole file is decoded by one :func:`json.loads` call (lines joined into a JSON array, one element per line so
that decoder errors keep their line numbers); fields are then gathered into numpy arrays, with the prefix-block
hashes flattened into a CSR layout. The conversation trace (12,031 rows, 288,500 blocks) loads in well under 0.1 s.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from env.workloads.columns import RequestColumns
from env.workloads.errors import MAX_TOKEN_COUNT, TraceFormatError
from env.workloads.traces._io import read_text

__all__ = ["MOONCAKE_FIELDS", "load_mooncake_jsonl"]

#: Fields every row must carry (``hash_ids`` may be absent when ``keep_hash_ids`` is false).
MOONCAKE_FIELDS: tuple[str, ...] = ("timestamp", "input_length", "output_length", "hash_ids")
_INT64 = 2**63


def _decode(path: Path, lines: list[str], numbers: list[int]) -> list[Any]:
    try:
        rows = json.loads("[" + ",\n".join(lines) + "]")
    except json.JSONDecodeError as exc:
        # Line k of the joined text is data line k (the "[" sits on line 1 before data line 1).
        index = min(max(exc.lineno - 1, 0), len(lines) - 1)
        raise TraceFormatError(path, f"invalid JSON ({exc.msg})", line=numbers[index]) from None
    if not isinstance(rows, list):  # pragma: no cover - the join always builds an array
        raise TraceFormatError(path, "invalid JSON")
    return rows


def _column(path: Path, rows: list[Any], numbers: list[int], field: str) -> list[Any]:
    try:
        return [row[field] for row in rows]
    except (KeyError, TypeError):
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise TraceFormatError(path, "line is not a JSON object", line=numbers[i]) from None
            if field not in row:
                raise TraceFormatError(path, "missing field", line=numbers[i], column=field) from None
        raise  # pragma: no cover - unreachable: one of the rows above failed


def _numbers(path: Path, values: list[Any], numbers: list[int], field: str, *, integer: bool) -> np.ndarray:
    bad = next(
        (
            i
            for i, v in enumerate(values)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf
        ),
        None,
    )
    if bad is None and integer:
        bad = next((i for i, v in enumerate(values) if v > MAX_TOKEN_COUNT or not float(v).is_integer()), None)
    if bad is not None:
        raise TraceFormatError(
            path,
            f"expected a non-negative {'token count' if integer else 'number'}, got {values[bad]!r}",
            line=numbers[bad],
            column=field,
        )
    return np.array(values, dtype=np.int64 if integer else np.float64)


def load_mooncake_jsonl(path: Path, *, keep_hash_ids: bool = True, hash_block_tokens: int = 512) -> RequestColumns:
    """Load a Mooncake JSONL trace; arrivals are seconds after the first row (rows must be sorted by time).

    Args:
        path: the JSONL file.
        keep_hash_ids: keep the prefix-block hashes (else every row gets none and the field may be absent).
        hash_block_tokens: tokens per hash block (512 in the published traces).

    Raises:
        TraceNotFoundError: the file is missing.
        TraceFormatError: invalid JSON, a missing or mistyped field, a hash list of the wrong length
            (``len(hash_ids)`` must be ``ceil(input_length / hash_block_tokens)``), or rows out of time order.
    """
    text = read_text(path)
    numbers: list[int] = []
    lines: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            lines.append(line)
            numbers.append(number)
    if not lines:
        return RequestColumns.empty(hash_block_tokens=hash_block_tokens)
    rows = _decode(path, lines, numbers)
    stamps_ms = _numbers(path, _column(path, rows, numbers, "timestamp"), numbers, "timestamp", integer=False)
    inputs = _numbers(path, _column(path, rows, numbers, "input_length"), numbers, "input_length", integer=True)
    outputs = _numbers(path, _column(path, rows, numbers, "output_length"), numbers, "output_length", integer=True)
    if (np.diff(stamps_ms) < 0).any():
        i = int(np.flatnonzero(np.diff(stamps_ms) < 0)[0]) + 1
        raise TraceFormatError(path, "timestamp earlier than the previous row", line=numbers[i], column="timestamp")
    arrival_s = (stamps_ms - stamps_ms[0]) / 1000.0
    if not keep_hash_ids:
        return RequestColumns.from_arrays(arrival_s, inputs, outputs, hash_block_tokens=hash_block_tokens)
    hashes = _column(path, rows, numbers, "hash_ids")
    try:
        counts = np.fromiter((len(h) for h in hashes), dtype=np.int64, count=len(hashes))
        offsets = np.zeros(len(hashes) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        flat = np.fromiter(itertools.chain.from_iterable(hashes), dtype=np.int64, count=int(offsets[-1]))
    except (TypeError, ValueError, OverflowError):
        for i, h in enumerate(hashes):
            if not isinstance(h, list) or not all(
                isinstance(x, int) and not isinstance(x, bool) and -_INT64 <= x < _INT64 for x in h
            ):
                raise TraceFormatError(
                    path, "expected a list of 64-bit integers", line=numbers[i], column="hash_ids"
                ) from None
        raise  # pragma: no cover - unreachable: one of the rows above failed
    expected = -(-inputs // hash_block_tokens)
    wrong = np.flatnonzero(counts != expected)
    if len(wrong):
        i = int(wrong[0])
        raise TraceFormatError(
            path,
            f"{counts[i]} hash ids for {inputs[i]} input tokens, expected "
            f"{math.ceil(inputs[i] / hash_block_tokens)} ({hash_block_tokens}-token blocks)",
            line=numbers[i],
            column="hash_ids",
        )
    return RequestColumns.from_arrays(
        arrival_s, inputs, outputs, hash_ids=flat, hash_offsets=offsets, hash_block_tokens=hash_block_tokens
    )
