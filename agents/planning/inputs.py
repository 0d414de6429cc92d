"""What the capacity planner plans for: the workload source, the SLO, the GPU budget and the configurations.

:func:`load_plan_scenario` turns a planner source (scenario YAML, fitted-workload file, Azure CSV, Mooncake
JSONL, router JSONL log or ServeGen folder) into the one-group scenario every probe runs; :func:`parse_slo`
reads ``--slo``. A :class:`PlanConfig` is one static configuration of that group's ``N // tp`` instances
(``N`` GPUs):

* **aggregated** — every instance serves prefill and decode (``aggregated`` role, every request local);
* **disaggregated** ``P:D`` with ``P + D = N // tp`` and ``P, D ≥ 1``, under one route level for every tenant:
  ``always_remote`` (every prompt prefilled remotely) or ``remote>=T`` for T in ``levels_tokens``
  (as :mod:`policies.route_levels` defines them: the project's rule with a crisp threshold: inputs ≥ T
  tokens, after prefix-cache hits, go remote; the seed's prefill-queue overload fallback stays on; no
  decode-pressure or expected-output condition).

:func:`candidate_configs` lists every one of them and :func:`configured_scenario` deploys one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import ValidationError

from agents.planning.parts import (
    MAX_WHOLE_REQUESTS,
    PlanSource,
    choose_part,
    plannable_without_duration,
    time_compressed,
)
from agents.runs import scale_rates
from env.perf.profile import OperatorProfile, ProfileError, load_operator_profile
from env.scenario import ClusterConfig, Scenario, ScenarioError, SloConfig, TenantConfig, load_scenario
from env.sim.simulator import kv_capacity_tokens
from env.workloads.config import WorkloadConfig, parse_workload_config
from env.workloads.errors import WorkloadError
from livestack.profiling.fit import fit_workload
from livestack.profiling.sources import detect_source_kind, load_records
from policies.route_levels import AGGREGATED, ALWAYS_REMOTE, level_min_remote_tokens, remote_level, route_thresholds
from policies.schema import RoutingThresholds

__all__ = [
    "DEFAULT_LEVELS_TOKENS",
    "GROUP_NAME",
    "MAX_WHOLE_REQUESTS",
    "SLO_FIELDS",
    "PlanConfig",
    "PlanInputError",
    "PlanSource",
    "candidate_configs",
    "configured_scenario",
    "load_plan_scenario",
    "load_plan_source",
    "parse_slo",
    "route_levels",
    "time_compressed",
]

DEFAULT_LEVELS_TOKENS: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
GROUP_NAME = "main"
"""The one tenant group the planner merges a source's groups into."""


class PlanInputError(ValueError):
    """Bad planner input; ``str()`` is one line naming the file or field."""


# ------------------------------------------------------------------------------------------------ SLO syntax

SLO_FIELDS = ("ttft_p95", "ttft_p99", "tpot_p95", "tpot_p99")
"""The objectives ``--slo`` accepts (each a ``SloConfig`` field with ``_s`` appended)."""
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s)?\s*$")


def parse_slo(text: str) -> SloConfig:
    """Parse ``ttft_p95=2s,tpot_p95=80ms`` (fields ttft/tpot × p95/p99; units ``s`` or ``ms``, bare = s).

    Raises:
        PlanInputError: bad syntax, an unknown or repeated field, or a non-positive value (the field named).
    """
    values: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, sep, raw = part.partition("=")
        name = name.strip()
        if not sep:
            raise PlanInputError(f"--slo: {part.strip()!r}: expected FIELD=VALUE (e.g. ttft_p95=2s)")
        if name not in SLO_FIELDS:
            raise PlanInputError(f"--slo: {name!r}: unknown field (known: {', '.join(SLO_FIELDS)})")
        if f"{name}_s" in values:
            raise PlanInputError(f"--slo: {name}: given twice")
        match = _DURATION.match(raw)
        if match is None:
            raise PlanInputError(f"--slo: {name}: {raw.strip()!r} is not a duration (e.g. 2s or 80ms)")
        seconds = float(match.group(1)) / (1000.0 if match.group(2) == "ms" else 1.0)
        if not seconds > 0 or not math.isfinite(seconds):
            raise PlanInputError(f"--slo: {name}: must be positive")
        values[f"{name}_s"] = seconds
    if not values:
        raise PlanInputError("--slo: no objective given (e.g. ttft_p95=2s,tpot_p95=80ms)")
    return SloConfig(**values)


# ------------------------------------------------------------------------------------------------ configurations


