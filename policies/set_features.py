"""Layout-free observation of the set policy: one row per tenant group and per tenant, normalised per group.

The slot observation (:mod:`policies.features`) has fixed slots and absolute scales (requests per second,
instance counts as fractions of one group's budget in a fixed slot), so a network trained on 4-instance groups
reads a 12-GPU group as something it never saw. Here every value is relative to what it is judged against:

* pool state relative to the group's budget and bounds (prefill share, position between the prefill bounds,
  idle share);
* load per instance of the group (requests per second per instance, queued tokens per prefill instance in
  ``max_num_batched_tokens``-sized chunks, running sequences per decode instance against ``max_num_seqs``);
* latencies relative to objectives (p95 TTFT / TTFT objective, queue wait / TTFT objective, transfer p95 / TTFT
  objective);
* rates of the tenant relative to its own rate (SLO attainment, goodput, failures) or to its group's (share).

Heavy-tailed values are ``log1p``-compressed; every value is clipped to ``[0, high]`` and has a known flag (a
missing series is value 0 with known 0, never zero). No feature counts groups, tenants or instances, so the
network cannot learn the layout. Rows are padded to :data:`SET_MAX_GROUPS` / :data:`SET_MAX_TENANTS` with masks.

:func:`build_set_observation` is the only derivation code; the gym env, the evaluation loop and the controller all
reach it through :class:`policies.set_policy.SetPolicy` or the env's set wrapper.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from policies.action_codec import MIN_REMOTE_LEVELS_TOKENS, QUEUE_WAIT_LEVELS_S
from policies.features import ObservationContext
from policies.schema import GroupWindow, MetricWindow, RouteRule, Tenant, TenantGroup, TenantWindow

__all__ = [
    "SET_FEATURES_VERSION",
    "SET_GROUP_FEATURES",
    "SET_MAX_GROUPS",
    "SET_MAX_TENANTS",
    "SET_TENANT_FEATURES",
    "SetFeature",
    "SetLayout",
    "SetObservation",
    "build_set_observation",
    "encode_row",
    "set_feature_hash",
]

SET_FEATURES_VERSION = 1
SET_MAX_GROUPS = 3
"""Most tenant groups a set policy is padded to by default (what the scenario family generates)."""
SET_MAX_TENANTS = 6
"""Most tenants in all (what the scenario family generates)."""
BATCHED_TOKENS_PER_CHUNK = 8192
"""Queued prefill tokens are counted in chunks of this many (vLLM's default ``max_num_batched_tokens``)."""
SEQS_PER_DECODE_INSTANCE = 256
"""Running sequences per decode instance are relative to this (vLLM's default ``max_num_seqs``)."""


@dataclass(frozen=True, slots=True)
class SetFeature:
    """One feature of a group or tenant row.

    Attributes:
        name: feature name.
        log: whether the (already relative) value is ``log1p``-compressed.
        high: clip ceiling after compression (floor 0).
        description: what the value is relative to.
    """

    name: str
    log: bool
    high: float
    description: str


SET_GROUP_FEATURES: tuple[SetFeature, ...] = (
    SetFeature("prefill_share_frac", False, 1.0, "prefill instances / instances the budget allows"),
    SetFeature("decode_share_frac", False, 1.0, "decode instances / instances the budget allows"),
    SetFeature("idle_share_frac", False, 1.0, "instances the budget allows but no pool uses / budget"),
    SetFeature("pending_share_frac", False, 1.0, "instances starting or switching / budget"),
    SetFeature("prefill_bound_frac", False, 1.0, "(prefill − min prefill) / (max prefill − min prefill)"),
    SetFeature("request_rate_per_instance", True, 5.0, "log1p(arrivals per second / instances of the budget)"),
    SetFeature("queue_wait_slo_ratio", True, 4.0, "log1p(prefill queue wait / tightest TTFT objective)"),
    SetFeature("queued_chunks_per_prefill", True, 6.0, "log1p(queued prompt tokens / prefill instance / 8192)"),
    SetFeature("prefill_waiting_per_prefill", True, 6.0, "log1p(requests waiting / prefill instance)"),
    SetFeature("decode_waiting_per_decode", True, 6.0, "log1p(requests waiting / decode instance)"),
    SetFeature("decode_seqs_frac", False, 2.0, "running sequences per decode instance / 256"),
    SetFeature("decode_kv_usage_frac", False, 1.0, "KV-cache usage of decode instances"),
    SetFeature("prefill_kv_usage_frac", False, 1.0, "KV-cache usage of prefill instances"),
    SetFeature("transfer_slo_ratio", True, 4.0, "log1p(KV transfer p95 / tightest TTFT objective)"),
    SetFeature("transfer_failure_frac", False, 1.0, "failed / attempted KV transfers"),
    SetFeature("prefix_hit_frac", False, 1.0, "prefix-cache hit tokens / queried tokens"),
)

SET_TENANT_FEATURES: tuple[SetFeature, ...] = (
    SetFeature("request_rate_per_instance", True, 5.0, "log1p(arrivals per second / instances of its group)"),
    SetFeature("rate_share_frac", False, 1.0, "its arrivals / its group's arrivals"),
    SetFeature("mean_input_kilotokens", True, 5.0, "log1p(mean prompt tokens / 1024)"),
    SetFeature("p95_input_kilotokens", True, 5.0, "log1p(p95 prompt tokens / 1024)"),
    SetFeature("mean_output_tokens", True, 5.0, "log1p(mean output tokens / 128)"),
    SetFeature("ttft_slo_ratio", True, 4.0, "log1p(p95 TTFT / TTFT objective)"),
    SetFeature("tpot_slo_ratio", True, 4.0, "log1p(p95 TPOT / TPOT objective)"),
    SetFeature("queue_wait_slo_ratio", True, 4.0, "log1p(its group's prefill queue wait / its TTFT objective)"),
    SetFeature("transfer_slo_ratio", True, 4.0, "log1p(its group's KV transfer p95 / its TTFT objective)"),
    SetFeature("slo_attainment_frac", False, 1.0, "finished requests meeting both objectives"),
    SetFeature("goodput_frac", False, 1.5, "requests per second meeting both objectives / arrivals per second"),
    SetFeature("failed_frac", False, 1.0, "failed requests per second / arrivals per second"),
    SetFeature("remote_prefill_frac", False, 1.0, "share of its requests prefilled remotely"),
    SetFeature("prefix_hit_frac", False, 1.0, "prefix-cache hit tokens / prompt tokens"),
    SetFeature("priority_rel", False, 1.0, "priority / the highest priority of any tenant"),
    SetFeature("ttft_objective", True, 5.0, "log1p(TTFT objective in seconds)"),
    SetFeature("tpot_objective", True, 5.0, "log1p(TPOT objective / 50 ms)"),
    SetFeature("remote_level_frac", False, 1.0, "current remote-prefill level / top level (never remote)"),
    SetFeature("queue_wait_level_frac", False, 1.0, "current queue-wait bound level / top level"),
    SetFeature("legacy_rule", False, 1.0, "1 when legacy Dynamo's rule routes it, else 0"),
)


def set_feature_hash() -> str:
    """A short hash of both feature tables and their version; stored in every set-policy artifact."""
    payload = {
        "version": SET_FEATURES_VERSION,
        "group": [(f.name, f.log, f.high) for f in SET_GROUP_FEATURES],
        "tenant": [(f.name, f.log, f.high) for f in SET_TENANT_FEATURES],
        "chunk": BATCHED_TOKENS_PER_CHUNK,
        "seqs": SEQS_PER_DECODE_INSTANCE,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class SetLayout:
    """The padding of a set policy's vectors: the most groups and tenants it takes (not the layout it learns).

    The flat observation vector (what stable-baselines3 sees) is, in order: group rows ``[max_groups, 2 × Fg]``
    (values then known flags), tenant rows ``[max_tenants, 2 × Ft]``, the group mask ``[max_groups]``, the
    tenant mask ``[max_tenants]`` and the tenant→group membership ``[max_tenants, max_groups]`` (one-hot).
    """

    max_groups: int = SET_MAX_GROUPS
    max_tenants: int = SET_MAX_TENANTS

    def __post_init__(self) -> None:
        if self.max_groups < 1 or self.max_tenants < 1:
            raise ValueError(f"set layout: max_groups and max_tenants must be >= 1, got {self}")

    @property
    def group_width(self) -> int:
        """Values and known flags of one group row."""
        return 2 * len(SET_GROUP_FEATURES)

    @property
    def tenant_width(self) -> int:
        """Values and known flags of one tenant row."""
        return 2 * len(SET_TENANT_FEATURES)

    @property
    def size(self) -> int:
        """Length of the flat observation vector."""
        g, t = self.max_groups, self.max_tenants
        return g * self.group_width + t * self.tenant_width + g + t + t * g

    def observation_space(self) -> spaces.Box:
        """The gymnasium Box of the flat vector."""
        group_high = [f.high for f in SET_GROUP_FEATURES] + [1.0] * len(SET_GROUP_FEATURES)
        tenant_high = [f.high for f in SET_TENANT_FEATURES] + [1.0] * len(SET_TENANT_FEATURES)
        g, t = self.max_groups, self.max_tenants
        high = np.concatenate(
            [
                np.tile(np.asarray(group_high, dtype=np.float32), g),
                np.tile(np.asarray(tenant_high, dtype=np.float32), t),
                np.ones(g + t + t * g, dtype=np.float32),
            ]
        )
        return spaces.Box(low=np.zeros_like(high), high=high, dtype=np.float32)

    def check_fits(self, num_groups: int, num_tenants: int) -> None:
        """Refuse (one line) a scenario beyond the maximum.

        Raises:
            ValueError: more groups or tenants than the padding holds.
        """
        if num_groups > self.max_groups or num_tenants > self.max_tenants:
            raise ValueError(
                f"{num_groups} groups / {num_tenants} tenants exceed the set policy's maximum of "
                f"{self.max_groups} groups / {self.max_tenants} tenants"
            )

    def split(self, vector: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(groups, tenants, group_mask, tenant_mask, membership)`` views of flat vectors ``[..., size]``."""
        x = np.asarray(vector, dtype=np.float32)
        lead = x.shape[:-1]
        g, t = self.max_groups, self.max_tenants
        cuts = np.cumsum([g * self.group_width, t * self.tenant_width, g, t])
        groups = x[..., : cuts[0]].reshape(*lead, g, self.group_width)
        tenants = x[..., cuts[0] : cuts[1]].reshape(*lead, t, self.tenant_width)
        membership = x[..., cuts[3] :].reshape(*lead, t, g)
        return groups, tenants, x[..., cuts[1] : cuts[2]], x[..., cuts[2] : cuts[3]], membership


@dataclass(frozen=True, slots=True)
class SetObservation:
    """Rows of one window, unpadded: raw relative values (``None`` = unknown) and tenant→group indices."""

    group_rows: tuple[tuple[float | None, ...], ...]
    tenant_rows: tuple[tuple[float | None, ...], ...]
    tenant_group: tuple[int, ...]
    """Index into ``group_rows`` of each tenant's group."""

    def to_vector(self, layout: SetLayout) -> np.ndarray:
        """The padded flat vector inside ``layout.observation_space()``.

        Raises:
            ValueError: more rows than the layout holds (one line).
        """
        layout.check_fits(len(self.group_rows), len(self.tenant_rows))
        groups = np.zeros((layout.max_groups, layout.group_width), dtype=np.float32)
        tenants = np.zeros((layout.max_tenants, layout.tenant_width), dtype=np.float32)
        for i, row in enumerate(self.group_rows):
            groups[i] = encode_row(row, SET_GROUP_FEATURES)
        for i, row in enumerate(self.tenant_rows):
            tenants[i] = encode_row(row, SET_TENANT_FEATURES)
        group_mask = np.zeros(layout.max_groups, dtype=np.float32)
        group_mask[: len(self.group_rows)] = 1.0
        tenant_mask = np.zeros(layout.max_tenants, dtype=np.float32)
        tenant_mask[: len(self.tenant_rows)] = 1.0
        membership = np.zeros((layout.max_tenants, layout.max_groups), dtype=np.float32)
        for i, gi in enumerate(self.tenant_group):
            membership[i, gi] = 1.0
        return np.concatenate([groups.ravel(), tenants.ravel(), group_mask, tenant_mask, membership.ravel()])


def encode_row(row: Sequence[float | None], table: Sequence[SetFeature]) -> np.ndarray:
    """Values (compressed and clipped as ``table`` says) then known flags; an unknown value is 0 with flag 0."""
    values = np.zeros(len(table), dtype=np.float32)
    known = np.zeros(len(table), dtype=np.float32)
    for i, (spec, raw) in enumerate(zip(table, row, strict=True)):
        if raw is None or not math.isfinite(raw):
            continue
        value = math.log1p(max(raw, 0.0)) if spec.log else raw
        values[i] = min(max(value, 0.0), spec.high)
        known[i] = 1.0
    return np.concatenate([values, known])


def _div(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or not math.isfinite(den) or den <= 0:
        return None
    return num / den


def _per(num: float | None, count: int) -> float | None:
    return None if num is None else num / max(count, 1)


def _level_frac(levels: Sequence[float], value: float) -> float:
    index = int(np.argmin([abs(float(level) - value) for level in levels]))
    return index / max(len(levels) - 1, 1)


def _group_row(
    group: TenantGroup, window: GroupWindow | None, tenants: Sequence[Tenant], rate_rps: float | None
) -> tuple[float | None, ...]:
    budget = max(group.max_instances, 1)
    max_prefill = group.max_prefill if group.max_prefill is not None else group.max_instances - group.min_decode
    span = max(max_prefill - group.min_prefill, 1)
    ttft_target_s = min((t.slo.ttft_target_s() for t in tenants), default=math.inf)
    if window is None:
        return (None,) * 5 + (_div(rate_rps, budget),) + (None,) * (len(SET_GROUP_FEATURES) - 6)
    used = window.num_prefill + window.num_decode + window.pending_prefill + window.pending_decode
    return (
        window.num_prefill / budget,
        window.num_decode / budget,
        max(budget - used, 0) / budget,
        (window.pending_prefill + window.pending_decode) / budget,
        min(max(window.num_prefill - group.min_prefill, 0) / span, 1.0),
        _div(rate_rps, budget),
        _div(window.prefill_queue_wait_s, ttft_target_s),
        _div(_per(window.prefill_queued_tokens, window.num_prefill), BATCHED_TOKENS_PER_CHUNK),
        _per(window.prefill_queue_requests, window.num_prefill),
        _per(window.decode_queue_requests, window.num_decode),
        _div(_per(window.decode_active_seqs, window.num_decode), SEQS_PER_DECODE_INSTANCE),
        window.decode_kv_usage_frac,
        window.prefill_kv_usage_frac,
        _div(window.kv_transfer_time_p95_s, ttft_target_s),
        window.kv_transfer_failure_frac,
        window.prefix_cache_hit_frac,
    )


def _tenant_row(
    tenant: Tenant,
    window: TenantWindow | None,
    group: TenantGroup,
    group_window: GroupWindow | None,
    group_rate_rps: float | None,
    top_priority: float,
    context: ObservationContext,
) -> tuple[float | None, ...]:
    w = window if window is not None else TenantWindow()
    ttft_target_s, tpot_target_s = tenant.slo.ttft_target_s(), tenant.slo.tpot_target_s()
    rate = w.request_rate_rps
    thresholds = context.thresholds.get(tenant.name)
    remote_level = queue_level = legacy = None
    if thresholds is not None:
        legacy_rule = thresholds.rule is RouteRule.DYNAMO_LEGACY
        bound = thresholds.max_local_input_tokens if legacy_rule else thresholds.min_remote_input_tokens
        remote_level = _level_frac(MIN_REMOTE_LEVELS_TOKENS, bound)
        queue_level = _level_frac(QUEUE_WAIT_LEVELS_S, thresholds.max_prefill_queue_wait_s)
        legacy = float(legacy_rule)
    gw = group_window
    return (
        _div(rate, max(group.max_instances, 1)),
        _div(rate, group_rate_rps) if group_rate_rps else None,
        _div(w.mean_input_tokens, 1024.0),
        _div(w.p95_input_tokens, 1024.0),
        _div(w.mean_output_tokens, 128.0),
        _div(w.ttft_p95_s, ttft_target_s),
        _div(w.tpot_p95_s, tpot_target_s),
        _div(None if gw is None else gw.prefill_queue_wait_s, ttft_target_s),
        _div(None if gw is None else gw.kv_transfer_time_p95_s, ttft_target_s),
        w.slo_attainment_frac,
        _div(w.goodput_rps, rate),
        _div(w.failed_rate_rps, rate),
        w.remote_prefill_frac,
        w.prefix_cache_hit_frac,
        _div(tenant.priority, top_priority),
        ttft_target_s if math.isfinite(ttft_target_s) else None,
        _div(tpot_target_s, 0.05) if math.isfinite(tpot_target_s) else None,
        remote_level,
        queue_level,
        legacy,
    )


def build_set_observation(window: MetricWindow, context: ObservationContext) -> SetObservation:
    """Turn a metric window into the set policy's rows (the only derivation code of these features).

    Raises:
        ValueError: a tenant names a group the context does not have (one line naming both).
    """
    index = {g.name: i for i, g in enumerate(context.groups)}
    members: list[list[Tenant]] = [[] for _ in context.groups]
    tenant_group: list[int] = []
    for tenant in context.tenants:
        if tenant.group not in index:
            raise ValueError(f"tenant {tenant.name}: group {tenant.group!r} is not among the context's groups")
        tenant_group.append(index[tenant.group])
        members[index[tenant.group]].append(tenant)
    rates: list[float | None] = []
    for tenants in members:
        known = [window.tenants[t.name].request_rate_rps for t in tenants if t.name in window.tenants]
        values = [r for r in known if r is not None]
        rates.append(sum(values) if values else None)
    group_rows = tuple(
        _group_row(g, window.groups.get(g.name), members[i], rates[i]) for i, g in enumerate(context.groups)
    )
    top_priority = max((t.priority for t in context.tenants), default=1.0)
    tenant_rows = tuple(
        _tenant_row(
            t,
            window.tenants.get(t.name),
            context.groups[tenant_group[i]],
            window.groups.get(t.group),
            rates[tenant_group[i]],
            top_priority,
            context,
        )
        for i, t in enumerate(context.tenants)
    )
    return SetObservation(group_rows=group_rows, tenant_rows=tenant_rows, tenant_group=tuple(tenant_group))
