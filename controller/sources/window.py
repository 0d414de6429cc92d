"""From query answers to the schema's :class:`~policies.schema.MetricWindow` (one derivation, two sources).

The metric names read are listed in :data:`ROUTER_METRICS` and :data:`INSTANCE_METRICS`. Per tenant they
come from the router (label ``tenant``); per tenant group from the instances (vLLM's own names, grouped by
the instance label and mapped to group and role through the topology, or through ``group``/``role``
labels on the series when the topology does not know the instance). Means and ratios are sums over the
window divided by sums (never averages of averages); quantiles come from summed bucket increases. A query
without rows leaves the field ``None``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from controller.sources.base import Query, Readout, Row, Topology
from policies.admission import REFUSED_ROUTE
from policies.schema import GroupWindow, MetricWindow, PoolTargets, TenantWindow
from policies.scoring import histogram_quantile

__all__ = ["INSTANCE_METRICS", "ROUTER_METRICS", "WindowBuilder", "WindowQueries"]

ROUTER_METRICS: Mapping[str, str] = {
    "requests": "pdctl_router_requests_total",
    "ttft": "pdctl_router_ttft_seconds",
    "tpot": "pdctl_router_tpot_seconds",
    "prompt_tokens": "pdctl_router_prompt_tokens_total",
    "output_tokens": "pdctl_router_generation_tokens_total",
    "prompt_tokens_per_request": "pdctl_router_request_prompt_tokens",
    "slo_met": "pdctl_router_slo_met_total",
    "prefix_hit_tokens": "pdctl_router_prefix_hit_tokens_total",
    "decisions": "pdctl_router_decisions_total",
    "routed_prompt_tokens": "pdctl_router_routed_prompt_tokens_total",
}
"""Router metrics read per tenant (``router/telemetry.py``): finished requests by ``tenant``, ``route`` and
``outcome`` (``ok``/``error``); client TTFT and per-request TPOT histograms (seconds); prompt and output
tokens of finished requests (counters; means are token sums / request counts); a per-request prompt-length
histogram (p95 input); requests meeting the tenant's SLO (attainment, goodput); the prompt tokens the router
estimated the chosen decode instance held in its prefix cache (prefix-hit fraction); and, counted as requests
arrive, the route decisions and their prompt tokens.

