"""The versioned feature table: one source for the observation vector and the gymnasium observation space.

Every feature has a fixed scale (no running normalisation is needed for the raw vector), a clip ceiling and
a *known* flag: a series missing from the window is encoded as value 0 **and** known 0, so a policy can tell
"unknown" from "zero". The layout is per slot: ``max_groups`` tenant-group slots, then ``max_tenants``
tenant slots; unused slots are all zeros (their known flags are 0 too).

:func:`build_observation` is the only feature-derivation code; the simulator, the gym env and the live
controller all call it, so training and production cannot drift.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from gymnasium import spaces

from policies.schema import (
    SCHEMA_VERSION,
    GroupWindow,
    MetricWindow,
    RoutingThresholds,
    Tenant,
    TenantGroup,
    TenantWindow,
)

__all__ = [
    "FEATURES_VERSION",
    "GROUP_FEATURES",
    "TENANT_FEATURES",
    "FeatureSpec",
    "Observation",
    "ObservationContext",
    "ObservationLayout",
    "PoolActions",
    "build_observation",
    "feature_table_hash",
    "feature_table_markdown",
]

FEATURES_VERSION = 1

PoolActions = Literal["delta", "target"]
"""How a learned policy's pool dimensions are encoded (see :class:`ObservationLayout`)."""


@dataclass(frozen=True, slots=True)
class FeatureSpec:
    """One observation feature.

    Attributes:
        name: feature name, also the attribute of the window or context it is read from.
        unit: unit of the raw value.
        scale: the raw value is divided by this before clipping.
        high: clip ceiling of the scaled value (floor is 0).
        description: what it measures.
    """

    name: str
    unit: str
    scale: float
    high: float
    description: str


GROUP_FEATURES: tuple[FeatureSpec, ...] = (
    FeatureSpec("num_prefill_frac", "frac", 1.0, 1.0, "prefill instances / instances the budget allows"),
    FeatureSpec("num_decode_frac", "frac", 1.0, 1.0, "decode instances / instances the budget allows"),
    FeatureSpec("pending_frac", "frac", 1.0, 1.0, "instances starting or draining / budget"),
    FeatureSpec("prefill_queue_wait_s", "s", 1.0, 10.0, "mean wait before prefill starts"),
    FeatureSpec("prefill_queued_tokens", "tokens", 65536.0, 10.0, "prompt tokens queued on prefill instances"),
    FeatureSpec("decode_active_seqs", "seqs", 256.0, 4.0, "running sequences per decode instance"),
    FeatureSpec("decode_kv_usage_frac", "frac", 1.0, 1.0, "KV-cache usage of decode instances"),
    FeatureSpec("prefill_kv_usage_frac", "frac", 1.0, 1.0, "KV-cache usage of prefill instances"),
    FeatureSpec("kv_transfer_time_p95_s", "s", 1.0, 10.0, "p95 KV transfer time"),
    FeatureSpec("kv_transfer_failure_frac", "frac", 1.0, 1.0, "failed / attempted KV transfers"),
    FeatureSpec("prefix_cache_hit_frac", "frac", 1.0, 1.0, "prefix-cache hit tokens / queried tokens"),
)

