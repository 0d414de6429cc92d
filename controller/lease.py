"""One writer: a controller that actuates holds a lease file, and a second one is refused.

An active controller with a router or Kubernetes actuator takes an exclusive, non-blocking ``flock`` on its
lease file before it starts and keeps it for its whole life; the kernel releases it when the process ends,
however it ends, so a lease never outlives its holder and needs no expiry. A second controller for the same
targets finds the lock taken and stops with one line naming the holder (pid, host, since when) and a
non-zero exit. The file holds that description, for people and for the refusal message.

The default path is ``$PDCTL_DATA_DIR/controller-<hash of the actuated targets>.lease`` (``./data`` without
the variable): two controllers for the same router URLs or Kubernetes API and namespace share it; controllers
for different stacks do not collide. ``lease_file`` in the config overrides it. The fence is host-local
(``flock`` on a local filesystem); controllers on different hosts need a shared lock service (a Kubernetes
``Lease``), which this module does not provide. Advisory mode never actuates and takes no lease. The router's
compare-and-set on the admin ``generation`` (``docs/admin-api.md``) is the second line: a write computed from a
state another writer has since changed is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import time
from pathlib import Path

from controller.config import ControllerConfig, DryRunActuatorConfig, KubernetesActuatorConfig, RouterActuatorConfig
from policies.data_dir import data_dir

__all__ = ["Lease", "LeaseHeldError", "lease_path"]


class LeaseHeldError(RuntimeError):
    """Another live controller holds the lease (the message is one line naming it)."""


def _targets(config: ControllerConfig) -> list[str]:
    out: list[str] = []
    for actuator in config.actuators:
        if isinstance(actuator, RouterActuatorConfig):
            out.append(f"router {actuator.url.rstrip('/')}")
        elif isinstance(actuator, KubernetesActuatorConfig):
            out.append(f"kubernetes {actuator.api_url.rstrip('/')} {actuator.namespace}")
        elif not isinstance(actuator, DryRunActuatorConfig):  # pragma: no cover - the config has three kinds
            out.append(repr(actuator))
    return sorted(out)


def lease_path(config: ControllerConfig) -> Path | None:
    """The lease file ``config`` needs (``None``: it writes nothing: advisory, or only the dry-run actuator)."""
    targets = _targets(config)
    if config.mode != "active" or not targets:
        return None
    if config.lease_file is not None:
        return config.lease_file
    digest = hashlib.sha256("\n".join(targets).encode()).hexdigest()[:12]
    return data_dir() / f"controller-{digest}.lease"


class Lease:
    """An exclusive ``flock`` on ``path``, held from :meth:`acquire` until :meth:`release` or process exit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this process holds the lease."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lease or refuse.

        Raises:
            LeaseHeldError: another process holds it (one line: the path and the holder).
        """
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            os.close(fd)
            raise LeaseHeldError(
                f"another controller holds the lease {self.path} ({_describe(holder)}); refusing to start a second "
                f"writer (stop it first, or point lease_file elsewhere for a different stack)"
            ) from None
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode() + b"\n", 0)
        self._fd = fd

    def release(self) -> None:
        """Give the lease back (also done by the kernel when the process ends)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def _describe(holder: str) -> str:
    try:
        record = json.loads(holder)
        return f"pid {record['pid']} on {record['host']} since {record['since']}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"
