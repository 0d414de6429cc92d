"""Observations of a running :class:`~env.sim.simulator.ClusterSimulator`: metric windows, vLLM metrics, records.

The functions read the simulator through :class:`ObservedCluster`, a read-only view of the few attributes they need
(the simulator's :mod:`env.sim.snapshots` part passes itself), so this module does not import the simulator.

:meth:`ClusterSimulator.snapshot` builds a :class:`~policies.schema.MetricWindow` from :func:`tenant_window` (exact
quantiles over the requests finished in the window; ``None`` where there is no data) and :func:`group_window`
(gauges at window end as an observer sees them, transfer statistics, prefix-cache hit fraction from counter deltas).

A window's ``slo_attainment_frac`` is the share of the requests *finished* in the window that met the SLO
(:func:`policies.scoring.count_slo_met`), as the live sources derive it from the router's counters: the requests
arriving in a window mostly finish in later ones, and failures are reported apart (``failed_rate_rps``). The
attainment of a whole run (:mod:`env.sim.summary`, :mod:`agents.evaluate`) is over arrivals.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any, Protocol

import numpy as np

from env.sim.instances import GroupState, SimInstance
from env.sim.records import STAGES, SimRequest
from env.sim.telemetry import Histogram
from policies.schema import GroupWindow, TenantWindow
from policies.scoring import count_slo_met, quantile, quantiles

__all__ = ["ObservedCluster", "group_window", "instance_metrics", "stage_records", "tenant_window"]

_QUANTILES = (0.5, 0.95, 0.99)


class ObservedCluster(Protocol):
    """What the windows read of a running simulator (read-only; :class:`~env.sim.simulator.ClusterSimulator`)."""

    @property
    def slo_ttft_s(self) -> Sequence[float]:
        """Per tenant index: the TTFT objective."""

    @property
    def slo_tpot_s(self) -> Sequence[float]:
        """Per tenant index: the TPOT objective."""

    @property
    def groups(self) -> Sequence[GroupState]:
        """The tenant groups, by group index."""

    @property
    def instances(self) -> Sequence[SimInstance]:
        """Every instance ever created, by instance index."""

    @property
    def finished(self) -> Sequence[Sequence[SimRequest]]:
        """Per tenant index: the requests finished so far, in order of completion."""

    @property
    def xfer_time_hist(self) -> Histogram:
        """Durations of the successful KV transfers."""

    @property
    def xfer_bytes_hist(self) -> Histogram:
        """Sizes of the successful KV transfers."""

    @property
    def transfer_failures(self) -> int:
        """KV transfers that failed or timed out."""

    def pool_counts(self, group: int) -> dict[str, int]:
        """Active and pending instance counts of a group."""

    def view(self, inst: SimInstance) -> tuple[int, int]:
        """``(running requests, KV tokens used)`` of an instance as an observer sees them now."""


def tenant_window(
    sim: ObservedCluster, tenant: int, arrived: Sequence[SimRequest], finished: Sequence[SimRequest], window_s: float
) -> TenantWindow:
    """One tenant's window from the requests that arrived and finished in it (exact quantiles)."""
    if not arrived and not finished:
        return TenantWindow(request_rate_rps=0.0)
    out: dict[str, float | None] = {"request_rate_rps": len(arrived) / window_s}
    if arrived:
        inputs = np.array([r.input_tokens for r in arrived], dtype=np.float64)
        out["mean_input_tokens"] = float(inputs.mean())
        out["p95_input_tokens"] = quantile(inputs, 0.95)
        out["mean_output_tokens"] = float(np.mean([r.output_tokens for r in arrived]))
        routed = [r for r in arrived if r.status != SimRequest.FAILED]
        if routed:
            out["remote_prefill_frac"] = sum(1 for r in routed if r.remote) / len(routed)
        out["failed_rate_rps"] = sum(1 for r in arrived if r.status == SimRequest.FAILED) / window_s
    if finished:
        ttft = np.array([r.ttft_s for r in finished])
        tpot = np.array([r.tpot_s for r in finished])
        out["ttft_p50_s"], out["ttft_p95_s"], out["ttft_p99_s"] = quantiles(ttft, _QUANTILES)
        multi = tpot[np.array([r.output_tokens > 1 for r in finished])]
        if multi.size:
            out["tpot_p50_s"], out["tpot_p95_s"], out["tpot_p99_s"] = quantiles(multi, _QUANTILES)
        met = count_slo_met(ttft, tpot, sim.slo_ttft_s[tenant], sim.slo_tpot_s[tenant])
        # over the completions of the window (module docstring), not the run's attainment over arrivals
        out["slo_attainment_frac"] = met / len(finished)
        out["goodput_rps"] = met / window_s
    return TenantWindow(**out)


