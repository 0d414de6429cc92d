"""Child processes of the demo: started in their own process groups, waited for over HTTP, always stopped.

Every child runs in a new session (so a Ctrl-C in the terminal reaches only the demo, which then stops the
children itself, in reverse start order). Stopping sends SIGTERM to the child's whole process group, waits
``term_timeout_s``, then sends SIGKILL to the group, so no grandchild is left behind either.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = [
    "ChildProcess",
    "ProcessSet",
    "StartupError",
    "free_port",
    "http_get",
    "pdctl_argv",
]


class StartupError(RuntimeError):
    """A child exited or did not become ready in time (the message ends with the tail of its log)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout_s: float = 2.0, headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
    """``(status, body)`` of a GET; status 0 when the server cannot be reached."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, b""


def pdctl_argv(*args: str) -> list[str]:
    """``python -m pdctl ARGS`` with this interpreter (works without the console script on the PATH)."""
    return [sys.executable, "-m", "pdctl", *args]


@dataclass
class ChildProcess:
    """One child process with its log file."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        """Process id (also the process group id), once started."""
        return None if self.proc is None else self.proc.pid

    def start(self) -> None:
        """Start the process in a new session, stdout and stderr to the log file."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        env = {**os.environ, **(self.env or {}), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            list(self.argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=None if self.cwd is None else str(self.cwd),
            start_new_session=True,
        )

    def alive(self) -> bool:
        """Started and not exited."""
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, num_chars: int = 1500) -> str:
        """The end of the log file."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-num_chars:]
        except OSError:
            return ""

    def wait_ready(self, check: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> None:
        """Poll ``check`` until it is true; raise :class:`StartupError` on exit or timeout."""
        deadline = time.monotonic() + timeout_s
        while not check():
            if not self.alive():
                raise StartupError(f"{self.name} exited during startup; log {self.log_path}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise StartupError(
                    f"{self.name} not ready after {timeout_s:.0f} s; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(interval_s)

    def wait(self, timeout_s: float) -> int | None:
        """Wait for a normal exit; the exit status, or ``None`` if still running after ``timeout_s``."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, term_timeout_s: float = 10.0) -> int | None:
        """SIGTERM to the process group, SIGKILL after ``term_timeout_s``; the exit status."""
        if self.proc is None:
            return None
        pgid = self.proc.pid
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=term_timeout_s)
        # the leader may be gone while children of its group live on: kill what is left of the group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=term_timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode


@dataclass
class ProcessSet:
    """Children started by one demo phase, stopped in reverse start order."""

    children: list[ChildProcess] = field(default_factory=list)
    term_timeout_s: float = 10.0

    def start(self, child: ChildProcess) -> ChildProcess:
        """Start ``child`` and remember it."""
        self.children.append(child)
        child.start()
        return child

    def dead(self) -> list[ChildProcess]:
        """Children that exited although nobody stopped them."""
        return [c for c in self.children if c.proc is not None and c.proc.poll() is not None]

    def stop_all(self) -> None:
        """Stop every child (reverse order); safe to call twice."""
        while self.children:
            self.children.pop().stop(self.term_timeout_s)
