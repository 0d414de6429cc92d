"""Scenario files: a cluster, its tenant groups and tenants with their workloads, run length and seed.

The same scenario runs in the simulator, the gym env and against the emulated live cluster. Example::

    name: mixed-chat-rag-4p4d
    duration_s: 600
    control_interval_s: 10
    seed: 7
    cluster:
      profile: h200-llama3-8b        # env/profiles/<dir> + model; see env.perf.profile
      tp: 1
      gpu_memory_utilization: 0.9
      max_num_seqs: 256
      max_num_batched_tokens: 8192
      startup_delay_s: 60            # a new instance serves after this
      role_switch_delay_s: 20        # a drained instance serves in its new role after this
      network: {link_bandwidth_bytes_per_s: 5.0e+10, setup_latency_s: 0.001, failure_prob: 0.0, timeout_s: 5,
                # optional: a congested, flapping fabric from minute 5 to 10 (see NetworkConfig.incidents)
                incidents: [{start_s: 300, end_s: 600, link_bandwidth_bytes_per_s: 2.0e+9, failure_prob: 0.1}]}
    tenant_groups:
      - {name: interactive, gpu_budget: 8, prefill: 4, decode: 4}
    tenants:
      - name: chat
        group: interactive
        priority: 2
        slo: {ttft_p95_s: 0.5, tpot_p95_s: 0.05}
        workload: {kind: poisson, rate_rps: 20, input_tokens: {kind: fixed, tokens: 512},
                   output_tokens: {kind: fixed, tokens: 200}}

Units are seconds, tokens, bytes and fractions. Unknown keys are refused. :func:`load_scenario` reports
problems as ``FILE:LINE: field.path: message`` (:class:`ScenarioError`); relative trace paths are resolved
against the scenario file's folder, and ``${PDCTL_TRACES}`` (or a ``traces_dir`` argument) replaces a leading
``traces/`` when the scenario names shared traces.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from env.workloads.config import WorkloadConfig, resolve_paths
from env.workloads.trace_catalog import default_traces_dir
from policies.schema import Slo, Tenant, TenantGroup
from policies.transfer_health import (
    DEFAULT_MIN_SAMPLES,
    DEFAULT_PROBE_REQUESTS,
    DEFAULT_UNHEALTHY_FRAC,
    DEFAULT_WINDOW_S,
)

__all__ = [
    "ClusterConfig",
    "NetworkConfig",
    "NetworkIncidentConfig",
    "PoolBoundsConfig",
    "Scenario",
    "ScenarioError",
    "SloConfig",
    "TenantConfig",
    "TenantGroupConfig",
    "load_scenario",
    "parse_scenario",
]

PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]


Probability = Annotated[float, Field(ge=0, le=1)]


def _field_error(loc: tuple[str | int, ...], message: str, value: object) -> ValidationError:
    """A validation error at ``loc`` (relative to the model being validated).

    Raised from a validator, it makes the loader's message name that field and its line, not the enclosing model.
    """
    details = InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=value)
    return ValidationError.from_exception_data("Scenario", [details])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NetworkIncidentConfig(_Strict):
    """A period ``[start_s, end_s)`` during which some link settings differ from the network's base values.

    Each field left out keeps the base value. The simulator switches at both ends: flows in flight continue at the
    new link rate from the switch on, and transfers starting in the period draw failures and pay setup latency
    with the incident's values.
    """

    start_s: NonNegFloat = Field(description="When the incident begins (seconds into the episode).")
    end_s: PositiveFloat = Field(description="When the network is back to its base settings (exclusive).")
    link_bandwidth_bytes_per_s: PositiveFloat | None = Field(default=None, description="Per-link rate meanwhile.")
    setup_latency_s: NonNegFloat | None = Field(default=None, description="Fixed cost of one transfer meanwhile.")
    failure_prob: Probability | None = Field(default=None, description="Per-transfer failure meanwhile.")

    @model_validator(mode="after")
    def _check(self) -> NetworkIncidentConfig:
        if self.end_s <= self.start_s:
            raise _field_error(("end_s",), f"must be after start_s ({self.start_s:g})", self.end_s)
        if self.link_bandwidth_bytes_per_s is None and self.setup_latency_s is None and self.failure_prob is None:
            raise ValueError(
                "an incident must override at least one of link_bandwidth_bytes_per_s, setup_latency_s, failure_prob"
            )
        return self

    def overrides(self) -> dict[str, float]:
        """The base fields this incident overrides, with their values."""
        pairs = (
            ("link_bandwidth_bytes_per_s", self.link_bandwidth_bytes_per_s),
            ("setup_latency_s", self.setup_latency_s),
            ("failure_prob", self.failure_prob),
        )
        return {name: value for name, value in pairs if value is not None}


class NetworkConfig(_Strict):
    """The prefill → decode KV-transfer path.

    Each prefill instance sends over one link of ``link_bandwidth_bytes_per_s``, fair-shared by its concurrent
    transfers. A transfer takes ``setup_latency_s`` + pack + bytes / share + unpack; pack and unpack are layout
    conversions at ``layout_bandwidth_bytes_per_s`` paid only when prefill and decode TP differ.

    ``incidents`` change the link rate, setup latency and failure probability for periods of the episode (a
    congested or flapping fabric, then recovery); :meth:`at` gives the settings in effect at a time. They are
    validated sorted, not overlapping and within ``duration_s``.

    The router's KV-transfer breaker (:class:`policies.transfer_health.TransferBreaker`) judges the path over the
    last ``health_window_s`` of outcomes and probes it with ``health_probe_requests`` once it has been unhealthy
    for that long, as the router does with the same defaults.
    """

    link_bandwidth_bytes_per_s: PositiveFloat = Field(default=45e9, description="Per-prefill-instance link rate.")
    setup_latency_s: NonNegFloat = Field(default=1e-3, description="Fixed cost of one transfer (registration).")
    layout_bandwidth_bytes_per_s: PositiveFloat = Field(
        default=1e12, description="Rate of the pack/unpack layout conversion when TPs differ."
    )
    failure_prob: Probability = Field(default=0.0, description="Per-transfer failure.")
    timeout_s: PositiveFloat = Field(default=5.0, description="A transfer not done after this is abandoned.")
    unhealthy_failure_frac: Annotated[float, Field(gt=0, le=1)] = Field(
        default=DEFAULT_UNHEALTHY_FRAC,
        description="Failed fraction of the breaker's window at which the router sees the path as unhealthy.",
    )
    health_window_s: PositiveFloat = Field(
        default=DEFAULT_WINDOW_S, description="Seconds of transfer outcomes the breaker judges (router: same)."
    )
    health_min_samples: Annotated[int, Field(ge=1)] = Field(
        default=DEFAULT_MIN_SAMPLES, description="Outcomes in the window before the path can be judged unhealthy."
    )
    health_probe_requests: Annotated[int, Field(ge=1)] = Field(
        default=DEFAULT_PROBE_REQUESTS, description="Requests let through at a time to probe an unhealthy path."
    )
    incidents: list[NetworkIncidentConfig] = Field(
        default_factory=list,
        description="Periods of degraded (or otherwise changed) link settings; sorted, not overlapping.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> NetworkConfig:
        for index in range(1, len(self.incidents)):
            previous, incident = self.incidents[index - 1], self.incidents[index]
            if incident.start_s < previous.end_s:
                message = f"incidents must be sorted and not overlap: starts before incidents[{index - 1}] ends"
                raise _field_error(("incidents", index, "start_s"), f"{message} ({previous.end_s:g})", incident.start_s)
        return self

    def at(self, t_s: float) -> NetworkConfig:
        """The settings in effect at ``t_s``: the base ones, overridden by the incident covering ``t_s`` if any.

        The result has no incidents of its own; without incidents it is this object.
        """
        for incident in self.incidents:
            if incident.start_s <= t_s < incident.end_s:
                return self.model_copy(update={**incident.overrides(), "incidents": []})
        return self if not self.incidents else self.model_copy(update={"incidents": []})

    def changes(self) -> list[tuple[float, NetworkConfig]]:
        """When the settings change, with the settings (as from :meth:`at`) in effect from then on, in time order.

        Empty without incidents. An incident ending where the next one starts gives one change, not two.
        """
        out: list[tuple[float, NetworkConfig]] = []
        for index, incident in enumerate(self.incidents):
            out.append((incident.start_s, self.at(incident.start_s)))
            following = self.incidents[index + 1] if index + 1 < len(self.incidents) else None
            if following is None or following.start_s > incident.end_s:
                out.append((incident.end_s, self.at(incident.end_s)))
        return out


class ClusterConfig(_Strict):
    """Hardware, model and engine settings shared by every instance."""

    profile: str = Field(default="h200-llama3-8b", description="Performance profile <dir>-<model>.")
    profile_dir: Path | None = Field(default=None, description="A measurement directory instead of the shipped one.")
    hf_config: Path | None = Field(
        default=None,
        description="Hugging Face config.json of the model (with profile_dir: any Llama-shaped model; profile names "
        "its model column).",
    )
    tp: Annotated[int, Field(ge=1, le=64)] = Field(default=1, description="TP degree of decode/aggregated instances.")
    prefill_tp: Annotated[int, Field(ge=1, le=64)] | None = Field(default=None, description="TP of prefill instances.")
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    activation_reserve_bytes: NonNegFloat = Field(default=4e9, description="Per-GPU memory kept for activations.")
    kv_capacity_tokens: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Override the KV capacity computed from memory."
    )
    max_num_seqs: Annotated[int, Field(ge=1)] = 256
    max_num_batched_tokens: Annotated[int, Field(ge=1)] = 8192
    enable_prefix_caching: bool = True
    step_overhead_s: NonNegFloat | None = Field(default=None, description="Override the per-step overhead.")
    startup_delay_s: NonNegFloat = 60.0
    role_switch_delay_s: NonNegFloat = 20.0
    network: NetworkConfig = NetworkConfig()

    @model_validator(mode="after")
    def _budget(self) -> ClusterConfig:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")
        return self


class PoolBoundsConfig(_Strict):
    """Bounds of one pool."""

    min: Annotated[int, Field(ge=0)] = 0
    max: Annotated[int, Field(ge=0)] | None = None


class TenantGroupConfig(_Strict):
    """Tenants sharing instances: GPU budget, initial pools and bounds."""

    name: Annotated[str, Field(min_length=1)]
    gpu_budget: Annotated[int, Field(ge=1)]
    prefill: Annotated[int, Field(ge=0)] = Field(default=0, description="Initial prefill instances.")
    decode: Annotated[int, Field(ge=0)] = Field(default=0, description="Initial decode instances.")
    aggregated: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Initial aggregated instances (serve prefill and decode; count as decode)."
    )
    prefill_pool: PoolBoundsConfig = PoolBoundsConfig(min=0)
    decode_pool: PoolBoundsConfig = PoolBoundsConfig(min=1)


class SloConfig(_Strict):
    """Latency objectives (seconds)."""

    ttft_p95_s: PositiveFloat | None = None
    ttft_p99_s: PositiveFloat | None = None
    tpot_p95_s: PositiveFloat | None = None
    tpot_p99_s: PositiveFloat | None = None

    def to_slo(self) -> Slo:
        """As the shared schema type."""
        return Slo(self.ttft_p95_s, self.ttft_p99_s, self.tpot_p95_s, self.tpot_p99_s)


class TenantConfig(_Strict):
    """One tenant: its group, objectives, weight and request stream."""

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")]
    group: Annotated[str, Field(min_length=1)]
    priority: PositiveFloat = 1.0
    slo: SloConfig = SloConfig()
    expected_output_tokens: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="What the router assumes about output length (default: the workload's mean)."
    )
    workload: WorkloadConfig


class Scenario(_Strict):
    """A whole scenario (see the module docstring)."""

    name: Annotated[str, Field(min_length=1)]
    description: str = ""
    duration_s: PositiveFloat
    drain_s: NonNegFloat = Field(default=600.0, description="After duration_s, time allowed for in-flight requests.")
    control_interval_s: PositiveFloat = 10.0
    seed: Annotated[int, Field(ge=0)] = 0
    cluster: ClusterConfig = ClusterConfig()
    tenant_groups: Annotated[list[TenantGroupConfig], Field(min_length=1)]
    tenants: Annotated[list[TenantConfig], Field(min_length=1)]

    @model_validator(mode="after")
    def _cross(self) -> Scenario:
        for index, incident in enumerate(self.cluster.network.incidents):
            if incident.end_s > self.duration_s:
                loc = ("cluster", "network", "incidents", index, "end_s")
                raise _field_error(loc, f"must be within the episode (duration_s {self.duration_s:g})", incident.end_s)
        groups = [g.name for g in self.tenant_groups]
        _unique(groups, "tenant group")
        _unique([t.name for t in self.tenants], "tenant")
        for tenant in self.tenants:
            if tenant.group not in groups:
                raise ValueError(f"tenant {tenant.name}: unknown group {tenant.group!r} (groups: {groups})")
        for group in self.tenant_groups:
            instances = group.prefill + group.decode + group.aggregated
            if instances < 1:
                raise ValueError(f"tenant group {group.name}: needs at least one instance")
            if group.decode + group.aggregated < 1:
                raise ValueError(f"tenant group {group.name}: needs at least one decode or aggregated instance")
            prefill_tp = self.cluster.prefill_tp or self.cluster.tp
            gpus = group.prefill * prefill_tp + (group.decode + group.aggregated) * self.cluster.tp
            if gpus > group.gpu_budget:
                raise ValueError(f"tenant group {group.name}: {instances} instances need {gpus} GPUs > gpu_budget")
        return self

    @property
    def gpus_per_instance(self) -> int:
        """GPUs of one decode/aggregated instance (its TP degree); prefill instances use ``prefill_tp``."""
        return self.cluster.tp

    def tenants_schema(self) -> dict[str, Tenant]:
        """Tenants as the shared schema type."""
        return {t.name: Tenant(t.name, t.group, t.slo.to_slo(), t.priority) for t in self.tenants}

    def groups_schema(self) -> dict[str, TenantGroup]:
        """Tenant groups as the shared schema type."""
        out: dict[str, TenantGroup] = {}
        for g in self.tenant_groups:
            out[g.name] = TenantGroup(
                name=g.name,
                tenants=tuple(t.name for t in self.tenants if t.group == g.name),
                gpu_budget=g.gpu_budget,
                min_prefill=g.prefill_pool.min,
                max_prefill=g.prefill_pool.max,
                min_decode=max(g.decode_pool.min, 1),
                max_decode=g.decode_pool.max,
                gpus_per_instance=self.gpus_per_instance,
            )
        return out


def _unique(names: Sequence[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"duplicate {what} name {name!r}")
        seen.add(name)


class ScenarioError(ValueError):
    """A scenario file is missing or invalid; ``str()`` is one line per problem, ``FILE:LINE: field: message``."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _line_of(root: yaml.Node | None, loc: Sequence[str | int]) -> int | None:
    node = root
    line = None if node is None else node.start_mark.line + 1
    for part in loc:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == part:
                    child = value
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            child = node.value[part]
        if child is None:
            break
        node = child
        line = node.start_mark.line + 1
    return line


