"""Scenario family files: distributions over scenarios, and the seed ranges of the training, validation and test splits.

A family is YAML validated here (unknown keys refused); :func:`load_family` names the file, line and field of the
first problem in one line (:class:`FamilyError`). The knobs are documented in ``docs/scenario-families.md``; the
shipped family is ``experiments/families/default.yaml``. Distributions are written as

* ``{min: A, max: B}`` — uniform between A and B (:class:`FloatRange`, :class:`IntRange`; ``log: true`` draws
  uniformly in log space, for scales);
* ``{choice: weight, ...}`` — one choice drawn with probability proportional to its weight (zero weights allowed,
  at least one positive).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from env.families.archetypes import ARCHETYPES
from env.perf.profile import available_profiles

__all__ = [
    "SPLITS",
    "ClusterKnobs",
    "EpisodeKnobs",
    "FamilyError",
    "FloatRange",
    "GroupKnobs",
    "IntRange",
    "LoadKnobs",
    "NetworkKnobs",
    "PatternKnobs",
    "ScenarioFamily",
    "SeedRange",
    "TenantKnobs",
    "load_family",
    "parse_family",
]

SPLITS: tuple[str, ...] = ("train", "validation", "test")
"""The seed splits every family declares."""

PatternName = Literal["steady", "diurnal", "surge", "flood", "ramp", "shift"]
NetworkName = Literal["healthy", "degraded", "incident"]
_Weight = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_Frac = Annotated[float, Field(ge=0, le=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FloatRange(_Strict):
    """Uniform between ``min`` and ``max`` (log-uniform with ``log: true``; then both must be positive)."""

    min: float = Field(allow_inf_nan=False)
    max: float = Field(allow_inf_nan=False)
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> FloatRange:
        if self.max < self.min:
            raise ValueError(f"max ({self.max:g}) is below min ({self.min:g})")
        if self.log and self.min <= 0:
            raise ValueError("a log-uniform range needs min > 0")
        return self


class IntRange(_Strict):
    """Uniform integer between ``min`` and ``max`` inclusive."""

    min: int
    max: int

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self


def _weights_valid(weights: Mapping[Any, float]) -> None:
    if not weights or sum(weights.values()) <= 0:
        raise ValueError("needs at least one positive weight")


class SeedRange(_Strict):
    """Seeds ``first`` … ``last`` (inclusive)."""

    first: Annotated[int, Field(ge=0)]
    last: Annotated[int, Field(ge=0)]

    @model_validator(mode="after")
    def _ordered(self) -> SeedRange:
        if self.last < self.first:
            raise ValueError(f"last ({self.last}) is before first ({self.first})")
        return self

    def seeds(self) -> range:
        """The seeds, in order."""
        return range(self.first, self.last + 1)


class EpisodeKnobs(_Strict):
    """Length and control interval of each episode."""

    duration_s: FloatRange = Field(description="Episode length (s), rounded to a whole number of intervals.")
    control_interval_s: dict[_Positive, _Weight] = Field(description="Control interval choices (s) and weights.")
    drain_s: Annotated[float, Field(ge=0)] = Field(default=300.0, description="Time allowed for in-flight requests.")

    @field_validator("control_interval_s")
    @classmethod
    def _weights(cls, value: dict[float, float]) -> dict[float, float]:
        _weights_valid(value)
        return value

    @model_validator(mode="after")
    def _long_enough(self) -> EpisodeKnobs:
        if self.duration_s.min < 2 * max(self.control_interval_s):
            raise ValueError("duration_s.min must hold at least two control intervals")
        return self


class ClusterKnobs(_Strict):
    """Model profiles (each instance's TP follows from its profile) and engine settings shared by the family."""

    profiles: dict[str, _Weight] = Field(description="Performance profiles (<dir>-<model>) and weights.")
    min_kv_tokens_per_instance: Annotated[int, Field(ge=1)] = Field(
        default=131_072, description="TP is the smallest degree whose instance holds this many KV tokens."
    )
    max_num_seqs: Annotated[int, Field(ge=1)] = 256
    max_num_batched_tokens: Annotated[int, Field(ge=1)] = 8192
    startup_delay_s: Annotated[float, Field(ge=0)] = 60.0
    role_switch_delay_s: Annotated[float, Field(ge=0)] = 20.0

    @field_validator("profiles")
    @classmethod
    def _known(cls, value: dict[str, float]) -> dict[str, float]:
        _weights_valid(value)
        known = available_profiles()
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"unknown profile {unknown[0]!r} (known: {', '.join(known)})")
        return value


class GroupKnobs(_Strict):
    """How many tenant groups (1-3) and each group's GPU budget (4-32 GPUs)."""

    count: IntRange = Field(description="Tenant groups per scenario (1-3).")
    gpu_budget: dict[Annotated[int, Field(ge=4, le=32)], _Weight] = Field(description="GPU budgets and weights.")

    @field_validator("count")
    @classmethod
    def _count(cls, value: IntRange) -> IntRange:
        if value.min < 1 or value.max > 3:
            raise ValueError("tenant groups must be within 1-3")
        return value

    @field_validator("gpu_budget")
    @classmethod
    def _weights(cls, value: dict[int, float]) -> dict[int, float]:
        _weights_valid(value)
        return value


