"""Logging for the daemon: one pure-JSON line per tick on stdout, everything else as ordinary text on stderr."""

from __future__ import annotations

import logging
import sys

__all__ = ["TICK_LOGGER", "configure_logging"]

TICK_LOGGER = "pdctl.controller.tick"


def configure_logging(level: str = "INFO") -> None:
    """Tick records (``pdctl.controller.tick``) go to stdout as bare JSON lines; other logs to stderr."""
    root = logging.getLogger()
    root.setLevel(level.upper())
    text = logging.StreamHandler(sys.stderr)
    text.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root.handlers[:] = [text]
    ticks = logging.getLogger(TICK_LOGGER)
    json_lines = logging.StreamHandler(sys.stdout)
    json_lines.setFormatter(logging.Formatter("%(message)s"))
    ticks.handlers[:] = [json_lines]
    ticks.propagate = False
