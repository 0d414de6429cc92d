"""From a SOURCE argument to a profile: detect the kind of source, load it, profile it.

Kinds: ``azure`` (CSV with the Azure 2023 header), ``mooncake`` (JSONL with ``input_length``/``hash_ids``),
``router`` (JSONL request log with ``input_tokens``), ``servegen`` (folder of ``chunk-*`` files) and
``prometheus`` (``http(s)://`` URL, needs a time range). ``auto`` picks by URL scheme, folder, suffix and, for
JSONL, the fields of the first record.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Literal

from env.workloads.errors import TraceFormatError, TraceNotFoundError
from env.workloads.traces import load_azure_csv, load_mooncake_jsonl, load_servegen_folder
from livestack.profiling.profile import ProfileOptions, WorkloadProfile, profile_records
from livestack.profiling.prometheus import PrometheusSourceError, profile_prometheus
from livestack.profiling.records import RequestRecords
from livestack.profiling.router_log import load_router_log
from livestack.profiling.servegen import profile_servegen

__all__ = ["PER_REQUEST_KINDS", "SourceKind", "detect_source_kind", "load_records", "profile_source"]

SourceKind = Literal["auto", "azure", "mooncake", "router", "servegen", "prometheus"]

#: Kinds with per-request records (the others only have distributions).
PER_REQUEST_KINDS: tuple[SourceKind, ...] = ("azure", "mooncake", "router")
_SOURCE_KIND_NAMES = {"azure": "azure_csv", "mooncake": "mooncake_jsonl", "router": "router_log"}


def _first_record_fields(path: Path) -> set[str]:
    try:
        with path.open(encoding="utf-8-sig") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise TraceFormatError(path, f"invalid JSON ({exc.msg})", line=number) from None
                    if not isinstance(row, dict):
                        raise TraceFormatError(path, "line is not a JSON object", line=number)
                    return set(row)
    except FileNotFoundError:
        raise TraceNotFoundError(path) from None
    except UnicodeDecodeError:
        raise TraceFormatError(path, "not UTF-8 text") from None
    raise TraceFormatError(path, "empty file")


def detect_source_kind(source: str) -> SourceKind:
    """Guess the kind of a SOURCE argument.

    Raises:
        TraceNotFoundError: a path that does not exist.
        TraceFormatError: a file whose kind cannot be told.
    """
    if source.startswith(("http://", "https://")):
        return "prometheus"
    path = Path(source)
    if path.is_dir():
        return "servegen"
    if not path.exists():
        raise TraceNotFoundError(path)
    if path.suffix.lower() == ".csv":
        return "azure"
    fields = _first_record_fields(path)
    if "input_length" in fields:
        return "mooncake"
    if "input_tokens" in fields or "prompt_tokens" in fields:
        return "router"
    raise TraceFormatError(
        path, "cannot tell the kind: expected a Mooncake trace (input_length) or a router log (input_tokens)", line=1
    )


def load_records(source: str, kind: SourceKind = "auto") -> tuple[RequestRecords, SourceKind]:
    """Per-request records of a trace file or router log, with the kind that was read.

    Raises:
        TraceNotFoundError, TraceFormatError: a missing or malformed file, or a source without per-request
            records (ServeGen folder, Prometheus).
    """
    if kind == "auto":
        kind = detect_source_kind(source)
    path = Path(source)
    if kind not in PER_REQUEST_KINDS:
        raise TraceFormatError(path, f"a {kind} source has distributions, not per-request records")
    if kind == "router":
        return load_router_log(path), kind
    columns = load_azure_csv(path) if kind == "azure" else load_mooncake_jsonl(path)
    return RequestRecords.from_columns(columns), kind


def profile_source(
    source: str,
    *,
    kind: SourceKind = "auto",
    options: ProfileOptions | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
) -> WorkloadProfile:
    """Load and profile one source.

    Raises:
        TraceNotFoundError, TraceFormatError: a missing, malformed or empty file (one-line message).
        PrometheusSourceError: Prometheus unreachable, failing or empty, or the time range missing.
    """
    options = options or ProfileOptions()
    if kind == "auto":
        kind = detect_source_kind(source)
    if kind == "prometheus":
        if start is None or end is None:
            raise PrometheusSourceError(f"{source}: a Prometheus source needs --start and --end")
        return profile_prometheus(source, start, end, options=options)
    if kind == "servegen":
        profile = profile_servegen(load_servegen_folder(Path(source)), source=source, options=options)
    else:
        records, kind = load_records(source, kind)
        profile = profile_records(records, source=source, source_kind=_SOURCE_KIND_NAMES[kind], options=options)
    if profile.num_requests <= 0:
        raise TraceFormatError(Path(source), "no requests to profile")
    return profile
