"""The per-request route decision: remote prefill or local prefill, and why.

This is the one copy of the routing logic; the simulator, the router and the evaluation harness all call
:func:`decide_route`. It is total: for any valid input it returns a decision and never raises.

Order of the checks (first match wins):

1. ``disaggregation_enabled`` false (the rollback / aggregated-only policy) → local.
2. ``enabled_models`` set and the model not in it → local (rollout scope).
3. ``traffic_percent`` < 100 and the request id not sampled → local. Sampling is a hash of the request id,
   so the same request always takes the same side.
4. KV transfer path unhealthy → the ``on_kv_transfer_timeout`` fallback (local).
5. No healthy prefill instance → local.
6. A prompt-length bucket containing the input length → the bucket's route.
7. Effective input = input − prefix-cache hit tokens on the chosen decode instance when
   ``prefer_local_on_prefix_hit`` is set, else the full input. Effective input ≤ ``max_local_input_tokens``
   → local, with reason *prefix hit* when the full input was above that bound, else *short prompt*.
8. Expected output < ``min_expected_output_tokens`` → local (short output: the decode phase is too short for
   interference to matter, so the transfer is not worth paying).
9. Prefill queue wait (when known) > ``max_prefill_queue_wait_s`` → the ``on_prefill_queue_overload``
    fallback (local).
10. Effective input ≥ ``min_remote_input_tokens``: remote, unless ``require_decode_pool_pressure`` is set
    and the decode instance is known to be below ``decode_pressure_threshold_frac`` (then local).
11. **The gap** (``max_local_input_tokens`` < effective input < ``min_remote_input_tokens``): remote only when
    the decode instance is known to be under pressure (≥ the threshold) — offloading a medium prompt helps
    only when decoding streams would be stalled by it; otherwise local. Unknown pressure in the gap → local
    (the cheaper, transfer-free side).

Unknown live values (``None``) never block the remote path by themselves, except in the gap (rule 11).

Rules 1-5 hold for every :class:`~policies.schema.RouteRule` (they are facts of the deployment: rollback,
rollout scope, a broken transfer path, no prefill capacity). From rule 6 on, a peer-system baseline rule
replaces this project's rules, reading its parameters from the same thresholds:

* ``aggregated_only``: local. ``always_remote`` (B1): remote.
* ``llmd_noncached`` (B2): remote iff uncached ≥ ``min_remote_input_tokens``.
* ``dynamo_isl_bounding`` (B3): local iff uncached < ``min_remote_input_tokens`` and
  uncached / input < ``uncached_ratio_threshold_frac``; else remote.
* ``dynamo_isl_or_load`` (B4): local iff (the B3 bypass holds, or the prefill instance is busy:
  ``prefill_active_tokens`` > ``prefill_busy_factor`` × ``prefill_max_batched_tokens``) and the decode instance
  is not busy (``decode_kv_usage_frac`` ≤ ``decode_pressure_threshold_frac``); else remote.
* ``dynamo_legacy`` (B5): remote iff uncached > ``max_local_input_tokens`` and
  ``prefill_queue_requests`` < ``max_prefill_queue_requests`` (unknown queue counts as empty).
"""

from __future__ import annotations

import zlib

from policies.schema import LiveState, RequestFeatures, Route, RouteDecision, RouteReason, RouteRule, RoutingThresholds

__all__ = ["decide_route", "rollout_sampled"]

_LOCAL = Route.LOCAL_PREFILL
_REMOTE = Route.REMOTE_PREFILL

# Decisions are immutable: share one instance per (route, reason).
_DECISIONS = {(route, reason): RouteDecision(route, reason) for route in Route for reason in RouteReason}


def rollout_sampled(request_id: str, traffic_percent: float) -> bool:
    """Deterministic per-request sampling: the same id is always in or out for a given percentage."""
    if traffic_percent >= 100.0:
        return True
    if traffic_percent <= 0.0:
        return False
    bucket = zlib.crc32(request_id.encode("utf-8", "surrogatepass")) % 10_000
    return bucket < traffic_percent * 100.0


