"""What the live dashboard shows, read from the running parts (never from the load generator).

Sources, polled about once a second:

* the router's JSONL request log (tailed): per-tenant TTFT/TPOT p95 and goodput over a sliding window,
  route mix and fallbacks;
* the router's admin API (``GET /admin/state``): instance roles (P/D counts, pending role changes) and the
  per-tenant remote-prefill thresholds in force;
* the decode instances' ``/metrics``: ``vllm:nixl_xfer_time_seconds`` (KV transfer time, emulated seconds);
* the controller's audit log (tailed): its last decision, reason, guard outcome and actuation.

Router timings are wall seconds; they are divided by ``time_scale`` here so that everything is in emulated
seconds. Each poll also appends a :class:`TimelinePoint` (counts and thresholds over time, for the report).
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdctl.demo.config import RequestSloBounds
from pdctl.demo.processes import http_get
from policies.scoring import meets_slo, quantile

__all__ = ["ControllerView", "Monitor", "Snapshot", "TenantView", "TimelinePoint"]

_NIXL_SUM = b"vllm:nixl_xfer_time_seconds_sum"
_NIXL_COUNT = b"vllm:nixl_xfer_time_seconds_count"


@dataclass(frozen=True, slots=True)
class TenantView:
    """One tenant over the sliding window (emulated seconds; ``None`` = no sample)."""

    tenant: str
    num_finished: int
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    slo: RequestSloBounds
    goodput_rps: float | None
    remote_frac: float | None
    num_fallbacks_total: int
    num_errors_total: int
    remote_min_input_tokens: int | None


@dataclass(frozen=True, slots=True)
class ControllerView:
    """The controller's last audit record, summarised."""

    tick: int
    mode: str
    policy_id: str
    reason: str
    outcome: str
    num_actuations_applied: int


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """P/D counts and thresholds at one moment (``t_s`` emulated seconds since the load started)."""

    t_s: float
    num_prefill: int
    num_decode: int
    num_pending: int
    remote_min_input_tokens: dict[str, int | None]

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {
            "t_s": round(self.t_s, 3),
            "num_prefill": self.num_prefill,
            "num_decode": self.num_decode,
            "num_pending": self.num_pending,
            "remote_min_input_tokens": self.remote_min_input_tokens,
        }


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one dashboard frame shows."""

    phase: str
    t_s: float
    duration_s: float
    tenants: list[TenantView]
    num_prefill: int
    num_decode: int
    num_pending: int
    route_counts: dict[str, int]
    transfer_mean_s: float | None
    num_requests_total: int
    controller: ControllerView | None
    router_reachable: bool


def remote_min_tokens(document: Mapping[str, Any], tenant: str) -> int | None:
    """``remote_prefill.min_input_tokens`` of ``tenant`` in a policy document (the top-level value if unset)."""
    for block in document.get("tenants", []) or []:
        if block.get("name") == tenant:
            value = ((block.get("pd_disaggregation_policy") or {}).get("remote_prefill") or {}).get("min_input_tokens")
            if value is not None:
                return int(value)
    value = ((document.get("pd_disaggregation_policy") or {}).get("remote_prefill") or {}).get("min_input_tokens")
    return None if value is None else int(value)


class _JsonlTail:
    """Reads the complete lines appended to a JSONL file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except OSError:
            return []
        self._offset += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        out: list[dict[str, Any]] = []
        for line in lines:
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return out


def _p95(values: list[float]) -> float | None:
    return quantile(values, 0.95)


def _nixl_totals(body: bytes) -> tuple[float, float]:
    total_s = count = 0.0
    for line in body.splitlines():
        if line.startswith(_NIXL_SUM):
            total_s += float(line.rsplit(b" ", 1)[1])
        elif line.startswith(_NIXL_COUNT):
            count += float(line.rsplit(b" ", 1)[1])
    return total_s, count


