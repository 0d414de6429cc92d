"""Policy files: the seed's YAML format, extended with tenants, routes, buckets, SLOs and pool bounds.

A policy file is validated as a whole on load; every problem is reported as one line
``FILE:LINE: field.path: message`` and nothing of an invalid file takes effect.

Format (every key optional unless noted; ``*_ms`` keys are milliseconds, converted to seconds on load)::

    version: 1
    description: free text
    mode: disaggregated | aggregated_only      # aggregated_only = one-step rollback, every tenant local
    expires_at: 2026-12-01T00:00:00Z           # overrides: ignored after this instant
    pd_disaggregation_policy:                  # the seed block: defaults for every tenant
      rule: pdctl | aggregated_only | always_remote | llmd_noncached | dynamo_isl_bounding
            | dynamo_isl_or_load | dynamo_legacy   # per-request rule (policies.routing); peers' rules = baselines
      baseline_params: {uncached_ratio_threshold_frac, max_prefill_queue_requests, prefill_busy_factor}
      remote_prefill: {min_input_tokens, max_prefill_queue_wait_ms, min_expected_output_tokens,
                       require_decode_pool_pressure, decode_pressure_threshold_perc}
      local_prefill: {max_input_tokens, prefer_when_prefix_cache_hit}
    fallback: {on_kv_transfer_timeout, on_prefill_queue_overload}
    rollout: {enabled_models, traffic_percent, remote_prefill_when: {input_tokens_gte},
              stream_response, fallback_to_aggregated}
    slo: {ttft_p95_ms, ttft_p99_ms, tpot_p95_ms, tpot_p99_ms}
    tenant_groups:
      - {name (required), gpu_budget (required), gpus_per_instance,
         pools: {prefill: {min, max}, decode: {min, max}}}
    tenants:
      - name (required), group, priority, slo, expected_output_tokens,
        match: {tenant_ids, api_keys, models},
        mode, pd_disaggregation_policy, fallback, rollout,
        prompt_length_buckets: [{min_input_tokens, max_input_tokens, route}]
    routes:                                    # model rules for requests with no tenant id
      - {model: NAME, tenant: NAME}

**Precedence** (most specific wins, field by field): a tenant's prompt-length bucket > the tenant's own
``pd_disaggregation_policy`` / ``fallback`` / ``rollout`` / ``mode`` fields > the file's top-level blocks >
built-in defaults (:class:`policies.schema.RoutingThresholds`). Within one level,
``rollout.remote_prefill_when.input_tokens_gte`` wins over ``remote_prefill.min_input_tokens``.
A request's tenant is, in order: its tenant id (header) if a tenant is named so or lists it in
``match.tenant_ids``; its API key in some tenant's ``match.api_keys``; its model in ``match.models`` or the
first ``routes`` rule naming the model; else the tenant ``default`` (built in when the file has none).

**The gap** between ``local_prefill.max_input_tokens`` and ``remote_prefill.min_input_tokens`` is decided
by decode pressure (see :mod:`policies.routing`, rule 11).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from policies.schema import FallbackAction, RoutingThresholds, Slo, Tenant, TenantGroup
from policies.threshold_fields import read_thresholds

__all__ = [
    "DEFAULT_TENANT",
    "PolicyFile",
    "PolicyFileError",
    "ResolvedPolicy",
    "TenantPolicy",
    "dump_policy_yaml",
    "load_policy_data",
    "load_policy_file",
    "load_policy_text",
    "resolve_policy",
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
    """A whole policy file (see the module docstring for the format)."""

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


# --------------------------------------------------------------------------------------------- resolution


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """A tenant's fully resolved policy."""

    tenant: Tenant
    thresholds: RoutingThresholds
    expected_output_tokens: int | None = None
    stream_response: bool = True


@dataclass(frozen=True, slots=True)
class ResolvedPolicy:
    """A policy file resolved per tenant, ready for the route decision and the controller."""

    tenants: dict[str, TenantPolicy]
    groups: dict[str, TenantGroup]
    tenant_ids: dict[str, str] = field(default_factory=dict)
    api_keys: dict[str, str] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)
    expires_at: datetime | None = None
    source: str = ""

    def identify_tenant(self, tenant_id: str | None = None, api_key: str | None = None, model: str = "") -> str:
        """Attribute a request to a tenant (precedence in the module docstring)."""
        if tenant_id:
            if tenant_id in self.tenants:
                return tenant_id
            if tenant_id in self.tenant_ids:
                return self.tenant_ids[tenant_id]
        if api_key and api_key in self.api_keys:
            return self.api_keys[api_key]
        if model and model in self.models:
            return self.models[model]
        return DEFAULT_TENANT

    def thresholds_for(self, tenant: str) -> RoutingThresholds:
        """Thresholds of ``tenant``, or of the default tenant when unknown."""
        policy = self.tenants.get(tenant) or self.tenants[DEFAULT_TENANT]
        return policy.thresholds