class TenantKnobs(_Strict):
    """How many tenants (1-6 in all, at least one per group), their archetypes, shares, objectives and priorities."""

    count: IntRange = Field(description="Tenants per scenario in all (1-6).")
    archetypes: dict[str, _Weight] = Field(description="Archetype weights (env.families.archetypes).")
    share_concentration: _Positive = Field(
        default=2.0, description="Dirichlet concentration of the tenants' shares of their group's requests."
    )
    slo_scale: FloatRange = Field(description="Multiplier of each tenant's objectives (below 1 = tighter).")
    priority_scale: FloatRange = Field(description="Multiplier of each tenant's archetype priority.")

    @field_validator("count")
    @classmethod
    def _count(cls, value: IntRange) -> IntRange:
        if value.min < 1 or value.max > 6:
            raise ValueError("tenants must be within 1-6")
        return value

    @field_validator("archetypes")
    @classmethod
    def _known(cls, value: dict[str, float]) -> dict[str, float]:
        _weights_valid(value)
        unknown = sorted(set(value) - set(ARCHETYPES))
        if unknown:
            raise ValueError(f"unknown archetype {unknown[0]!r} (known: {', '.join(ARCHETYPES)})")
        return value

    @field_validator("slo_scale", "priority_scale")
    @classmethod
    def _positive(cls, value: FloatRange) -> FloatRange:
        if value.min <= 0:
            raise ValueError("a scale must be positive")
        return value


class LoadKnobs(_Strict):
    """Each group's request rate as a fraction of its estimated capacity (:mod:`env.families.capacity`)."""

    capacity_frac: FloatRange = Field(description="Load relative to capacity, per group (e.g. 0.3-1.5).")

    @field_validator("capacity_frac")
    @classmethod
    def _positive(cls, value: FloatRange) -> FloatRange:
        if value.min <= 0:
            raise ValueError("load must be positive")
        return value


class PatternKnobs(_Strict):
    """Temporal patterns: which one shapes a scenario's rates, and each pattern's parameters."""

    weights: dict[PatternName, _Weight] = Field(description="steady, diurnal, surge, flood, ramp, shift weights.")
    diurnal_peak_to_mean: FloatRange = Field(default=FloatRange(min=1.3, max=1.9), description="Cycle amplitude.")
    surge_factor: FloatRange = Field(default=FloatRange(min=2.5, max=5.0), description="Rate ×, long prompts.")
    flood_factor: FloatRange = Field(default=FloatRange(min=5.0, max=10.0), description="Rate ×, short prompts.")
    event_start_frac: FloatRange = Field(
        default=FloatRange(min=0.2, max=0.5), description="Surge/flood start, fraction of the episode."
    )
    event_length_frac: FloatRange = Field(
        default=FloatRange(min=0.2, max=0.35), description="Surge/flood length, fraction of the episode."
    )
    ramp_end_capacity_frac: FloatRange = Field(
        default=FloatRange(min=1.2, max=1.8), description="Load at the end of a ramp (past capacity)."
    )
    ramp_steps: Annotated[int, Field(ge=2, le=64)] = Field(default=8, description="Rate steps of a ramp.")
    shift_at_frac: FloatRange = Field(
        default=FloatRange(min=0.35, max=0.65), description="When a tenant shift happens, fraction of the episode."
    )

    @field_validator("weights")
    @classmethod
    def _weights(cls, value: dict[str, float]) -> dict[str, float]:
        _weights_valid(value)
        return value

    @model_validator(mode="after")
    def _fracs(self) -> PatternKnobs:
        for name in ("event_start_frac", "event_length_frac", "shift_at_frac"):
            value: FloatRange = getattr(self, name)
            if value.min <= 0 or value.max >= 1:
                raise ValueError(f"{name} must lie strictly between 0 and 1")
        if self.event_start_frac.max + self.event_length_frac.max >= 1:
            raise ValueError("event_start_frac.max + event_length_frac.max must stay below 1")
        if self.diurnal_peak_to_mean.min < 1 or self.diurnal_peak_to_mean.max > 2:
            raise ValueError("diurnal_peak_to_mean must lie within 1-2")
        return self


class HealthyNetwork(_Strict):
    """The base KV-transfer network."""

    link_bandwidth_bytes_per_s: _Positive = 4.5e10
    setup_latency_s: Annotated[float, Field(ge=0)] = 1e-3
    failure_prob: _Frac = 1e-3
    timeout_s: _Positive = 5.0


