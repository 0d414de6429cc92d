"""The shared contract: tenants, SLOs, request features, route decisions, actions and metric windows.

Everything here is plain data. Hot-path types (used once per request by the simulator and the router) are
frozen, slotted dataclasses so that building one costs well under a microsecond; configuration types that a
person writes are pydantic models (see :mod:`policies.policy_file`).

Units are seconds, tokens, bytes and fractions (0-1) throughout; names carry them.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from policies.scoring import meets_slo

__all__ = [
    "SCHEMA_VERSION",
    "STAGES",
    "ControlAction",
    "FallbackAction",
    "GroupWindow",
    "LengthBucket",
    "LiveState",
    "MetricWindow",
    "PoolTargets",
    "RequestFeatures",
    "Route",
    "RouteDecision",
    "RouteReason",
    "RouteRule",
    "RoutingThresholds",
    "Slo",
    "Tenant",
    "TenantGroup",
    "TenantWindow",
]

SCHEMA_VERSION = 1
"""Bump when any observation feature, action field or route reason changes meaning."""

STAGES: tuple[str, ...] = (
    "request_queue_wait",
    "prefill_compute_time",
    "kv_cache_pack_time",
    "kv_cache_transfer_time",
    "kv_cache_unpack_time",
    "decode_queue_wait",
    "first_token_emit_time",
    "per_token_decode_time",
)
"""Per-request stage names every request records, simulated or live (``pdctl_request_stage_seconds{stage}``)."""


class Route(enum.StrEnum):
    """Where a request's prompt is prefilled."""

    REMOTE_PREFILL = "remote_prefill"
    """On a prefill instance; the KV cache is then transferred to a decode instance."""
    LOCAL_PREFILL = "local_prefill"
    """On the decode instance itself (aggregated prefill + decode)."""


class RouteReason(enum.StrEnum):
    """Why a route was chosen. Append-only: values are exported as metric labels."""

    ROLLBACK_AGGREGATED = "rollback_aggregated"
    DISAGGREGATION_DISABLED = "disaggregation_disabled"
    ROLLOUT_MODEL_NOT_ENABLED = "rollout_model_not_enabled"
    ROLLOUT_NOT_SAMPLED = "rollout_not_sampled"
    KV_TRANSFER_UNHEALTHY = "kv_transfer_unhealthy"
    NO_PREFILL_INSTANCE = "no_prefill_instance"
    PREFIX_CACHE_HIT = "prefix_cache_hit"
    SHORT_PROMPT = "short_prompt"
    SHORT_OUTPUT = "short_output"
    PREFILL_QUEUE_OVERLOAD = "prefill_queue_overload"
    NO_DECODE_PRESSURE = "no_decode_pressure"
    LONG_PROMPT = "long_prompt"
    GAP_DECODE_PRESSURE = "gap_decode_pressure"
    GAP_NO_PRESSURE = "gap_no_pressure"
    BUCKET_RULE = "bucket_rule"
    FALLBACK_TRANSFER_FAILED = "fallback_transfer_failed"
    FALLBACK_PREFILL_ERROR = "fallback_prefill_error"
    BASELINE_ALWAYS_REMOTE = "baseline_always_remote"
    BASELINE_AGGREGATED = "baseline_aggregated"
    BASELINE_UNCACHED_ABOVE = "baseline_uncached_above"
    BASELINE_UNCACHED_BELOW = "baseline_uncached_below"
    BASELINE_ISL_BOUNDED = "baseline_isl_bounded"
    BASELINE_PREFILL_BUSY = "baseline_prefill_busy"
    BASELINE_DECODE_BUSY_VETO = "baseline_decode_busy_veto"
    BASELINE_PREFILL_QUEUE_FULL = "baseline_prefill_queue_full"
    ADMISSION_REFUSED = "admission_refused"
    """Refused at the door by :mod:`policies.admission` (its first token would have come too late)."""


