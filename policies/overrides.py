"""Override files: policy files a person drops in to win over the running policy for some tenants.

An override is an ordinary policy file (validated by the same loader) with these restrictions:

* it may set only routing keys: top-level ``mode``, ``pd_disaggregation_policy``, ``fallback``, ``rollout``,
  ``expires_at``, ``description`` and ``tenants``; each tenant entry only ``name``, ``mode``,
  ``pd_disaggregation_policy``, ``fallback``, ``rollout`` and ``prompt_length_buckets``;
* every tenant it names must exist in the running (base) policy.

**Scope.** The tenants it names; a file that names no tenant applies to every tenant. **Resolution.** For
each tenant in scope, the base policy's tenant entry, then the override's top-level blocks, then the
override's own entry for the tenant, merged key by key (later wins) and resolved as a policy file — so an
override that sets one key keeps the base's value for every other key. **Lifetime.** Until ``expires_at``
(if set) or until the file is removed. **Precedence.** Overrides win over the policy's action for the
tenants in scope; among overrides, the later file name wins; a rollback file (top-level
``mode: aggregated_only`` naming no tenant) is applied last and turns every tenant to local aggregated
serving in one step.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from policies.documents import policy_document
from policies.policy_file import (
    PolicyFile,
    PolicyFileError,
    PolicyProblem,
    ResolvedPolicy,
    load_policy_text,
    resolve_policy,
)
from policies.schema import ControlAction, RoutingThresholds

__all__ = ["Override", "OverrideResult", "apply_overrides", "load_override"]

_TOP_KEYS = frozenset(
    {"version", "description", "mode", "expires_at", "pd_disaggregation_policy", "fallback", "rollout", "tenants"}
)
_TENANT_KEYS = frozenset({"name", "mode", "pd_disaggregation_policy", "fallback", "rollout", "prompt_length_buckets"})
_SEED_BLOCKS = ("mode", "pd_disaggregation_policy", "fallback", "rollout")


@dataclass(frozen=True, slots=True)
class Override:
    """A validated override file, resolved against the base policy.

    Attributes:
        name: file name (orders overrides: the later name wins).
        source: path or label it was read from.
        expires_at: end of validity (timezone-aware), ``None`` = until removed.
        tenants: tenants in scope, in file order (every base tenant when the file names none).
        thresholds: resolved thresholds per tenant in scope.
        rollback: a global ``mode: aggregated_only`` file (the one-step rollback).
    """

    name: str
    source: str
    expires_at: datetime | None
    tenants: tuple[str, ...]
    thresholds: Mapping[str, RoutingThresholds]
    rollback: bool = False

    def is_active(self, now: datetime) -> bool:
        """Whether the override applies at ``now`` (timezone-aware)."""
        return self.expires_at is None or now < self.expires_at


@dataclass(frozen=True, slots=True)
class OverrideResult:
    """An action with overrides applied, and which overrides took part."""

    action: ControlAction
    active: tuple[str, ...]
    tenants: tuple[str, ...]
    rollback: bool


def _deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _problem(source: str, field_path: str, message: str) -> PolicyFileError:
    return PolicyFileError([PolicyProblem(source, None, field_path, message)])


def _check_keys(policy: PolicyFile, base: ResolvedPolicy, source: str) -> None:
    problems: list[PolicyProblem] = []
    problems.extend(
        PolicyProblem(source, None, key, "not allowed in an override (routing keys only)")
        for key in sorted(policy.model_fields_set - _TOP_KEYS)
    )
    for index, tenant in enumerate(policy.tenants):
        problems.extend(
            PolicyProblem(source, None, f"tenants[{index}].{key}", "not allowed in an override (routing keys only)")
            for key in sorted(tenant.model_fields_set - _TENANT_KEYS)
        )
        if tenant.name not in base.tenants:
            problems.append(
                PolicyProblem(source, None, f"tenants[{index}].name", f"tenant {tenant.name!r} is not in the policy")
            )
    if problems:
        raise PolicyFileError(problems)


def _unset_dump(model: BaseModel, keys: Iterable[str]) -> dict[str, Any]:
    data = model.model_dump(mode="json", exclude_unset=True)
    return {key: data[key] for key in keys if key in data}


def load_override(text: str, name: str, base: ResolvedPolicy, source: str = "") -> Override:
    """Validate an override file's text and resolve it against ``base``.

    Raises:
        PolicyFileError: the file is not a valid policy file, sets keys an override may not set, names a
            tenant the base does not know, or resolves to inconsistent thresholds.
    """
    source = source or name
    policy = load_policy_text(text, source)
    _check_keys(policy, base, source)
    top = _unset_dump(policy, _SEED_BLOCKS)
    named = {t.name: _unset_dump(t, (*_SEED_BLOCKS, "prompt_length_buckets")) for t in policy.tenants}
    scope = tuple(named) if named else tuple(sorted(base.tenants))
    document = policy_document(base, ControlAction())
    for block in document["tenants"]:
        if block["name"] in scope:
            merged = _deep_merge(_deep_merge(block, top), named.get(block["name"], {}))
            if "prompt_length_buckets" in named.get(block["name"], {}):
                merged["prompt_length_buckets"] = named[block["name"]]["prompt_length_buckets"]
            block.clear()
            block.update(merged)
    try:
        resolved = resolve_policy(PolicyFile.model_validate(document, strict=False), source)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise _problem(source, ".".join(str(p) for p in first["loc"]), str(first["msg"])) from None
    thresholds = {tenant: resolved.tenants[tenant].thresholds for tenant in scope}
    rollback = not named and top.get("mode") == "aggregated_only"
    return Override(name, source, policy.expires_at, scope, thresholds, rollback)


def apply_overrides(action: ControlAction, overrides: Sequence[Override], now: datetime) -> OverrideResult:
    """Let active overrides win over ``action`` for the tenants they name (precedence in the module docstring).

    Pure: the same inputs give the same result; expired overrides are ignored; applying the result again with
    the same overrides changes nothing.
    """
    active = sorted((o for o in overrides if o.is_active(now)), key=lambda o: (o.rollback, o.name))
    if not active:
        return OverrideResult(action, (), (), rollback=False)
    thresholds = dict(action.thresholds)
    touched: dict[str, None] = {}
    for override in active:
        for tenant in override.tenants:
            thresholds[tenant] = override.thresholds[tenant]
            touched[tenant] = None
    rollback = any(o.rollback for o in active)
    names = tuple(o.name for o in active)
    reason = f"{action.reason};override:{','.join(names)}" if action.reason else f"override:{','.join(names)}"
    merged = ControlAction(thresholds=thresholds, pools=dict(action.pools), reason=reason, policy_id=action.policy_id)
    return OverrideResult(merged, names, tuple(touched), rollback)
