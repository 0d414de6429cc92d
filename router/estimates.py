"""What the router estimates per request: prompt tokens, prefix-cache hits, prefill wait and transfer health.

* **Prompt tokens**: characters / ``chars_per_token`` (calibrated; exact against the emulator), or the decode
  instance's ``POST /tokenize`` when configured.
* **Prefix-cache hits on a decode instance**: vLLM does not tell a router what it has cached, so the router
  remembers what it sent. The prompt text is cut into blocks of ``prefix_block_tokens`` tokens; block ``k`` is
  identified by a chained CRC-32 of blocks ``0..k``. Each decode instance keeps an LRU set of the block ids of
  prompts routed to it (bounded by ``prefix_blocks_per_instance``, roughly its KV capacity in blocks). The hit
  estimate for a new prompt is the number of its leading blocks in that set times the block size. It
  over-estimates when the instance evicted blocks the router still remembers, and ignores hits from traffic
  that bypassed the router. An instance that passes a health check after failing one is assumed to have
  restarted, and its set is cleared.
* **Prefill queue wait** of a prefill instance: prompt tokens in flight on it divided by its prefill throughput;
  the throughput starts at ``prefill_tokens_per_s`` and follows (EWMA) the rate measured on prefill legs that
  ran alone on their instance (:class:`policies.placement.PrefillRate`, shared with the simulator).
* **KV-transfer health**: outcomes of remote legs (prefill error or timeout, pull failure, pull timeout) over a
  sliding window; unhealthy when at least ``transfer_min_samples`` outcomes are in the window and the failure
  fraction reaches ``transfer_unhealthy_frac``. Unhealthy (open) routes everything local for
  ``transfer_window_s``; then up to ``transfer_probe_requests`` requests at a time probe the path (half-open), and
  their outcomes close the breaker or open it again, which bounds an outage's cost. The judgment is the core's
  (:class:`policies.transfer_health.TransferBreaker`, the simulator's too); the router's breaker logs
  (``pdctl.router``, WARNING) each change of state.
"""

from __future__ import annotations

import logging
import zlib
from collections import OrderedDict

from policies.placement import PrefillRate
from policies.transfer_health import DEFAULT_PROBE_REQUESTS, BreakerState, TransferBreaker

__all__ = ["PrefillRate", "PrefixTracker", "TransferHealth", "prefix_blocks"]

_log = logging.getLogger("pdctl.router")


def prefix_blocks(text: str, block_chars: int) -> list[int]:
    """Chained CRC-32 ids of the full blocks of ``text`` (``block_chars`` characters each)."""
    data = text.encode("utf-8", "surrogatepass")
    view = memoryview(data)
    out: list[int] = []
    running = 0
    for start in range(0, len(data) - block_chars + 1, block_chars):
        running = zlib.crc32(view[start : start + block_chars], running)
        out.append(running)
    return out


class PrefixTracker:
    """The router's view of one decode instance's prefix cache (an LRU set of block ids)."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def hit_blocks(self, blocks: list[int]) -> int:
        """Leading blocks of ``blocks`` that are cached."""
        cached = self._blocks
        n = 0
        for block in blocks:
            if block not in cached:
                break
            n += 1
        return n

    def record(self, blocks: list[int]) -> None:
        """Remember that a prompt with ``blocks`` was sent to the instance."""
        cached = self._blocks
        for block in blocks:
            if block in cached:
                cached.move_to_end(block)
            else:
                cached[block] = None
        while len(cached) > self.capacity_blocks:
            cached.popitem(last=False)

    def clear(self) -> None:
        """Forget everything (the instance restarted or changed role)."""
        self._blocks.clear()


class TransferHealth(TransferBreaker):
    """The router's KV-transfer breaker: :class:`policies.transfer_health.TransferBreaker`, logging its changes."""

    def __init__(
        self, window_s: float, min_samples: int, unhealthy_frac: float, probe_requests: int = DEFAULT_PROBE_REQUESTS
    ) -> None:
        super().__init__(window_s, min_samples, unhealthy_frac, probe_requests, self._log_change)

    def _log_change(self, state: BreakerState, failures: int, outcomes: int) -> None:
        if state == "open":
            _log.warning(
                "KV transfer breaker opened: %d of the last %d remote requests failed (limit %.0f %%); new requests "
                "are served with local prefill for %.0f s, then up to %d probe the path",
                failures, outcomes, 100 * self.unhealthy_frac, self.window_s, self.probe_requests,
            )  # fmt: skip
        elif state == "half_open":
            _log.warning("KV transfer breaker half-open: up to %d remote requests probe the path", self.probe_requests)
        else:
            _log.warning(
                "KV transfer breaker closed: %d of %d probe requests failed; remote prefill resumes",
                failures, outcomes,
            )  # fmt: skip