def _apply_level(level: PolicyFile | TenantBlock) -> dict[str, Any]:
    """The thresholds fields one level sets (:data:`policies.threshold_fields.THRESHOLD_FIELDS`)."""
    values = read_thresholds(level, tenant=isinstance(level, TenantBlock))
    if level.rollout.fallback_to_aggregated is False and level.fallback.on_kv_transfer_timeout is None:
        values["on_kv_transfer_timeout"] = FallbackAction.RETRY_REMOTE_PREFILL
    return values


class _ResolveError(ValueError):
    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def _thresholds(base: RoutingThresholds, values: Mapping[str, Any], loc: tuple[str | int, ...]) -> RoutingThresholds:
    try:
        return replace(base, **values)
    except ValueError as exc:
        merged = {
            **{
                "max_local_input_tokens": base.max_local_input_tokens,
                "min_remote_input_tokens": base.min_remote_input_tokens,
            },
            **values,
        }
        raise _ResolveError(
            loc,
            f"{exc} (resolved local_prefill.max_input_tokens={merged['max_local_input_tokens']}, "
            f"remote_prefill.min_input_tokens={merged['min_remote_input_tokens']})",
        ) from exc


def resolve_policy(policy: PolicyFile, source: str = "") -> ResolvedPolicy:
    """Resolve a validated file per tenant. Raises :class:`PolicyFileError` on cross-level conflicts."""
    try:
        return _resolve(policy, source)
    except _ResolveError as exc:
        raise PolicyFileError([PolicyProblem(source or "<policy>", None, _dotted(exc.loc), str(exc))]) from exc


def _resolve(policy: PolicyFile, source: str) -> ResolvedPolicy:
    for loc, message in cross_reference_problems(policy):
        raise _ResolveError(loc, message)
    top = _thresholds(RoutingThresholds(), _apply_level(policy), ("pd_disaggregation_policy",))
    default_slo = policy.slo.to_slo() if policy.slo is not None else Slo()
    default_stream = policy.rollout.stream_response if policy.rollout.stream_response is not None else True
    groups = {
        g.name: TenantGroup(
            name=g.name,
            tenants=tuple(t.name for t in policy.tenants if (t.group or DEFAULT_GROUP) == g.name),
            gpu_budget=g.gpu_budget,
            min_prefill=g.pools.prefill.min,
            max_prefill=g.pools.prefill.max,
            min_decode=g.pools.decode.min,
            max_decode=g.pools.decode.max,
            gpus_per_instance=g.gpus_per_instance,
        )
        for g in policy.tenant_groups
    }
    tenants: dict[str, TenantPolicy] = {}
    tenant_ids: dict[str, str] = {}
    api_keys: dict[str, str] = {}
    models: dict[str, str] = {}
    for index, block in enumerate(policy.tenants):
        thresholds = _thresholds(top, _apply_level(block), ("tenants", index, "pd_disaggregation_policy"))
        slo = block.slo.to_slo() if block.slo is not None else default_slo
        stream = block.rollout.stream_response if block.rollout.stream_response is not None else default_stream
        tenants[block.name] = TenantPolicy(
            tenant=Tenant(block.name, block.group or DEFAULT_GROUP, slo, block.priority),
            thresholds=thresholds,
            expected_output_tokens=block.expected_output_tokens,
            stream_response=stream,
        )
        for tid in block.match.tenant_ids:
            tenant_ids.setdefault(tid, block.name)
        for key in block.match.api_keys:
            api_keys.setdefault(key, block.name)
        for model in block.match.models:
            models.setdefault(model, block.name)
    if DEFAULT_TENANT not in tenants:
        tenants[DEFAULT_TENANT] = TenantPolicy(
            tenant=Tenant(DEFAULT_TENANT, DEFAULT_GROUP, default_slo),
            thresholds=top,
            stream_response=default_stream,
        )
    for rule in policy.routes:
        models.setdefault(rule.model, rule.tenant)
    return ResolvedPolicy(tenants, groups, tenant_ids, api_keys, models, policy.expires_at, source)


# ------------------------------------------------------------------------------------------- loading


@dataclass(frozen=True, slots=True)
class PolicyProblem:
    """One problem found in a policy file."""

    source: str
    line: int | None
    field_path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line is not None else self.source
        text = f"{where}: {self.field_path or '<top>'}: {self.message}"
        return text.replace("\r", "\\r").replace("\n", "\\n")  # always one line


