"""The pydantic schema of a policy file: one model per block, their own checks, and the cross-block checks.

The format and the meaning of every key are in :mod:`policies.policy_file`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from policies.schema import Slo

__all__ = [
    "DEFAULT_GROUP",
    "DEFAULT_TENANT",
    "BucketBlock",
    "DisaggregationBlock",
    "FallbackBlock",
    "PolicyFile",
    "TenantBlock",
    "TenantGroupBlock",
    "cross_reference_problems",
]

DEFAULT_TENANT = "default"
DEFAULT_GROUP = "default"

FallbackName = Literal["local_aggregated_serving", "local_prefill", "retry_remote_prefill"]
LocalFallbackName = Literal["local_aggregated_serving", "local_prefill"]
RouteName = Literal["remote_prefill", "local_prefill"]
ModeName = Literal["disaggregated", "aggregated_only"]
RouteRuleName = Literal[
    "pdctl",
    "aggregated_only",
    "always_remote",
    "llmd_noncached",
    "dynamo_isl_bounding",
    "dynamo_isl_or_load",
    "dynamo_legacy",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


NonNegInt = Annotated[int, Field(ge=0)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class RemotePrefillBlock(_Strict):
    """``pd_disaggregation_policy.remote_prefill``."""

    min_input_tokens: NonNegInt | None = None
    max_prefill_queue_wait_ms: NonNegFloat | None = None
    min_expected_output_tokens: NonNegInt | None = None
    require_decode_pool_pressure: bool | None = None
    decode_pressure_threshold_perc: Annotated[float, Field(ge=0, le=100)] | None = None


class LocalPrefillBlock(_Strict):
    """``pd_disaggregation_policy.local_prefill``."""

    max_input_tokens: NonNegInt | None = None
    prefer_when_prefix_cache_hit: bool | None = None


class BaselineParamsBlock(_Strict):
    """Parameters only the peer-system route rules read (``pd_disaggregation_policy.baseline_params``)."""

    uncached_ratio_threshold_frac: Annotated[float, Field(ge=0, le=1)] | None = None
    max_prefill_queue_requests: NonNegInt | None = None
    prefill_busy_factor: NonNegFloat | None = None


class DisaggregationBlock(_Strict):
    """The seed's ``pd_disaggregation_policy`` block (plus ``rule`` and ``baseline_params``)."""

    rule: RouteRuleName | None = None
    remote_prefill: RemotePrefillBlock = RemotePrefillBlock()
    local_prefill: LocalPrefillBlock = LocalPrefillBlock()
    baseline_params: BaselineParamsBlock = BaselineParamsBlock()

    @model_validator(mode="after")
    def _not_inverted(self) -> DisaggregationBlock:
        low, high = self.local_prefill.max_input_tokens, self.remote_prefill.min_input_tokens
        if low is not None and high is not None and low > high:
            raise ValueError(
                f"local_prefill.max_input_tokens ({low}) is above remote_prefill.min_input_tokens ({high})"
            )
        return self


class FallbackBlock(_Strict):
    """The seed's ``fallback`` block."""

    on_kv_transfer_timeout: FallbackName | None = None
    on_prefill_queue_overload: LocalFallbackName | None = None


class RemotePrefillWhen(_Strict):
    """``rollout.remote_prefill_when``."""

    input_tokens_gte: NonNegInt | None = None


class RolloutBlock(_Strict):
    """The seed's ``rollout`` block."""

    enabled_models: list[str] | None = None
    traffic_percent: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] | None = None
    remote_prefill_when: RemotePrefillWhen = RemotePrefillWhen()
    stream_response: bool | None = None
    fallback_to_aggregated: bool | None = None


class SloBlock(_Strict):
    """Latency objectives in milliseconds."""

    ttft_p95_ms: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    ttft_p99_ms: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    tpot_p95_ms: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    tpot_p99_ms: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None

    @model_validator(mode="after")
    def _quantiles_ordered(self) -> SloBlock:
        for kind in ("ttft", "tpot"):
            p95, p99 = getattr(self, f"{kind}_p95_ms"), getattr(self, f"{kind}_p99_ms")
            if p95 is not None and p99 is not None and p95 > p99:
                raise ValueError(f"{kind}_p95_ms ({p95}) is above {kind}_p99_ms ({p99})")
        return self

    def to_slo(self) -> Slo:
        """Convert to seconds."""

        def sec(v: float | None) -> float | None:
            return None if v is None else v / 1000.0

        return Slo(sec(self.ttft_p95_ms), sec(self.ttft_p99_ms), sec(self.tpot_p95_ms), sec(self.tpot_p99_ms))


