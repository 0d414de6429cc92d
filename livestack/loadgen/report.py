"""Summaries of a load run: per-tenant latency percentiles (:func:`policies.scoring.quantile`), JSON / CSV output."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from livestack.loadgen.client import RequestResult
from policies.scoring import quantile

__all__ = ["ClientTenantStats", "summarize", "write_csv", "write_json"]


@dataclass(frozen=True, slots=True)
class ClientTenantStats:
    """One tenant's (or ``all``) client-side statistics; latencies in seconds, ``None`` = no sample."""

    tenant: str
    num_requests: int
    num_ok: int
    num_errors: int
    output_tokens: int
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None
    tpot_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p95_s: float | None


def _summary(name: str, results: Sequence[RequestResult]) -> ClientTenantStats:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    itl = [x for r in ok for x in r.itl_s]
    return ClientTenantStats(
        tenant=name,
        num_requests=len(results),
        num_ok=len(ok),
        num_errors=len(results) - len(ok),
        output_tokens=sum(r.output_tokens for r in ok),
        ttft_p50_s=quantile(ttft, 0.5),
        ttft_p95_s=quantile(ttft, 0.95),
        ttft_p99_s=quantile(ttft, 0.99),
        tpot_p50_s=quantile(tpot, 0.5),
        tpot_p95_s=quantile(tpot, 0.95),
        tpot_p99_s=quantile(tpot, 0.99),
        itl_p50_s=quantile(itl, 0.5),
        itl_p99_s=quantile(itl, 0.99),
        e2e_p50_s=quantile(e2e, 0.5),
        e2e_p95_s=quantile(e2e, 0.95),
    )


def summarize(results: Sequence[RequestResult]) -> list[ClientTenantStats]:
    """One summary per tenant (sorted), then ``all``."""
    tenants = sorted({r.tenant for r in results})
    out = [_summary(t, [r for r in results if r.tenant == t]) for t in tenants]
    out.append(_summary("all", results))
    return out


def write_json(path: Path, results: Sequence[RequestResult], summaries: Sequence[ClientTenantStats]) -> None:
    """Summaries and per-request results as one JSON document."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"summary": [asdict(s) for s in summaries], "requests": [asdict(r) for r in results]}
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")


def write_csv(path: Path, results: Sequence[RequestResult]) -> None:
    """One CSV row per request (ITL samples omitted)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = [
        "request_id", "tenant", "arrival_s", "input_tokens", "requested_output_tokens", "status", "error",
        "output_tokens", "ttft_s", "tpot_s", "e2e_s",
    ]  # fmt: skip
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for r in results:
            writer.writerow([getattr(r, c) for c in columns])