class NetworkKnobs(_Strict):
    """Network conditions: healthy, degraded for the whole episode, or healthy with incidents."""

    weights: dict[NetworkName, _Weight] = Field(description="healthy, degraded, incident weights.")
    healthy: HealthyNetwork = HealthyNetwork()
    degraded_bandwidth_bytes_per_s: FloatRange = Field(
        default=FloatRange(min=1e9, max=1e10, log=True), description="Link rate of a degraded network."
    )
    degraded_failure_prob: FloatRange = Field(
        default=FloatRange(min=0.02, max=0.1), description="Per-transfer failure of a degraded network."
    )
    incident_count: IntRange = Field(default=IntRange(min=1, max=2), description="Incidents per episode.")
    incident_length_frac: FloatRange = Field(
        default=FloatRange(min=0.15, max=0.3), description="Length of one incident, fraction of the episode."
    )

    @field_validator("weights")
    @classmethod
    def _weights(cls, value: dict[str, float]) -> dict[str, float]:
        _weights_valid(value)
        return value

    @model_validator(mode="after")
    def _ranges(self) -> NetworkKnobs:
        if self.degraded_bandwidth_bytes_per_s.min <= 0:
            raise ValueError("degraded_bandwidth_bytes_per_s must be positive")
        if self.degraded_failure_prob.min < 0 or self.degraded_failure_prob.max > 1:
            raise ValueError("degraded_failure_prob must lie within 0-1")
        if self.incident_count.min < 1 or self.incident_count.max > 4:
            raise ValueError("incident_count must lie within 1-4")
        if self.incident_length_frac.min <= 0 or self.incident_count.max * self.incident_length_frac.max >= 1:
            raise ValueError("incident_length_frac must be positive and incident_count.max of them fit the episode")
        return self


class ScenarioFamily(_Strict):
    """A whole family (see the module docstring and ``docs/scenario-families.md``)."""

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str = ""
    splits: dict[Literal["train", "validation", "test"], SeedRange] = Field(
        description="Disjoint seed ranges of the training, validation and test splits."
    )
    episode: EpisodeKnobs
    cluster: ClusterKnobs
    groups: GroupKnobs
    tenants: TenantKnobs
    load: LoadKnobs
    patterns: PatternKnobs
    network: NetworkKnobs

    @field_validator("splits")
    @classmethod
    def _disjoint(cls, value: dict[str, SeedRange]) -> dict[str, SeedRange]:
        missing = [name for name in SPLITS if name not in value]
        if missing:
            raise ValueError(f"missing split {missing[0]!r} (need {', '.join(SPLITS)})")
        for (a, ra), (b, rb) in itertools.combinations(value.items(), 2):
            if ra.first <= rb.last and rb.first <= ra.last:
                raise ValueError(f"{a} ({ra.first}..{ra.last}) and {b} ({rb.first}..{rb.last}) overlap")
        return value

    @model_validator(mode="after")
    def _cross(self) -> ScenarioFamily:
        if self.tenants.count.max < self.groups.count.min:
            raise ValueError("tenants.count.max is below groups.count.min (every group needs a tenant)")
        return self

    def split_seeds(self, split: str) -> range:
        """The seeds of one split.

        Raises:
            ValueError: unknown split name.
        """
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r} (known: {', '.join(SPLITS)})")
        return self.splits[split].seeds()

    def split_of(self, seed: int) -> str | None:
        """The split a seed belongs to, or None."""
        return next((name for name, r in self.splits.items() if r.first <= seed <= r.last), None)


class FamilyError(ValueError):
    """A family file is missing or invalid; ``str()`` is one line, ``FILE:LINE: field: message``."""


def _line_of(root: yaml.Node | None, loc: Sequence[str | int]) -> int | None:
    node, line = root, (None if root is None else root.start_mark.line + 1)
    for part in loc:
        child = None
        if isinstance(node, yaml.MappingNode):
            child = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            child = node.value[part]
        if child is None:
            break
        node, line = child, child.start_mark.line + 1
    return line


def parse_family(text: str, source: str = "<family>") -> ScenarioFamily:
    """Validate family YAML text.

    Raises:
        FamilyError: one line naming ``source``, the line and the field of the first problem.
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise FamilyError(f"{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise FamilyError(f"{source}: a family must be a mapping of fields")
    try:
        return ScenarioFamily.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = [p for p in err["loc"] if isinstance(p, str | int) and not str(p).startswith("function-")]
        line = _line_of(root, loc)
        where = f"{source}:{line}" if line is not None else source
        field = ".".join(str(p) for p in loc) or "(top level)"
        message = str(err["msg"]).removeprefix("Value error, ")
        extra = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise FamilyError(f"{where}: {field}: {message}{extra}") from None


def load_family(path: str | Path) -> ScenarioFamily:
    """Read and validate a family file.

    Raises:
        FamilyError: missing, unreadable or invalid (one line naming the file, line and field).
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise FamilyError(f"{file}: cannot read family ({exc.strerror or exc})") from None
    return parse_family(text, str(file))
