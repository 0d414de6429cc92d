"""What the capacity planner reports: capacities, their ranking, the Pareto front, ``plan.json`` and the policy file.

A :class:`Capacity` is what the search knows of one configuration's sustainable rate multiplier; the best
configuration has the highest sustainable rate; ties (within one grid step) go to fewer per-tenant exceptions
(an exception must raise the capacity), then the higher attainment at the first failing multiplier (run to the
end for the tied leaders), then the higher goodput at the sustainable rate, then the simpler configuration
(aggregated, then fewer prefill instances): :func:`rank_key`.

Besides the best configuration a :class:`PlanResult` carries every probe (goodput at the SLO per configuration
and rate), each configuration's goodput at its sustainable rate, and the **Pareto front of goodput per GPU
versus offered rate** (:func:`pareto_front`): the two leading configurations and the best aggregated one are
run on a common rate grid (fractions of the best capacity) and, at each offered rate, the configuration with the
highest goodput per GPU is on the front (one row per offered rate: multipliers that offer the same requests per
second, as the first seconds of a trace can, are one row). :func:`policy_document`
turns the best configuration into a per-tenant policy file and :func:`best_scenario` into the scenario it
replays on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agents.planning.inputs import GROUP_NAME, SLO_FIELDS, PlanConfig, configured_scenario
from agents.planning.probes import Probe, ProbeRunner, code_version
from env.scenario import Scenario
from policies.schema import FallbackAction, RoutingThresholds

if TYPE_CHECKING:
    from agents.planning.coverage import Coverage
    from agents.planning.validate import Validation

__all__ = [
    "Capacity",
    "PlanResult",
    "base_rate_rps",
    "best_scenario",
    "distinct_probes",
    "pareto_front",
    "policy_document",
    "rank_key",
]

_PARETO_GRID_FRACS = (0.25, 0.5, 0.75, 1.0, 1.25)
"""The front's rates, as fractions of the best sustainable multiplier."""


@dataclass(slots=True)
class Capacity:
    """What the search knows about one configuration's sustainable rate multiplier: ``lo ≤ capacity < hi``."""

    config: PlanConfig
    lo: float = 0.0
    """Highest multiplier sustained (0: none probed was)."""
    hi: float | None = None
    """Lowest multiplier that failed (None: none did)."""
    attainment_at_hi: float = 0.0


@dataclass(slots=True)
class PlanResult:
    """What :func:`plan` found (see the module docstring)."""

    scenario: Scenario
    best: Capacity
    capacities: list[Capacity]
    probes: list[Probe]
    at_capacity: dict[PlanConfig, Probe]
    """Each configuration's probe at its sustainable multiplier (goodput at the SLO there)."""
    at_workload_rate: dict[PlanConfig, Probe]
    """Complete probes at the workload's own rate (multiplier 1), for the configurations the search ran there."""
    pareto: list[dict[str, Any]]
    curves: dict[str, list[dict[str, Any]]]
    wall_s: float
    num_probes: int
    num_cache_hits: int
    exhaustive: bool
    target_frac: float
    base_rate_rps: float
    stages: list[dict[str, Any]] = field(default_factory=list)
    search_best: Capacity | None = None
    """The search's best configuration (``best`` is the recommendation: the first that passed validation)."""
    validation: Validation | None = None
    coverage: Coverage | None = None
    """Which part of the source the probes covered (set by the caller, :func:`agents.planning.coverage.coverage_of`)."""

    @property
    def validated(self) -> bool:
        """Whether the recommendation passed its validation replay."""
        return self.validation is not None and self.validation.passed

    @property
    def gpus(self) -> int:
        """The planned GPU budget."""
        return self.scenario.tenant_groups[0].gpu_budget

    @property
    def max_sustainable_rps(self) -> float:
        """The best configuration's sustainable request rate (requests per second)."""
        return self.offered_rps(self.best.lo)

    def offered_rps(self, rate_scale: float) -> float:
        """Requests per second a probe at ``rate_scale`` offered (a trace's rate varies along it: measured)."""
        known = [p.offered_rps for p in self.probes if p.rate_scale == rate_scale]
        return known[0] if known else rate_scale * self.base_rate_rps

    def ranked(self) -> list[Capacity]:
        """Every searched configuration, best first."""
        return sorted(self.capacities, key=rank_key(self.at_capacity))

    def as_dict(self) -> dict[str, Any]:
        """JSON form (``plan.json``)."""

        def cap_row(cap: Capacity) -> dict[str, Any]:
            probe = self.at_workload_rate.get(cap.config)
            top = self.at_capacity.get(cap.config)
            return {
                **cap.config.as_dict(),
                "label": cap.config.label,
                "max_rate_scale": cap.lo,
                "max_sustainable_rps": self.offered_rps(cap.lo) if cap.lo > 0 else 0.0,
                "first_failing_scale": cap.hi,
                "attainment_at_first_failing": cap.attainment_at_hi if cap.hi is not None else None,
                "goodput_rps_at_max_rate": None if top is None else top.goodput_rps,
                "goodput_per_gpu_rps_at_max_rate": None if top is None else top.goodput_per_gpu_rps,
                "slo_attainment_frac_at_max_rate": None if top is None else top.slo_attainment_frac,
                "goodput_rps_at_workload_rate": None if probe is None else probe.goodput_rps,
                "slo_attainment_frac_at_workload_rate": None if probe is None else probe.slo_attainment_frac,
            }

        return {
            "scenario": self.scenario.model_dump(mode="json"),
            "gpus": self.gpus,
            "instances": self.scenario.tenant_groups[0].gpu_budget // self.scenario.cluster.tp,
            "tp": self.scenario.cluster.tp,
            "target_frac": self.target_frac,
            "base_rate_rps": self.base_rate_rps,
            "best": cap_row(self.best),
            "search_best": cap_row(self.search_best or self.best),
            "validation": None if self.validation is None else self.validation.as_dict(),
            "coverage": None if self.coverage is None else self.coverage.as_dict(),
            "max_sustainable_rps": self.max_sustainable_rps,
            "ranked": [cap_row(c) for c in self.ranked()],
            "pareto": self.pareto,
            "curves": self.curves,
            "probes": [p.as_dict() for p in self.probes],
            "stages": self.stages,
            "wall_s": self.wall_s,
            "num_probes": self.num_probes,
            "num_cache_hits": self.num_cache_hits,
            "exhaustive": self.exhaustive,
            "code_version": code_version(),
        }