class RouteRule(enum.StrEnum):
    """Which per-request rule :func:`policies.routing.decide_route` applies.

    ``pdctl`` is this project's rule (the seed's policy, documented in :mod:`policies.routing`); the others are
    the peer systems' rules, kept in the same core so that baselines are evaluated by the very same simulator
    and router code paths (``../shared/reference/peer-systems.md`` §8, ids B1-B5).
    """

    PDCTL = "pdctl"
    AGGREGATED_ONLY = "aggregated_only"
    """Always local (the aggregated-serving baseline)."""
    ALWAYS_REMOTE = "always_remote"
    """B1: vLLM production-stack / SGLang: every request prefilled remotely."""
    LLMD_NONCACHED = "llmd_noncached"
    """B2: llm-d ``prefix-based-pd-decider``: remote iff uncached ≥ ``min_remote_input_tokens`` (N)."""
    DYNAMO_ISL_BOUNDING = "dynamo_isl_bounding"
    """B3: Dynamo ``isl_bounding``: local iff eff. ISL < ``min_remote_input_tokens`` and eff/prompt < ratio."""
    DYNAMO_ISL_OR_LOAD = "dynamo_isl_or_load"
    """B4: Dynamo ``isl_or_load`` with the decode-busy gate."""
    DYNAMO_LEGACY = "dynamo_legacy"
    """B5: legacy Dynamo: remote iff uncached > ``max_local_input_tokens`` and prefill queue < max requests."""


class FallbackAction(enum.StrEnum):
    """What to do when the remote path cannot be used.

    ``local_aggregated_serving`` and ``local_prefill`` both prefill on the decode instance; the first is the
    seed's term for a transfer-health fallback (the tenant is served aggregated while the transfer path is
    unhealthy), the second a per-request choice. ``retry_remote_prefill`` tries another prefill instance once
    before falling back to local prefill.
    """

    LOCAL_AGGREGATED_SERVING = "local_aggregated_serving"
    LOCAL_PREFILL = "local_prefill"
    RETRY_REMOTE_PREFILL = "retry_remote_prefill"


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency objectives of one tenant, in seconds. ``None`` = no objective on that quantile."""

    ttft_p95_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p95_s: float | None = None
    tpot_p99_s: float | None = None

    def ttft_target_s(self) -> float:
        """Per-request TTFT bound used to count a request as meeting the SLO (the tightest set quantile)."""
        values = [v for v in (self.ttft_p95_s, self.ttft_p99_s) if v is not None]
        return min(values) if values else math.inf

    def tpot_target_s(self) -> float:
        """Per-request TPOT bound used to count a request as meeting the SLO."""
        values = [v for v in (self.tpot_p95_s, self.tpot_p99_s) if v is not None]
        return min(values) if values else math.inf

    def is_met(self, ttft_s: float, tpot_s: float) -> bool:
        """Whether one finished request's TTFT and mean TPOT meet both objectives (:mod:`policies.scoring`)."""
        return meets_slo(ttft_s, tpot_s, self.ttft_target_s(), self.tpot_target_s())


