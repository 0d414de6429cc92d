"""Reading the router's JSONL request log (one object per request) into :class:`RequestRecords`.

Accepted fields (all optional except the token counts): ``tenant``, ``route``, ``stream``, ``status``, ``error``,
``input_tokens``, ``output_tokens`` (``expected_output_tokens`` stands in when absent), arrival time as
``arrival_s`` (seconds), ``arrival_ts`` or ``ts`` (Unix seconds, or an ISO-8601 string), ``ttft_s``, ``tpot_s``,
``e2e_s``, ``prefix_hit_tokens`` (or ``cached_tokens``), ``stages`` (``{stage: seconds}``) and ``hash_ids``
(with ``hash_block_tokens``). ``null`` means unknown. Arrival times are made relative to the earliest one.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from env.workloads.errors import MAX_TOKEN_COUNT, TraceFormatError
from env.workloads.traces._io import read_text
from livestack.profiling.records import RequestRecords

__all__ = ["load_router_log"]

_ARRIVAL_FIELDS = ("arrival_s", "arrival_ts", "ts")
_LATENCY_FIELDS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}


def _number(path: Path, line: int, name: str, value: Any, *, allow_none: bool = True) -> float:
    if value is None and allow_none:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise TraceFormatError(path, f"expected a non-negative number, got {value!r}", line=line, column=name)
    return float(value)


def _arrival(path: Path, line: int, row: dict[str, Any]) -> float:
    for name in _ARRIVAL_FIELDS:
        value = row.get(name)
        if value is None:
            continue
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                raise TraceFormatError(path, f"bad time {value!r}", line=line, column=name) from None
        return _number(path, line, name, value)
    return math.nan


def _tokens(path: Path, line: int, row: dict[str, Any], names: tuple[str, ...]) -> int:
    for name in names:
        if row.get(name) is not None:
            value = row[name]
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 <= value <= MAX_TOKEN_COUNT
                or value != int(value)
            ):
                raise TraceFormatError(path, f"expected a token count, got {value!r}", line=line, column=name)
            return int(value)
    raise TraceFormatError(path, "missing field", line=line, column=names[0])


def _parse_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    for line, text in enumerate(read_text(path).splitlines(), start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(path, f"invalid JSON ({exc.msg})", line=line) from None
        if not isinstance(row, dict):
            raise TraceFormatError(path, "line is not a JSON object", line=line)
        rows.append((line, row))
    if not rows:
        raise TraceFormatError(path, "no request records")
    return rows


def load_router_log(path: Path) -> RequestRecords:
    """Load a router JSONL request log.

    Raises:
        TraceNotFoundError: the file is missing.
        TraceFormatError: invalid JSON or a mistyped field (file, line and field named).
    """
    rows = _parse_rows(path)
    n = len(rows)
    inputs = np.empty(n, dtype=np.int64)
    outputs = np.empty(n, dtype=np.int64)
    arrival = np.full(n, math.nan)
    tenants: list[str] = []
    routes: list[str] = []
    stream = np.full(n, math.nan)
    ok = np.ones(n, dtype=np.bool_)
    latency = {key: np.full(n, math.nan) for key in _LATENCY_FIELDS}
    stages: dict[str, np.ndarray] = {}
    hits = np.full(n, math.nan)
    hash_lists: list[list[int]] = []
    block_tokens = 512
    seen = {"tenant": False, "route": False, "stream": False, "status": False, "hits": False}
    for i, (line, row) in enumerate(rows):
        inputs[i] = _tokens(path, line, row, ("input_tokens", "prompt_tokens"))
        outputs[i] = _tokens(path, line, row, ("output_tokens", "expected_output_tokens"))
        arrival[i] = _arrival(path, line, row)
        tenants.append(str(row.get("tenant") or "default"))
        routes.append(str(row.get("route") or "unknown"))
        seen["tenant"] |= row.get("tenant") is not None
        seen["route"] |= row.get("route") is not None
        if row.get("stream") is not None:
            seen["stream"] = True
            stream[i] = 1.0 if row["stream"] else 0.0
        if row.get("status") is not None or row.get("error") is not None:
            seen["status"] = True
            status = row.get("status", 200)
            ok[i] = row.get("error") is None and isinstance(status, int) and 200 <= status < 300
        for key, name in _LATENCY_FIELDS.items():
            latency[key][i] = _number(path, line, name, row.get(name))
        hit = row.get("prefix_hit_tokens", row.get("cached_tokens"))
        if hit is not None:
            seen["hits"] = True
            hits[i] = _number(path, line, "prefix_hit_tokens", hit)
        raw_stages = row.get("stages")
        if isinstance(raw_stages, dict):
            for stage, seconds in raw_stages.items():
                stages.setdefault(str(stage), np.full(n, math.nan))[i] = _number(path, line, f"stages.{stage}", seconds)
        elif raw_stages is not None:
            raise TraceFormatError(path, "expected an object {stage: seconds}", line=line, column="stages")
        ids = row.get("hash_ids")
        if ids is not None and not (
            isinstance(ids, list)
            and all(isinstance(x, int) and not isinstance(x, bool) and abs(x) < 2**63 for x in ids)
        ):
            raise TraceFormatError(path, "expected a list of 64-bit integers", line=line, column="hash_ids")
        hash_lists.append(ids or [])
        if row.get("hash_block_tokens") is not None:
            block_tokens = _tokens(path, line, row, ("hash_block_tokens",))
            if block_tokens == 0:
                raise TraceFormatError(path, "must be positive", line=line, column="hash_block_tokens")
    order = np.argsort(np.where(np.isnan(arrival), np.inf, arrival), kind="stable")
    has_arrivals = bool(np.isfinite(arrival).all())
    counts = np.array([len(h) for h in hash_lists], dtype=np.int64)[order]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    has_hashes = bool(offsets[-1] > 0)
    flat = np.array([x for j in order.tolist() for x in hash_lists[j]], dtype=np.int64) if has_hashes else None
    return RequestRecords(
        input_tokens=inputs[order],
        output_tokens=outputs[order],
        arrival_s=(arrival[order] - np.nanmin(arrival)) if has_arrivals else None,
        tenant=np.array(tenants, dtype=np.str_)[order] if seen["tenant"] else None,
        route=np.array(routes, dtype=np.str_)[order] if seen["route"] else None,
        stream=stream[order] if seen["stream"] else None,
        ok=ok[order] if seen["status"] else None,
        latency_s={k: v[order] for k, v in latency.items() if np.isfinite(v).any()},
        stages_s={k: v[order] for k, v in stages.items()},
        prefix_hit_tokens=hits[order] if seen["hits"] else None,
        hash_ids=flat,
        hash_offsets=offsets if has_hashes else None,
        hash_block_tokens=block_tokens,
    )
