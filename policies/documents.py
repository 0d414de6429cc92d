"""Policy documents: a resolved policy plus an action, written back in the policy-file format.

The router's ``PUT /admin/policy`` accepts exactly what a person could write in a policy file (see
``docs/admin-api.md``). :func:`policy_document` builds that document from the resolved base policy with the
action's per-tenant thresholds in place, every tenant written out in full (no reliance on top-level
defaults), so that loading and resolving the document gives back the same per-tenant thresholds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.policy_file import DEFAULT_TENANT, ResolvedPolicy, TenantPolicy
from policies.schema import ControlAction, RoutingThresholds, Slo, TenantGroup
from policies.threshold_fields import to_file_scale, write_thresholds

__all__ = ["policy_document", "thresholds_block"]

_MS_PER_S = 1000.0


def _ms(value_s: float) -> float:
    return to_file_scale(value_s, _MS_PER_S)


def thresholds_block(t: RoutingThresholds) -> dict[str, Any]:
    """The per-tenant policy-file keys that resolve to ``t`` (mode, seed blocks, rollout, buckets).

    Written from :data:`policies.threshold_fields.THRESHOLD_FIELDS`, the table the loader reads these keys
    with; every field is written except the two values a file cannot spell (``enabled_models=None`` and
    ``on_prefill_queue_overload=retry_remote_prefill``), which the tenant then inherits.
    """
    return write_thresholds(t)


def _slo_block(slo: Slo) -> dict[str, float] | None:
    values = {
        "ttft_p95_ms": slo.ttft_p95_s,
        "ttft_p99_ms": slo.ttft_p99_s,
        "tpot_p95_ms": slo.tpot_p95_s,
        "tpot_p99_ms": slo.tpot_p99_s,
    }
    out = {key: _ms(v) for key, v in values.items() if v is not None}
    return out or None


def _group_block(group: TenantGroup) -> dict[str, Any]:
    prefill: dict[str, int] = {"min": group.min_prefill}
    decode: dict[str, int] = {"min": group.min_decode}
    if group.max_prefill is not None:
        prefill["max"] = group.max_prefill
    if group.max_decode is not None:
        decode["max"] = group.max_decode
    return {
        "name": group.name,
        "gpu_budget": group.gpu_budget,
        "gpus_per_instance": group.gpus_per_instance,
        "pools": {"prefill": prefill, "decode": decode},
    }


def _inverse(mapping: Mapping[str, str], tenant: str) -> list[str]:
    return sorted(key for key, owner in mapping.items() if owner == tenant)


def _tenant_block(
    name: str, policy: TenantPolicy, thresholds: RoutingThresholds, resolved: ResolvedPolicy
) -> dict[str, Any]:
    block: dict[str, Any] = {"name": name}
    if policy.tenant.group in resolved.groups:
        block["group"] = policy.tenant.group
    block["priority"] = policy.tenant.priority
    slo = _slo_block(policy.tenant.slo)
    if slo is not None:
        block["slo"] = slo
    if policy.expected_output_tokens is not None:
        block["expected_output_tokens"] = policy.expected_output_tokens
    match = {
        "tenant_ids": _inverse(resolved.tenant_ids, name),
        "api_keys": _inverse(resolved.api_keys, name),
        "models": _inverse(resolved.models, name),
    }
    match = {key: values for key, values in match.items() if values}
    if match:
        block["match"] = match
    block.update(thresholds_block(thresholds))
    block.setdefault("rollout", {})["stream_response"] = policy.stream_response
    return block


def policy_document(resolved_base: ResolvedPolicy, action: ControlAction, description: str = "") -> dict[str, Any]:
    """The policy-file document (JSON-able dict) for ``resolved_base`` with ``action``'s thresholds in place.

    Tenants the action does not mention keep the base thresholds; thresholds for tenants the base does not
    know are ignored (the guard drops them earlier). Pool targets are not part of a policy document.
    """
    tenants = []
    names = sorted(resolved_base.tenants, key=lambda n: n == DEFAULT_TENANT)  # file order, default last
    for name in names:
        policy = resolved_base.tenants[name]
        thresholds = action.thresholds.get(name, policy.thresholds)
        tenants.append(_tenant_block(name, policy, thresholds, resolved_base))
    document: dict[str, Any] = {"version": 1}
    if description:
        document["description"] = description
    if resolved_base.groups:
        document["tenant_groups"] = [_group_block(g) for g in resolved_base.groups.values()]
    document["tenants"] = tenants
    return document