class PolicyFileError(ValueError):
    """A policy file was refused; ``problems`` holds one entry per problem."""

    def __init__(self, problems: Sequence[PolicyProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


def _dotted(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        name = part if part.isidentifier() or part.replace("-", "_").isidentifier() else repr(part)
        out += f".{name}" if out else name
    return out


class _LineIndex:
    """Maps pydantic error locations to YAML line numbers; finds duplicate keys on the way."""

    def __init__(self, root: yaml.Node | None) -> None:
        self.root = root

    def line_of(self, loc: Sequence[str | int]) -> int | None:
        node = self.root
        line = None if node is None else node.start_mark.line + 1
        for part in loc:
            child = self._child(node, part)
            if child is None:
                break
            node = child
            line = node.start_mark.line + 1
        return line

    @staticmethod
    def _child(node: yaml.Node | None, part: str | int) -> yaml.Node | None:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == part:
                    return value if isinstance(value, yaml.Node) else None
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            child = node.value[part]
            return child if isinstance(child, yaml.Node) else None
        return None

    def duplicate_keys(self) -> Iterator[tuple[int, str, str]]:
        """Yield (line, path, key) for every repeated key of a mapping."""
        stack: list[tuple[yaml.Node, str]] = [] if self.root is None else [(self.root, "")]
        while stack:
            node, path = stack.pop()
            if isinstance(node, yaml.MappingNode):
                seen: set[str] = set()
                for key, value in node.value:
                    name = str(key.value)
                    child_path = f"{path}.{name}" if path else name
                    if name in seen:
                        yield key.start_mark.line + 1, child_path, name
                    seen.add(name)
                    stack.append((value, child_path))
            elif isinstance(node, yaml.SequenceNode):
                stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node.value))


def load_policy_text(text: str, source: str = "<string>") -> PolicyFile:
    """Parse and validate a policy from YAML text. Raises :class:`PolicyFileError` naming every problem."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PolicyFileError([PolicyProblem(source, line, "", f"not valid YAML: {problem}")]) from exc
    index = _LineIndex(root)
    problems = [
        PolicyProblem(source, line, path, f"duplicate key {key!r}") for line, path, key in index.duplicate_keys()
    ]
    if data is None:
        problems.append(PolicyProblem(source, None, "", "empty policy file"))
    elif not isinstance(data, dict):
        problems.append(PolicyProblem(source, 1, "", f"expected a mapping at the top level, got {type(data).__name__}"))
    if problems:
        raise PolicyFileError(problems)
    return _validate(data, source, index)


def load_policy_data(data: object, source: str = "<document>") -> PolicyFile:
    """Validate a policy document that is already parsed (e.g. JSON from the admin API), as a file would be.

    The same checks as :func:`load_policy_text`, without text: problems name the field but no line.
    Raises :class:`PolicyFileError` naming every problem.
    """
    return _validate(data, source, _LineIndex(None))


def _validate(data: object, source: str, index: _LineIndex) -> PolicyFile:
    if not isinstance(data, Mapping):
        kind = type(data).__name__
        raise PolicyFileError([PolicyProblem(source, None, "", f"expected a mapping at the top level, got {kind}")])
    try:
        policy = PolicyFile.model_validate(dict(data))
    except ValidationError as exc:
        raise PolicyFileError(
            [
                PolicyProblem(source, index.line_of(err["loc"]), _dotted(err["loc"]), _message(err))
                for err in exc.errors(include_url=False)
            ]
        ) from None
    cross = cross_reference_problems(policy)
    if cross:
        raise PolicyFileError([PolicyProblem(source, index.line_of(loc), _dotted(loc), msg) for loc, msg in cross])
    try:
        _resolve(policy, source)  # conflicts between levels (e.g. an inverted tenant threshold), with their line
    except _ResolveError as exc:
        raise PolicyFileError([PolicyProblem(source, index.line_of(exc.loc), _dotted(exc.loc), str(exc))]) from None
    return policy


def _message(err: Mapping[str, Any]) -> str:
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return "unknown key"
    text = str(err.get("msg", "invalid"))
    value = err.get("input")
    if kind not in ("missing", "value_error") and not isinstance(value, dict | list):
        text += f" (got {value!r})"
    return text.removeprefix("Value error, ")


def load_policy_file(path: str | Path) -> PolicyFile:
    """Read and validate a policy file; the error names the file, line and field of each problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyFileError([PolicyProblem(str(p), None, "", f"cannot read: {exc}")]) from exc
    return load_policy_text(text, str(p))


def dump_policy_yaml(policy: PolicyFile) -> str:
    """Serialise a policy file back to YAML (only the keys that were set; round-trips through the loader)."""
    data = policy.model_dump(mode="json", exclude_unset=True)
    return yaml.safe_dump(data, sort_keys=False)
