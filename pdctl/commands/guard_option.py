"""The ``--guard FILE`` option of the simulator commands (``pdctl evaluate``, ``pdctl sim``).

It runs the safety guard of an operator's controller configuration instead of the defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from policies.guard import GuardLimits

__all__ = ["GUARD_HELP", "read_guard_option"]

GUARD_HELP = (
    "Run under the safety-guard limits of this file (a controller configuration's guard block, or a file with only "
    "that block) instead of the defaults; the policy is then named SPEC+guard[...] with the limits that differ."
)


def read_guard_option(path: Path | None) -> GuardLimits | None:
    """The guard limits of ``--guard PATH``; ``None`` without the option.

    Raises:
        ValueError: one line naming the option, the file and the field (``--guard FILE: guard.FIELD: ...``).
    """
    if path is None:
        return None
    from controller.config import ConfigError, load_guard_limits

    try:
        return load_guard_limits(path)
    except ConfigError as exc:
        raise ValueError(f"--guard {str(exc).splitlines()[0]}") from None