def decide_route(  # noqa: C901 - a flat, documented rule list reads best as one function
    features: RequestFeatures, thresholds: RoutingThresholds, live: LiveState
) -> RouteDecision:
    """Choose remote or local prefill for one request (see the module docstring for the rules)."""
    t = thresholds
    if not t.disaggregation_enabled:
        return _DECISIONS[_LOCAL, RouteReason.DISAGGREGATION_DISABLED]
    if t.enabled_models is not None and features.model not in t.enabled_models:
        return _DECISIONS[_LOCAL, RouteReason.ROLLOUT_MODEL_NOT_ENABLED]
    if t.traffic_percent < 100.0 and not rollout_sampled(features.request_id, t.traffic_percent):
        return _DECISIONS[_LOCAL, RouteReason.ROLLOUT_NOT_SAMPLED]
    if not live.kv_transfer_healthy:
        return _DECISIONS[_LOCAL, RouteReason.KV_TRANSFER_UNHEALTHY]
    if live.num_prefill_instances <= 0:
        return _DECISIONS[_LOCAL, RouteReason.NO_PREFILL_INSTANCE]
    input_tokens = max(features.input_tokens, 0)
    if t.rule is not RouteRule.PDCTL:
        return _baseline_route(input_tokens, t, live)
    for bucket in t.buckets:
        if bucket.contains(input_tokens):
            return _DECISIONS[bucket.route, RouteReason.BUCKET_RULE]
    effective = input_tokens
    if t.prefer_local_on_prefix_hit:
        effective = max(input_tokens - max(live.prefix_hit_tokens, 0), 0)
    if effective <= t.max_local_input_tokens:
        if input_tokens > t.max_local_input_tokens:
            return _DECISIONS[_LOCAL, RouteReason.PREFIX_CACHE_HIT]
        return _DECISIONS[_LOCAL, RouteReason.SHORT_PROMPT]
    if features.expected_output_tokens < t.min_expected_output_tokens:
        return _DECISIONS[_LOCAL, RouteReason.SHORT_OUTPUT]
    wait_s = live.prefill_queue_wait_s
    if wait_s is not None and wait_s > t.max_prefill_queue_wait_s:
        return _DECISIONS[_LOCAL, RouteReason.PREFILL_QUEUE_OVERLOAD]
    pressure = live.decode_pressure_frac
    if effective >= t.min_remote_input_tokens:
        if t.require_decode_pool_pressure and pressure is not None and pressure < t.decode_pressure_threshold_frac:
            return _DECISIONS[_LOCAL, RouteReason.NO_DECODE_PRESSURE]
        return _DECISIONS[_REMOTE, RouteReason.LONG_PROMPT]
    if pressure is not None and pressure >= t.decode_pressure_threshold_frac:
        return _DECISIONS[_REMOTE, RouteReason.GAP_DECODE_PRESSURE]
    return _DECISIONS[_LOCAL, RouteReason.GAP_NO_PRESSURE]


def _baseline_route(input_tokens: int, t: RoutingThresholds, live: LiveState) -> RouteDecision:
    """Peer-system rules B1-B5 (see the module docstring)."""
    rule = t.rule
    if rule is RouteRule.AGGREGATED_ONLY:
        return _DECISIONS[_LOCAL, RouteReason.BASELINE_AGGREGATED]
    if rule is RouteRule.ALWAYS_REMOTE:
        return _DECISIONS[_REMOTE, RouteReason.BASELINE_ALWAYS_REMOTE]
    uncached = max(input_tokens - max(live.prefix_hit_tokens, 0), 0)
    if rule is RouteRule.LLMD_NONCACHED:
        if uncached >= t.min_remote_input_tokens:
            return _DECISIONS[_REMOTE, RouteReason.BASELINE_UNCACHED_ABOVE]
        return _DECISIONS[_LOCAL, RouteReason.BASELINE_UNCACHED_BELOW]
    if rule is RouteRule.DYNAMO_LEGACY:
        if uncached <= t.max_local_input_tokens:
            return _DECISIONS[_LOCAL, RouteReason.BASELINE_UNCACHED_BELOW]
        queued = live.prefill_queue_requests or 0
        if queued >= t.max_prefill_queue_requests:
            return _DECISIONS[_LOCAL, RouteReason.BASELINE_PREFILL_QUEUE_FULL]
        return _DECISIONS[_REMOTE, RouteReason.BASELINE_UNCACHED_ABOVE]
    ratio = uncached / input_tokens if input_tokens > 0 else 0.0
    isl_bypass = uncached < t.min_remote_input_tokens and ratio < t.uncached_ratio_threshold_frac
    if rule is RouteRule.DYNAMO_ISL_BOUNDING:
        if isl_bypass:
            return _DECISIONS[_LOCAL, RouteReason.BASELINE_ISL_BOUNDED]
        return _DECISIONS[_REMOTE, RouteReason.BASELINE_UNCACHED_ABOVE]
    # DYNAMO_ISL_OR_LOAD
    prefill_busy = (
        live.prefill_active_tokens is not None
        and live.prefill_max_batched_tokens is not None
        and live.prefill_active_tokens > t.prefill_busy_factor * live.prefill_max_batched_tokens
    )
    if not (isl_bypass or prefill_busy):
        return _DECISIONS[_REMOTE, RouteReason.BASELINE_UNCACHED_ABOVE]
    decode_usage = live.decode_kv_usage_frac if live.decode_kv_usage_frac is not None else live.decode_pressure_frac
    if decode_usage is not None and decode_usage > t.decode_pressure_threshold_frac:
        return _DECISIONS[_REMOTE, RouteReason.BASELINE_DECODE_BUSY_VETO]
    if isl_bypass:
        return _DECISIONS[_LOCAL, RouteReason.BASELINE_ISL_BOUNDED]
    return _DECISIONS[_LOCAL, RouteReason.BASELINE_PREFILL_BUSY]