def rank_key(at_capacity: Mapping[PlanConfig, Probe]) -> Callable[[Capacity], tuple[float, ...]]:
    """Sort key of capacities, best first (see the module docstring); ``at_capacity`` gives goodput there."""

    def key(cap: Capacity) -> tuple[float, ...]:
        probe = at_capacity.get(cap.config)
        goodput = probe.goodput_rps if probe is not None else 0.0
        simple = 0 if cap.config.is_aggregated else 1
        exceptions = len(cap.config.tenant_routes)
        config = cap.config
        return (-cap.lo, exceptions, -cap.attainment_at_hi, -goodput, simple, config.num_prefill, _level_order(config))

    return key


def _level_order(config: PlanConfig) -> int:
    tokens = config.min_remote_input_tokens
    return -1 if tokens is None else tokens


def distinct_probes(known: Mapping[tuple[PlanConfig, float, float | None], Probe]) -> list[Probe]:
    """One probe per (configuration, multiplier): the complete one when both kinds exist."""
    out: dict[tuple[PlanConfig, float], Probe] = {}
    for (config, scale, _), probe in sorted(known.items(), key=lambda kv: kv[0][2] is None):
        current = out.get((config, scale))
        if current is None or (probe.complete and not current.complete):
            out[(config, scale)] = probe
    return [out[k] for k in sorted(out, key=lambda k: (k[0], k[1]))]


def base_rate_rps(probes: Sequence[Probe]) -> float:
    """Offered rate at multiplier 1 (every configuration sees the same requests at one multiplier)."""
    at_one = [p.offered_rps for p in probes if p.rate_scale == 1.0]
    if at_one:
        return at_one[0]
    return probes[0].offered_rps / probes[0].rate_scale if probes else 0.0