def group_window(
    sim: ObservedCluster,
    group_index: int,
    log: Sequence[tuple[float, float, bool]],
    counter_marks: MutableMapping[int, tuple[int, int]],
) -> GroupWindow:
    """One tenant group's window: pools, gauges now, and the transfers ``log`` of the window.

    ``counter_marks`` holds each engine's prefix-cache counters at the previous window's end (by ``id`` of the
    counters); the hit fraction is over their increase, and the marks move to now.
    """
    group = sim.groups[group_index]
    counts = sim.pool_counts(group_index)
    prefill, decode = group.prefill, group.decode
    out: dict[str, float | None] = {}
    if prefill:
        queued = [p.engine.queued_prefill_tokens for p in prefill]
        out["prefill_queued_tokens"] = float(sum(queued))
        out["prefill_queue_wait_s"] = float(
            np.mean([q / p.prefill_rate_tokens_per_s for q, p in zip(queued, prefill, strict=True)])
        )
        out["prefill_kv_usage_frac"] = float(np.mean([p.engine.kv_usage_frac for p in prefill]))
        out["prefill_queue_requests"] = float(sum(p.engine.num_waiting for p in prefill))
    if decode:
        views = [sim.view(d) for d in decode]
        out["decode_active_seqs"] = float(np.mean([running for running, _ in views]))
        out["decode_kv_usage_frac"] = float(
            np.mean(
                [min(kv / d.engine.config.kv_capacity_tokens, 1.0) for (_, kv), d in zip(views, decode, strict=True)]
            )
        )
        out["decode_queue_requests"] = float(sum(d.engine.num_waiting + d.incoming for d in decode))
    if log:
        times = [elapsed for _, elapsed, failed in log if not failed]
        if times:
            out["kv_transfer_time_p95_s"] = quantile(times, 0.95)
        out["kv_transfer_failure_frac"] = sum(1 for _, _, failed in log if failed) / len(log)
    queries = hits = 0
    for inst in group.instances:
        c = inst.engine.counters
        before = counter_marks.get(id(c), (0, 0))
        queries += c.prefix_cache_queries - before[0]
        hits += c.prefix_cache_hits - before[1]
        counter_marks[id(c)] = (c.prefix_cache_queries, c.prefix_cache_hits)
    if queries > 0:
        out["prefix_cache_hit_frac"] = hits / queries
    return GroupWindow(
        num_prefill=counts["prefill"],
        num_decode=counts["decode"],
        pending_prefill=counts["pending_prefill"],
        pending_decode=counts["pending_decode"],
        **out,
    )


def instance_metrics(sim: ObservedCluster) -> dict[str, dict[str, Any]]:
    """Per instance: vLLM-named counters, gauges and histograms (per-request ones from the records)."""
    out: dict[str, dict[str, Any]] = {}
    for inst in sim.instances:
        engine = inst.engine
        metrics: dict[str, Any] = dict(engine.counters.as_metrics())
        metrics["vllm:num_requests_running"] = float(engine.num_running)
        metrics["vllm:num_requests_waiting"] = float(engine.num_waiting)
        metrics["vllm:kv_cache_usage_perc"] = engine.kv_usage_frac
        out[f"{inst.role}-{inst.index}"] = metrics
    out["cluster"] = {
        "vllm:nixl_xfer_time_seconds": sim.xfer_time_hist,
        "vllm:nixl_bytes_transferred": sim.xfer_bytes_hist,
        "vllm:nixl_num_failed_transfers_total": float(sim.transfer_failures),
    }
    return out


def stage_records(sim: ObservedCluster) -> dict[str, np.ndarray]:
    """Columns of every finished request: tenant index, route (1 = remote), TTFT, TPOT and the stages."""
    finished = [r for per in sim.finished for r in per]
    finished.sort(key=lambda r: r.index)
    columns: dict[str, list[float]] = {s: [] for s in STAGES}
    for r in finished:
        for key, value in r.stages().items():
            columns[key].append(value)
    out = {key: np.asarray(values, dtype=np.float64) for key, values in columns.items()}
    out["tenant"] = np.asarray([r.tenant for r in finished], dtype=np.int64)
    out["remote"] = np.asarray([r.remote for r in finished], dtype=np.int64)
    out["ttft_s"] = np.asarray([r.ttft_s for r in finished], dtype=np.float64)
    out["tpot_s"] = np.asarray([r.tpot_s for r in finished], dtype=np.float64)
    return out
