"""The one table between per-tenant policy-file keys and :class:`~policies.schema.RoutingThresholds` fields.

The loader reads a level of a policy file (the file's top level, or one tenant entry) through
:func:`read_thresholds`; :func:`write_thresholds` writes typed thresholds back as the keys of a tenant entry
(used by :func:`policies.documents.thresholds_block`). Both walk :data:`THRESHOLD_FIELDS`, so a new knob is
one row here (besides its key in the file model and its field in ``RoutingThresholds``).

Unit conversions are exact in both directions for every value a file can hold: a value written back is the
shortest file value that reads back to exactly the same float (``0.3`` s is written ``300.0`` ms).
Two values have no spelling in a file and are left out when written, so the tenant inherits them:
``enabled_models=None`` (every model) and ``on_prefill_queue_overload=retry_remote_prefill`` (the file admits
only the local fallbacks there).

This module is imported by :mod:`policies.policy_file`; it reads the file model's blocks by attribute only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from policies.schema import FallbackAction, LengthBucket, Route, RouteRule, RoutingThresholds

__all__ = ["THRESHOLD_FIELDS", "ThresholdField", "read_thresholds", "to_file_scale", "write_thresholds"]

_UNSET: Final = object()
"""What a writer returns for a value the file cannot spell (the key is left out)."""

_MS_PER_S = 1000.0
_PERCENT_PER_FRAC = 100.0


def to_file_scale(value: float, scale: float) -> float:
    """The shortest file value ``v`` with ``v / scale == value``, so that reading it back is exact.

    ``value * scale`` alone is off by an ulp for some values (``0.07 * 100`` is ``7.000000000000001``).
    When no float divides back exactly (a few values the file could never have produced), the nearest
    one, ``value * scale``, is returned.
    """
    product = value * scale
    if not math.isfinite(product):
        return product
    for digits in range(1, 18):  # the fewest significant digits that read back exactly (17 = product itself)
        candidate = float(f"{product:.{digits}g}")
        if candidate / scale == value:
            return candidate
    below = above = product
    for _ in range(2):  # an exact inverse, when one exists, lies within two ulps of the product
        below, above = math.nextafter(below, -math.inf), math.nextafter(above, math.inf)
        for candidate in (below, above):
            if candidate / scale == value:
                return candidate
    return product


def _identity(value: Any) -> Any:
    return value


def _enum_value(value: Any) -> Any:
    return value.value


def _mode(enabled: Any) -> str:
    return "disaggregated" if enabled else "aggregated_only"


def _local_fallback(action: Any) -> Any:
    return _UNSET if action is FallbackAction.RETRY_REMOTE_PREFILL else action.value


def _models(models: Any) -> Any:
    return _UNSET if models is None else sorted(models)


def _read_buckets(blocks: Any) -> tuple[LengthBucket, ...]:
    return tuple(LengthBucket(Route(b.route), b.min_input_tokens, b.max_input_tokens) for b in blocks)


def _write_buckets(buckets: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for bucket in buckets:
        entry: dict[str, Any] = {"min_input_tokens": bucket.min_input_tokens}
        if bucket.max_input_tokens is not None:
            entry["max_input_tokens"] = bucket.max_input_tokens
        entry["route"] = bucket.route.value
        out.append(entry)
    return out


@dataclass(frozen=True, slots=True)
class ThresholdField:
    """One policy-file key and the thresholds field it sets.

    Attributes:
        key_path: dotted key path inside a tenant entry (and, unless ``tenant_only``, the file's top level).
        name: the :class:`RoutingThresholds` field.
        read: file value (as the file model holds it) → typed value.
        write: typed value → file value, or the module's unset marker to leave the key out; ``None`` for a
            read-only alias of a field that another row writes.
        tenant_only: the key exists in tenant entries only.
    """

    key_path: str
    name: str
    read: Callable[[Any], Any] = _identity
    write: Callable[[Any], Any] | None = _identity
    tenant_only: bool = False


_PD = "pd_disaggregation_policy"

THRESHOLD_FIELDS: Final[tuple[ThresholdField, ...]] = (
    ThresholdField("mode", "disaggregation_enabled", lambda mode: mode != "aggregated_only", _mode),
    ThresholdField(f"{_PD}.rule", "rule", RouteRule, _enum_value),
    ThresholdField(f"{_PD}.remote_prefill.min_input_tokens", "min_remote_input_tokens"),
    ThresholdField(
        f"{_PD}.remote_prefill.max_prefill_queue_wait_ms",
        "max_prefill_queue_wait_s",
        lambda ms: ms / _MS_PER_S,
        lambda s: to_file_scale(s, _MS_PER_S),
    ),
    ThresholdField(f"{_PD}.remote_prefill.min_expected_output_tokens", "min_expected_output_tokens"),
    ThresholdField(f"{_PD}.remote_prefill.require_decode_pool_pressure", "require_decode_pool_pressure"),
    ThresholdField(
        f"{_PD}.remote_prefill.decode_pressure_threshold_perc",
        "decode_pressure_threshold_frac",
        lambda perc: perc / _PERCENT_PER_FRAC,
        lambda frac: to_file_scale(frac, _PERCENT_PER_FRAC),
    ),
    ThresholdField(f"{_PD}.local_prefill.max_input_tokens", "max_local_input_tokens"),
    ThresholdField(f"{_PD}.local_prefill.prefer_when_prefix_cache_hit", "prefer_local_on_prefix_hit"),
    ThresholdField(f"{_PD}.baseline_params.uncached_ratio_threshold_frac", "uncached_ratio_threshold_frac"),
    ThresholdField(f"{_PD}.baseline_params.max_prefill_queue_requests", "max_prefill_queue_requests"),
    ThresholdField(f"{_PD}.baseline_params.prefill_busy_factor", "prefill_busy_factor"),
    ThresholdField("fallback.on_kv_transfer_timeout", "on_kv_transfer_timeout", FallbackAction, _enum_value),
    ThresholdField("fallback.on_prefill_queue_overload", "on_prefill_queue_overload", FallbackAction, _local_fallback),
    ThresholdField("rollout.traffic_percent", "traffic_percent"),
    ThresholdField("rollout.enabled_models", "enabled_models", frozenset, _models),
    ThresholdField("prompt_length_buckets", "buckets", _read_buckets, _write_buckets, tenant_only=True),
    # The rollout trigger comes after remote_prefill.min_input_tokens: it wins at the same level.
    ThresholdField("rollout.remote_prefill_when.input_tokens_gte", "min_remote_input_tokens", write=None),
)
"""Every per-tenant key, in the order a tenant entry is written (and read: a later row wins)."""


def read_thresholds(level: object, *, tenant: bool) -> dict[str, Any]:
    """The thresholds fields one level of a validated policy file sets (keys left out are absent).

    Args:
        level: the file model (``PolicyFile``) or one of its tenant entries (``TenantBlock``).
        tenant: whether ``level`` is a tenant entry (tenant-only keys are read).

    Returns:
        ``RoutingThresholds`` field name → typed value, for the keys that were given.
    """
    values: dict[str, Any] = {}
    for spec in THRESHOLD_FIELDS:
        if spec.tenant_only and not tenant:
            continue
        value: Any = level
        for part in spec.key_path.split("."):
            value = getattr(value, part)
        if value is not None:
            values[spec.name] = spec.read(value)
    return values


def write_thresholds(thresholds: RoutingThresholds) -> dict[str, Any]:
    """The tenant-entry keys (nested, JSON-able) that :func:`read_thresholds` reads back as ``thresholds``.

    Every field is written except the two values a file cannot spell (see the module docstring).
    """
    block: dict[str, Any] = {}
    for spec in THRESHOLD_FIELDS:
        if spec.write is None:
            continue
        value = spec.write(getattr(thresholds, spec.name))
        if value is _UNSET:
            continue
        *parents, key = spec.key_path.split(".")
        target = block
        for part in parents:
            target = target.setdefault(part, {})
        target[key] = value
    return block
