"""The override directory watcher: valid files take effect, invalid ones are refused and reported.

Polled at the start of every tick, so a file takes effect within one interval. Files ending in ``.yaml``,
``.yml`` or ``.json`` are read (hidden files and editor backups are skipped; write a file elsewhere and
rename it into place). A file is re-read when its modification time, size or content changes. An invalid
file is refused with its reason; if an earlier version of the same file was valid, that version stays in
effect (the running state never changes because of an invalid file). A removed file stops applying.
Loading, refusing, removing and expiring (given the tick's time) are logged (``pdctl.controller.overrides``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from policies.overrides import Override, load_override
from policies.policy_file import PolicyFileError, ResolvedPolicy

__all__ = ["OverridePoll", "OverrideWatcher"]

_SUFFIXES = (".yaml", ".yml", ".json")
_log = logging.getLogger("pdctl.controller.overrides")


@dataclass(frozen=True, slots=True)
class OverridePoll:
    """What the directory holds after one poll.

    Attributes:
        overrides: valid overrides by file name (expired ones included; the merge ignores them).
        refused: file name → reason, for files currently refused.
        newly_refused: files refused in this poll (for counting and logging once).
    """

    overrides: tuple[Override, ...] = ()
    refused: Mapping[str, str] = field(default_factory=dict)
    newly_refused: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Seen:
    signature: tuple[int, int, str]
    override: Override | None
    reason: str | None


class OverrideWatcher:
    """Reads the override directory; remembers each file's last valid version."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._seen: dict[str, _Seen] = {}
        self._base_key: int | None = None
        self._expired: set[str] = set()  # files whose expiry was logged (until they change or go)

    def _files(self) -> list[Path]:
        if self.directory is None or not self.directory.is_dir():
            return []
        return sorted(
            p
            for p in self.directory.iterdir()
            if p.is_file() and p.suffix in _SUFFIXES and not p.name.startswith(".") and not p.name.endswith("~")
        )

    def poll(self, base: ResolvedPolicy, base_generation: int, now: datetime | None = None) -> OverridePoll:
        """Read new or changed files; resolve everything again when the base policy changed.

        With ``now`` (timezone-aware), an override that has expired by then is logged once (it stops applying;
        the file stays until removed).
        """
        if base_generation != self._base_key:
            self._seen.clear()
            self._base_key = base_generation
        present: set[str] = set()
        newly_refused: list[str] = []
        for path in self._files():
            present.add(path.name)
            try:
                stat = path.stat()
                data = path.read_bytes()
            except OSError as exc:
                _log.warning("override %s: cannot read: %s", path, exc)
                continue
            signature = (stat.st_mtime_ns, stat.st_size, hashlib.sha256(data).hexdigest())
            previous = self._seen.get(path.name)
            if previous is not None and previous.signature == signature:
                continue
            try:
                override = load_override(data.decode("utf-8"), path.name, base, str(path))
            except (PolicyFileError, UnicodeDecodeError) as exc:
                reason = "; ".join(str(exc).splitlines())
                kept = previous.override if previous is not None else None
                self._seen[path.name] = _Seen(signature, kept, reason)
                newly_refused.append(path.name)
                _log.warning("override %s refused: %s", path, reason)
                continue
            self._seen[path.name] = _Seen(signature, override, None)
            self._expired.discard(path.name)
            _log.info(
                "override %s loaded: tenants %s, expires %s", path, ",".join(override.tenants), override.expires_at
            )
        for name in set(self._seen) - present:
            del self._seen[name]
            self._expired.discard(name)
            _log.info("override %s removed", name)
        if now is not None:
            self._log_expired(now)
        overrides = tuple(s.override for _, s in sorted(self._seen.items()) if s.override is not None)
        refused = {name: s.reason for name, s in sorted(self._seen.items()) if s.reason is not None}
        return OverridePoll(overrides, refused, tuple(newly_refused))

    def _log_expired(self, now: datetime) -> None:
        for name, seen in sorted(self._seen.items()):
            override = seen.override
            if override is None or override.is_active(now) or name in self._expired:
                continue
            self._expired.add(name)
            _log.info(
                "override %s expired at %s: tenants %s are back to the running policy (remove the file to tidy up)",
                name, override.expires_at, ",".join(override.tenants),
            )  # fmt: skip