def _dotted(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_scenario(text: str, source: str = "<scenario>", base_dir: Path | None = None) -> Scenario:
    """Validate scenario YAML text; relative workload paths are resolved against ``base_dir``."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError([f"{source}{line}: not valid YAML: {problem}"]) from None
    if not isinstance(data, dict):
        raise ScenarioError([f"{source}: a scenario must be a mapping of fields"])
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = [p for p in err["loc"] if isinstance(p, str | int)]
            # drop discriminator tags pydantic inserts into union locations
            loc_clean = [p for p in loc if not (isinstance(p, str) and p in _WORKLOAD_TAGS and loc.index(p) > 0)]
            line_no = _line_of(root, loc_clean)
            where = f"{source}:{line_no}" if line_no is not None else source
            problems.append(f"{where}: {_dotted(loc_clean)}: {err['msg']}")
        raise ScenarioError(problems) from None
    if base_dir is not None:
        tenants = [t.model_copy(update={"workload": resolve_paths(t.workload, base_dir)}) for t in scenario.tenants]
        scenario = scenario.model_copy(update={"tenants": tenants})
    return scenario


_WORKLOAD_TAGS = frozenset(
    {
        "poisson",
        "gamma",
        "diurnal",
        "step",
        "trace_azure",
        "trace_mooncake",
        "servegen",
        "fixed",
        "lognormal",
        "empirical",
    }
)


def _expand(text: str, traces_dir: str | Path | None) -> str:
    # The resolution order (argument, PDCTL_TRACES, fetched data folder, ../shared fallback) is the catalogue's.
    target = traces_dir if traces_dir is not None else default_traces_dir()
    return text.replace("${PDCTL_TRACES}", str(target))


def load_scenario(path: str | Path, traces_dir: str | Path | None = None) -> Scenario:
    """Read and validate a scenario file.

    ``${PDCTL_TRACES}`` in the text is replaced by ``traces_dir`` (or the environment variable of that name);
    left as is, relative paths resolve against the file's folder.

    Raises:
        ScenarioError: the file is missing, not YAML, or invalid (message names file, line and field).
    """
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ScenarioError([f"{file}: cannot read scenario ({exc.strerror or exc})"]) from None
    return parse_scenario(_expand(text, traces_dir), str(file), file.resolve().parent)
