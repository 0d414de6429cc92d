"""Admission control that follows the load: refuse a request whose first token would come too late anyway.

Under overload every queue grows until most requests miss their TTFT objective, and a request that will miss it
still takes its share of prefill compute from the ones behind it. This stage runs after the route decision
(:func:`policies.routing.decide_route`): it estimates the request's time to first token on the route and instance
placement chose, and refuses the request when that estimate exceeds its tenant's TTFT objective by more than the
configured slack. A refused request is answered at once (the router: HTTP 429 with ``Retry-After``; the simulator:
a request that fails at arrival, counted as missing its objectives as every failed request is).

The estimate reads only what a router knows at decision time (:mod:`policies.placement`):

* **Remote prefill**: the prefill instance's queue wait (its queued prompt tokens over its measured prefill rate,
  :attr:`~policies.schema.LiveState.prefill_queue_wait_s`) plus the request's own uncached prompt at that rate.
  The KV transfer is not counted (it is short next to a queue that matters here).
* **Local prefill**: the prompt tokens already waiting for their first token on the chosen decode instance plus
  the request's own uncached prompt, over the prefill rate: the chosen prefill instance's measured rate when the
  group has one (same model), else the configured initial rate (a decode instance does not measure its own).

Since the queue it reads is the one the request would join, the stage follows the load: it refuses only while
that queue is past the objective and admits again as soon as it drains. On the test family it cost the per-scenario
best rule at most 1.4 % where the deployment serves its load and doubled it (median) where it does not
(``experiments/results/families/admission-control``). It is off unless configured
(:attr:`AdmissionConfig.ttft_slack_frac` ``None``).

Pure: no I/O and no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.schema import LiveState, RouteDecision

__all__ = ["REFUSED_ROUTE", "AdmissionConfig", "admits", "estimated_ttft_s"]

REFUSED_ROUTE = "refused"
"""The ``route`` label (metrics, request log, ``X-Pdctl-Route``) of a request the stage refused."""


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Settings of the admission stage.

    Attributes:
        ttft_slack_frac: refuse a request whose estimated time to first token exceeds this multiple of its tenant's
            TTFT objective (:meth:`policies.schema.Slo.ttft_target_s`); ``None`` admits every request.
            1.0 refuses exactly the requests the estimate says will miss their objective.
        retry_after_s: what the router's 429 answer tells the client to wait before retrying.
    """

    ttft_slack_frac: float | None = None
    retry_after_s: float = 1.0

    def __post_init__(self) -> None:
        slack = self.ttft_slack_frac
        if slack is not None and not (math.isfinite(slack) and slack > 0):
            raise ValueError(f"admission ttft_slack_frac must be a finite number > 0, got {slack}")
        if not (math.isfinite(self.retry_after_s) and self.retry_after_s >= 0):
            raise ValueError(f"admission retry_after_s must be a finite number >= 0, got {self.retry_after_s}")

    @property
    def enabled(self) -> bool:
        """Whether any request can be refused."""
        return self.ttft_slack_frac is not None


def estimated_ttft_s(
    decision: RouteDecision,
    live: LiveState,
    uncached_prompt_tokens: int,
    local_queued_prompt_tokens: int,
    prefill_tokens_per_s: float,
) -> float:
    """Seconds until the request's first token on its route, from what the router knows (module docstring).

    Args:
        decision: the route decision.
        live: the request's live state (its prefill queue wait is used on the remote route when known).
        uncached_prompt_tokens: the request's prompt tokens not covered by its estimated prefix hit.
        local_queued_prompt_tokens: prompt tokens waiting for their first token on the chosen decode instance.
        prefill_tokens_per_s: the prefill rate the estimate assumes (> 0).
    """
    own_s = max(uncached_prompt_tokens, 0) / prefill_tokens_per_s
    if decision.is_remote and live.prefill_queue_wait_s is not None:
        return live.prefill_queue_wait_s + own_s
    return max(local_queued_prompt_tokens, 0) / prefill_tokens_per_s + own_s


def admits(config: AdmissionConfig, ttft_target_s: float, estimate_s: float) -> bool:
    """Whether a request with TTFT objective ``ttft_target_s`` and estimated TTFT ``estimate_s`` is admitted.

    Every request is admitted when the stage is off or the tenant has no TTFT objective (an infinite target).
    """
    slack = config.ttft_slack_frac
    if slack is None or not math.isfinite(ttft_target_s):
        return True
    return estimate_s <= slack * ttft_target_s
