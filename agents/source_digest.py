"""A digest of the source files that decide a cached result, so a cache entry is never read across a code change."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

__all__ = ["REPO_ROOT", "source_digest"]

REPO_ROOT = Path(__file__).resolve().parents[1]


def source_digest(salt: str, paths: Sequence[str], root: Path = REPO_ROOT) -> str:
    """SHA-256 (16 hex digits) of ``salt`` and every ``*.py`` file under ``paths``, names and bytes, stably ordered.

    ``paths`` are files or folders relative to ``root``.

    Raises:
        FileNotFoundError: a path does not exist (a renamed module must be renamed here too).
    """
    digest = hashlib.sha256(salt.encode())
    files: list[Path] = []
    for rel in paths:
        target = root / rel
        if not target.exists():
            raise FileNotFoundError(f"source_digest: {target} does not exist")
        files.extend(sorted(target.rglob("*.py")) if target.is_dir() else [target])
    for file in files:
        digest.update(file.relative_to(root).as_posix().encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]
