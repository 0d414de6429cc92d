"""How many requests per second a tenant group's GPUs serve: the estimate a family scales its load against.

The estimate comes from the calibrated performance model (:class:`env.perf.model.InterpolatedExecutionTimeModel`
over the profile's operator timings), not a constant:

* prefill: tokens per second of one instance running full ``max_num_batched_tokens`` chunks;
* decode: tokens per second of one instance at the largest batch whose decode step (at the mix's mean context
  per sequence) stays within the tightest TPOT objective of the group, bounded by ``max_num_seqs`` and by the KV
  cache (:func:`env.sim.simulator.kv_capacity_tokens`);
* a request costs ``E[input] / prefill rate + E[output] / decode rate`` instance-seconds, and the group's
  instances are shared between the two roles as needed, so the group serves
  ``instances / Σ share × cost`` requests per second at the given rate shares.

Shared prefixes are not discounted (cache hits depend on placement), so the estimate is slightly low for prefix-heavy
mixes; queueing, interference of co-batched prefills and transfers make the real knee lower than this bound for
other mixes. A load of 1.0 is therefore "at the modelled capacity", not "meeting every objective".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from env.families.archetypes import LogNormalSpec
from env.perf.model import InterpolatedExecutionTimeModel
from env.perf.profile import OperatorProfile, load_operator_profile
from env.sim.simulator import kv_capacity_tokens

__all__ = ["EngineShape", "TenantDemand", "clipped_lognormal_mean", "group_capacity_rps", "instance_tp"]

_TP_CHOICES = (1, 2, 4, 8)
_GAUSS_HERMITE_POINTS = 64


@dataclass(frozen=True, slots=True)
class EngineShape:
    """The engine settings a capacity estimate depends on (the scenario's cluster block)."""

    profile: str
    tp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float = 0.9
    activation_reserve_bytes: float = 4e9


@dataclass(frozen=True, slots=True)
class TenantDemand:
    """What one tenant asks of the GPUs: its lengths, its TPOT objective and its share of the group's requests."""

    input_tokens: LogNormalSpec
    output_tokens: LogNormalSpec
    tpot_target_s: float
    share_frac: float


@functools.lru_cache(maxsize=8)
def _profile(name: str) -> OperatorProfile:
    return load_operator_profile(name)


@functools.lru_cache(maxsize=16)
def _model(name: str, tp: int, max_batch: int) -> InterpolatedExecutionTimeModel:
    return InterpolatedExecutionTimeModel(_profile(name), tp, max_batch=max_batch)


def instance_tp(profile: str, min_kv_tokens: int, gpu_memory_utilization: float = 0.9) -> int:
    """The smallest TP degree (1, 2, 4, 8) at which one instance of the profile's model holds ``min_kv_tokens``.

    Raises:
        ValueError: not even TP 8 leaves that much KV cache (message names the profile).
    """
    loaded = _profile(profile)
    for tp in _TP_CHOICES:
        if kv_capacity_tokens(loaded, tp, gpu_memory_utilization, 4e9) >= min_kv_tokens:
            return tp
    raise ValueError(f"profile {profile}: no TP up to 8 leaves {min_kv_tokens} KV tokens per instance")


@functools.lru_cache(maxsize=1)
def _quadrature() -> tuple[np.ndarray, np.ndarray]:
    nodes, weights = np.polynomial.hermite_e.hermegauss(_GAUSS_HERMITE_POINTS)
    return nodes, weights


@functools.lru_cache(maxsize=64)
def clipped_lognormal_mean(spec: LogNormalSpec) -> float:
    """Mean of the clipped log-normal (tokens), by Gauss-Hermite quadrature (deterministic, no sampling)."""
    nodes, weights = _quadrature()
    values = np.clip(spec.median_tokens * np.exp(spec.sigma * nodes), spec.min_tokens, spec.max_tokens)
    return float(np.sum(weights * values) / math.sqrt(2.0 * math.pi))


def _prefill_tokens_per_s(shape: EngineShape) -> float:
    model = _model(shape.profile, shape.tp, shape.max_num_seqs)
    chunk = shape.max_num_batched_tokens
    return chunk / model.step_time_s(chunk, 1, 0, 0, [(chunk, 0)])


def _decode_tokens_per_s(shape: EngineShape, context_tokens: float, tpot_target_s: float) -> float:
    model = _model(shape.profile, shape.tp, shape.max_num_seqs)
    kv_tokens = kv_capacity_tokens(
        _profile(shape.profile), shape.tp, shape.gpu_memory_utilization, shape.activation_reserve_bytes
    )
    max_batch = max(min(shape.max_num_seqs, int(kv_tokens // max(context_tokens, 1.0))), 1)
    best = 1.0 / model.decode_step_time_s(1, int(context_tokens))
    for batch in range(1, max_batch + 1):
        step_s = model.decode_step_time_s(batch, int(context_tokens * batch))
        if step_s > tpot_target_s:
            break
        best = batch / step_s
    return best


def group_capacity_rps(shape: EngineShape, num_instances: int, demands: Sequence[TenantDemand]) -> float:
    """Requests per second ``num_instances`` instances serve for this tenant mix (see the module docstring).

    Raises:
        ValueError: no demand, or shares that do not sum to a positive number.
    """
    total_share = sum(d.share_frac for d in demands)
    if not demands or total_share <= 0:
        raise ValueError("a capacity estimate needs at least one tenant with a positive share")
    prefill_rate = _prefill_tokens_per_s(shape)
    tpot_target_s = min((d.tpot_target_s for d in demands if math.isfinite(d.tpot_target_s)), default=0.05)
    cost_s = 0.0
    context = 0.0
    means = [(clipped_lognormal_mean(d.input_tokens), clipped_lognormal_mean(d.output_tokens)) for d in demands]
    for demand, (mean_in, mean_out) in zip(demands, means, strict=True):
        context += demand.share_frac / total_share * (mean_in + mean_out / 2.0)
    decode_rate = _decode_tokens_per_s(shape, context, tpot_target_s)
    for demand, (mean_in, mean_out) in zip(demands, means, strict=True):
        cost_s += demand.share_frac / total_share * (mean_in / prefill_rate + mean_out / decode_rate)
    return num_instances / cost_s