@dataclass(frozen=True, slots=True, order=True)
class PlanConfig:
    """One static configuration: instance counts, the route level of every tenant, and per-tenant exceptions."""

    num_prefill: int
    num_decode: int
    route: str
    """``aggregated``, ``always_remote`` or ``remote>=T``."""
    tenant_routes: tuple[tuple[str, str], ...] = ()
    """``(tenant, level)`` pairs overriding ``route`` for those tenants (the per-tenant refinement)."""

    @property
    def is_aggregated(self) -> bool:
        """Aggregated serving (no prefill pool)."""
        return self.route == AGGREGATED

    @property
    def min_remote_input_tokens(self) -> int | None:
        """T of the common ``remote>=T`` level (0 for always remote, None when aggregated)."""
        return level_min_remote_tokens(self.route)

    def route_for(self, tenant: str) -> str:
        """The route level of ``tenant``."""
        return dict(self.tenant_routes).get(tenant, self.route)

    @property
    def label(self) -> str:
        """Short human form, e.g. ``4P:12D remote>=2048 [rag: always_remote]`` or ``aggregated x16``."""
        if self.is_aggregated:
            return f"aggregated x{self.num_decode}"
        extra = "".join(f" [{tenant}: {level}]" for tenant, level in self.tenant_routes)
        return f"{self.num_prefill}P:{self.num_decode}D {self.route}{extra}"

    def thresholds(self, tenant: str | None = None) -> RoutingThresholds:
        """The routing thresholds of ``tenant`` (default: of the common level) under this configuration."""
        return route_thresholds(self.route if tenant is None else self.route_for(tenant))

    def thresholds_for(self, tenant: str) -> RoutingThresholds:
        """The routing thresholds of ``tenant`` (what :class:`policies.rules.FilePolicy` publishes)."""
        return self.thresholds(tenant)

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        out: dict[str, Any] = {"num_prefill": self.num_prefill, "num_decode": self.num_decode, "route": self.route}
        if self.tenant_routes:
            out["tenant_routes"] = [list(pair) for pair in self.tenant_routes]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanConfig:
        """Inverse of :meth:`as_dict`."""
        routes = tuple((str(t), str(level)) for t, level in data.get("tenant_routes", ()))
        return cls(int(data["num_prefill"]), int(data["num_decode"]), str(data["route"]), routes)


def route_levels(levels_tokens: Sequence[int]) -> list[str]:
    """The disaggregated route levels: always remote, then ``remote>=T`` for each T."""
    return [ALWAYS_REMOTE, *(remote_level(t) for t in sorted(set(levels_tokens)))]


def candidate_configs(num_instances: int, levels_tokens: Sequence[int] = DEFAULT_LEVELS_TOKENS) -> list[PlanConfig]:
    """Every configuration of ``num_instances``: aggregated, then each split P:D under each route level."""
    if num_instances < 1:
        raise PlanInputError("--gpus: not enough GPUs for one instance at this TP")
    out = [PlanConfig(0, num_instances, AGGREGATED)]
    for num_prefill in range(1, num_instances):
        out.extend(PlanConfig(num_prefill, num_instances - num_prefill, lvl) for lvl in route_levels(levels_tokens))
    return out


# ------------------------------------------------------------------------------------------------ the workload


def load_plan_scenario(
    source: str | Path,
    *,
    gpus: int | None,
    slo: SloConfig | None = None,
    model_profile: str | None = None,
    tp: int | None = None,
    horizon_s: float | None = 30.0,
    seed: int = 0,
    traces_dir: str | Path | None = None,
) -> Scenario:
    """The scenario the planner searches (:func:`load_plan_source`'s ``scenario``)."""
    return load_plan_source(
        source, gpus=gpus, slo=slo, model_profile=model_profile, tp=tp, horizon_s=horizon_s, seed=seed,
        traces_dir=traces_dir,
    ).scenario  # fmt: skip


