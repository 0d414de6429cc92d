"""The KV-transfer circuit breaker: whether the remote (prefill → decode) path may be used.

This is the one copy of the judgment; the router (``router/estimates.py``, ``router/decide.py``) and the simulator
(``env/sim/kv_transfers.py``, ``env/sim/simulator.py``) both record their remote-path outcomes into a
:class:`TransferBreaker`, ask it :meth:`TransferBreaker.allows_remote` for each request (passed to
:func:`policies.routing.decide_route` as ``LiveState.kv_transfer_healthy``), and tell it
:meth:`TransferBreaker.sent_remote` when a request went remote.

Three states, the usual circuit breaker's:

* **closed** (healthy): every request may go remote. The outcomes (ok or failed: a prefill error, a transfer
  failure, a timeout) of the last ``window_s`` seconds are kept; once at least ``min_samples`` are in the window and
  the failed fraction reaches ``unhealthy_frac``, the breaker **opens**.
* **open**: every new request goes local, for ``window_s`` seconds. Outcomes of legs sent before it opened still
  arrive and are kept, but change nothing.
* **half-open**: then at most ``probe_requests`` requests may go remote at a time, as probes. When that many have
  reported, the breaker closes (with an empty window) if fewer than ``unhealthy_frac`` of them failed, else opens
  again for another ``window_s``. A probe that never reports (lost with its request) is given up after
  ``window_s``, so the breaker cannot stay half-open forever.

So an outage costs one burst of failed legs (those sent before ``min_samples`` failures came back), then at most
``probe_requests`` failed legs per ``window_s``, and a path that recovered is used again at most ``window_s`` plus one
round of probes later.

(Until the seventeenth session the simulator judged health by a failure average that moved only on new transfers,
so once open it never closed; then, in ``1019262``, by the window alone, which closed as soon as the failures aged
out and sent every request remote again, failing a new burst each window while an incident lasted.)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Literal

__all__ = [
    "DEFAULT_MIN_SAMPLES",
    "DEFAULT_PROBE_REQUESTS",
    "DEFAULT_UNHEALTHY_FRAC",
    "DEFAULT_WINDOW_S",
    "BreakerChange",
    "BreakerState",
    "TransferBreaker",
]

DEFAULT_WINDOW_S = 30.0
"""Seconds of remote-path outcomes the closed breaker judges, and how long it stays open."""
DEFAULT_MIN_SAMPLES = 8
"""Outcomes needed in the window before the path can be judged unhealthy."""
DEFAULT_UNHEALTHY_FRAC = 0.5
"""Failed fraction of the window's outcomes (or of a round of probes) at which the path counts as unhealthy."""
DEFAULT_PROBE_REQUESTS = 8
"""Requests let through at a time while half-open, and how many outcomes decide it."""

BreakerState = Literal["closed", "open", "half_open"]
BreakerChange = Callable[[BreakerState, int, int], None]
"""Called on every change of state: ``(new_state, failures, outcomes)``, the counts that decided it (the window's
when it opens from closed, the probes' otherwise)."""


