"""Router configuration: a YAML file validated by pydantic (keys = field names, extra keys refused).

Example::

    listen: {host: 127.0.0.1, port: 8000}
    policy_file: policies/examples/multi_tenant.yaml
    admin_token: change-me            # or leave out and set PDCTL_ADMIN_TOKEN
    request_log: runs/router-requests.jsonl
    instances:
      - {id: p0, url: "http://127.0.0.1:8100", role: prefill}
      - {id: d0, url: "http://127.0.0.1:8200", role: decode}
    timeouts: {prefill_s: 30, remote_first_token_s: 30, connect_s: 2}
    admission: {ttft_slack_frac: 1.0}   # refuse (429) what would miss its TTFT objective; off when left out
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from policies.admission import AdmissionConfig
from policies.transfer_health import (
    DEFAULT_MIN_SAMPLES,
    DEFAULT_PROBE_REQUESTS,
    DEFAULT_UNHEALTHY_FRAC,
    DEFAULT_WINDOW_S,
)

__all__ = [
    "AdmissionSettings",
    "EstimationConfig",
    "HealthConfig",
    "InstanceConfig",
    "ListenConfig",
    "RouterConfig",
    "RouterConfigError",
    "TimeoutsConfig",
    "load_router_config",
]

Role = Literal["prefill", "decode"]
ADMIN_TOKEN_ENV = "PDCTL_ADMIN_TOKEN"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenConfig(_Frozen):
    """Where the router listens."""

    host: str = Field("127.0.0.1", description="Bind address.")
    port: Annotated[int, Field(ge=0, le=65535)] = Field(8000, description="TCP port (0 = any free port).")


class InstanceConfig(_Frozen):
    """One vLLM instance (or emulated instance) the router sends requests to."""

    id: Annotated[str, Field(min_length=1)] = Field(description="Instance id used by the admin API and metrics.")
    url: Annotated[str, Field(pattern=r"^https?://")] = Field(description="Base URL, e.g. http://10.0.0.5:8000.")
    role: Role = Field(description="Initial role: prefill or decode.")
    max_num_seqs: Annotated[int, Field(ge=1)] = Field(
        256, description="vLLM --max-num-seqs: decode pressure = in-flight streams / this (or KV usage if higher)."
    )
    max_num_batched_tokens: Annotated[int, Field(ge=1)] = Field(
        8192, description="vLLM --max-num-batched-tokens (Dynamo's load rule reads it)."
    )


class TimeoutsConfig(_Frozen):
    """Timeouts of upstream calls, in seconds."""

    connect_s: Annotated[float, Field(gt=0)] = Field(2.0, description="TCP connect to an instance.")
    prefill_s: Annotated[float, Field(gt=0)] = Field(
        30.0, description="Whole prefill leg (remote path); past it the request falls back to local prefill."
    )
    remote_first_token_s: Annotated[float, Field(gt=0)] = Field(
        30.0,
        description="Decode leg of a remote request until its first byte (KV pull + decode queue); past it the "
        "KV transfer counts as timed out and the request falls back to local prefill.",
    )
    first_token_s: Annotated[float, Field(gt=0)] = Field(
        300.0, description="Local decode leg until its first byte; past it the instance counts as failed."
    )
    stream_idle_s: Annotated[float, Field(gt=0)] = Field(
        120.0, description="Longest gap between two chunks of a stream before it is ended with an error event."
    )


class HealthConfig(_Frozen):
    """Active health checks and the transfer-health window."""

    interval_s: Annotated[float, Field(gt=0)] = Field(1.0, description="GET /health period per instance.")
    timeout_s: Annotated[float, Field(gt=0)] = Field(1.0, description="Timeout of one health check.")
    unhealthy_after_timeouts: Annotated[int, Field(ge=1)] = Field(
        2,
        description="Health checks in a row that time out before an instance is marked down (a refused connection "
        "or a non-200 answer marks it down at once).",
    )
    metrics_poll_s: Annotated[float, Field(ge=0)] = Field(
        0.0, description="GET /metrics period per instance to read vllm:kv_cache_usage_perc (0 = off)."
    )
    transfer_window_s: Annotated[float, Field(gt=0)] = Field(
        DEFAULT_WINDOW_S,
        description="Window of remote-path outcomes used to judge KV-transfer health, and how long an unhealthy path "
        "is left alone before it is probed.",
    )
    transfer_min_samples: Annotated[int, Field(ge=1)] = Field(
        DEFAULT_MIN_SAMPLES, description="Outcomes needed in the window before the path can be judged unhealthy."
    )
    transfer_unhealthy_frac: Annotated[float, Field(gt=0, le=1)] = Field(
        DEFAULT_UNHEALTHY_FRAC,
        description="Failure fraction in the window (or of a round of probes) at which the transfer path counts as "
        "unhealthy.",
    )
    transfer_probe_requests: Annotated[int, Field(ge=1)] = Field(
        DEFAULT_PROBE_REQUESTS,
        description="Requests let through at a time to probe the transfer path once it has been unhealthy for "
        "transfer_window_s (half-open).",
    )


class EstimationConfig(_Frozen):
    """How the router estimates what it cannot see."""

    chars_per_token: Annotated[float, Field(gt=0)] = Field(
        4.0, description="Prompt tokens = characters / this (the emulator's exact ratio; an estimate on vLLM)."
    )
    tokenizer: Literal["chars_per_token", "instance"] = Field(
        "chars_per_token",
        description="chars_per_token: estimate from the prompt length; instance: exact count from the decode "
        "instance's POST /tokenize (vLLM's tokenizer; one extra round trip per request).",
    )
    default_output_tokens: Annotated[int, Field(ge=1)] = Field(
        256, description="Expected output when the request has no max_tokens and the tenant has no estimate."
    )
    prefill_tokens_per_s: Annotated[float, Field(gt=0)] = Field(
        20000.0, description="Initial prefill throughput of one instance (refined from measured prefill legs)."
    )
    prefix_block_tokens: Annotated[int, Field(ge=1)] = Field(
        64, description="Granularity of the decode-instance prefix-cache estimate, in tokens."
    )
    prefix_blocks_per_instance: Annotated[int, Field(ge=1)] = Field(
        65536, description="Prefix blocks remembered per decode instance (LRU), ~ its KV capacity / block."
    )
    affinity_slack_requests: Annotated[int, Field(ge=0)] = Field(
        4,
        description="A decode instance with a longer prefix hit is preferred if it has at most this many more "
        "requests placed and unfinished (in flight, or remote and still prefilling) than the least-loaded one "
        "(policies.placement).",
    )


class AdmissionSettings(_Frozen):
    """The admission stage (policies.admission): refuse a request whose first token would come too late anyway."""

    ttft_slack_frac: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None,
        description="Answer 429 to a request whose estimated time to first token exceeds this multiple of its "
        "tenant's TTFT objective (1.0: the requests the estimate says will miss it); none = admit every request.",
    )
    retry_after_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        1.0, description="The Retry-After a refused client is told (seconds, rounded up)."
    )

    def to_config(self) -> AdmissionConfig:
        """The core's settings."""
        return AdmissionConfig(self.ttft_slack_frac, self.retry_after_s)


