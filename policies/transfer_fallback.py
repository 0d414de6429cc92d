"""Whether a tenant group's KV-transfer path is unusable for its tenants, judged on one control window.

The router's circuit breaker (:mod:`policies.transfer_health`) protects each request: once half the remote legs
of its window fail, new requests go local. It does not free the prefill pool those requests no longer use, and a
path that is slow rather than failing never trips it. At the control interval the same path is judged here, on the
window every policy sees, and two stages act on the answer:

* the safety guard (:mod:`policies.guard`) lets a move **toward aggregated serving** (fewer prefill instances, no
  fewer decode instances) through at once, past its step limit, cooldown, hysteresis and pending-change hold: with
  the remote path gone the prefill pool serves nobody, and every tick it stays up the decode pool alone takes the
  whole load (measured on a generated scenario: a switch to ``aggregated`` 10 s into a transfer incident kept
  97 % of the aggregated rule's goodput when the move was let through at once, 14 % when it was paced at one
  instance per minute);
* the rule selector (:mod:`policies.rule_selector`, ``transfer_fallback``) switches the group to its
  ``aggregated`` rule at once instead of waiting out its patience.

The path is **unusable** when the window's remote legs number at least the breaker's ``min_samples`` (estimated
from the tenants' request rates and remote fractions) and either

* their failed fraction reaches the breaker's ``unhealthy_frac``, or
* their p95 transfer time reaches the **loosest** TTFT objective of the group's tenants: one remote request in
  twenty then misses every tenant's TTFT objective on its transfer alone, before it queues or prefills.

Unknown values (no transfers, no rates) never make a path unusable: a group serving aggregated has no transfers
to judge, and a controller's first ticks have no rates.
"""

from __future__ import annotations

import math

from policies.base import PolicyContext
from policies.schema import MetricWindow
from policies.transfer_health import DEFAULT_MIN_SAMPLES, DEFAULT_UNHEALTHY_FRAC

__all__ = ["remote_legs", "remote_path_unusable"]


def remote_legs(window: MetricWindow, context: PolicyContext, group: str) -> float | None:
    """Estimated remote legs of ``group`` in the window (Σ rate × remote fraction × window length).

    ``None`` when no tenant of the group has both a request rate and a remote fraction.
    """
    legs = 0.0
    known = False
    for tenant in context.tenants_of(group):
        tw = window.tenants.get(tenant.name)
        if tw is None or tw.request_rate_rps is None or tw.remote_prefill_frac is None:
            continue
        known = True
        legs += tw.request_rate_rps * tw.remote_prefill_frac * window.window_s
    return legs if known else None


def remote_path_unusable(
    window: MetricWindow,
    context: PolicyContext,
    group: str,
    *,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    unhealthy_frac: float = DEFAULT_UNHEALTHY_FRAC,
) -> bool:
    """Whether ``group``'s KV-transfer path was unusable in ``window`` (module docstring)."""
    gw = window.groups.get(group)
    if gw is None:
        return False
    legs = remote_legs(window, context, group)
    if legs is None or legs < min_samples:
        return False
    failed = gw.kv_transfer_failure_frac
    if failed is not None and failed >= unhealthy_frac:
        return True
    p95_s = gw.kv_transfer_time_p95_s
    if p95_s is None:
        return False
    objectives = [t.slo.ttft_target_s() for t in context.tenants_of(group)]
    loosest_s = max(objectives, default=math.inf)
    return math.isfinite(loosest_s) and p95_s >= loosest_s