class PoolBounds(_Strict):
    """Min/max instances of one pool."""

    min: NonNegInt = 0
    max: NonNegInt | None = None

    @model_validator(mode="after")
    def _ordered(self) -> PoolBounds:
        if self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


class PoolsBlock(_Strict):
    """Prefill and decode pool bounds."""

    prefill: PoolBounds = PoolBounds(min=0)
    decode: PoolBounds = PoolBounds(min=1)


class TenantGroupBlock(_Strict):
    """A tenant group and its GPU budget."""

    name: Annotated[str, Field(min_length=1)]
    gpu_budget: Annotated[int, Field(ge=1)]
    gpus_per_instance: Annotated[int, Field(ge=1)] = 1
    pools: PoolsBlock = PoolsBlock()

    @model_validator(mode="after")
    def _fits_budget(self) -> TenantGroupBlock:
        if self.pools.decode.min < 1:
            raise ValueError("pools.decode.min must be at least 1")
        needed = (self.pools.prefill.min + self.pools.decode.min) * self.gpus_per_instance
        if needed > self.gpu_budget:
            raise ValueError(f"minimum pools need {needed} GPUs, above gpu_budget {self.gpu_budget}")
        return self


class BucketBlock(_Strict):
    """A prompt-length bucket with a fixed route."""

    min_input_tokens: NonNegInt = 0
    max_input_tokens: NonNegInt | None = None
    route: RouteName

    @model_validator(mode="after")
    def _ordered(self) -> BucketBlock:
        if self.max_input_tokens is not None and self.min_input_tokens > self.max_input_tokens:
            raise ValueError(
                f"min_input_tokens ({self.min_input_tokens}) is above max_input_tokens ({self.max_input_tokens})"
            )
        return self


class MatchBlock(_Strict):
    """How requests are attributed to a tenant."""

    tenant_ids: list[str] = []
    api_keys: list[str] = []
    models: list[str] = []


class TenantBlock(_Strict):
    """One tenant's entry."""

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")]
    group: str | None = None
    priority: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0
    slo: SloBlock | None = None
    expected_output_tokens: NonNegInt | None = None
    match: MatchBlock = MatchBlock()
    mode: ModeName | None = None
    pd_disaggregation_policy: DisaggregationBlock = DisaggregationBlock()
    fallback: FallbackBlock = FallbackBlock()
    rollout: RolloutBlock = RolloutBlock()
    prompt_length_buckets: list[BucketBlock] = []


class ModelRoute(_Strict):
    """A model → tenant rule for requests that carry no tenant id."""

    model: Annotated[str, Field(min_length=1)]
    tenant: Annotated[str, Field(min_length=1)]


class PolicyFile(_Strict):
    """A whole policy file (see :mod:`policies.policy_file` for the format)."""

    version: Literal[1] = 1
    description: str = ""
    mode: ModeName = "disaggregated"
    expires_at: Annotated[datetime, Field(strict=False)] | None = None
    pd_disaggregation_policy: DisaggregationBlock = DisaggregationBlock()
    fallback: FallbackBlock = FallbackBlock()
    rollout: RolloutBlock = RolloutBlock()
    slo: SloBlock | None = None
    tenant_groups: list[TenantGroupBlock] = []
    tenants: list[TenantBlock] = []
    routes: list[ModelRoute] = []

    @field_validator("expires_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value

    @field_validator("tenants")
    @classmethod
    def _unique_tenants(cls, value: list[TenantBlock]) -> list[TenantBlock]:
        _no_duplicates([t.name for t in value], "tenant")
        return value

    @field_validator("tenant_groups")
    @classmethod
    def _unique_groups(cls, value: list[TenantGroupBlock]) -> list[TenantGroupBlock]:
        _no_duplicates([g.name for g in value], "tenant group")
        return value

    def is_expired(self, now: datetime) -> bool:
        """Whether this file's ``expires_at`` has passed at ``now``."""
        return self.expires_at is not None and now >= self.expires_at


def cross_reference_problems(policy: PolicyFile) -> list[tuple[tuple[str | int, ...], str]]:
    """Problems between parts of a file (unknown groups or tenants named elsewhere), with their locations."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    tenant_names = {t.name for t in policy.tenants} | {DEFAULT_TENANT}
    group_names = {g.name for g in policy.tenant_groups}
    for index, tenant in enumerate(policy.tenants):
        if tenant.group is not None and group_names and tenant.group not in group_names:
            problems.append((("tenants", index, "group"), f"unknown tenant group {tenant.group!r}"))
    for index, rule in enumerate(policy.routes):
        if rule.tenant not in tenant_names:
            problems.append((("routes", index, "tenant"), f"unknown tenant {rule.tenant!r}"))
    return problems


def _no_duplicates(names: Sequence[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"duplicate {what} {name!r}")
        seen.add(name)