class LimitsConfig(_Frozen):
    """Bounds on what clients may send (router/limits.py)."""

    max_body_bytes: Annotated[int, Field(ge=1024)] = Field(
        16 * 1024**2, description="Largest request body on the data API (/v1/...), bytes; larger is 413."
    )
    max_admin_body_bytes: Annotated[int, Field(ge=1024)] = Field(
        1024**2, description="Largest request body on the admin API (/admin/...), bytes; larger is 413."
    )
    max_json_depth: Annotated[int, Field(ge=2, le=512)] = Field(
        64, description="Deepest JSON nesting accepted in a body; deeper is 400."
    )


class RouterConfig(_Frozen):
    """The router's configuration file."""

    listen: ListenConfig = ListenConfig()
    instances: list[InstanceConfig] = Field(description="Instances and their initial roles.")
    policy_file: Path | None = Field(None, description="Policy file (YAML); none = built-in defaults.")
    admin_token: str | None = Field(None, description=f"Admin API bearer token (else ${ADMIN_TOKEN_ENV}).")
    request_log: Path | None = Field(None, description="JSONL file with one record per request (none = off).")
    timeouts: TimeoutsConfig = TimeoutsConfig()
    health: HealthConfig = HealthConfig()
    estimation: EstimationConfig = EstimationConfig()
    limits: LimitsConfig = LimitsConfig()
    admission: AdmissionSettings = AdmissionSettings()
    max_decode_attempts: Annotated[int, Field(ge=1)] = Field(
        2, description="Decode instances tried for one request when one fails before its first byte."
    )
    migration_limit: Annotated[int, Field(ge=0)] = Field(
        3,
        description="Times one stream may be resumed on another decode instance when its decode instance fails "
        "after the first byte (router/migrate.py; like Dynamo's --migration-limit); 0 = off: the stream ends "
        "with an error event.",
    )

    @model_validator(mode="after")
    def _check_instances(self) -> RouterConfig:
        ids = [i.id for i in self.instances]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"duplicate instance ids: {duplicates}")
        if not any(i.role == "decode" for i in self.instances):
            raise ValueError("at least one instance must have role decode")
        return self

    def resolved_admin_token(self) -> str | None:
        """The admin token from the file, else from the environment."""
        return self.admin_token or os.environ.get(ADMIN_TOKEN_ENV) or None


class RouterConfigError(ValueError):
    """The router configuration file is invalid (the message names the file and fields)."""


def load_router_config(path: str | Path) -> RouterConfig:
    """Read and validate a router configuration file; paths inside are relative to the file."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise RouterConfigError(f"{p}: {exc}") from exc
    if not isinstance(data, dict):
        raise RouterConfigError(f"{p}: expected a mapping at the top level")
    try:
        config = RouterConfig.model_validate(data)
    except ValidationError as exc:
        lines = [
            f"{p}: {'.'.join(str(x) for x in err['loc']) or '<top>'}: {err['msg']}"
            for err in exc.errors(include_url=False)
        ]
        raise RouterConfigError("\n".join(lines)) from None
    updates: dict[str, Path] = {}
    for key in ("policy_file", "request_log"):
        value = getattr(config, key)
        if value is not None and not value.is_absolute():
            updates[key] = p.parent / value
    return config.model_copy(update=updates) if updates else config
