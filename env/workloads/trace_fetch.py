"""Download the catalogue's traces, verify each file's SHA-256, and store them without half-written files.

Each file is streamed into a temporary file in the destination folder, hashed on the way, and moved into place
(``os.replace``) only when its sum matches; on any failure the temporary file is removed and nothing else is
touched. A file already present with the right sum is not downloaded again. ``base_url`` replaces the upstream
location (``{base_url}/{relative_path}``), for a mirror or for tests against a server on loopback.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from env.workloads.trace_catalog import CATALOG, TraceFile

__all__ = ["FetchResult", "TraceFetchError", "fetch_traces", "file_sha256", "resolve_names"]

_CHUNK_BYTES = 1 << 16
_TIMEOUT_S = 60.0

ProgressCallback = Callable[[TraceFile, int, int | None], None]
"""Called as bytes arrive: ``(file, bytes_so_far, total_bytes or None)``."""


class TraceFetchError(Exception):
    """A trace could not be fetched or verified; ``str(error)`` is one line naming the file and the problem."""


@dataclass(frozen=True, slots=True)
class FetchResult:
    """What happened to one file: ``downloaded`` or ``present`` (already there with the right sum)."""

    file: TraceFile
    path: Path
    outcome: str


def resolve_names(names: Iterable[str]) -> list[str]:
    """The trace names to fetch: all of them when ``names`` is empty.

    Raises:
        TraceFetchError: a name is not in the catalogue (the message lists the known names).
    """
    wanted = list(names) or sorted(CATALOG)
    unknown = [n for n in wanted if n not in CATALOG]
    if unknown:
        raise TraceFetchError(f"unknown trace {unknown[0]!r}; known traces: {', '.join(sorted(CATALOG))}")
    return list(dict.fromkeys(wanted))


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's content."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_traces(
    names: Iterable[str],
    dest: Path,
    *,
    base_url: str | None = None,
    on_progress: ProgressCallback | None = None,
    timeout_s: float = _TIMEOUT_S,
) -> list[FetchResult]:
    """Fetch and verify every file of the named traces (all of them when ``names`` is empty) into ``dest``.

    Args:
        names: trace names from :data:`env.workloads.trace_catalog.CATALOG`.
        dest: the trace folder; files land at ``dest/<relative_path>``.
        base_url: a mirror to read ``{base_url}/{relative_path}`` from instead of the pinned upstream URLs.
        on_progress: called as bytes arrive, for a progress bar.
        timeout_s: socket timeout of each request.

    Raises:
        TraceFetchError: an unknown name, an unreachable host or HTTP error, or a checksum mismatch; the message
            names the trace file and the URL. Files completed before the failure stay (they are verified).
    """
    results: list[FetchResult] = []
    for name in resolve_names(names):
        for file in CATALOG[name].files():
            target = dest / file.relative_path
            if target.is_file() and file_sha256(target) == file.sha256:
                results.append(FetchResult(file, target, "present"))
                continue
            url = f"{base_url.rstrip('/')}/{file.relative_path}" if base_url else file.url
            _download_verified(file, url, target, on_progress, timeout_s)
            results.append(FetchResult(file, target, "downloaded"))
    return results


def _download_verified(
    file: TraceFile, url: str, target: Path, on_progress: ProgressCallback | None, timeout_s: float
) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    temp = Path(temp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(handle, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout_s) as response:
                    length = response.headers.get("Content-Length")
                    total = int(length) if length and length.isdigit() else None
                    done = 0
                    for chunk in iter(lambda: response.read(_CHUNK_BYTES), b""):
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        if on_progress is not None:
                            on_progress(file, done, total)
            except urllib.error.HTTPError as exc:
                raise TraceFetchError(f"{file.relative_path}: {url}: HTTP {exc.code} {exc.reason}") from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", None) or exc
                raise TraceFetchError(f"{file.relative_path}: {url}: cannot be reached ({reason})") from None
        got = digest.hexdigest()
        if got != file.sha256:
            raise TraceFetchError(
                f"{file.relative_path}: checksum mismatch (expected sha256 {file.sha256}, got {got}) from {url}; "
                "nothing was stored"
            )
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)