class TransferBreaker:
    """The closed / open / half-open judgment of the remote path (see the module docstring).

    Args:
        window_s: seconds of outcomes judged while closed, and of each open period (> 0).
        min_samples: outcomes needed before the closed path can be judged unhealthy (≥ 1).
        unhealthy_frac: failed fraction at which it is (0 < f ≤ 1).
        probe_requests: requests let through at a time while half-open (≥ 1).
        on_change: called once per change of state (the router logs it); ``None`` for none.
    """

    __slots__ = (
        "_events",
        "_failures",
        "_half_open_since_s",
        "_probe_failures",
        "_probe_outcomes",
        "_probes_in_flight",
        "_retry_at_s",
        "_state",
        "min_samples",
        "on_change",
        "probe_requests",
        "unhealthy_frac",
        "window_s",
    )

    def __init__(
        self,
        window_s: float = DEFAULT_WINDOW_S,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        unhealthy_frac: float = DEFAULT_UNHEALTHY_FRAC,
        probe_requests: int = DEFAULT_PROBE_REQUESTS,
        on_change: BreakerChange | None = None,
    ) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        if min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {min_samples}")
        if not 0 < unhealthy_frac <= 1:
            raise ValueError(f"unhealthy_frac must be in (0, 1], got {unhealthy_frac}")
        if probe_requests < 1:
            raise ValueError(f"probe_requests must be >= 1, got {probe_requests}")
        self.window_s = window_s
        self.min_samples = min_samples
        self.unhealthy_frac = unhealthy_frac
        self.probe_requests = probe_requests
        self.on_change = on_change
        self._events: deque[tuple[float, bool]] = deque()
        self._failures = 0
        self._state: BreakerState = "closed"
        self._retry_at_s = 0.0
        self._half_open_since_s = 0.0
        self._probes_in_flight = 0
        self._probe_outcomes = 0
        self._probe_failures = 0

    # -------------------------------------------------------------------------------------------- the adapters' calls

    def record(self, now_s: float, ok: bool) -> None:
        """Add one remote-path outcome at ``now_s`` (outcomes must come in time order)."""
        self._advance(now_s)
        self._events.append((now_s, ok))
        if not ok:
            self._failures += 1
        self._trim(now_s)
        if self._state == "closed":
            self._judge_window(now_s)
        elif self._state == "half_open":
            self._probes_in_flight = max(self._probes_in_flight - 1, 0)
            self._probe_outcomes += 1
            self._probe_failures += 0 if ok else 1
            if self._probe_outcomes >= self.probe_requests:
                if self._probe_failures / self._probe_outcomes >= self.unhealthy_frac:
                    self._open(now_s, self._probe_failures, self._probe_outcomes)
                else:
                    self._close(self._probe_failures, self._probe_outcomes)

    def allows_remote(self, now_s: float) -> bool:
        """Whether a request arriving at ``now_s`` may go remote (closed; or half-open with a probe slot free)."""
        self._advance(now_s)
        if self._state == "closed":
            return True
        return self._state == "half_open" and self._probes_in_flight < self.probe_requests

    def sent_remote(self, now_s: float) -> None:
        """A request was sent remote at ``now_s`` (while half-open it takes a probe slot)."""
        self._advance(now_s)
        if self._state == "half_open":
            self._probes_in_flight += 1

    # ------------------------------------------------------------------------------------------------ queries

    def healthy(self, now_s: float) -> bool:
        """Whether the path is judged healthy at ``now_s`` (closed): the gauge and the admin API report this."""
        self._advance(now_s)
        return self._state == "closed"

    @property
    def state(self) -> BreakerState:
        """The state as last advanced."""
        return self._state

    def failure_frac(self, now_s: float) -> float | None:
        """Failed fraction of the outcomes in the window at ``now_s`` (``None`` when the window is empty)."""
        self._trim(now_s)
        n = len(self._events)
        return None if n == 0 else self._failures / n

    # ------------------------------------------------------------------------------------------------ transitions

    def _advance(self, now_s: float) -> None:
        """Time-driven changes.

        Open → half-open after ``window_s``; a closed window re-judged as it slides; lost probes given up after
        ``window_s``.
        """
        if self._state == "closed":
            self._trim(now_s)
            self._judge_window(now_s)
        elif self._state == "open":
            if now_s >= self._retry_at_s:
                self._state = "half_open"
                self._half_open_since_s = now_s
                self._probes_in_flight = self._probe_outcomes = self._probe_failures = 0
                self._changed(0, 0)
        elif self._probes_in_flight and now_s - self._half_open_since_s >= self.window_s:
            self._probes_in_flight = 0
            self._half_open_since_s = now_s

    def _judge_window(self, now_s: float) -> None:
        n = len(self._events)
        if n >= self.min_samples and self._failures / n >= self.unhealthy_frac:
            self._open(now_s, self._failures, n)

    def _open(self, now_s: float, failures: int, outcomes: int) -> None:
        self._state = "open"
        self._retry_at_s = now_s + self.window_s
        self._changed(failures, outcomes)

    def _close(self, failures: int, outcomes: int) -> None:
        self._state = "closed"
        self._events.clear()
        self._failures = 0
        self._changed(failures, outcomes)

    def _changed(self, failures: int, outcomes: int) -> None:
        if self.on_change is not None:
            self.on_change(self._state, failures, outcomes)

    def _trim(self, now_s: float) -> None:
        events = self._events
        horizon = now_s - self.window_s
        while events and events[0][0] < horizon:
            if not events.popleft()[1]:
                self._failures -= 1