def pareto_front(
    runner: ProbeRunner, ranked: Sequence[Capacity], best_scale: float
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Rate curves of the leading configurations and their upper envelope (the front)."""
    shown: list[PlanConfig] = []
    best_agg = next((c for c in ranked if c.config.is_aggregated), None)
    for cap in [*ranked[:2], *([best_agg] if best_agg is not None else [])]:
        if cap.config not in shown:
            shown.append(cap.config)
    scales = [round(best_scale * f, 9) for f in _PARETO_GRID_FRACS]
    probes = runner.run(((c, s) for c in shown for s in scales), exact=True)
    curves: dict[str, list[dict[str, Any]]] = {}
    for p in probes:
        curves.setdefault(p.config.label, []).append(
            {
                "rate_scale": p.rate_scale,
                "offered_rps": p.offered_rps,
                "goodput_per_gpu_rps": p.goodput_per_gpu_rps,
                "slo_attainment_frac": p.slo_attainment_frac,
            }
        )
    best_at: dict[float, Probe] = {}  # one row per offered rate: the best configuration there
    for p in probes:
        rate = round(p.offered_rps, 9)
        current = best_at.get(rate)
        if current is None or (p.goodput_per_gpu_rps, -shown.index(p.config)) > (
            current.goodput_per_gpu_rps,
            -shown.index(current.config),
        ):
            best_at[rate] = p
    front = []
    for rate in sorted(best_at):
        top = best_at[rate]
        front.append(
            {
                "rate_scale": top.rate_scale,
                "offered_rps": top.offered_rps,
                "goodput_per_gpu_rps": top.goodput_per_gpu_rps,
                "slo_attainment_frac": top.slo_attainment_frac,
                "label": top.config.label,
                **top.config.as_dict(),
            }
        )
    return front, curves


# ------------------------------------------------------------------------------------------------ outputs


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 6)


def _pd_block(thresholds: RoutingThresholds) -> dict[str, Any]:
    """A complete ``pd_disaggregation_policy`` block: loading it gives back exactly ``thresholds``."""
    return {
        "rule": thresholds.rule.value,
        "remote_prefill": {
            "min_input_tokens": thresholds.min_remote_input_tokens,
            "max_prefill_queue_wait_ms": _ms(thresholds.max_prefill_queue_wait_s),
            "min_expected_output_tokens": thresholds.min_expected_output_tokens,
            "require_decode_pool_pressure": thresholds.require_decode_pool_pressure,
            "decode_pressure_threshold_perc": round(100.0 * thresholds.decode_pressure_threshold_frac, 9),
        },
        "local_prefill": {
            "max_input_tokens": thresholds.max_local_input_tokens,
            "prefer_when_prefix_cache_hit": thresholds.prefer_local_on_prefix_hit,
        },
    }


def policy_document(result: PlanResult, source: str = "") -> dict[str, Any]:
    """A per-tenant policy file (seed format) for the best configuration: thresholds, SLOs, pinned pools."""
    scenario = result.scenario
    config = result.best.config
    group = scenario.tenant_groups[0]
    thresholds = config.thresholds()
    pd = {"rule": "aggregated_only"} if config.is_aggregated else _pd_block(thresholds)
    fallback = {
        "on_kv_transfer_timeout": FallbackAction(thresholds.on_kv_transfer_timeout).value,
        "on_prefill_queue_overload": FallbackAction(thresholds.on_prefill_queue_overload).value,
    }
    tenants = []
    for tenant in scenario.tenants:
        slo = {
            f"{name}_ms": _ms(getattr(tenant.slo, f"{name}_s"))
            for name in SLO_FIELDS
            if getattr(tenant.slo, f"{name}_s") is not None
        }
        entry: dict[str, Any] = {"name": tenant.name, "group": GROUP_NAME, "priority": tenant.priority, "slo": slo}
        if tenant.expected_output_tokens is not None:
            entry["expected_output_tokens"] = tenant.expected_output_tokens
        if config.route_for(tenant.name) != config.route:
            entry["pd_disaggregation_policy"] = _pd_block(config.thresholds(tenant.name))
        tenants.append(entry)
    num_prefill = 0 if config.is_aggregated else config.num_prefill
    description = (
        f"pdctl plan{' of ' + source if source else ''}: {config.label} on {group.gpu_budget} GPUs "
        f"(TP {scenario.cluster.tp}); sustains x{result.best.lo:.3g} of the workload rate "
        f"({result.max_sustainable_rps:.3g} req/s) at >= {result.target_frac:.0%} SLO attainment"
    )
    return {
        "version": 1,
        "description": description,
        "mode": "aggregated_only" if config.is_aggregated else "disaggregated",
        "pd_disaggregation_policy": pd,
        "fallback": fallback,
        "tenant_groups": [
            {
                "name": GROUP_NAME,
                "gpu_budget": group.gpu_budget,
                "gpus_per_instance": scenario.cluster.tp,
                "pools": {
                    "prefill": {"min": num_prefill, "max": num_prefill},
                    "decode": {"min": config.num_decode, "max": config.num_decode},
                },
            }
        ],
        "tenants": tenants,
    }


def best_scenario(result: PlanResult, rate_scale: float = 1.0) -> Scenario:
    """The searched scenario deployed as the best configuration (what ``pdctl sim`` runs the policy file on)."""
    return configured_scenario(result.scenario, result.best.config, rate_scale)
