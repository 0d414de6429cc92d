"""Real processes on loopback for controller integration tests: Prometheus and the controller daemon.

Both are started as subprocesses, waited for over HTTP, and always stopped (SIGTERM, then SIGKILL after a
timeout) when the context exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.error import URLError
from urllib.request import urlopen

import yaml
from prometheus_client.parser import text_string_to_metric_families

from pdctl.scrape_config import render_scrape_config

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    try:
        with urlopen(url, timeout=timeout_s) as response:
            return int(response.status), response.read()
    except URLError as exc:
        code = getattr(exc, "code", 0)
        return int(code or 0), b""
    except (ConnectionError, TimeoutError, OSError):
        return 0, b""


async def wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.25, what: str = "condition") -> Any:
    """Poll ``predicate`` (sync or async) until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(interval_s)


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)


@dataclass
class PrometheusServer:
    """A real Prometheus on loopback (``prometheus`` from the PATH), restartable on the same port and TSDB."""

    binary: str
    config_path: Path
    data_dir: Path
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> None:
        assert self.proc is None or self.proc.poll() is not None
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={self.data_dir}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while http_get(f"{self.url}/-/ready")[0] != 200:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("prometheus did not become ready")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)

    def query(self, expression: str) -> list[dict[str, Any]]:
        from urllib.parse import urlencode

        status, body = http_get(f"{self.url}/api/v1/query?{urlencode({'query': expression})}")
        assert status == 200, (status, body)
        result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
        return result


def prometheus_config(
    router_url: str | None, instances: Mapping[str, tuple[str, str]], scrape_interval_s: float = 1.0
) -> dict[str, Any]:
    """The shipped scrape configuration with the router and each instance (``instance_id``, ``group`` labels)."""
    return render_scrape_config(router_url, instances, scrape_interval_s)


@contextlib.contextmanager
def prometheus(
    tmp_path: Path, router_url: str | None, instances: Mapping[str, tuple[str, str]]
) -> Iterator[PrometheusServer]:
    binary = shutil.which("prometheus")
    if binary is None:
        import pytest

        pytest.skip("prometheus is not on the PATH (Debian package `prometheus`)")
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(prometheus_config(router_url, instances)))
    server = PrometheusServer(binary, config_path, tmp_path / "tsdb", free_port(), tmp_path / "prometheus.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class ControllerProcess:
    """``python -m controller --config FILE`` in its own process."""

    config_path: Path
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "controller", "--config", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(REPO_ROOT),
                env=env,
            )
        deadline = time.monotonic() + timeout_s
        while http_get(f"{self.url}/healthz")[0] != 200:
            if self.proc.poll() is not None:
                raise RuntimeError(f"controller exited: {self.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"controller did not become healthy: {self.log_text()[-3000:]}")
            time.sleep(0.1)

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        _stop(self.proc)
        return self.proc.returncode

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, body = http_get(f"{self.url}/metrics")
        assert status == 200
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
        return out

    def metric(self, name: str, **labels: str) -> float | None:
        return self.metrics().get((name, tuple(sorted(labels.items()))))


@contextlib.contextmanager
def controller(config: Mapping[str, Any], tmp_path: Path, name: str = "controller") -> Iterator[ControllerProcess]:
    port = free_port()
    config_path = tmp_path / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump({**config, "listen": {"host": "127.0.0.1", "port": port}}))
    process = ControllerProcess(config_path, port, tmp_path / f"{name}.log")
    process.start()
    try:
        yield process
    finally:
        process.stop()


def controller_once(config_path: Path, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``python -m controller --config config_path`` to its end (a start that is refused), output captured."""
    return subprocess.run(
        [sys.executable, "-m", "controller", "--config", str(config_path)],
        cwd=str(REPO_ROOT),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def audit_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tenant_block(document: Mapping[str, Any], tenant: str) -> Mapping[str, Any]:
    for block in document.get("tenants", []):
        if block.get("name") == tenant:
            found: Mapping[str, Any] = block
            return found
    raise KeyError(tenant)


def remote_min_tokens(document: Mapping[str, Any], tenant: str) -> int | None:
    """``remote_prefill.min_input_tokens`` of a tenant in a policy document (None when not set)."""
    block = tenant_block(document, tenant)
    value = block.get("pd_disaggregation_policy", {}).get("remote_prefill", {}).get("min_input_tokens")
    if value is None:
        value = document.get("pd_disaggregation_policy", {}).get("remote_prefill", {}).get("min_input_tokens")
    return None if value is None else int(value)


def role_map(state: Mapping[str, Any]) -> dict[str, str]:
    """Instance id → role it has or is changing to."""
    return {i["id"]: i.get("pending_role") or i["role"] for i in state.get("instances", [])}


def ids(instances: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(i["id"]) for i in instances]
