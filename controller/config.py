"""The controller's configuration: one typed document (YAML or JSON), environment overrides, JSON Schema.

Keys are the field names below. Environment variables override the file: ``PDCTL_CONTROLLER_<FIELD>`` for
top-level fields and ``PDCTL_CONTROLLER_<FIELD>__<SUBFIELD>`` for nested ones (for example
``PDCTL_CONTROLLER_MODE=active`` or ``PDCTL_CONTROLLER_GUARD__COOLDOWN_S=30``). Relative paths are taken
relative to the config file's directory. ``pdctl controller --print-schema`` prints the JSON Schema.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from policies.guard import GuardLimits
from policies.registry import PolicySpecError, parse_policy_spec
from policies.rules import QueueKvParams
from policies.watchdog import FALLBACK_KINDS, WatchdogParams

__all__ = [
    "ConfigError",
    "ControllerConfig",
    "DryRunActuatorConfig",
    "GuardConfig",
    "InstanceConfig",
    "KubernetesActuatorConfig",
    "PrometheusSourceConfig",
    "RouterActuatorConfig",
    "ScrapeSourceConfig",
    "WatchdogConfig",
    "config_schema",
    "load_config",
    "load_guard_limits",
]

ENV_PREFIX = "PDCTL_CONTROLLER_"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class PrometheusSourceConfig(_Strict):
    """Read windows from a Prometheus server with PromQL."""

    kind: Literal["prometheus"] = "prometheus"
    url: str = Field(description="Prometheus base URL, e.g. http://127.0.0.1:9090")
    window_s: PositiveSeconds = Field(30.0, description="PromQL range of increase()/histogram_quantile(), seconds")
    timeout_s: PositiveSeconds = Field(5.0, description="per-query HTTP timeout, seconds")
    instance_label: str = Field("instance_id", description="target label naming the instance (set at scrape time)")
    bearer_token_env: str | None = Field(None, description="environment variable holding a bearer token, if any")


class ScrapeSourceConfig(_Strict):
    """Scrape ``/metrics`` of the router and every instance directly (the embedded default)."""

    kind: Literal["scrape"] = "scrape"
    router_metrics_url: str | None = Field(None, description="router /metrics URL; None = no per-tenant metrics")
    window_s: PositiveSeconds = Field(30.0, description="counters are diffed against the oldest scrape this recent")
    timeout_s: PositiveSeconds = Field(2.0, description="per-endpoint HTTP timeout, seconds")


class InstanceConfig(_Strict):
    """One serving instance: its id, tenant group, initial role and base URL (``/metrics`` is appended)."""

    id: Annotated[str, Field(min_length=1)]
    group: Annotated[str, Field(min_length=1)]
    role: Literal["prefill", "decode"]
    url: str | None = Field(None, description="base URL of the instance, e.g. http://127.0.0.1:8001")


class RouterActuatorConfig(_Strict):
    """Publish thresholds and instance roles through the router admin API (docs/admin-api.md)."""

    kind: Literal["router"] = "router"
    url: str = Field(description="router base URL")
    token: SecretStr | None = Field(None, description="admin bearer token (else read from token_env)")
    token_env: str = Field("PDCTL_ADMIN_TOKEN", description="environment variable holding the admin token")
    timeout_s: PositiveSeconds = 5.0


class KubernetesWorkloadConfig(_Strict):
    """A Deployment or StatefulSet whose ``scale`` subresource sets one pool's replicas."""

    kind: Literal["Deployment", "StatefulSet"] = "Deployment"
    name: Annotated[str, Field(min_length=1)]


class KubernetesGroupConfig(_Strict):
    """The prefill and decode workloads of one tenant group."""

    prefill: KubernetesWorkloadConfig
    decode: KubernetesWorkloadConfig


class KubernetesActuatorConfig(_Strict):
    """Patch replica counts through the Kubernetes API server (REST, bearer token)."""

    kind: Literal["kubernetes"] = "kubernetes"
    api_url: str = Field(description="API server URL, e.g. https://kubernetes.default.svc")
    namespace: str = "default"
    token: SecretStr | None = None
    token_file: Path | None = Field(
        Path("/var/run/secrets/kubernetes.io/serviceaccount/token"), description="read when token is unset"
    )
    ca_file: Path | None = None
    insecure_skip_tls_verify: bool = False
    timeout_s: PositiveSeconds = 5.0
    groups: dict[str, KubernetesGroupConfig]


class DryRunActuatorConfig(_Strict):
    """Record what would be done; actuate nothing."""

    kind: Literal["dry_run"] = "dry_run"


ActuatorConfig = Annotated[
    RouterActuatorConfig | KubernetesActuatorConfig | DryRunActuatorConfig, Field(discriminator="kind")
]
SourceConfig = Annotated[PrometheusSourceConfig | ScrapeSourceConfig, Field(discriminator="kind")]