TENANT_FEATURES: tuple[FeatureSpec, ...] = (
    FeatureSpec("request_rate_rps", "req/s", 50.0, 10.0, "arrival rate"),
    FeatureSpec("mean_input_tokens", "tokens", 16384.0, 4.0, "mean prompt length"),
    FeatureSpec("p95_input_tokens", "tokens", 16384.0, 4.0, "p95 prompt length"),
    FeatureSpec("mean_output_tokens", "tokens", 1024.0, 8.0, "mean output length"),
    FeatureSpec("ttft_p95_s", "s", 1.0, 20.0, "p95 time to first token"),
    FeatureSpec("tpot_p95_s", "s", 0.1, 20.0, "p95 time per output token"),
    FeatureSpec("ttft_slo_ratio", "ratio", 1.0, 10.0, "p95 TTFT / TTFT objective"),
    FeatureSpec("tpot_slo_ratio", "ratio", 1.0, 10.0, "p95 TPOT / TPOT objective"),
    FeatureSpec("slo_attainment_frac", "frac", 1.0, 1.0, "requests meeting both objectives"),
    FeatureSpec("goodput_rps", "req/s", 50.0, 10.0, "requests per second meeting both objectives"),
    FeatureSpec("remote_prefill_frac", "frac", 1.0, 1.0, "share of requests routed to remote prefill"),
    FeatureSpec("prefix_cache_hit_frac", "frac", 1.0, 1.0, "prefix-cache hit tokens / prompt tokens"),
    FeatureSpec("failed_rate_rps", "req/s", 1.0, 10.0, "failed requests per second"),
    FeatureSpec("priority", "weight", 1.0, 10.0, "tenant priority (context)"),
    FeatureSpec("min_remote_input_tokens", "tokens", 16384.0, 4.0, "current remote-prefill threshold (context)"),
)


