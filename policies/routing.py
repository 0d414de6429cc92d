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
"""

from __future__ import annotations

import zlib

from policies.schema import LiveState, RequestFeatures, Route, RouteDecision, RouteReason, RoutingThresholds

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
