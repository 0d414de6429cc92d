"""``python -m controller --config FILE`` (the same as ``pdctl controller --config FILE``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from controller.config import ConfigError, config_schema
from controller.control_memory import ControlMemoryError
from controller.daemon import run
from controller.lease import LeaseHeldError
from controller.logs import configure_logging
from controller.runtime import RuntimeConfigError

__all__ = ["main"]

EXIT_CONFIG = 2
EXIT_LEASE = 3


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, set up logging, run the daemon; exit 2 on a refused configuration."""
    parser = argparse.ArgumentParser(prog="python -m controller", description="pdctl controller daemon")
    parser.add_argument("--config", type=Path, help="controller config file (YAML or JSON)")
    parser.add_argument("--print-schema", action="store_true", help="print the config JSON Schema and exit")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    args = parser.parse_args(argv)
    if args.print_schema:
        sys.stdout.write(config_schema() + "\n")
        return 0
    if args.config is None:
        parser.error("--config is required")
    configure_logging(args.log_level)
    try:
        run(args.config)
    except (ConfigError, RuntimeConfigError, ControlMemoryError) as exc:
        sys.stderr.write(f"{exc}\n")
        return EXIT_CONFIG
    except LeaseHeldError as exc:
        sys.stderr.write(f"{exc}\n")
        return EXIT_LEASE
    return 0


if __name__ == "__main__":
    sys.exit(main())
