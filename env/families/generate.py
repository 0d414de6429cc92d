"""Draw one scenario of a family per seed: a validated scenario, or its file text (byte-identical per seed).

:func:`generate_scenario` returns the :class:`~env.scenario.Scenario`; :func:`scenario_yaml` the file text.

The seed feeds one :class:`numpy.random.SeedSequence`, spawned into independent streams for the structure (model,
groups, budgets, tenants), the objectives, the load, the temporal pattern and the network, so a change to one knob
of the family leaves the draws of the others as they were. No trace file is read: archetypes are synthetic
distributions fitted to the traces (:mod:`env.families.archetypes`); the load is a fraction of each group's
capacity estimated from the calibrated performance model (:mod:`env.families.capacity`).

Temporal patterns (one per scenario):

* ``steady`` — every tenant at its rate (Poisson, or Gamma with the archetype's burstiness);
* ``diurnal`` — one cosine cycle per episode per tenant, each with its own phase (the mix moves);
* ``surge`` — one long-prompt tenant (any tenant when none) at ``surge_factor`` × its rate for a window;
* ``flood`` — one short-prompt tenant (chat, code; any when none) at ``flood_factor`` × its rate for a window;
* ``ramp`` — every group's load climbs in ``ramp_steps`` steps from its drawn load to ``ramp_end_capacity_frac``;
* ``shift`` — at ``shift_at_frac`` the tenants of each group trade their shares (the order of the shares is
  reversed); a group with one tenant moves to a newly drawn load instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml

from env.families.archetypes import ARCHETYPES, Archetype
from env.families.capacity import EngineShape, TenantDemand, clipped_lognormal_mean, group_capacity_rps, instance_tp
from env.families.config import FloatRange, IntRange, ScenarioFamily
from env.scenario import Scenario

__all__ = ["generate_scenario", "scenario_name", "scenario_yaml"]

_STREAMS = ("structure", "objectives", "load", "pattern", "network")


def scenario_name(family: ScenarioFamily, seed: int) -> str:
    """The name (and file stem) of a family's scenario for a seed."""
    return f"{family.name}-{seed:05d}"


def _sig(value: float, digits: int = 4) -> float:
    """``value`` rounded to ``digits`` significant digits (readable, stable YAML)."""
    return float(f"{value:.{digits}g}")


def _uniform(rng: np.random.Generator, spec: FloatRange) -> float:
    if spec.log:
        return float(math.exp(rng.uniform(math.log(spec.min), math.log(spec.max))))
    return float(rng.uniform(spec.min, spec.max))


def _integer(rng: np.random.Generator, spec: IntRange, low: int | None = None, high: int | None = None) -> int:
    lo = spec.min if low is None else max(spec.min, low)
    hi = spec.max if high is None else min(spec.max, high)
    return int(rng.integers(lo, max(hi, lo) + 1))


def _choice(rng: np.random.Generator, weights: dict[Any, float]) -> Any:
    keys = list(weights)
    probs = np.asarray([weights[k] for k in keys], dtype=np.float64)
    return keys[int(rng.choice(len(keys), p=probs / probs.sum()))]


@dataclass(slots=True)
class _Tenant:
    name: str
    group: str
    archetype: Archetype
    share_frac: float
    slo_scale: float = 1.0
    priority: float = 1.0
    rate_rps: float = 0.0


@dataclass(slots=True)
class _Group:
    name: str
    gpu_budget: int
    instances: int
    load_frac: float = 1.0
    capacity_rps: float = 0.0