@dataclass(frozen=True, slots=True)
class RoutingThresholds:
    """The per-tenant knobs of the route decision, in internal units.

    Input lengths at or below ``max_local_input_tokens`` go local; at or above ``min_remote_input_tokens``
    go remote when the remaining conditions hold. Between the two (the *gap*) a request goes remote only when
    the decode pool is under pressure and the prefill queue is within bounds
    (see :func:`policies.routing.decide_route`).
    """

    disaggregation_enabled: bool = True
    min_remote_input_tokens: int = 2048
    max_local_input_tokens: int = 1024
    max_prefill_queue_wait_s: float = 0.3
    min_expected_output_tokens: int = 128
    require_decode_pool_pressure: bool = True
    decode_pressure_threshold_frac: float = 0.5
    prefer_local_on_prefix_hit: bool = True
    on_kv_transfer_timeout: FallbackAction = FallbackAction.LOCAL_AGGREGATED_SERVING
    on_prefill_queue_overload: FallbackAction = FallbackAction.LOCAL_PREFILL
    traffic_percent: float = 100.0
    enabled_models: frozenset[str] | None = None
    """Models for which disaggregation may be used; ``None`` = all models."""
    buckets: tuple[LengthBucket, ...] = ()
    """Prompt-length buckets with a fixed route; the first bucket containing the input length wins."""
    rule: RouteRule = RouteRule.PDCTL
    """The per-request rule; peer-system baselines reuse the thresholds above as their parameters."""
    uncached_ratio_threshold_frac: float = 0.7
    """Dynamo ``isl_bounding``: local only if uncached / prompt is below this."""
    max_prefill_queue_requests: int = 2
    """Legacy Dynamo: remote only while the prefill queue holds fewer requests than this."""
    prefill_busy_factor: float = 16.0
    """Dynamo ``isl_or_load``: a prefill instance is busy when active tokens > factor × max batched tokens."""

    def __post_init__(self) -> None:
        if self.min_remote_input_tokens < 0 or self.max_local_input_tokens < 0:
            raise ValueError("token thresholds must be >= 0")
        if self.max_local_input_tokens > self.min_remote_input_tokens:
            raise ValueError("max_local_input_tokens must be <= min_remote_input_tokens")
        if not 0.0 <= self.traffic_percent <= 100.0:
            raise ValueError("traffic_percent must be within 0-100")
        if not 0.0 <= self.decode_pressure_threshold_frac <= 1.0:
            raise ValueError("decode_pressure_threshold_frac must be within 0-1")
        if self.max_prefill_queue_wait_s < 0 or self.min_expected_output_tokens < 0:
            raise ValueError("thresholds must be >= 0")
        if not 0.0 <= self.uncached_ratio_threshold_frac <= 1.0:
            raise ValueError("uncached_ratio_threshold_frac must be within 0-1")
        if self.max_prefill_queue_requests < 0 or self.prefill_busy_factor < 0:
            raise ValueError("max_prefill_queue_requests and prefill_busy_factor must be >= 0")


