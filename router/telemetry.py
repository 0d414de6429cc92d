"""The router's metrics (``pdctl_router_*``, ``pdctl_request_stage_seconds``) and per-request JSONL records.

Stages the router observes (docs/design.md names), measured on the router's clock:

``request_queue_wait``
    arrival at the router → first upstream request sent (body parse, routing decision).
``prefill_compute_time``
    remote route: the prefill leg's round trip (vLLM does not split its queue from its compute).
``first_token_emit_time``
    decode leg sent → its first byte (remote: KV pull + decode queue + the last prompt token's forward pass;
    local: decode queue + the whole prefill).
``per_token_decode_time``
    mean gap between stream events after the first (TPOT as the client sees it).

``kv_cache_pack_time``, ``kv_cache_transfer_time``, ``kv_cache_unpack_time`` and ``decode_queue_wait`` happen
inside the instances and reach a router speaking vLLM's protocol only as part of the decode leg's wait for its
first byte; they are absent from router records and read per instance from vLLM's own metrics
(:data:`policies.stages.STAGE_SOURCES` names the metric of every stage).

SLO judgement: every successful request is judged against its tenant's objectives in the policy in force
(:meth:`policies.schema.Slo.ttft_target_s` / :meth:`~policies.schema.Slo.tpot_target_s`, the rule of
:func:`policies.scoring.meets_slo`) and counted in ``pdctl_router_slo_met_total{tenant,route}`` when it met
them; the controller's window attainment is that counter over the successful requests of
``pdctl_router_requests_total``. The child of a tenant is created at 0 by its first successful request, so a
tenant that meets nothing reads 0, not unknown.

All observation happens after a request ends, off the stream path. The JSONL writer buffers lines and is
flushed by :meth:`RequestLog.flush` (the app flushes once a second and on shutdown).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from policies.schema import STAGES, Slo
from policies.scoring import meets_slo

__all__ = ["STAGES", "RequestLog", "RequestRecord", "RouterMetrics", "judge_slo"]


_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)  # fmt: skip
_E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
_PROMPT_TOKEN_BUCKETS = (16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 1536.0, 2048.0, 3072.0, 4096.0, 6144.0, 8192.0,
                         12288.0, 16384.0, 24576.0, 32768.0, 65536.0, 131072.0, 262144.0)  # fmt: skip
_STAGE_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                  30.0, 60.0, 300.0)  # fmt: skip


@dataclass(slots=True)
class RequestRecord:
    """What the router knows about one request when it ends (one JSONL line)."""

    request_id: str
    arrival_ts: float
    tenant: str
    route: str
    reason: str
    stream: bool
    input_tokens: int
    expected_output_tokens: int
    prefix_hit_tokens: int = 0
    prefill_instance: str | None = None
    decode_instance: str | None = None
    fallback: str | None = None
    status: int = 200
    error: str | None = None
    output_tokens: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    stages: dict[str, float] = field(default_factory=dict)
    slo_met: bool | None = None
    """Whether the request met its tenant's SLO (``None`` until judged; a failed request never meets it)."""

    def to_json(self) -> str:
        """The record as one JSON line (no newline)."""
        return json.dumps(
            {
                "request_id": self.request_id,
                "arrival_ts": round(self.arrival_ts, 6),
                "tenant": self.tenant,
                "route": self.route,
                "reason": self.reason,
                "fallback": self.fallback,
                "prefill_instance": self.prefill_instance,
                "decode_instance": self.decode_instance,
                "stream": self.stream,
                "status": self.status,
                "error": self.error,
                "input_tokens": self.input_tokens,
                "expected_output_tokens": self.expected_output_tokens,
                "prefix_hit_tokens": self.prefix_hit_tokens,
                "output_tokens": self.output_tokens,
                "ttft_s": self.ttft_s,
                "tpot_s": self.tpot_s,
                "e2e_s": self.e2e_s,
                "stages": self.stages,
                "slo_met": self.slo_met,
            },
            separators=(",", ":"),
        )


