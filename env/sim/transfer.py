"""KV-cache transfers prefill → decode over shared links (processor sharing).

Each prefill instance owns one egress :class:`Link`; its concurrent transfers share the bandwidth equally and
the shares are recomputed at every flow start and end (so a transfer's duration depends on what else is
sending). A transfer's stages: ``setup`` (fixed latency) and ``pack`` (layout conversion, only when the two
TP degrees differ), the ``flow`` over the link, then ``unpack``. The simulator schedules the stage events; this
module holds the link arithmetic.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["Link", "Transfer"]


class Transfer:
    """One KV transfer in flight."""

    __slots__ = (
        "armed",
        "bytes_total",
        "deadline_s",
        "decode",
        "engine_request",
        "fails",
        "flow_end_s",
        "flow_start_s",
        "link",
        "pack_s",
        "prefill",
        "remaining_bytes",
        "request",
        "start_s",
        "state",
        "unpack_s",
    )

    PENDING = 0
    FLOWING = 1
    UNPACKING = 2
    DONE = 3
    ABANDONED = 4

    def __init__(
        self,
        request: Any,
        engine_request: Any,
        prefill: Any,
        decode: Any,
        link: Link,
        bytes_total: float,
        start_s: float,
        pack_s: float,
        unpack_s: float,
        fails: bool,
    ) -> None:
        self.request = request
        self.engine_request = engine_request
        self.prefill = prefill
        self.decode = decode
        self.link = link
        self.bytes_total = bytes_total
        self.remaining_bytes = bytes_total
        self.start_s = start_s
        self.pack_s = pack_s
        self.unpack_s = unpack_s
        self.fails = fails
        self.state = Transfer.PENDING
        self.flow_start_s = math.nan
        self.flow_end_s = math.nan
        self.deadline_s = math.inf
        self.armed = False


class Link:
    """A link shared equally by its active flows; its bandwidth changes only through :meth:`set_bandwidth`."""

    __slots__ = ("bandwidth_bytes_per_s", "bytes_sent", "flows", "last_update_s", "version")

    def __init__(self, bandwidth_bytes_per_s: float) -> None:
        if bandwidth_bytes_per_s <= 0:
            raise ValueError("link bandwidth must be > 0")
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.flows: list[Transfer] = []
        self.last_update_s = 0.0
        self.version = 0
        self.bytes_sent = 0.0

    def advance(self, now_s: float) -> None:
        """Progress every flow to ``now_s`` at its equal share."""
        flows = self.flows
        if flows:
            sent = (now_s - self.last_update_s) * self.bandwidth_bytes_per_s / len(flows)
            if sent > 0:
                for flow in flows:
                    flow.remaining_bytes -= sent
        self.last_update_s = now_s

    def set_bandwidth(self, bandwidth_bytes_per_s: float, now_s: float) -> None:
        """Change the rate at ``now_s``: flows progress to ``now_s`` at the old rate, then at the new one.

        The caller reschedules the link's completion (:meth:`next_completion_s` moves).
        """
        if bandwidth_bytes_per_s <= 0:
            raise ValueError("link bandwidth must be > 0")
        self.advance(now_s)
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s

    def next_completion_s(self) -> float:
        """When the first active flow ends at current shares (inf when idle)."""
        if not self.flows:
            return math.inf
        least = min(flow.remaining_bytes for flow in self.flows)
        return self.last_update_s + max(least, 0.0) * len(self.flows) / self.bandwidth_bytes_per_s

    def add(self, flow: Transfer, now_s: float) -> None:
        """Start a flow at ``now_s``."""
        self.advance(now_s)
        flow.state = Transfer.FLOWING
        flow.flow_start_s = now_s
        self.flows.append(flow)

    def remove(self, flow: Transfer, now_s: float) -> None:
        """Stop a flow early (abandoned)."""
        self.advance(now_s)
        if flow in self.flows:
            self.flows.remove(flow)
            self.bytes_sent += flow.bytes_total - max(flow.remaining_bytes, 0.0)

    def pop_finished(self, now_s: float) -> list[Transfer]:
        """Flows whose bytes are all sent by ``now_s`` (tolerance: one nanosecond of link time)."""
        self.advance(now_s)
        eps = self.bandwidth_bytes_per_s * 1e-9
        done = [flow for flow in self.flows if flow.remaining_bytes <= eps]
        if done:
            self.flows = [flow for flow in self.flows if flow.remaining_bytes > eps]
            for flow in done:
                flow.flow_end_s = now_s
                self.bytes_sent += flow.bytes_total
        return done
