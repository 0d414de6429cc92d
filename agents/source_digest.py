"""A digest of the source files that decide a cached result, so a cache entry is never read across a code change."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

__all__ = ["REPO_ROOT", "UNRECORDED", "OneSimulator", "source_digest"]

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


UNRECORDED = "unrecorded"
"""The simulator of results written before they recorded one (``simulator_sha256``): they count as one simulator."""


class OneSimulator:
    """The simulator that measured a set of results; a second one is refused (results of two are not compared).

    ``see`` is called with each result's recorded digest (``simulator_sha256``, a digest of the simulator's source;
    empty or missing: :data:`UNRECORDED`) and the file it came from; the first fixes the simulator.
    """

    def __init__(self, verb: str = "measured", holder: str = "column", noun: str = "results") -> None:
        self._verb, self._holder, self._noun = verb, holder, noun
        self._first: tuple[str, str] | None = None  # (simulator, file)

    def see(self, recorded: str | None, path: str) -> None:
        """Note one result's simulator.

        Raises:
            SystemExit: it is not the first result's; one line naming both files and both digests.
        """
        simulator = recorded or UNRECORDED
        if self._first is None:
            self._first = (simulator, path)
        elif simulator != self._first[0]:
            first, where = self._first
            raise SystemExit(
                f"{path}: {self._verb} by simulator {simulator[:12]}, {where} by {first[:12]} (the simulator_sha256 "
                f"{self._holder}); {self._noun} of two simulators are not compared"
            )
