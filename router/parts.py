"""What the router's request flow and its upkeep share: the live state, the client pool and the clock.

:class:`router.app.Router` builds one :class:`RouterParts` and hands it to :class:`router.flow.RequestFlow` and
:class:`router.upkeep.Upkeep`, which both derive from :class:`RouterPart`: one list of the injected parts, one way
to reach the client pool, instead of a copy in each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from router.config import RouterConfig
from router.decide import Planner
from router.estimates import TransferHealth
from router.registry import InstanceRegistry
from router.telemetry import RequestLog, RouterMetrics

__all__ = ["RouterPart", "RouterParts"]


@dataclass(frozen=True, slots=True)
class RouterParts:
    """The router's live state and services, as its parts receive them.

    ``session`` and ``now`` are read at each use: the client pool opens when the server starts, and the clock is the
    running event loop's once there is one.
    """

    config: RouterConfig
    registry: InstanceRegistry
    planner: Planner
    transfer_health: TransferHealth
    metrics: RouterMetrics
    log: RequestLog | None
    """The JSONL request log (None: not configured)."""
    session: Callable[[], aiohttp.ClientSession]
    now: Callable[[], float]
    """Seconds on a monotonic clock."""


class RouterPart:
    """A part of the router that works on its live state (:class:`RouterParts`)."""

    def __init__(self, parts: RouterParts) -> None:
        self.config = parts.config
        self.registry = parts.registry
        self.planner = parts.planner
        self.transfer_health = parts.transfer_health
        self.metrics = parts.metrics
        self.log = parts.log
        self._session = parts.session
        self._now = parts.now

    @property
    def session(self) -> aiohttp.ClientSession:
        """The upstream client pool."""
        return self._session()