class GuardConfig(_Strict):
    """Safety guard limits (see :mod:`policies.guard`)."""

    max_step_per_tick: Annotated[int, Field(ge=1)] = 1
    cooldown_s: Annotated[float, Field(ge=0)] = 60.0
    hysteresis_ticks: Annotated[int, Field(ge=1)] = 2
    max_staleness_s: Annotated[float, Field(ge=0)] = 30.0
    threshold_dead_band_frac: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.05, description="a routing-threshold change smaller than this fraction of its value is held (0 = off)"
    )
    threshold_reversal_hold_s: Annotated[float, Field(ge=0)] = Field(
        600.0,
        description="seconds after a threshold moved during which a move back the other way is refused (0 = off)",
    )
    pool_reversal_hold_s: Annotated[float, Field(ge=0)] = Field(
        600.0,
        description="seconds after a group's pools changed during which a pool's move back is held (0 = off)",
    )

    def limits(self) -> GuardLimits:
        """As the guard's dataclass."""
        return GuardLimits(
            self.max_step_per_tick,
            self.cooldown_s,
            self.hysteresis_ticks,
            self.max_staleness_s,
            self.threshold_dead_band_frac,
            self.threshold_reversal_hold_s,
            self.pool_reversal_hold_s,
        )


class WatchdogConfig(_Strict):
    """The SLO watchdog over the policy (see :mod:`policies.watchdog`): a fallback while objectives are missed."""

    fallback: str = Field(
        "policy_file",
        description="policy_file (the base policy file's thresholds) or a baseline:NAME / file:PATH spec",
    )
    min_attainment_frac: Annotated[float, Field(gt=0, le=1)] = 0.5
    trigger_intervals: Annotated[int, Field(ge=1)] = 4
    hold_intervals: Annotated[int, Field(ge=1)] = 20
    backoff: Annotated[float, Field(ge=1)] = 2.0
    max_hold_intervals: Annotated[int, Field(ge=1)] = 10_000
    fallback_margin_frac: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.05, description="with evidence, failing = attainment below the fallback's estimate less this margin"
    )
    load_tolerance_frac: Annotated[float, Field(gt=0)] = Field(
        0.25, description="fallback windows within this ratio of the judged window's load per instance count"
    )
    min_evidence_windows: Annotated[int, Field(ge=1)] = Field(
        3, description="comparable fallback windows needed before the estimate replaces min_attainment_frac"
    )
    max_evidence_windows: Annotated[int, Field(ge=1)] = Field(512, description="fallback windows remembered")
    handback_windows: Annotated[int, Field(ge=0)] = Field(
        3, description="hand control back early once this many fallback windows did no better (0 = never)"
    )
    settle_grace_s: Annotated[float, Field(ge=0)] = Field(
        600.0, description="windows are not judged while the primary's pool move is under way, for up to this long"
    )
    move_dwell_s: Annotated[float, Field(ge=0)] = Field(
        300.0, description="nor after it settled, as long as it took, at most this long (its backlog shows; 0 = never)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> WatchdogConfig:
        if self.fallback != "policy_file":
            try:
                spec = parse_policy_spec(self.fallback)
            except PolicySpecError as exc:
                raise ValueError(f"fallback: {exc}") from None
            if spec.kind not in FALLBACK_KINDS:
                raise ValueError(f"fallback: {self.fallback!r} is not a rule policy (policy_file, baseline:, file:)")
        self.params()
        return self

    def params(self) -> WatchdogParams:
        """As the watchdog's dataclass."""
        return WatchdogParams(
            self.min_attainment_frac,
            self.trigger_intervals,
            self.hold_intervals,
            self.backoff,
            self.max_hold_intervals,
            self.fallback_margin_frac,
            self.load_tolerance_frac,
            self.min_evidence_windows,
            self.max_evidence_windows,
            self.handback_windows,
            self.settle_grace_s,
            self.move_dwell_s,
        )


class ListenConfig(_Strict):
    """Where /healthz, /readyz and /metrics are served."""

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 9464


def _default_actuators() -> list[ActuatorConfig]:
    return [DryRunActuatorConfig()]


class ControllerConfig(BaseSettings):
    """The controller daemon's configuration."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        nested_model_default_partial_update=True,
    )

    mode: Literal["advisory", "active"] = Field("advisory", description="advisory computes and logs, never actuates")
    interval_s: PositiveSeconds = Field(10.0, description="control interval, seconds")
    policy: str = Field(description="policy spec: file:PATH | baseline:NAME | learned:PATH | registry:models:/N@A")
    policy_file: Path = Field(description="base policy file: tenants, SLOs, tenant groups, base thresholds")
    override_dir: Path | None = Field(None, description="directory watched for override policy files")
    audit_log: Path | None = Field(None, description="append-only JSONL audit log of every decision")
    lease_file: Path | None = Field(
        None,
        description="lease file an active controller holds (flock) so that a second one for the same targets is "
        "refused; default $PDCTL_DATA_DIR (or ./data)/controller-<hash of the actuated targets>.lease",
    )
    control_memory_file: Path | None = Field(
        None,
        description="file an active controller keeps its control state in (thresholds in force, the guard's cooldown "
        "clocks and reversal holds) so that a restart carries on from it; default: the lease file's path with "
        ".memory.json for .lease (none for advisory mode or the dry-run actuator alone; controller.control_memory)",
    )
    listen: ListenConfig = ListenConfig()
    source: SourceConfig = Field(default_factory=ScrapeSourceConfig, description="metric source")
    instances: list[InstanceConfig] = Field(default_factory=list, description="serving instances (topology)")
    actuators: list[ActuatorConfig] = Field(default_factory=_default_actuators, description="what decisions drive")
    guard: GuardConfig = GuardConfig()
    rules: QueueKvParams = Field(
        default_factory=QueueKvParams, description="marks of the baseline:queue_kv rule policy (policies.rules)"
    )
    watchdog: WatchdogConfig | None = Field(
        None, description="SLO watchdog: hand control to a fallback rule policy while objectives are missed"
    )
    baseline_params: dict[str, float] = Field(
        default_factory=dict, description="parameters of a peer baseline (e.g. dynamo-throughput's throughputs)"
    )
    mlflow_tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI for registry: policies (default: MLFLOW_TRACKING_URI, else the embedded "
        "registry $PDCTL_DATA_DIR/mlflow/mlflow.db, ./data/mlflow/mlflow.db)",
    )
    heartbeat_timeout_intervals: Annotated[float, Field(gt=1)] = Field(
        3.0, description="/healthz fails when the last tick is older than this many intervals"
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Environment variables win over the file's values."""
        del settings_cls, dotenv_settings, file_secret_settings
        return (env_settings, init_settings)

    @model_validator(mode="after")
    def _consistent(self) -> ControllerConfig:
        try:
            parse_policy_spec(self.policy)
        except PolicySpecError as exc:
            raise ValueError(str(exc)) from None
        ids = [i.id for i in self.instances]
        if len(ids) != len(set(ids)):
            raise ValueError("instance ids must be unique")
        if isinstance(self.source, ScrapeSourceConfig) and self.source.window_s < self.interval_s:
            raise ValueError("source.window_s must be at least interval_s")
        kinds = [a.kind for a in self.actuators]
        if len(kinds) != len(set(kinds)):
            raise ValueError("at most one actuator of each kind")
        return self


class ConfigError(ValueError):
    """The configuration was refused; the message names every problem, one per line."""


def _resolve_paths(data: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    out = dict(data)
    for key in ("policy_file", "override_dir", "audit_log", "lease_file", "control_memory_file"):
        value = out.get(key)
        if isinstance(value, str) and not Path(value).is_absolute():
            out[key] = str(base_dir / value)
    policy = out.get("policy")
    if isinstance(policy, str) and policy.startswith("file:") and not Path(policy[5:]).is_absolute():
        out["policy"] = f"file:{base_dir / policy[5:]}"
    return out


def load_config(path: str | Path) -> ControllerConfig:
    """Read, validate and return the configuration in ``path`` (YAML or JSON), with environment overrides."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{p}: cannot read: {exc}".splitlines()[0]) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level")
    try:
        return ControllerConfig(**_resolve_paths(data, p.resolve().parent))
    except ValidationError as exc:
        lines = [
            f"{p}: {'.'.join(str(x) for x in err['loc']) or '<top>'}: {err['msg']}"
            for err in exc.errors(include_url=False)
        ]
        raise ConfigError("\n".join(lines)) from None


def load_guard_limits(path: str | Path) -> GuardLimits:
    """The safety guard's limits in ``path`` (YAML or JSON).

    A controller configuration's ``guard`` block, or a file holding only that block; unset fields keep the
    controller's defaults. For ``pdctl evaluate --guard``: the simulator then runs the guard an operator's
    controller runs.

    Raises:
        ConfigError: unreadable, not a mapping, or an invalid field (one line per problem, naming ``guard.FIELD``).
    """
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{p}: cannot read: {exc}".splitlines()[0]) from exc
    if isinstance(data, dict) and "guard" in data:
        data = data["guard"]
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of guard limits (or a controller configuration with a guard block)")
    try:
        return GuardConfig(**data).limits()
    except ValidationError as exc:
        lines = [
            f"{p}: guard.{'.'.join(str(x) for x in err['loc']) or '<top>'}: {err['msg']}"
            for err in exc.errors(include_url=False)
        ]
        raise ConfigError("\n".join(lines)) from None


def config_schema() -> str:
    """The JSON Schema of the configuration, pretty-printed."""
    return json.dumps(ControllerConfig.model_json_schema(), indent=2, sort_keys=True)