def load_plan_source(
    source: str | Path,
    *,
    gpus: int | None,
    slo: SloConfig | None = None,
    model_profile: str | None = None,
    tp: int | None = None,
    horizon_s: float | None = None,
    seed: int = 0,
    traces_dir: str | Path | None = None,
    max_whole_requests: int = MAX_WHOLE_REQUESTS,
) -> PlanSource:
    """The source's tenants in one group of ``gpus`` GPUs: the searched scenario and the whole source.

    ``source`` is a scenario YAML (its cluster and tenants; groups are merged into one), a fitted-workload file
    of ``pdctl profile --emit-workload`` (tenant → workload), an Azure CSV, a Mooncake JSONL, a router JSONL log
    (fitted with :func:`livestack.profiling.fit.fit_workload`) or a ServeGen folder. ``slo`` replaces every
    tenant's objectives (required when the source carries none).

    Without ``horizon_s`` a probe is representative of the whole source: an Azure or Mooncake trace is replayed
    whole, time-compressed by the rate multiplier ``m`` (a probe lasts ``span / m``), or, above
    ``max_whole_requests`` (default :data:`MAX_WHOLE_REQUESTS`) requests, over the window of that many
    requests (at its mean rate) centred on its busiest minute; a scenario with non-stationary
    workloads runs its own duration; a stationary synthetic source (Poisson or Gamma arrivals, and a fitted
    router log) runs long enough for :data:`STATIONARY_REQUESTS` requests (within bounds and its own duration).
    With ``horizon_s`` (a quick look) a probe covers the first
    ``m × horizon_s`` seconds of a trace (tiled when the trace is shorter) or of a scenario.

    Raises:
        PlanInputError: a missing or invalid source or option (one line naming the file or field).
    """
    path = Path(source)
    if not path.exists():
        raise PlanInputError(f"{path}: no such file or folder")
    base_cluster = ClusterConfig()
    own_duration_s: float | None = None
    if path.suffix.lower() in (".yaml", ".yml"):
        tenants, cluster, default_gpus, own_duration_s = _yaml_source(path, traces_dir)
        base_cluster = cluster or base_cluster
    else:
        tenants, default_gpus = _trace_source(path), None
    budget = gpus if gpus is not None else default_gpus
    if budget is None:
        raise PlanInputError("--gpus: required for this source (the GPU budget to plan)")
    if budget < 1:
        raise PlanInputError(f"--gpus: must be at least 1 (got {budget})")
    cluster_update: dict[str, Any] = {"prefill_tp": None}
    if model_profile is not None:
        cluster_update["profile"] = model_profile
    if tp is not None:
        cluster_update["tp"] = tp
    cluster = base_cluster.model_copy(update=cluster_update)
    if budget // cluster.tp < 1:
        raise PlanInputError(f"--gpus: {budget} GPUs hold no instance at TP {cluster.tp}")
    out_tenants = []
    for tenant in tenants:
        tenant_slo = slo if slo is not None else tenant.slo
        if tenant_slo.to_slo().ttft_target_s() == math.inf and tenant_slo.to_slo().tpot_target_s() == math.inf:
            raise PlanInputError(f"--slo: required (tenant {tenant.name!r} of {path} has no objective)")
        out_tenants.append(tenant.model_copy(update={"slo": tenant_slo, "group": GROUP_NAME}))

    def build(duration_s: float, members: Sequence[TenantConfig]) -> Scenario:
        data = {
            "name": f"plan-{_slug(path.stem)}",
            "description": f"pdctl plan of {path}",
            "duration_s": duration_s,
            "drain_s": 300.0,
            "control_interval_s": 10.0,
            "seed": seed,
            "cluster": cluster.model_dump(),
            "tenant_groups": [{"name": GROUP_NAME, "gpu_budget": budget, "decode": budget // cluster.tp}],
            "tenants": [t.model_dump() for t in members],
        }
        try:
            return Scenario.model_validate(data)
        except ValueError as exc:
            first = str(exc).splitlines()
            raise PlanInputError(f"{path}: {first[-1].strip() if first else exc}") from None

    source_out = choose_part(out_tenants, own_duration_s, horizon_s, build, max_whole_requests)
    if own_duration_s is None and path.suffix.lower() not in (".yaml", ".yml") and source_out.mode == "stationary":
        records, _ = load_records(str(path), "router")  # read once already by the fit: valid
        arrival = records.arrival_s if records.arrival_s is not None else np.zeros(len(records.input_tokens))
        text = (
            "router log fitted to a stationary workload (its mean rate, inter-arrival CV and length quantiles); "
            + source_out.description
        )
        source_out = PlanSource(
            source_out.scenario,
            source_out.whole,
            "fitted",
            text,
            (arrival, records.input_tokens, records.output_tokens),
        )
    _check_profile(source_out.scenario)
    return source_out


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "workload"


def _check_profile(scenario: Scenario) -> None:
    cluster = scenario.cluster
    try:
        profile = _profile_cached(cluster.profile, str(cluster.profile_dir), str(cluster.hf_config))
    except (ProfileError, KeyError, OSError) as exc:
        message = str(exc).strip("'\"")
        raise PlanInputError(f"--model-profile: {cluster.profile}: {message}") from None
    capacity = cluster.kv_capacity_tokens or kv_capacity_tokens(
        profile, cluster.tp, cluster.gpu_memory_utilization, cluster.activation_reserve_bytes
    )
    if capacity <= 1:
        raise PlanInputError(f"--tp: {cluster.profile} leaves no memory for the KV cache at TP {cluster.tp}")


@cache
def _profile_cached(name: str, directory: str, model_config: str) -> OperatorProfile:
    return load_operator_profile(
        name,
        None if directory == "None" else directory,
        model_config=None if model_config == "None" else model_config,
    )


def _yaml_source(
    path: Path, traces_dir: str | Path | None
) -> tuple[list[TenantConfig], ClusterConfig | None, int, float | None]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanInputError(f"{path}: cannot read ({exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise PlanInputError(f"{path}{line}: not valid YAML") from None
    if isinstance(data, dict) and "tenants" in data:
        try:
            scenario = load_scenario(path, traces_dir=traces_dir)
        except ScenarioError as exc:
            raise PlanInputError(exc.problems[0]) from None
        budget = sum(g.gpu_budget for g in scenario.tenant_groups)
        return list(scenario.tenants), scenario.cluster, budget, scenario.duration_s
    if not isinstance(data, dict) or not data:
        raise PlanInputError(f"{path}: expected a scenario or a fitted-workload file (tenant: workload)")
    tenants = []
    for name, spec in data.items():
        try:
            workload: WorkloadConfig = parse_workload_config(spec)
            tenants.append(TenantConfig(name=str(name), group=GROUP_NAME, workload=workload))
        except ValidationError as exc:
            raise PlanInputError(f"{path}: {name}: not a workload ({_first_problem(exc)})") from None
        except ValueError as exc:
            detail = str(exc).splitlines()
            raise PlanInputError(f"{path}: {name}: not a workload ({detail[-1].strip() if detail else exc})") from None
    kinds = {t.workload.kind for t in tenants}
    if not plannable_without_duration(kinds):
        raise PlanInputError(
            f"{path}: workloads of kinds {', '.join(sorted(kinds))} have no duration in a fitted-workload file "
            "(only traces, Poisson/Gamma workloads or one ServeGen folder do): write a scenario file with duration_s"
        )
    return tenants, None, 0, None


def _first_problem(exc: ValidationError) -> str:
    """The first of pydantic's errors as ``field.path: message`` (without the union's tag), and how many more."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    field = ".".join(str(p) for p in first["loc"][1:] if isinstance(p, str | int))
    more = f"; and {len(errors) - 1} more" if len(errors) > 1 else ""
    return f"{field}: {first['msg']}{more}" if field else f"{first['msg']}{more}"


def _trace_source(path: Path) -> list[TenantConfig]:
    try:
        kind = detect_source_kind(str(path))
    except WorkloadError as exc:
        raise PlanInputError(str(exc).splitlines()[0]) from None
    spec: dict[str, Any]
    window = {"start_s": 0.0, "repeat": False}
    if kind == "azure":
        spec = {"kind": "trace_azure", "path": str(path), **window}
    elif kind == "mooncake":
        spec = {"kind": "trace_mooncake", "path": str(path), **window}
    elif kind == "servegen":
        spec = {"kind": "servegen", "path": str(path), "start_s": 0.0}
    elif kind == "router":
        try:
            records, _ = load_records(str(path), "router")
            return [TenantConfig(name="default", group=GROUP_NAME, workload=fit_workload(records))]
        except (WorkloadError, ValueError) as exc:
            raise PlanInputError(f"{path}: cannot fit a workload ({str(exc).splitlines()[0]})") from None
    else:  # pragma: no cover - detect_source_kind returns prometheus only for URLs, refused above
        raise PlanInputError(f"{path}: not a trace file")
    return [TenantConfig(name="default", group=GROUP_NAME, workload=parse_workload_config(spec))]


def configured_scenario(scenario: Scenario, config: PlanConfig, rate_scale: float = 1.0) -> Scenario:
    """``scenario`` with its group deployed as ``config`` and every tenant's rate multiplied by ``rate_scale``.

    A :func:`time_compressed` scenario also lasts ``1 / rate_scale`` as long (the same trace window, faster).
    """
    group = scenario.tenant_groups[0]
    if config.is_aggregated:
        pools = {"prefill": 0, "decode": 0, "aggregated": config.num_decode}
    else:
        pools = {"prefill": config.num_prefill, "decode": config.num_decode, "aggregated": 0}
    update: dict[str, Any] = {"tenant_groups": [group.model_copy(update=pools)]}
    if rate_scale != 1.0 and time_compressed(scenario):
        update["duration_s"] = scenario.duration_s / rate_scale
    return scale_rates(scenario.model_copy(update=update), rate_scale)
