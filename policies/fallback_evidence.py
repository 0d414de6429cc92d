"""What the SLO watchdog's fallback achieved: the evidence behind its estimate of the counterfactual.

The watchdog (:mod:`policies.watchdog`) should hand control to its fallback only when the fallback would do
better than the primary, but it cannot run both on the same traffic: while the primary decides, what the
fallback would have achieved is never observed. The honest estimate available live is what the fallback *did*
achieve, in the windows it decided, at a comparable **offered load relative to the pool size**::

    load_rps_per_instance = Σ tenants request_rate_rps / Σ groups running instances (prefill + decode)

(over the groups the watchdog judges, and their tenants: it keeps one record per such population).

:class:`FallbackRecord` keeps the last ``max_windows`` such (load, attainment) pairs; :meth:`FallbackRecord.estimate`
answers, for the load of the window being judged, the mean attainment of the recorded windows whose load is
within ``tolerance_frac`` of it (a ratio: ``1 / (1 + t) <= load_i / load <= 1 + t``), or ``None`` when fewer than
``min_windows`` are comparable. The watchdog then keeps its absolute floor, unless the windows at that load or
lighter (:meth:`FallbackRecord.ceiling`) show the fallback below it: attainment does not rise with load, so a
primary doing as well as the fallback did under less load is not failing.

Limits of the estimate, stated rather than hidden: request rate per instance ignores the mix (prompt and
output lengths, prefix hits), so two windows of equal load can differ in difficulty; the fallback is only
observed after trips, that is, in hard periods, so its record leans pessimistic (which makes the watchdog slower
to trip again, not quicker); the pool size in the ratio is what ran at the end of the window. Attainment itself is
computed by the caller (this module only keeps and matches numbers).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from policies.base import PolicyContext
from policies.features import Observation

__all__ = ["FallbackEstimate", "FallbackRecord", "offered_load_rps_per_instance"]


@dataclass(frozen=True, slots=True)
class FallbackEstimate:
    """The fallback's attainment at a comparable load.

    Attributes:
        attainment_frac: mean attainment of the comparable windows.
        num_windows: how many windows it rests on.
        load_rps_per_instance: the load it was asked for.
    """

    attainment_frac: float
    num_windows: int
    load_rps_per_instance: float
    lighter: bool = False
    """From windows at this load or lighter (:meth:`FallbackRecord.ceiling`), not only comparable ones."""


def offered_load_rps_per_instance(observation: Observation, context: PolicyContext) -> float | None:
    """Known request rate over running instances (``None``: no known rate, or no instance running)."""
    instances = sum(p.num_instances for p in context.current_pools.values())
    rates = [
        observation.value("tenant", t.name, "request_rate_rps")
        for t in context.tenants
        if t.name in observation.tenant_names
    ]
    known = [r for r in rates if r is not None and math.isfinite(r)]
    if instances <= 0 or not known:
        return None
    return sum(known) / instances


class FallbackRecord:
    """A bounded record of (load, attainment) of windows the fallback decided (module docstring)."""

    def __init__(self, max_windows: int) -> None:
        if max_windows < 1:
            raise ValueError(f"fallback record max_windows must be >= 1, got {max_windows}")
        self._windows: deque[tuple[float, float]] = deque(maxlen=max_windows)

    def __len__(self) -> int:
        return len(self._windows)

    def windows(self) -> list[tuple[float, float]]:
        """The recorded (load, attainment) pairs, oldest first."""
        return list(self._windows)

    def add(self, load_rps_per_instance: float, attainment_frac: float) -> None:
        """Record one window the fallback was answerable for (non-finite or negative values are ignored)."""
        if not (math.isfinite(load_rps_per_instance) and math.isfinite(attainment_frac)):
            return
        if load_rps_per_instance < 0:
            return
        self._windows.append((load_rps_per_instance, attainment_frac))

    def estimate(
        self, load_rps_per_instance: float, *, tolerance_frac: float, min_windows: int
    ) -> FallbackEstimate | None:
        """Mean attainment of the windows within ``tolerance_frac`` of this load; ``None`` below ``min_windows``."""
        if not math.isfinite(load_rps_per_instance) or load_rps_per_instance < 0:
            return None
        high = 1.0 + tolerance_frac
        matches = [a for load, a in self._windows if _comparable(load, load_rps_per_instance, high)]
        if len(matches) < min_windows:
            return None
        return FallbackEstimate(sum(matches) / len(matches), len(matches), load_rps_per_instance)

    def ceiling(self, load_rps_per_instance: float, *, min_windows: int) -> FallbackEstimate | None:
        """Mean attainment of the windows at this load **or lighter**; ``None`` below ``min_windows``.

        Attainment does not rise with load (for the same mix): what the fallback achieved at a lighter load is an
        optimistic estimate of what it would achieve at this one, so a window may be judged against it when no
        comparable one exists. It can only lower a bar (a primary no worse than the fallback was at a lighter
        load is not failing), never raise it.
        """
        if not math.isfinite(load_rps_per_instance) or load_rps_per_instance < 0:
            return None
        matches = [a for load, a in self._windows if load <= load_rps_per_instance]
        if len(matches) < min_windows:
            return None
        return FallbackEstimate(sum(matches) / len(matches), len(matches), load_rps_per_instance, lighter=True)


def _comparable(recorded: float, asked: float, high: float) -> bool:
    if asked == 0 or recorded == 0:
        return asked == recorded
    ratio = recorded / asked
    return 1.0 / high <= ratio <= high
