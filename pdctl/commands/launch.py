"""``pdctl launch``: start real vLLM prefill/decode instances with NixlConnector and write a router configuration.

Every instance runs ``vllm serve`` with ``--kv-transfer-config {"kv_connector": "NixlConnector", "kv_role": ...}``
(``kv_both`` by default, so the router can change roles live), its own HTTP port and its own NIXL side-channel
port. ``--prefill-gpus 0 --decode-gpus 1,2+3`` means one prefill instance on GPU 0, one decode instance on GPU 1
and one on GPUs 2 and 3 (tensor parallel 2). ``--dry-run`` prints the commands instead of running them
(see ``docs/real-vllm.md``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import typer
import yaml

__all__ = ["LaunchSpec", "register", "vllm_commands"]


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """One vLLM instance to start."""

    instance_id: str
    role: str
    port: int
    env: dict[str, str]
    argv: list[str]

    @property
    def url_host(self) -> str:
        """Host part of the instance's URL."""
        host = self.argv[self.argv.index("--host") + 1]
        return "127.0.0.1" if host in ("0.0.0.0", "") else host

    def shell(self) -> str:
        """The command as one shell line."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return f"{env} {shlex.join(self.argv)}"


def _gpu_groups(text: str) -> list[list[str]]:
    return [[g.strip() for g in group.split("+") if g.strip()] for group in text.split(",") if group.strip()]


def vllm_commands(
    model: str,
    prefill_gpus: str,
    decode_gpus: str,
    host: str = "127.0.0.1",
    prefill_port: int = 8100,
    decode_port: int = 8200,
    side_channel_port: int = 5600,
    side_channel_host: str | None = None,
    kv_role: str = "kv_both",
    extra_args: str = "",
) -> list[LaunchSpec]:
    """The ``vllm serve`` command of every instance."""
    kv_config = json.dumps(
        {"kv_connector": "NixlConnector", "kv_role": kv_role, "kv_connector_extra_config": {"kv_lease_duration": 30}},
        separators=(",", ":"),
    )
    specs: list[LaunchSpec] = []
    channel = side_channel_port
    for role, gpus_text, first_port, prefix in (
        ("prefill", prefill_gpus, prefill_port, "p"),
        ("decode", decode_gpus, decode_port, "d"),
    ):
        wanted_role = kv_role
        if kv_role == "explicit":
            wanted_role = "kv_producer" if role == "prefill" else "kv_consumer"
        config = kv_config.replace('"kv_role":"explicit"', f'"kv_role":"{wanted_role}"')
        for k, gpus in enumerate(_gpu_groups(gpus_text)):
            env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus), "UCX_NET_DEVICES": "all"}
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(channel)
            if side_channel_host:
                env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = side_channel_host
            argv = ["vllm", "serve", model, "--host", host, "--port", str(first_port + k)]
            argv += ["--served-model-name", model, "--tensor-parallel-size", str(len(gpus))]
            argv += ["--kv-transfer-config", config, *shlex.split(extra_args)]
            specs.append(LaunchSpec(f"{prefix}{k}", role, first_port + k, env, argv))
            channel += 1
    return specs


def router_config(specs: list[LaunchSpec], listen_port: int = 8000) -> dict[str, object]:
    """A router configuration naming the launched instances with their roles."""
    return {
        "listen": {"host": "127.0.0.1", "port": listen_port},
        "instances": [{"id": s.instance_id, "url": f"http://{s.url_host}:{s.port}", "role": s.role} for s in specs],
    }


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _run(specs: list[LaunchSpec], ready_timeout_s: float) -> None:
    if shutil.which("vllm") is None:
        typer.echo("vllm is not on the PATH: pip install 'pdctl[vllm]' (and nixl), or use --dry-run", err=True)
        raise typer.Exit(code=2)
    procs = [subprocess.Popen(s.argv, env={**os.environ, **s.env}) for s in specs]
    try:
        deadline = time.monotonic() + ready_timeout_s
        pending = {s.instance_id: f"http://{s.url_host}:{s.port}" for s in specs}
        while pending and time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                raise typer.Exit(code=1)
            pending = {i: u for i, u in pending.items() if not _healthy(u)}
            time.sleep(2)
        if pending:
            typer.echo(f"not healthy after {ready_timeout_s:.0f} s: {sorted(pending)}", err=True)
            raise typer.Exit(code=1)
        typer.echo("all instances healthy; Ctrl-C stops them")
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Add the ``launch`` command to ``app``."""

    @app.command(name=name, help=help_text)
    def launch(
        model: str = typer.Option(..., help="Model to serve (Hugging Face id or path)."),
        prefill_gpus: str = typer.Option("0", help="Prefill instances: comma-separated GPU groups, e.g. 0,1 or 0+1."),
        decode_gpus: str = typer.Option("1", help="Decode instances: comma-separated GPU groups."),
        host: str = typer.Option("127.0.0.1", help="HTTP bind address of the instances."),
        prefill_port: int = typer.Option(8100, help="Port of the first prefill instance."),
        decode_port: int = typer.Option(8200, help="Port of the first decode instance."),
        side_channel_port: int = typer.Option(5600, help="First NIXL side-channel port."),
        side_channel_host: str | None = typer.Option(None, help="VLLM_NIXL_SIDE_CHANNEL_HOST (needed across hosts)."),
        kv_role: str = typer.Option("kv_both", help="kv_both (live role changes) or explicit (producer/consumer)."),
        extra_args: str = typer.Option("", help="More vllm serve arguments, one shell-quoted string."),
        router_config_path: Path | None = typer.Option(  # noqa: B008
            None, "--router-config", help="Write a router config here."
        ),
        ready_timeout_s: float = typer.Option(900.0, help="Wait this long for every /health."),
        dry_run: bool = typer.Option(False, help="Print the commands; start nothing."),
    ) -> None:
        """Start vLLM prefill/decode instances with NixlConnector."""
        if kv_role not in ("kv_both", "explicit"):
            raise typer.BadParameter("--kv-role must be kv_both or explicit")
        specs = vllm_commands(
            model, prefill_gpus, decode_gpus, host, prefill_port, decode_port, side_channel_port,
            side_channel_host, kv_role, extra_args,
        )  # fmt: skip
        if not any(s.role == "decode" for s in specs):
            raise typer.BadParameter("at least one decode instance is needed")
        if router_config_path is not None:
            router_config_path.parent.mkdir(parents=True, exist_ok=True)
            router_config_path.write_text(yaml.safe_dump(router_config(specs), sort_keys=False), encoding="utf-8")
        if dry_run:
            for spec in specs:
                typer.echo(spec.shell())
            return
        _run(specs, ready_timeout_s)
