"""Shared fixtures."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"


@pytest.fixture(autouse=True)
def _logging_left_as_found() -> Iterator[None]:
    """Undo what a command run in-process (``typer.testing.CliRunner``) leaves in the process's logging.

    ``pdctl controller`` configures logging for its process (``controller.logs.configure_logging``): handlers on the
    root and tick loggers that write to the CLI runner's captured streams, closed once the command returns, and the
    root level set to INFO. Left in place, every later INFO line of any test fails to write and prints a traceback
    (a full run once printed 446). After each test, handlers on a closed stream are removed and the root level, the
    tick logger's handlers and its propagation are restored; pytest's own capture handlers are left to pytest.
    """
    from controller.logs import TICK_LOGGER

    root, ticks = logging.getLogger(), logging.getLogger(TICK_LOGGER)
    root_level, tick_handlers, tick_propagate = root.level, list(ticks.handlers), ticks.propagate
    yield
    for handler in list(root.handlers):
        if getattr(getattr(handler, "stream", None), "closed", False):
            root.removeHandler(handler)
    root.setLevel(root_level)
    ticks.handlers[:] = tick_handlers
    ticks.propagate = tick_propagate


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def traces_dir() -> Path:
    path = Path(os.environ["PDCTL_TRACES"]) if os.environ.get("PDCTL_TRACES") else SHARED / "traces"
    if not path.is_dir():
        pytest.skip(f"shared traces folder {path} is absent")
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def mlflow_server_running(root: Path) -> Iterator[str]:
    """A real MLflow tracking server on 127.0.0.1 (SQLite backend under ``root``), stopped on exit; yields its URL.

    The test packages that use one start it in a package-scoped ``mlflow_server`` fixture of their own
    (``tests/agents/conftest.py``, ``tests/controller/conftest.py``), so that it is not left running, with its job
    workers, behind the live tests that follow: those measure latency in real time on the same cores.
    """
    port = _free_port()
    log = (root / "server.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
