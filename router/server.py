"""Run the router until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from router.app import Router
from router.config import RouterConfig

__all__ = ["serve"]

log = logging.getLogger("pdctl.router")


async def serve(config: RouterConfig, stop: asyncio.Event | None = None) -> None:
    """Start the router, log its address, and run until a signal (or ``stop``) arrives."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    router = Router(config)
    await router.start()
    if config.resolved_admin_token() is None:
        log.warning("no admin token configured (admin_token or PDCTL_ADMIN_TOKEN): the admin API refuses every call")
    log.info("router listening on %s with %d instances", router.url, len(config.instances))
    print(f"router listening on {router.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await router.stop()
