"""A validated policy file resolved per tenant: thresholds, SLOs, groups and the request → tenant maps.

**Precedence** (most specific wins, field by field) is described in :mod:`policies.policy_file`: a tenant's
level over the file's top-level blocks over the built-in defaults (:class:`policies.schema.RoutingThresholds`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from policies.policy_file.errors import PolicyFileError, PolicyProblem, dotted_path
from policies.policy_file.schema import (
    DEFAULT_GROUP,
    DEFAULT_TENANT,
    PolicyFile,
    TenantBlock,
    cross_reference_problems,
)
from policies.schema import FallbackAction, RoutingThresholds, Slo, Tenant, TenantGroup
from policies.threshold_fields import read_thresholds

__all__ = ["ResolveError", "ResolvedPolicy", "TenantPolicy", "resolve_located", "resolve_policy"]


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
        """Attribute a request to a tenant (precedence in :mod:`policies.policy_file`)."""
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

    def grouped_tenant_names(self) -> list[str]:
        """Tenants that belong to a declared group, in file order: the ones a per-group policy decides for.

        The implicit ``default`` tenant is among them only when the file declares a group named ``default``.
        """
        return [name for name, tp in self.tenants.items() if tp.tenant.group in self.groups]

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


class ResolveError(ValueError):
    """A conflict found while resolving, at ``loc`` (a pydantic-style location in the file)."""

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
        raise ResolveError(
            loc,
            f"{exc} (resolved local_prefill.max_input_tokens={merged['max_local_input_tokens']}, "
            f"remote_prefill.min_input_tokens={merged['min_remote_input_tokens']})",
        ) from exc


def resolve_policy(policy: PolicyFile, source: str = "") -> ResolvedPolicy:
    """Resolve a validated file per tenant. Raises :class:`PolicyFileError` on cross-level conflicts."""
    try:
        return resolve_located(policy, source)
    except ResolveError as exc:
        raise PolicyFileError([PolicyProblem(source or "<policy>", None, dotted_path(exc.loc), str(exc))]) from exc


def resolve_located(policy: PolicyFile, source: str) -> ResolvedPolicy:
    """Resolve a validated file per tenant. Raises :class:`ResolveError` naming where the first conflict is."""
    for loc, message in cross_reference_problems(policy):
        raise ResolveError(loc, message)
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
