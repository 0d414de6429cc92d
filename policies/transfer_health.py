"""The KV-transfer circuit breaker: whether the remote (prefill → decode) path may be used.

This is the one copy of the judgment; the router (``router/estimates.py``) and the simulator
(``env/sim/kv_transfers.py``) both record their remote-path outcomes into a :class:`TransferBreaker` and pass
:meth:`TransferBreaker.healthy` to :func:`policies.routing.decide_route` as ``LiveState.kv_transfer_healthy``.

The rule: keep the outcomes (ok or failed: a prefill error, a transfer failure, a timeout) of the last
``window_s`` seconds. The path is **unhealthy** when at least ``min_samples`` outcomes are in the window and the
failed fraction reaches ``unhealthy_frac``. An unhealthy path routes every new request local, so no new outcomes
arrive; the window then empties and the breaker closes by itself (half-open): remote prefill is tried again, and
the breaker opens again only if ``min_samples`` new outcomes fail as often. An outage therefore costs at most one
window of local serving per round of failed tries, and a path that recovered is used again within one window.

(Until the seventeenth session the simulator judged health by an exponentially weighted failure fraction that
updated only on new outcomes: once open it could never close, since an open breaker sends no more transfers, and a
single incident left the rest of an episode without remote prefill. The router never behaved that way.)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

__all__ = [
    "DEFAULT_MIN_SAMPLES",
    "DEFAULT_UNHEALTHY_FRAC",
    "DEFAULT_WINDOW_S",
    "BreakerChange",
    "TransferBreaker",
]

DEFAULT_WINDOW_S = 30.0
"""Seconds of remote-path outcomes the breaker judges."""
DEFAULT_MIN_SAMPLES = 8
"""Outcomes needed in the window before the path can be judged unhealthy."""
DEFAULT_UNHEALTHY_FRAC = 0.5
"""Failed fraction of the window's outcomes at which the path counts as unhealthy."""

BreakerChange = Callable[[bool, int, int], None]
"""Called when the breaker opens or closes: ``(is_open, failures_in_window, outcomes_in_window)``."""


class TransferBreaker:
    """Sliding-window failure fraction of the remote path, and the open / closed judgment on it.

    Args:
        window_s: seconds of outcomes kept (> 0).
        min_samples: outcomes needed before the path can be judged unhealthy (≥ 1).
        unhealthy_frac: failed fraction at which it is (0 < f ≤ 1).
        on_change: called once per change of state (the router logs it); ``None`` for none.
    """

    __slots__ = ("_events", "_failures", "_open", "min_samples", "on_change", "unhealthy_frac", "window_s")

    def __init__(
        self,
        window_s: float = DEFAULT_WINDOW_S,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        unhealthy_frac: float = DEFAULT_UNHEALTHY_FRAC,
        on_change: BreakerChange | None = None,
    ) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        if min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {min_samples}")
        if not 0 < unhealthy_frac <= 1:
            raise ValueError(f"unhealthy_frac must be in (0, 1], got {unhealthy_frac}")
        self.window_s = window_s
        self.min_samples = min_samples
        self.unhealthy_frac = unhealthy_frac
        self.on_change = on_change
        self._events: deque[tuple[float, bool]] = deque()
        self._failures = 0
        self._open = False

    def record(self, now_s: float, ok: bool) -> None:
        """Add one remote-path outcome at ``now_s`` (outcomes must come in time order)."""
        self._events.append((now_s, ok))
        if not ok:
            self._failures += 1
        self._trim(now_s)
        self._judge()

    def healthy(self, now_s: float) -> bool:
        """Whether the remote path may be used at ``now_s``."""
        self._trim(now_s)
        return not self._judge()

    def failure_frac(self, now_s: float) -> float | None:
        """Failed fraction of the outcomes in the window at ``now_s`` (``None`` when the window is empty)."""
        self._trim(now_s)
        n = len(self._events)
        return None if n == 0 else self._failures / n

    @property
    def is_open(self) -> bool:
        """The state as last judged (open = unhealthy)."""
        return self._open

    def _trim(self, now_s: float) -> None:
        events = self._events
        horizon = now_s - self.window_s
        while events and events[0][0] < horizon:
            if not events.popleft()[1]:
                self._failures -= 1

    def _judge(self) -> bool:
        n = len(self._events)
        is_open = n >= self.min_samples and self._failures / n >= self.unhealthy_frac
        if is_open != self._open:
            self._open = is_open
            if self.on_change is not None:
                self.on_change(is_open, self._failures, n)
        return is_open
