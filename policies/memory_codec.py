"""Reading back a policy's memory document (JSON values): each reader checks one value and names its field.

Shared by the rule selector's memory (:mod:`policies.selector_memory`) and the SLO watchdog's
(:meth:`policies.watchdog.SloWatchdog.restore_memory`), which a restarted controller hands back from its control
memory file (:mod:`controller.control_memory`). Every reader raises :class:`ValueError` with one line that starts with
the field it read; times are on the writer's control clock and are moved by a shift onto the reader's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from policies.schema import PoolTargets

__all__ = [
    "decode_mapping",
    "decode_pools",
    "read_bool",
    "read_count",
    "read_names",
    "read_number",
    "read_numbers",
    "read_optional_number",
    "read_pair",
    "read_time",
]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_time(value: object, field: str, shift_s: float, *, optional: bool = True) -> float | None:
    """A time on the writer's control clock, moved by ``shift_s`` (``None`` when absent and ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{field}: expected seconds, got {value!r}")
    return float(value) + shift_s


def read_pair(value: object, field: str) -> tuple[float, float]:
    """Two finite numbers."""
    if not isinstance(value, list) or len(value) != 2 or not all(_is_number(v) for v in value):
        raise ValueError(f"{field}: expected two numbers, got {value!r}")
    return float(value[0]), float(value[1])


def read_number(value: object, field: str) -> float:
    """One finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{field}: expected a number, got {value!r}")
    return float(value)


def read_optional_number(value: object, field: str) -> float | None:
    """One finite number, or ``None``."""
    return None if value is None else read_number(value, field)


def read_numbers(value: object, field: str) -> list[float]:
    """A list of finite numbers."""
    if not isinstance(value, list):
        raise ValueError(f"{field}: expected a list of numbers, got {value!r}")
    return [read_number(v, f"{field}[{i}]") for i, v in enumerate(value)]


def read_count(value: object, field: str) -> int:
    """A whole number, zero or more."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field}: expected a count, got {value!r}")
    return value


def read_bool(value: object, field: str) -> bool:
    """``true`` or ``false``."""
    if not isinstance(value, bool):
        raise ValueError(f"{field}: expected true or false, got {value!r}")
    return value


def read_names(value: object, field: str) -> frozenset[str]:
    """A list of names (group or tenant names)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{field}: expected a list of names, got {value!r}")
    return frozenset(value)


def decode_pools(value: object, field: str) -> PoolTargets:
    """Pools written as ``[prefill, decode]``."""
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        raise ValueError(f"{field}: expected [prefill, decode] instance counts, got {value!r}")
    return PoolTargets(value[0], value[1])


def decode_mapping(value: object, field: str) -> Mapping[str, Any]:
    """A JSON object."""
    if not isinstance(value, dict):
        raise ValueError(f"{field}: expected a mapping")
    return value