**Arrivals, not completions, measure the load.** ``request_rate_rps`` is the window's arrivals (route decisions
plus the requests refused for want of a decode instance), and ``mean_input_tokens`` and ``remote_prefill_frac``
are over the requests routed in the window, as the simulator measures them (:mod:`env.sim.windows`): a policy
trained there reads the offered load. Completions lag arrivals under a backlog and stop rising at capacity, so a
rate of finished requests would read an overloaded deployment as a loaded one. A router without the decision
series (an older one) is read by its finished requests instead. A series absent from the source leaves its fields
unknown."""

INSTANCE_METRICS: Mapping[str, str] = {
    "queue_time": "vllm:request_queue_time_seconds",
    "prompt_tokens": "vllm:request_prompt_tokens",
    "xfer_time": "vllm:nixl_xfer_time_seconds",
    "xfer_failed": "vllm:nixl_num_failed_transfers_total",
    "prefix_hits": "vllm:prefix_cache_hits_total",
    "prefix_queries": "vllm:prefix_cache_queries_total",
    "waiting": "vllm:num_requests_waiting",
    "running": "vllm:num_requests_running",
    "kv_usage": "vllm:kv_cache_usage_perc",
}
"""vLLM instance metrics read per tenant group (``../shared/reference/vllm-interface.md`` §5)."""

_QUANTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True, slots=True)
class WindowQueries:
    """The fixed query list (its length does not depend on the number of tenants or instances)."""

    instance_label: str = "instance_id"

    def router(self) -> dict[str, Query]:
        """Per-tenant queries on router metrics."""
        r = ROUTER_METRICS
        out = {
            "requests": Query("increase", r["requests"], ("tenant", "route", "outcome")),
            "prompt_sum": Query("increase", r["prompt_tokens"], ("tenant",)),
            "prompt_p95": Query("quantile", r["prompt_tokens_per_request"], ("tenant",), 0.95),
            "output_sum": Query("increase", r["output_tokens"], ("tenant",)),
            "slo_met": Query("increase", r["slo_met"], ("tenant",)),
            "prefix_hit_tokens": Query("increase", r["prefix_hit_tokens"], ("tenant",)),
            "decisions": Query("increase", r["decisions"], ("tenant", "route")),
            "routed_prompt_sum": Query("increase", r["routed_prompt_tokens"], ("tenant",)),
        }
        for q in _QUANTILES:
            out[f"ttft_{q}"] = Query("quantile", r["ttft"], ("tenant",), q)
            out[f"tpot_{q}"] = Query("quantile", r["tpot"], ("tenant",), q)
        return out

    def instances(self) -> dict[str, Query]:
        """Per-instance queries on vLLM metrics (grouped later by tenant group and role)."""
        m, by = INSTANCE_METRICS, (self.instance_label,)
        return {
            "queue_sum": Query("increase", m["queue_time"] + "_sum", by),
            "queue_count": Query("increase", m["queue_time"] + "_count", by),
            "prompt_sum": Query("increase", m["prompt_tokens"] + "_sum", by),
            "prompt_count": Query("increase", m["prompt_tokens"] + "_count", by),
            "xfer_count": Query("increase", m["xfer_time"] + "_count", by),
            "xfer_buckets": Query("buckets", m["xfer_time"], by),
            "xfer_failed": Query("increase", m["xfer_failed"], by),
            "prefix_hits": Query("increase", m["prefix_hits"], by),
            "prefix_queries": Query("increase", m["prefix_queries"], by),
            "waiting": Query("gauge", m["waiting"], by),
            "running": Query("gauge", m["running"], by),
            "kv_usage": Query("gauge", m["kv_usage"], by),
        }

    def all(self) -> list[Query]:
        """Every query, router first."""
        return [*self.router().values(), *self.instances().values()]


def _div(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    value = numerator / denominator
    return value if math.isfinite(value) else None


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


class _ByKey:
    """Sums of rows keyed by one label, over the rows whose other labels match ``where``.

    A key no row carried reads ``None`` (:meth:`get`) or 0 (:meth:`total`).
    """

    def __init__(self, rows: Iterable[Row], label: str, **where: str) -> None:
        self.sums: dict[str, float] = {}
        for labels, value in rows:
            key = labels.get(label)
            if key is None or not math.isfinite(value):
                continue
            if all(labels.get(k) == v for k, v in where.items()):
                self.sums[key] = self.sums.get(key, 0.0) + value

    def get(self, key: str) -> float | None:
        return self.sums.get(key)

    def total(self, key: str) -> float:
        """The sum, 0 when no row carried the key."""
        return self.sums.get(key, 0.0)


@dataclass(slots=True)
class _Pool:
    """Per-(group, role) accumulators over instances."""

    sums: dict[str, float]
    seen: set[str]
    kv_values: list[float]
    buckets: dict[float, float]

    @staticmethod
    def empty() -> _Pool:
        return _Pool({}, set(), [], {})

    def add(self, name: str, value: float) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + value
        self.seen.add(name)

    def get(self, name: str) -> float | None:
        return self.sums.get(name) if name in self.seen else None


class WindowBuilder:
    """Builds a :class:`MetricWindow` from a readout, the topology, and the tenants and groups of the policy."""

    def __init__(self, queries: WindowQueries | None = None) -> None:
        self.queries = queries or WindowQueries()
        self._router = self.queries.router()
        self._instances = self.queries.instances()

    def build(
        self,
        readout: Readout,
        topology: Topology,
        tenants: Sequence[str],
        groups: Sequence[str],
        end_s: float,
        staleness_s: float,
    ) -> MetricWindow:
        """The window for ``tenants`` and ``groups`` ending at ``end_s`` (epoch seconds)."""
        tenant_windows = self._tenants(readout, tenants)
        group_windows = self._groups(readout, topology, groups)
        return MetricWindow(end_s, readout.window_s, tenant_windows, group_windows, staleness_s)

    # ------------------------------------------------------------------------------------------ tenants

    def _tenants(self, readout: Readout, tenants: Sequence[str]) -> dict[str, TenantWindow]:
        res, q, w = readout.results, self._router, readout.window_s
        # requests refused for their body (route "rejected": malformed, too large) are neither load nor failures
        requests = [row for row in res.get(q["requests"], ()) if row[0].get("route") != "rejected"]
        decisions = res.get(q["decisions"], ())
        total = _ByKey(requests, "tenant")
        remote = _ByKey(requests, "tenant", route="remote_prefill")
        errors = _ByKey(requests, "tenant", outcome="error")
        refused = _ByKey(requests, "tenant", route="none")  # refused as they arrived: no decode instance
        decided = _ByKey(decisions, "tenant")
        decided_remote = _ByKey(decisions, "tenant", route="remote_prefill")
        # refused by the admission stage: arrivals (load, and failures once answered), but never placed, so not in
        # the remote share's denominator (env.sim.windows: the share is over the requests that did not fail)
        decided_refused = _ByKey(decisions, "tenant", route=REFUSED_ROUTE)
        sums = {name: _ByKey(res.get(query, ()), "tenant") for name, query in q.items()}
        out: dict[str, TenantWindow] = {}
        for tenant in tenants:
            finished = total.get(tenant)
            ok = None if finished is None else finished - errors.total(tenant)
            slo_met = sums["slo_met"].get(tenant)
            prompt_sum = sums["prompt_sum"].get(tenant)
            routed = decided.get(tenant)
            arrived = None if routed is None else routed + refused.total(tenant)
            routed_prompt_sum = sums["routed_prompt_sum"].get(tenant)
            if routed is None:  # a router without the decision series: its finished requests stand in
                remote_frac = _div(remote.total(tenant) if finished is not None else None, finished)
            else:
                remote_frac = _div(decided_remote.total(tenant), routed - decided_refused.total(tenant))
            if routed is not None and routed_prompt_sum is not None:
                mean_input = _div(routed_prompt_sum, routed)
            else:  # a router without the decision series, as above
                mean_input = _div(prompt_sum, finished)
            out[tenant] = TenantWindow(
                request_rate_rps=_div(arrived if arrived is not None else finished, w),
                mean_input_tokens=mean_input,
                p95_input_tokens=sums["prompt_p95"].get(tenant),
                mean_output_tokens=_div(sums["output_sum"].get(tenant), finished),
                ttft_p50_s=sums["ttft_0.5"].get(tenant),
                ttft_p95_s=sums["ttft_0.95"].get(tenant),
                ttft_p99_s=sums["ttft_0.99"].get(tenant),
                tpot_p50_s=sums["tpot_0.5"].get(tenant),
                tpot_p95_s=sums["tpot_0.95"].get(tenant),
                tpot_p99_s=sums["tpot_0.99"].get(tenant),
                slo_attainment_frac=_div(slo_met, ok),
                goodput_rps=_div(slo_met, w),
                remote_prefill_frac=remote_frac,
                prefix_cache_hit_frac=_div(sums["prefix_hit_tokens"].get(tenant), prompt_sum),
                failed_rate_rps=_div(errors.total(tenant) if finished is not None else None, w),
            )
        return out

    # ------------------------------------------------------------------------------------------- groups

    def _placement(self, labels: Mapping[str, str], topology: Topology) -> tuple[str, str] | None:
        instance_id = labels.get(self.queries.instance_label)
        info = topology.instance(instance_id) if instance_id is not None else None
        if info is not None:
            return info.group, info.role
        group, role = labels.get("group"), labels.get("role")
        return (group, role) if group is not None and role is not None else None

    def _pools(self, readout: Readout, topology: Topology) -> dict[tuple[str, str], _Pool]:
        pools: dict[tuple[str, str], _Pool] = defaultdict(_Pool.empty)
        placements: dict[frozenset[tuple[str, str]], tuple[str, str] | None] = {}
        for name, query in self._instances.items():
            for labels, value in readout.results.get(query, ()):
                if not math.isfinite(value):
                    continue
                key = frozenset((k, v) for k, v in labels.items() if k != "le")
                if key not in placements:
                    placements[key] = self._placement(labels, topology)
                placement = placements[key]
                if placement is None:
                    continue
                pool = pools[placement]
                if name == "xfer_buckets":
                    le = float(labels.get("le", "nan"))
                    pool.buckets[le] = pool.buckets.get(le, 0.0) + value
                    continue
                if name == "kv_usage":
                    pool.kv_values.append(value)
                pool.add(name, value)
        return pools

    def _groups(self, readout: Readout, topology: Topology, groups: Sequence[str]) -> dict[str, GroupWindow]:
        pools = self._pools(readout, topology)
        out: dict[str, GroupWindow] = {}
        for group in groups:
            prefill = pools.get((group, "prefill"), _Pool.empty())
            decode = pools.get((group, "decode"), _Pool.empty())
            counts = topology.pools.get(group, PoolTargets(0, 0))
            pending = topology.pending.get(group, (0, 0))
            both = _Pool.empty()
            for pool in (prefill, decode):
                for name in pool.seen:
                    both.add(name, pool.sums[name])
                for le, value in pool.buckets.items():
                    both.buckets[le] = both.buckets.get(le, 0.0) + value
            mean_prompt = _div(prefill.get("prompt_sum"), prefill.get("prompt_count"))
            waiting = prefill.get("waiting")
            queued_tokens = None
            if waiting is not None and (waiting == 0 or mean_prompt is not None):
                queued_tokens = waiting * (mean_prompt or 0.0)
            xfers, failed = both.get("xfer_count"), both.get("xfer_failed")
            attempts = None if xfers is None and failed is None else (xfers or 0.0) + (failed or 0.0)
            out[group] = GroupWindow(
                num_prefill=counts.num_prefill,
                num_decode=counts.num_decode,
                pending_prefill=pending[0],
                pending_decode=pending[1],
                prefill_queue_wait_s=_div(prefill.get("queue_sum"), prefill.get("queue_count")),
                prefill_queued_tokens=queued_tokens,
                decode_active_seqs=decode.get("running"),
                decode_kv_usage_frac=_div(sum(decode.kv_values), len(decode.kv_values)) if decode.kv_values else None,
                prefill_kv_usage_frac=(
                    _div(sum(prefill.kv_values), len(prefill.kv_values)) if prefill.kv_values else None
                ),
                kv_transfer_time_p95_s=histogram_quantile(0.95, both.buckets.items()) if both.buckets else None,
                kv_transfer_failure_frac=_div(failed, attempts) if failed is not None else None,
                prefix_cache_hit_frac=_div(both.get("prefix_hits"), both.get("prefix_queries")),
                prefill_queue_requests=waiting,
                decode_queue_requests=decode.get("waiting"),
            )
        return out