class RouterMetrics:
    """``pdctl_router_*`` metrics on an explicit registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        tr = ("tenant", "route")
        self.stage = Histogram(
            "pdctl_request_stage_seconds",
            "Per-request stage durations seen by the router (docs/design.md stage names).",
            ("stage", "tenant", "route"),
            buckets=_STAGE_BUCKETS,
            registry=registry,
        )
        self.ttft = Histogram(
            "pdctl_router_ttft_seconds", "Client-visible time to first token.", tr, buckets=_TTFT_BUCKETS,
            registry=registry,
        )  # fmt: skip
        self.tpot = Histogram(
            "pdctl_router_tpot_seconds", "Client-visible mean time per output token after the first.", tr,
            buckets=_TPOT_BUCKETS, registry=registry,
        )  # fmt: skip
        self.e2e = Histogram(
            "pdctl_router_e2e_seconds", "Client-visible request latency.", tr, buckets=_E2E_BUCKETS, registry=registry
        )
        self.requests = Counter(
            "pdctl_router_requests",
            "Finished requests by outcome (route none: refused, no decode instance available; route rejected: "
            "the request itself refused, 400 or 413; route refused: refused by the admission stage, 429).",
            ("tenant", "route", "outcome"),
            registry=registry,
        )
        self.decisions = Counter(
            "pdctl_router_decisions", "Route decisions by route and reason, counted as each request arrives.",
            ("tenant", "route", "reason"), registry=registry,
        )  # fmt: skip
        self.routed_prompt_tokens = Counter(
            "pdctl_router_routed_prompt_tokens",
            "Estimated prompt tokens of the requests routed, counted as each arrives (pdctl_router_prompt_tokens_total "
            "counts them as they finish).",
            ("tenant", "route"),
            registry=registry,
        )
        self.fallbacks = Counter(
            "pdctl_router_fallbacks",
            "Requests that left their decided path (kind: prefill_error, prefill_timeout, transfer_failed, "
            "transfer_timeout, prefill_retry, decode_retry, migration).",
            ("tenant", "kind"),
            registry=registry,
        )
        self.migrations = Counter(
            "pdctl_router_migrations",
            "Stream migrations (router/migrate.py) by outcome: completed, error_event, failed, refused, client_gone "
            "per attempt; exhausted, no_instance, unsupported per cut stream not resumed.",
            ("outcome",),
            registry=registry,
        )
        self.upstream_errors = Counter(
            "pdctl_router_upstream_errors", "Failed upstream calls by instance and kind.", ("instance", "kind"),
            registry=registry,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "pdctl_router_prompt_tokens", "Estimated prompt tokens routed.", ("tenant", "route"), registry=registry
        )
        self.request_prompt_tokens = Histogram(
            "pdctl_router_request_prompt_tokens", "Estimated prompt tokens of each finished request.", tr,
            buckets=_PROMPT_TOKEN_BUCKETS, registry=registry,
        )  # fmt: skip
        self.prefix_hit_tokens = Counter(
            "pdctl_router_prefix_hit_tokens",
            "Prompt tokens the chosen decode instance was estimated to hold in its prefix cache.", tr,
            registry=registry,
        )  # fmt: skip
        self.slo_met = Counter(
            "pdctl_router_slo_met", "Successful requests within their tenant's TTFT and TPOT objectives.", tr,
            registry=registry,
        )  # fmt: skip
        self.generation_tokens = Counter(
            "pdctl_router_generation_tokens", "Output tokens relayed.", ("tenant", "route"), registry=registry
        )
        self.in_flight = Gauge(
            "pdctl_router_in_flight_requests", "Requests in flight in the router.", registry=registry
        )
        self.instance_in_flight = Gauge(
            "pdctl_router_instance_in_flight_requests", "Requests in flight per instance and role.",
            ("instance", "role"), registry=registry,
        )  # fmt: skip
        self.instance_healthy = Gauge(
            "pdctl_router_instance_healthy", "1 when the instance passes health checks.", ("instance",),
            registry=registry,
        )  # fmt: skip
        self.instance_role = Gauge(
            "pdctl_router_instance_role", "1 for the role an instance serves now (prefill or decode), else 0.",
            ("instance", "role"), registry=registry,
        )  # fmt: skip
        self.transfer_healthy = Gauge(
            "pdctl_router_kv_transfer_healthy", "1 when the remote-prefill path is judged healthy.", registry=registry
        )
        self.policy_generation = Gauge(
            "pdctl_router_policy_generation", "Generation of the routing policy in force.", registry=registry
        )
        self.admission_slack = Gauge(
            "pdctl_router_admission_ttft_slack_frac",
            "The admission stage's TTFT slack: a request whose estimated TTFT exceeds this multiple of its tenant's "
            "objective is refused (429); 0 when the stage is off.",
            registry=registry,
        )
        self.transfer_healthy.set(1)

    def rejected(self, tenant: str) -> None:
        """Count a request refused for its body before it was routed (``route="rejected"``, outcome ``error``)."""
        self.requests.labels(tenant, "rejected", "error").inc()

    def routed(self, rec: RequestRecord) -> None:
        """Count a request as it arrives and is routed (the offered load; :meth:`record` counts it as it ends)."""
        self.decisions.labels(rec.tenant, rec.route, rec.reason).inc()
        self.routed_prompt_tokens.labels(rec.tenant, rec.route).inc(rec.input_tokens)

    def record(self, rec: RequestRecord, slo: Slo | None = None) -> None:
        """Observe a finished request, judging it against ``slo`` (its tenant's objectives; None: no objective)."""
        tenant, route = rec.tenant, rec.route
        succeeded = rec.error is None and rec.status < 400
        rec.slo_met = judge_slo(rec, slo)
        if succeeded:
            met = self.slo_met.labels(tenant, route)  # created at 0 by the first success
            if rec.slo_met:
                met.inc()
        for stage, seconds in rec.stages.items():
            self.stage.labels(stage, tenant, route).observe(seconds)
        if rec.ttft_s is not None:
            self.ttft.labels(tenant, route).observe(rec.ttft_s)
        if rec.tpot_s is not None:
            self.tpot.labels(tenant, route).observe(rec.tpot_s)
        if rec.e2e_s is not None:
            self.e2e.labels(tenant, route).observe(rec.e2e_s)
        outcome = "ok" if succeeded else "error"
        self.requests.labels(tenant, route, outcome).inc()
        self.prompt_tokens.labels(tenant, route).inc(rec.input_tokens)
        self.request_prompt_tokens.labels(tenant, route).observe(rec.input_tokens)
        self.prefix_hit_tokens.labels(tenant, route).inc(rec.prefix_hit_tokens)
        self.generation_tokens.labels(tenant, route).inc(rec.output_tokens)


def judge_slo(rec: RequestRecord, slo: Slo | None) -> bool:
    """Whether ``rec`` met ``slo`` (:func:`policies.scoring.meets_slo`; no objective set: met when it succeeded)."""
    succeeded = rec.error is None and rec.status < 400
    if slo is None:
        return succeeded and rec.ttft_s is not None
    return meets_slo(rec.ttft_s, rec.tpot_s, slo.ttft_target_s(), slo.tpot_target_s(), succeeded=succeeded)


class RequestLog:
    """Append-only JSONL file of :class:`RequestRecord` lines (buffered; see :meth:`flush`)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: IO[str] | None = path.open("a", encoding="utf-8", buffering=1 << 16)

    def write(self, record: RequestRecord) -> None:
        """Append one record."""
        if self._file is not None:
            self._file.write(record.to_json() + "\n")

    def flush(self) -> None:
        """Push buffered lines to the file."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Flush and close."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def records(self) -> list[dict[str, Any]]:
        """Read the file back (tests and tools)."""
        self.flush()
        return [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line]