@dataclass(frozen=True, slots=True)
class LengthBucket:
    """A prompt-length range ``[min_input_tokens, max_input_tokens]`` with a fixed route."""

    route: Route
    min_input_tokens: int = 0
    max_input_tokens: int | None = None

    def contains(self, input_tokens: int) -> bool:
        """Whether ``input_tokens`` falls in this bucket."""
        if input_tokens < self.min_input_tokens:
            return False
        return self.max_input_tokens is None or input_tokens <= self.max_input_tokens


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What is known about one request when it is routed."""

    request_id: str
    tenant: str
    input_tokens: int
    expected_output_tokens: int
    model: str = ""


@dataclass(frozen=True, slots=True)
class LiveState:
    """Live cluster state the route decision reads; ``None`` = unknown.

    Attributes:
        prefill_queue_wait_s: estimated wait before a new prefill starts on the least-loaded prefill instance.
        decode_pressure_frac: load of the chosen decode instance (max of KV usage and batch occupancy), 0-1.
        prefix_hit_tokens: prompt tokens already cached on the chosen decode instance.
        kv_transfer_healthy: whether the prefill→decode transfer path is currently healthy.
        num_prefill_instances: healthy prefill instances able to take the request.
        prefill_queue_requests: prefill legs in flight on the chosen prefill instance (legacy Dynamo rule).
        prefill_active_tokens: prompt tokens queued or running on the chosen prefill instance (Dynamo load rule).
        prefill_max_batched_tokens: that instance's ``max_num_batched_tokens``.
        decode_kv_usage_frac: KV usage of the chosen decode instance as last observed, without this request
            (decode-busy gate; see :mod:`policies.placement`).
    """

    prefill_queue_wait_s: float | None = None
    decode_pressure_frac: float | None = None
    prefix_hit_tokens: int = 0
    kv_transfer_healthy: bool = True
    num_prefill_instances: int = 1
    prefill_queue_requests: int | None = None
    prefill_active_tokens: float | None = None
    prefill_max_batched_tokens: int | None = None
    decode_kv_usage_frac: float | None = None


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The route chosen for one request and why."""

    route: Route
    reason: RouteReason

    @property
    def is_remote(self) -> bool:
        """True for remote prefill."""
        return self.route is Route.REMOTE_PREFILL


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant: who sends requests, its objectives and its weight in the reward."""

    name: str
    group: str
    slo: Slo = field(default_factory=Slo)
    priority: float = 1.0


@dataclass(frozen=True, slots=True)
class TenantGroup:
    """Tenants sharing one set of prefill and decode instances, with pool bounds."""

    name: str
    tenants: tuple[str, ...]
    gpu_budget: int
    min_prefill: int = 0
    max_prefill: int | None = None
    min_decode: int = 1
    max_decode: int | None = None
    gpus_per_instance: int = 1

    def __post_init__(self) -> None:
        if self.gpu_budget < 1 or self.gpus_per_instance < 1:
            raise ValueError(f"tenant group {self.name}: gpu_budget and gpus_per_instance must be >= 1")
        if self.min_decode < 1:
            raise ValueError(f"tenant group {self.name}: min_decode must be >= 1")
        if (self.min_prefill + self.min_decode) * self.gpus_per_instance > self.gpu_budget:
            raise ValueError(f"tenant group {self.name}: minimum pools exceed the GPU budget")

    @property
    def max_instances(self) -> int:
        """Instances the GPU budget allows."""
        return self.gpu_budget // self.gpus_per_instance


@dataclass(frozen=True, slots=True)
class PoolTargets:
    """Target instance counts of one tenant group."""

    num_prefill: int
    num_decode: int

    @property
    def num_instances(self) -> int:
        """Prefill plus decode instances."""
        return self.num_prefill + self.num_decode


@dataclass(frozen=True, slots=True)
class ControlAction:
    """What a policy decides each control interval.

    ``thresholds`` maps tenant → routing thresholds; ``pools`` maps tenant group → pool targets. A tenant or
    group missing from a map means "no opinion: keep what is running".
    """

    thresholds: dict[str, RoutingThresholds] = field(default_factory=dict)
    pools: dict[str, PoolTargets] = field(default_factory=dict)
    reason: str = ""
    policy_id: str = ""


@dataclass(frozen=True, slots=True)
class TenantWindow:
    """Per-tenant statistics over one window; ``None`` = the series was missing (unknown, not zero)."""

    request_rate_rps: float | None = None
    mean_input_tokens: float | None = None
    p95_input_tokens: float | None = None
    mean_output_tokens: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p95_s: float | None = None
    tpot_p99_s: float | None = None
    slo_attainment_frac: float | None = None
    goodput_rps: float | None = None
    remote_prefill_frac: float | None = None
    prefix_cache_hit_frac: float | None = None
    failed_rate_rps: float | None = None


@dataclass(frozen=True, slots=True)
class GroupWindow:
    """Per-tenant-group statistics over one window; ``None`` = unknown."""

    num_prefill: int
    num_decode: int
    pending_prefill: int = 0
    pending_decode: int = 0
    prefill_queue_wait_s: float | None = None
    prefill_queued_tokens: float | None = None
    decode_active_seqs: float | None = None
    decode_kv_usage_frac: float | None = None
    prefill_kv_usage_frac: float | None = None
    kv_transfer_time_p95_s: float | None = None
    kv_transfer_failure_frac: float | None = None
    prefix_cache_hit_frac: float | None = None
    prefill_queue_requests: float | None = None
    """Requests waiting on the prefill pool (sum over instances, ``vllm:num_requests_waiting``)."""
    decode_queue_requests: float | None = None
    """Requests waiting on the decode pool (sum over instances)."""


@dataclass(frozen=True, slots=True)
class MetricWindow:
    """One control interval of observations, from the simulator or from Prometheus (same type)."""

    end_s: float
    window_s: float
    tenants: dict[str, TenantWindow]
    groups: dict[str, GroupWindow]
    staleness_s: float = 0.0
    """Age of the newest sample at window end; large values mean the source is stale."""