def _structure(family: ScenarioFamily, rng: np.random.Generator) -> tuple[str, int, list[_Group], list[_Tenant]]:
    profile = str(_choice(rng, family.cluster.profiles))
    tp = instance_tp(profile, family.cluster.min_kv_tokens_per_instance)
    num_groups = _integer(rng, family.groups.count, high=family.tenants.count.max)
    groups = []
    for gi in range(num_groups):
        budget = int(_choice(rng, family.groups.gpu_budget))
        instances = max(budget // tp, 1)
        groups.append(_Group(f"g{gi + 1}", instances * tp, instances))
    num_tenants = _integer(rng, family.tenants.count, low=num_groups)
    owners = list(range(num_groups)) + [int(rng.integers(0, num_groups)) for _ in range(num_tenants - num_groups)]
    owners.sort()
    tenants: list[_Tenant] = []
    counts: dict[str, int] = {}
    for gi in owners:
        archetype = ARCHETYPES[str(_choice(rng, family.tenants.archetypes))]
        counts[archetype.name] = counts.get(archetype.name, 0) + 1
        tenants.append(_Tenant(f"{archetype.name}-{counts[archetype.name]}", groups[gi].name, archetype, 1.0))
    for group in groups:
        members = [t for t in tenants if t.group == group.name]
        shares = rng.dirichlet(np.full(len(members), family.tenants.share_concentration))
        for tenant, share in zip(members, shares, strict=True):
            tenant.share_frac = max(float(share), 0.02)
    return profile, tp, groups, tenants


def _objectives(family: ScenarioFamily, tenants: Sequence[_Tenant], rng: np.random.Generator) -> None:
    for tenant in tenants:
        tenant.slo_scale = _uniform(rng, family.tenants.slo_scale)
        tenant.priority = max(round(tenant.archetype.priority * _uniform(rng, family.tenants.priority_scale), 2), 0.05)


def _slo(tenant: _Tenant) -> dict[str, float]:
    a, s = tenant.archetype, tenant.slo_scale
    out = {"ttft_p95_s": _sig(a.ttft_p95_s * s, 3)}
    if a.ttft_p99_s is not None:
        out["ttft_p99_s"] = _sig(a.ttft_p99_s * s, 3)
    out[f"tpot_p{a.tpot_quantile}_s"] = _sig(a.tpot_s * s, 3)
    return out


def _tpot_s(tenant: _Tenant) -> float:
    return next(v for k, v in _slo(tenant).items() if k.startswith("tpot"))


def _load(
    family: ScenarioFamily,
    shape: EngineShape,
    groups: Sequence[_Group],
    tenants: Sequence[_Tenant],
    rng: np.random.Generator,
) -> None:
    for group in groups:
        members = [t for t in tenants if t.group == group.name]
        demands = [
            TenantDemand(t.archetype.input_tokens, t.archetype.output_tokens, _tpot_s(t), t.share_frac) for t in members
        ]
        group.capacity_rps = group_capacity_rps(shape, group.instances, demands)
        group.load_frac = _uniform(rng, family.load.capacity_frac)
        total_share = sum(t.share_frac for t in members)
        for tenant in members:
            tenant.rate_rps = group.load_frac * group.capacity_rps * tenant.share_frac / total_share


def _lengths(tenant: _Tenant) -> dict[str, Any]:
    out: dict[str, Any] = {
        "input_tokens": tenant.archetype.input_tokens.as_config(),
        "output_tokens": tenant.archetype.output_tokens.as_config(),
    }
    if tenant.archetype.prefix is not None:
        out["prefix"] = tenant.archetype.prefix.as_config()
    return out


def _steady(tenant: _Tenant) -> dict[str, Any]:
    rate = _sig(tenant.rate_rps)
    if tenant.archetype.arrival_cv == 1.0:
        return {"kind": "poisson", "rate_rps": rate, **_lengths(tenant)}
    return {"kind": "gamma", "rate_rps": rate, "cv": tenant.archetype.arrival_cv, **_lengths(tenant)}


def _step(tenant: _Tenant, segments: Sequence[tuple[float, float]]) -> dict[str, Any]:
    return {"kind": "step", "segments": [[s, _sig(r)] for s, r in segments], **_lengths(tenant)}


def _at(duration_s: float, interval_s: float, frac: float) -> float:
    """A time ``frac`` into the episode, on a control-interval boundary strictly inside it."""
    steps = round(duration_s * frac / interval_s)
    return float(min(max(steps, 1), round(duration_s / interval_s) - 1) * interval_s)


def _window(
    family: ScenarioFamily, duration_s: float, interval_s: float, rng: np.random.Generator
) -> tuple[float, float]:
    start_frac = _uniform(rng, family.patterns.event_start_frac)
    start = _at(duration_s, interval_s, start_frac)
    end = _at(duration_s, interval_s, start_frac + _uniform(rng, family.patterns.event_length_frac))
    return start, max(end, start + interval_s)


def _workloads(
    family: ScenarioFamily,
    pattern: str,
    groups: Sequence[_Group],
    tenants: Sequence[_Tenant],
    duration_s: float,
    interval_s: float,
    rng: np.random.Generator,
) -> dict[str, dict[str, Any]]:
    knobs = family.patterns
    out = {t.name: _steady(t) for t in tenants}
    if pattern == "diurnal":
        for t in tenants:
            out[t.name] = {
                "kind": "diurnal",
                "mean_rate_rps": _sig(t.rate_rps),
                "peak_to_mean": _sig(_uniform(rng, knobs.diurnal_peak_to_mean), 3),
                "period_s": duration_s,
                "phase_s": float(round(rng.uniform(0.0, duration_s))),
                **_lengths(t),
            }
    elif pattern in ("surge", "flood"):
        wanted = [t for t in tenants if t.archetype.short == (pattern == "flood")] or list(tenants)
        target = wanted[int(rng.integers(0, len(wanted)))]
        factor = _uniform(rng, knobs.flood_factor if pattern == "flood" else knobs.surge_factor)
        start, end = _window(family, duration_s, interval_s, rng)
        r = target.rate_rps
        out[target.name] = _step(target, [(0.0, r), (start, r * factor), (end, r)])
    elif pattern == "ramp":
        for group in groups:
            end_frac = _uniform(rng, knobs.ramp_end_capacity_frac)
            start_frac = min(group.load_frac, end_frac)
            times = [_at(duration_s, interval_s, i / knobs.ramp_steps) for i in range(knobs.ramp_steps)]
            times[0] = 0.0
            fracs = np.linspace(start_frac, end_frac, knobs.ramp_steps)
            for t in (t for t in tenants if t.group == group.name):
                scale = t.rate_rps / group.load_frac
                segments = dict(zip(times, (scale * f for f in fracs), strict=True))  # duplicates: last wins
                out[t.name] = _step(t, sorted(segments.items()))
    elif pattern == "shift":
        at = _at(duration_s, interval_s, _uniform(rng, knobs.shift_at_frac))
        for group in groups:
            members = [t for t in tenants if t.group == group.name]
            if len(members) > 1:
                after = [t.rate_rps for t in reversed(members)]
            else:
                after = [members[0].rate_rps / group.load_frac * _uniform(rng, family.load.capacity_frac)]
            for t, rate in zip(members, after, strict=True):
                out[t.name] = _step(t, [(0.0, t.rate_rps), (at, rate)])
    return out


def _network(family: ScenarioFamily, duration_s: float, rng: np.random.Generator) -> tuple[str, dict[str, Any]]:
    knobs = family.network
    kind = str(_choice(rng, knobs.weights))
    base: dict[str, Any] = knobs.healthy.model_dump()
    if kind == "degraded":
        base["link_bandwidth_bytes_per_s"] = _sig(_uniform(rng, knobs.degraded_bandwidth_bytes_per_s), 3)
        base["failure_prob"] = _sig(_uniform(rng, knobs.degraded_failure_prob), 3)
        base["timeout_s"] = min(base["timeout_s"], 3.0)
    elif kind == "incident":
        count = _integer(rng, knobs.incident_count)
        slot_s = duration_s / count
        incidents = []
        for i in range(count):
            length = _uniform(rng, knobs.incident_length_frac) * duration_s
            start = i * slot_s + rng.uniform(0.0, max(slot_s - length, 0.0))
            incidents.append(
                {
                    "start_s": float(round(start)),
                    "end_s": float(min(round(start + length), math.floor((i + 1) * slot_s))),
                    "link_bandwidth_bytes_per_s": _sig(_uniform(rng, knobs.degraded_bandwidth_bytes_per_s), 3),
                    "setup_latency_s": 0.005,
                    "failure_prob": _sig(_uniform(rng, knobs.degraded_failure_prob), 3),
                }
            )
        base["incidents"] = incidents
    return kind, base


def _draw(family: ScenarioFamily, seed: int) -> tuple[dict[str, Any], str]:
    rngs = dict(zip(_STREAMS, (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5)), strict=True))
    structure = rngs["structure"]
    interval_s = float(_choice(structure, family.episode.control_interval_s))
    steps = max(round(_uniform(structure, family.episode.duration_s) / interval_s), 2)
    duration_s = steps * interval_s
    profile, tp, groups, tenants = _structure(family, structure)
    _objectives(family, tenants, rngs["objectives"])
    c = family.cluster
    shape = EngineShape(profile, tp, c.max_num_seqs, c.max_num_batched_tokens)
    _load(family, shape, groups, tenants, rngs["load"])
    pattern_rng = rngs["pattern"]
    pattern = str(_choice(pattern_rng, family.patterns.weights))
    workloads = _workloads(family, pattern, groups, tenants, duration_s, interval_s, pattern_rng)
    network_kind, network = _network(family, duration_s, rngs["network"])
    loads = "/".join(f"{g.load_frac:.2f}" for g in groups)
    description = (
        f"{len(groups)} group(s) of {'+'.join(str(g.gpu_budget) for g in groups)} GPUs ({profile}, TP{tp}); "
        f"{len(tenants)} tenant(s) ({', '.join(t.name for t in tenants)}); load {loads} x capacity; "
        f"pattern {pattern}; network {network_kind}"
    )
    data: dict[str, Any] = {
        "name": scenario_name(family, seed),
        "description": description,
        "duration_s": duration_s,
        "drain_s": family.episode.drain_s,
        "control_interval_s": interval_s,
        "seed": seed,
        "cluster": {
            "profile": profile,
            "tp": tp,
            "max_num_seqs": c.max_num_seqs,
            "max_num_batched_tokens": c.max_num_batched_tokens,
            "startup_delay_s": c.startup_delay_s,
            "role_switch_delay_s": c.role_switch_delay_s,
            "network": network,
        },
        "tenant_groups": [
            {
                "name": g.name,
                "gpu_budget": g.gpu_budget,
                "prefill": g.instances // 2,
                "decode": g.instances - g.instances // 2,
                "prefill_pool": {"min": 0, "max": g.instances - 1},
                "decode_pool": {"min": 1, "max": g.instances},
            }
            for g in groups
        ],
        "tenants": [
            {
                "name": t.name,
                "group": t.group,
                "priority": t.priority,
                "slo": _slo(t),
                "expected_output_tokens": round(clipped_lognormal_mean(t.archetype.output_tokens)),
                "workload": workloads[t.name],
            }
            for t in tenants
        ],
    }
    return data, description


def generate_scenario(family: ScenarioFamily, seed: int) -> Scenario:
    """The family's scenario for ``seed`` (validated; the same family and seed give the same scenario).

    Raises:
        ValueError: a negative seed, or a family whose draw does not make a valid scenario (a bug, reported with
            the seed).
    """
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    data, _ = _draw(family, seed)
    return Scenario.model_validate(data)


def scenario_yaml(family: ScenarioFamily, seed: int) -> str:
    """The scenario file text of :func:`generate_scenario` (a comment header, then the scenario)."""
    data, description = _draw(family, seed)
    Scenario.model_validate(data)
    split = family.split_of(seed) or "no split"
    del description
    header = (
        f"# Generated by `pdctl scenarios generate` from family {family.name} (seed {seed}, {split});\n"
        "# do not edit: regenerate instead (docs/scenario-families.md).\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False, width=120, default_flow_style=None, allow_unicode=True)