@dataclass
class Monitor:
    """Polls the running parts and keeps the sliding windows (see the module docstring)."""

    phase: str
    router_url: str
    admin_token: str
    request_log: Path
    audit_log: Path
    instance_urls: Mapping[str, str]
    slos: Mapping[str, RequestSloBounds]
    time_scale: float
    duration_s: float
    window_s: float = 20.0
    """Sliding window of the latency and goodput figures, emulated seconds."""
    start_wall: float = field(default_factory=time.time)
    timeline: list[TimelinePoint] = field(default_factory=list)
    _records: deque[dict[str, Any]] = field(default_factory=deque)
    _fallbacks: dict[str, int] = field(default_factory=dict)
    _errors: dict[str, int] = field(default_factory=dict)
    _routes: dict[str, int] = field(default_factory=dict)
    _num_total: int = 0
    _nixl: deque[tuple[float, float, float]] = field(default_factory=deque)
    _last_audit: dict[str, Any] | None = None
    _applied: int = 0
    _log_tail: _JsonlTail | None = None
    _audit_tail: _JsonlTail | None = None

    def __post_init__(self) -> None:
        self._log_tail = _JsonlTail(self.request_log)
        self._audit_tail = _JsonlTail(self.audit_log)

    def elapsed_s(self, now_wall: float | None = None) -> float:
        """Emulated seconds since the load started."""
        return ((now_wall if now_wall is not None else time.time()) - self.start_wall) / self.time_scale

    def _ingest_requests(self) -> None:
        assert self._log_tail is not None
        for rec in self._log_tail.read():
            tenant = str(rec.get("tenant", "?"))
            self._num_total += 1
            route = str(rec.get("route", "?"))
            self._routes[route] = self._routes.get(route, 0) + 1
            if rec.get("fallback"):
                self._fallbacks[tenant] = self._fallbacks.get(tenant, 0) + 1
            if rec.get("error") is not None or int(rec.get("status", 200)) >= 400:
                self._errors[tenant] = self._errors.get(tenant, 0) + 1
            e2e = rec.get("e2e_s")
            rec["_finish_wall"] = float(rec.get("arrival_ts", 0.0)) + (float(e2e) if e2e is not None else 0.0)
            self._records.append(rec)

    def _ingest_audit(self) -> None:
        assert self._audit_tail is not None
        for rec in self._audit_tail.read():
            self._last_audit = rec
            for result in rec.get("actuation", []) or []:
                if result.get("outcome") == "applied":
                    self._applied += 1

    def _poll_transfer(self, now_wall: float) -> float | None:
        total_s = count = 0.0
        for url in self.instance_urls.values():
            status, body = http_get(f"{url}/metrics", timeout_s=1.0)
            if status == 200:
                s, c = _nixl_totals(body)
                total_s += s
                count += c
        self._nixl.append((now_wall, total_s, count))
        horizon = now_wall - self.window_s * self.time_scale
        while len(self._nixl) > 2 and self._nixl[1][0] <= horizon:
            self._nixl.popleft()
        _, s0, c0 = self._nixl[0]
        if count - c0 <= 0:
            return None
        return (total_s - s0) / (count - c0)

    def _tenant_view(self, tenant: str, recent: list[dict[str, Any]], thresholds: dict[str, int | None]) -> TenantView:
        scale = self.time_scale
        mine = [r for r in recent if r.get("tenant") == tenant and r.get("error") is None]
        ttft = [float(r["ttft_s"]) / scale for r in mine if r.get("ttft_s") is not None]
        tpot = [float(r["tpot_s"]) / scale for r in mine if r.get("tpot_s") is not None]
        slo = self.slos[tenant]
        good = sum(
            meets_slo(
                None if r.get("ttft_s") is None else float(r["ttft_s"]) / scale,
                None if r.get("tpot_s") is None else float(r["tpot_s"]) / scale,
                slo.ttft_s,
                slo.tpot_s,
            )
            for r in mine
        )
        window = min(self.window_s, max(self.elapsed_s(), 1e-9))
        remote = sum(1 for r in mine if r.get("route") == "remote_prefill")
        return TenantView(
            tenant=tenant,
            num_finished=len(mine),
            ttft_p95_s=_p95(ttft),
            tpot_p95_s=_p95(tpot),
            slo=slo,
            goodput_rps=good / window if mine else None,
            remote_frac=remote / len(mine) if mine else None,
            num_fallbacks_total=self._fallbacks.get(tenant, 0),
            num_errors_total=self._errors.get(tenant, 0),
            remote_min_input_tokens=thresholds.get(tenant),
        )

    def poll(self) -> Snapshot:
        """Read every source once; return the frame and record a timeline point."""
        now_wall = time.time()
        self._ingest_requests()
        self._ingest_audit()
        horizon = now_wall - self.window_s * self.time_scale
        while self._records and self._records[0]["_finish_wall"] < horizon:
            self._records.popleft()
        recent = [r for r in self._records if r["_finish_wall"] >= horizon]
        status, body = http_get(
            f"{self.router_url}/admin/state", timeout_s=1.0, headers={"Authorization": f"Bearer {self.admin_token}"}
        )
        state: dict[str, Any] = json.loads(body) if status == 200 and body else {}
        instances = state.get("instances", []) or []
        num_prefill = sum(1 for i in instances if (i.get("pending_role") or i.get("role")) == "prefill")
        num_decode = sum(1 for i in instances if (i.get("pending_role") or i.get("role")) == "decode")
        num_pending = sum(1 for i in instances if i.get("pending_role"))
        document = state.get("policy") or {}
        thresholds = {tenant: remote_min_tokens(document, tenant) for tenant in self.slos} if document else {}
        t_s = self.elapsed_s(now_wall)
        if state:
            self.timeline.append(TimelinePoint(t_s, num_prefill, num_decode, num_pending, thresholds))
        transfer = self._poll_transfer(now_wall)
        controller = None
        if self._last_audit is not None:
            rec = self._last_audit
            summary = (rec.get("guarded") or {}).get("summary") or {}
            outcomes = [str(r.get("outcome")) for r in rec.get("actuation", []) or []]
            controller = ControllerView(
                tick=int(rec.get("tick", 0)),
                mode=str(rec.get("mode", "?")),
                policy_id=str(rec.get("policy_id", "?")),
                reason=str((rec.get("decision") or {}).get("reason", "")),
                outcome=",".join(f"{g}:{v}" for g, v in summary.items())
                + (f" [{','.join(outcomes)}]" if outcomes else ""),
                num_actuations_applied=self._applied,
            )
        return Snapshot(
            phase=self.phase,
            t_s=t_s,
            duration_s=self.duration_s,
            tenants=[self._tenant_view(t, recent, thresholds) for t in self.slos],
            num_prefill=num_prefill,
            num_decode=num_decode,
            num_pending=num_pending,
            route_counts=dict(self._routes),
            transfer_mean_s=None if transfer is None or not math.isfinite(transfer) else transfer,
            num_requests_total=self._num_total,
            controller=controller,
            router_reachable=bool(state),
        )