def feature_table_hash() -> str:
    """A short hash of the feature table and schema version; stored in every learned-policy artifact."""
    payload = {
        "schema": SCHEMA_VERSION,
        "features": FEATURES_VERSION,
        "group": [(f.name, f.unit, f.scale, f.high) for f in GROUP_FEATURES],
        "tenant": [(f.name, f.unit, f.scale, f.high) for f in TENANT_FEATURES],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def feature_table_markdown() -> str:
    """The feature table as Markdown, for docstrings and the README (checked by a test)."""
    lines = ["| scope | feature | unit | scale | clip |", "|---|---|---|---|---|"]
    for scope, table in (("group", GROUP_FEATURES), ("tenant", TENANT_FEATURES)):
        lines.extend(f"| {scope} | `{f.name}` | {f.unit} | {f.scale:g} | {f.high:g} |" for f in table)
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class ObservationLayout:
    """How many tenant-group and tenant slots the vectors have, and how pool actions are encoded (fixed per policy).

    ``pool_actions`` is read by :class:`~policies.action_codec.ActionCodec` only: ``"delta"`` (±1 instance per
    pool) or ``"target"`` (the instance count each pool should reach, one step per interval); the observation is
    the same for both.
    """

    max_groups: int = 2
    max_tenants: int = 4
    pool_actions: PoolActions = "delta"

    def __post_init__(self) -> None:
        if self.pool_actions not in ("delta", "target"):
            raise ValueError(f"pool_actions: {self.pool_actions!r} is not 'delta' or 'target'")

    @property
    def size(self) -> int:
        """Length of the observation vector: values then known flags for every slot."""
        return 2 * (self.max_groups * len(GROUP_FEATURES) + self.max_tenants * len(TENANT_FEATURES))

    def observation_space(self) -> spaces.Box:
        """The gymnasium Box the vector lives in."""
        highs = [f.high for f in GROUP_FEATURES] * self.max_groups + [
            f.high for f in TENANT_FEATURES
        ] * self.max_tenants
        high = np.concatenate([np.asarray(highs, dtype=np.float32), np.ones(len(highs), dtype=np.float32)])
        return spaces.Box(low=np.zeros_like(high), high=high, dtype=np.float32)


@dataclass(frozen=True, slots=True)
class ObservationContext:
    """Static facts the window does not carry: tenant order, SLOs, pool bounds and current thresholds."""

    tenants: tuple[Tenant, ...]
    groups: tuple[TenantGroup, ...]
    thresholds: Mapping[str, RoutingThresholds]


@dataclass(frozen=True, slots=True)
class Observation:
    """A policy's view of one window: named, unit-carrying values per slot, ``None`` = unknown."""

    group_values: tuple[tuple[float | None, ...], ...]
    tenant_values: tuple[tuple[float | None, ...], ...]
    group_names: tuple[str, ...]
    tenant_names: tuple[str, ...]
    window: MetricWindow

    def value(self, scope: str, slot_name: str, feature: str) -> float | None:
        """Raw value of one feature of one named group or tenant."""
        if scope == "group":
            row = self.group_values[self.group_names.index(slot_name)]
            return row[[f.name for f in GROUP_FEATURES].index(feature)]
        row = self.tenant_values[self.tenant_names.index(slot_name)]
        return row[[f.name for f in TENANT_FEATURES].index(feature)]

    def to_vector(self, layout: ObservationLayout) -> np.ndarray:
        """Encode as a float32 vector inside ``layout.observation_space()`` (finite, clipped)."""
        if len(self.group_values) > layout.max_groups or len(self.tenant_values) > layout.max_tenants:
            raise ValueError(
                f"observation has {len(self.group_values)} groups / {len(self.tenant_values)} tenants; "
                f"layout allows {layout.max_groups} / {layout.max_tenants}"
            )
        values: list[float] = []
        known: list[float] = []
        _encode_slots(self.group_values, GROUP_FEATURES, layout.max_groups, values, known)
        _encode_slots(self.tenant_values, TENANT_FEATURES, layout.max_tenants, values, known)
        return np.asarray(values + known, dtype=np.float32)


def _encode_slots(
    rows: Sequence[Sequence[float | None]],
    table: Sequence[FeatureSpec],
    max_slots: int,
    values: list[float],
    known: list[float],
) -> None:
    for slot in range(max_slots):
        row = rows[slot] if slot < len(rows) else (None,) * len(table)
        for spec, raw in zip(table, row, strict=True):
            if raw is None or not math.isfinite(raw):
                values.append(0.0)
                known.append(0.0)
            else:
                values.append(min(max(raw / spec.scale, 0.0), spec.high))
                known.append(1.0)


def _ratio(value: float | None, target: float) -> float | None:
    if value is None or not math.isfinite(target) or target <= 0:
        return None
    return value / target


def _group_row(group: TenantGroup, window: GroupWindow | None) -> tuple[float | None, ...]:
    if window is None:
        return (None,) * len(GROUP_FEATURES)
    budget = max(group.max_instances, 1)
    return (
        window.num_prefill / budget,
        window.num_decode / budget,
        (window.pending_prefill + window.pending_decode) / budget,
        window.prefill_queue_wait_s,
        window.prefill_queued_tokens,
        None if window.decode_active_seqs is None else window.decode_active_seqs / max(window.num_decode, 1),
        window.decode_kv_usage_frac,
        window.prefill_kv_usage_frac,
        window.kv_transfer_time_p95_s,
        window.kv_transfer_failure_frac,
        window.prefix_cache_hit_frac,
    )


def _tenant_row(
    tenant: Tenant, window: TenantWindow | None, thresholds: RoutingThresholds | None
) -> tuple[float | None, ...]:
    w = window if window is not None else TenantWindow()
    return (
        w.request_rate_rps,
        w.mean_input_tokens,
        w.p95_input_tokens,
        w.mean_output_tokens,
        w.ttft_p95_s,
        w.tpot_p95_s,
        _ratio(w.ttft_p95_s, tenant.slo.ttft_target_s()),
        _ratio(w.tpot_p95_s, tenant.slo.tpot_target_s()),
        w.slo_attainment_frac,
        w.goodput_rps,
        w.remote_prefill_frac,
        w.prefix_cache_hit_frac,
        w.failed_rate_rps,
        tenant.priority,
        None if thresholds is None else float(thresholds.min_remote_input_tokens),
    )


def build_observation(window: MetricWindow, context: ObservationContext) -> Observation:
    """Turn a metric window into the policy's observation (the only feature-derivation code)."""
    group_rows = tuple(_group_row(g, window.groups.get(g.name)) for g in context.groups)
    tenant_rows = tuple(
        _tenant_row(t, window.tenants.get(t.name), context.thresholds.get(t.name)) for t in context.tenants
    )
    return Observation(
        group_values=group_rows,
        tenant_values=tenant_rows,
        group_names=tuple(g.name for g in context.groups),
        tenant_names=tuple(t.name for t in context.tenants),
        window=window,
    )
