"""Command-line entry of the emulator (``python -m livestack.emulator`` and ``pdctl emulate``).

Starts ``--prefill`` + ``--decode`` instances in this process (ids ``p0..``, ``d0..``; ports from ``--base-port``,
or free ports with 0), prints one ``emulator <id> <url>`` line per instance, optionally writes a router
configuration naming them with their roles, and serves until SIGINT/SIGTERM or ``--duration-s``. Every
instance is a ``kv_both`` NixlConnector instance; the roles only go into the router configuration. Fault flags
apply to every instance of the process (run an instance alone to fault only it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import Sequence
from pathlib import Path

import yaml

from env.perf.profile import ProfileError
from env.scenario import ClusterConfig, load_scenario
from livestack.emulator.engine import load_profile
from livestack.emulator.faults import FaultConfig
from livestack.emulator.host import EmulatorHost, InstanceSpec

__all__ = ["build_parser", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    """The emulator's argument parser."""
    p = argparse.ArgumentParser(prog="pdctl emulate", description=__doc__)
    p.add_argument("--prefill", type=int, default=1, help="prefill instances (ids p0, p1, ...)")
    p.add_argument("--decode", type=int, default=1, help="decode instances (ids d0, d1, ...)")
    p.add_argument("--id-offset", type=int, default=0, help="first index of the instance ids")
    p.add_argument("--base-port", type=int, default=8100, help="port of the first instance (0 = free ports)")
    p.add_argument("--scenario", type=Path, help="take the cluster settings from this scenario file")
    p.add_argument("--profile", default=None, help="performance profile, e.g. h200-llama3-8b")
    p.add_argument("--profile-dir", type=Path, default=None, help="operator-timing folder instead of a shipped one")
    p.add_argument("--model-config", type=Path, default=None, help="Hugging Face config.json (with --profile-dir)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel degree")
    p.add_argument("--kv-capacity-tokens", type=int, default=None, help="override the KV capacity per instance")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--model-name", default="meta-llama/Llama-3.1-8B-Instruct", help="served model name")
    p.add_argument("--max-model-len", type=int, default=131072, help="context length (Llama-3.1: 128 Ki)")
    p.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per emulated second (0.1 = 10x)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--transfer-failure-frac", type=float, default=0.0, help="probability a KV pull fails")
    p.add_argument("--transfer-delay-s", type=float, default=0.0, help="extra seconds per KV pull")
    p.add_argument("--slow-factor", type=float, default=1.0, help="multiply every step time (slow instance)")
    p.add_argument("--crash-after-s", type=float, default=None, help="crash after this many wall seconds")
    p.add_argument("--crash-after-requests", type=int, default=None, help="crash at this many requests")
    p.add_argument("--router-config", type=Path, help="write a router configuration for these instances")
    p.add_argument("--duration-s", type=float, default=None, help="stop after this many wall seconds")
    return p


def _cluster(args: argparse.Namespace) -> ClusterConfig:
    cluster = load_scenario(args.scenario).cluster if args.scenario else ClusterConfig()
    updates = {
        key: value
        for key, value in (
            ("profile", args.profile),
            ("profile_dir", args.profile_dir),
            ("hf_config", args.model_config),
            ("tp", args.tp),
            ("kv_capacity_tokens", args.kv_capacity_tokens),
            ("max_num_seqs", args.max_num_seqs),
            ("max_num_batched_tokens", args.max_num_batched_tokens),
        )
        if value is not None
    }
    return ClusterConfig.model_validate({**cluster.model_dump(), **updates}) if updates else cluster


def _specs(args: argparse.Namespace, faults: FaultConfig) -> list[tuple[InstanceSpec, str]]:
    out: list[tuple[InstanceSpec, str]] = []
    port = args.base_port
    for role, count, prefix in (("prefill", args.prefill, "p"), ("decode", args.decode, "d")):
        for k in range(count):
            out.append((InstanceSpec(f"{prefix}{args.id_offset + k}", port, faults), role))
            if port:
                port += 1
    return out


def write_router_config(path: Path, urls: dict[str, str], roles: dict[str, str]) -> None:
    """A minimal router configuration naming the instances with their roles."""
    data = {
        "listen": {"host": "127.0.0.1", "port": 8000},
        "instances": [{"id": i, "url": url, "role": roles[i]} for i, url in urls.items()],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


async def run(args: argparse.Namespace) -> None:
    """Start the instances and serve until a signal or the duration ends."""
    faults = FaultConfig(
        transfer_failure_frac=args.transfer_failure_frac,
        transfer_delay_s=args.transfer_delay_s,
        slow_factor=args.slow_factor,
        crash_after_s=args.crash_after_s,
        crash_after_requests=args.crash_after_requests,
    )
    specs = _specs(args, faults)
    host = EmulatorHost(
        _cluster(args),
        [s for s, _ in specs],
        model_name=args.model_name,
        time_scale=args.time_scale,
        max_model_len=args.max_model_len,
        seed=args.seed,
        exit_on_crash=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    await host.start()
    try:
        for instance_id, url in host.urls.items():
            print(f"emulator {instance_id} {url}", flush=True)
        if args.router_config:
            write_router_config(args.router_config, host.urls, {s.instance_id: role for s, role in specs})
        if args.duration_s is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.duration_s)
        else:
            await stop.wait()
    finally:
        await host.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """Parse ``argv`` and run (a profile that does not load ends it with one line naming the file, status 1)."""
    args = build_parser().parse_args(argv)
    cluster = _cluster(args)
    try:
        load_profile(cluster.profile, _path(cluster.profile_dir), _path(cluster.hf_config))
    except ProfileError as exc:
        raise SystemExit(f"pdctl emulate: {exc}") from None
    asyncio.run(run(args))


def _path(path: Path | None) -> str | None:
    return None if path is None else str(path)
