"""The cluster simulator: tenants' request streams, the router in the loop, instances, KV transfers, pools.

:class:`ClusterSimulator` is a library object: it does no I/O (workloads and the operator profile are passed
in already loaded; :func:`env.sim.build.build_simulator` does the loading), draws all randomness from one
``numpy.random.Generator``, and advances with :meth:`ClusterSimulator.run_until` so a gym env can step it one
control interval at a time, calling :meth:`ClusterSimulator.apply` (a :class:`~policies.schema.ControlAction`)
and :meth:`ClusterSimulator.snapshot` (a :class:`~policies.schema.MetricWindow`) between intervals.

**Events.** Arrivals are read from the merged, sorted request arrays (never pushed on the heap); the heap holds
instance wake-ups (end of a step or of a closed-form decode run, see :mod:`env.sim.engine`), transfer stages,
link completions, transfer timeouts, instances becoming ready and the network's changes at the ends of its
incidents (pushed at construction; a scenario without incidents pushes none). Nothing is paid per generated token.

**Router** (per arrival, in the request's tenant group): the router's placement rules,
:mod:`policies.placement`, over views of the instances (:mod:`env.sim.placement`) — decode instance by prefix hit
within ``affinity_slack_requests`` of the least load, prefill instance by fewest queued prompt tokens, and the
:class:`~policies.schema.LiveState` the router would build (prefill wait = queued prompt tokens / the rate measured
on prefill legs that ran alone, decode pressure, KV usage without the arriving request, prefix hit on the decode
instance; transfer health = recent failure fraction of the group below the scenario's threshold); then
:func:`policies.routing.decide_route` with the tenant's thresholds. The expected output is the request's
``max_tokens`` (the load generator sends ``max_tokens = output_tokens`` for every workload, so a simulated request
carries the same unless ``requests_carry_max_tokens`` is off), else the tenant's ``expected_output_tokens``, else
the placement default.

**KV transfer** (remote route): bytes = (prompt − tokens the decode instance already caches) × KV bytes per
token of the whole model (all TP shards), over the prefill instance's link (:mod:`env.sim.transfer`). On failure
(probability ``failure_prob``) or timeout the tenant's ``on_kv_transfer_timeout`` applies: local re-prefill on
the decode instance, or one retry on another prefill instance first (``retry_remote_prefill``).

**Network incidents** (``network.incidents``): at an incident's start and end every link changes rate mid-flight
(its flows progress to that instant at the old rate, then its completion is rescheduled and timeouts re-checked at
the new one), and transfers starting from then on use the period's failure probability and setup latency.

**Pools.** :meth:`ClusterSimulator.apply` moves each group toward its targets: surplus instances of one role
flip to the other (drain, then ``role_switch_delay_s``), missing ones start (``startup_delay_s``) within the GPU
budget, extra ones drain and stop. Draining instances take no new requests and finish what they hold (no
request is dropped); pending counts are in the snapshot.

**Observed state.** Inside a closed-form decode run the engine's own counters are those of the run's start;
:meth:`ClusterSimulator.view` gives the state at the last completed step boundary, and the router and the
snapshots read that, so results do not depend on how runs are planned (``max_run_segments`` is an efficiency
knob only; a test checks equality across settings). While a general step executes, its effects are visible
from its start (vLLM publishes them at its end: at most one step early).

A request whose prompt plus output cannot fit an instance's KV cache is rejected at arrival (failed).
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from env.perf.model import InterpolatedExecutionTimeModel, StepOverheads
from env.perf.profile import OperatorProfile
from env.scenario import Scenario
from env.sim.base import (
    EVENT_LINK,
    EVENT_NETWORK,
    EVENT_TRANSFER_READY,
    EVENT_TRANSFER_START,
    EVENT_TRANSFER_TIMEOUT,
    EVENT_WAKE,
)
from env.sim.engine import EngineConfig, EngineRequest
from env.sim.instances import GroupState, InstanceRole, InstanceState, SimInstance, kv_capacity_tokens
from env.sim.kv_transfers import KvTransfers
from env.sim.placement import decode_view, prefill_view
from env.sim.pools import PoolControl
from env.sim.records import SimRequest
from env.sim.snapshots import Snapshots
from env.sim.stepping import InstanceStepping
from env.sim.telemetry import BUCKETS_NIXL_BYTES, BUCKETS_NIXL_XFER_S, Histogram
from env.workloads.columns import RequestColumns
from policies.admission import AdmissionConfig, admits, estimated_ttft_s
from policies.placement import (
    PlacementConfig,
    build_live_state,
    choose_decode,
    choose_prefill,
    expected_output_tokens,
)
from policies.routing import decide_route
from policies.schema import LiveState, RequestFeatures, RouteDecision, RouteReason, RoutingThresholds
from policies.transfer_health import TransferBreaker

__all__ = ["ClusterSimulator", "InstanceRole", "InstanceState", "SimInstance", "kv_capacity_tokens"]


class ClusterSimulator(InstanceStepping, KvTransfers, PoolControl, Snapshots):
    """A simulated P/D cluster (see the module docstring; its parts are listed in :mod:`env.sim.base`).

    Args:
        scenario: cluster, groups and tenants (workload fields are not read here).
        profile: the loaded operator profile of the scenario's model.
        workloads: tenant name → its requests (columns sorted by arrival).
        thresholds: tenant name → routing thresholds (missing tenants get the defaults).
        rng: the one random generator (transfer failures).
        expected_output_tokens: tenant → what the router assumes when a request has no ``max_tokens``.
        placement: the router's placement settings (affinity slack, initial prefill rate, default output).
        requests_carry_max_tokens: whether requests carry ``max_tokens = output_tokens`` (as the load generator
            sends them); off, the route decision assumes the tenant's expected output.
        admission: the admission stage's settings (:mod:`policies.admission`; default: admit every request).
    """

    def __init__(
        self,
        scenario: Scenario,
        profile: OperatorProfile,
        workloads: Mapping[str, RequestColumns],
        thresholds: Mapping[str, RoutingThresholds],
        rng: np.random.Generator,
        expected_output_tokens: Mapping[str, int] | None = None,
        placement: PlacementConfig | None = None,
        requests_carry_max_tokens: bool = True,
        admission: AdmissionConfig | None = None,
    ) -> None:
        self.scenario = scenario
        self.placement = placement or PlacementConfig()
        self.admission = admission or AdmissionConfig()
        self.requests_carry_max_tokens = requests_carry_max_tokens
        self.profile = profile
        self.rng = rng
        cluster = scenario.cluster
        overheads = StepOverheads() if cluster.step_overhead_s is None else StepOverheads(cluster.step_overhead_s)
        self._models: dict[int, InterpolatedExecutionTimeModel] = {}
        self._engine_configs: dict[int, EngineConfig] = {}
        self._prefill_tp = cluster.prefill_tp or cluster.tp
        for tp in {cluster.tp, self._prefill_tp}:
            self._models[tp] = InterpolatedExecutionTimeModel(profile, tp, overheads, max_batch=cluster.max_num_seqs)
            capacity = cluster.kv_capacity_tokens or kv_capacity_tokens(
                profile, tp, cluster.gpu_memory_utilization, cluster.activation_reserve_bytes
            )
            self._engine_configs[tp] = EngineConfig(
                kv_capacity_tokens=capacity,
                max_num_seqs=cluster.max_num_seqs,
                max_num_batched_tokens=cluster.max_num_batched_tokens,
                enable_prefix_caching=cluster.enable_prefix_caching,
            )
        self.kv_bytes_per_token = profile.model.kv_bytes_per_token(1)
        net = cluster.network
        self._net = net
        """The network settings in effect now (the scenario's, or an incident's while one lasts)."""
        self._layout_s_per_byte = 0.0 if self._prefill_tp == cluster.tp else 1.0 / net.layout_bandwidth_bytes_per_s

        self.tenant_names = [t.name for t in scenario.tenants]
        self._tenant_index = {name: i for i, name in enumerate(self.tenant_names)}
        self._tenants = scenario.tenants_schema()
        self.slo_ttft_s = [self._tenants[n].slo.ttft_target_s() for n in self.tenant_names]
        self.slo_tpot_s = [self._tenants[n].slo.tpot_target_s() for n in self.tenant_names]
        self.thresholds: list[RoutingThresholds] = [thresholds.get(n, RoutingThresholds()) for n in self.tenant_names]

        group_names = [g.name for g in scenario.tenant_groups]
        self.groups: list[GroupState] = []
        for g in scenario.tenant_groups:
            self.groups.append(
                GroupState(
                    name=g.name,
                    tenants=[i for i, t in enumerate(scenario.tenants) if t.group == g.name],
                    gpu_budget=g.gpu_budget,
                    gpus_per_instance=scenario.gpus_per_instance,
                    min_prefill=g.prefill_pool.min,
                    max_prefill=g.prefill_pool.max,
                    min_decode=max(g.decode_pool.min, 1),
                    max_decode=g.decode_pool.max,
                    breaker=TransferBreaker(
                        net.health_window_s,
                        net.health_min_samples,
                        net.unhealthy_failure_frac,
                        net.health_probe_requests,
                    ),
                )
            )
        self._tenant_group = [group_names.index(t.group) for t in scenario.tenants]
        self.instances: list[SimInstance] = []
        self.now_s = 0.0
        self.max_run_segments = 8
        """Completions one closed-form decode run may span (efficiency only: results do not depend on it)."""
        self._heap: list[tuple[float, int, int, Any, int]] = []
        self._seq = 0
        for gi, g in enumerate(scenario.tenant_groups):
            for role, count in (
                (InstanceRole.PREFILL, g.prefill),
                (InstanceRole.DECODE, g.decode),
                (InstanceRole.AGGREGATED, g.aggregated),
            ):
                for _ in range(count):
                    self._new_instance(gi, role, ready=True)

        # Requests: merge every tenant's columns into one arrival order.
        self._load_workloads(workloads, expected_output_tokens or {})
        self.requests: list[SimRequest | None] = [None] * self.num_requests
        self._next = 0
        self.forecast_from = sys.maxsize
        """Index of the first arrival made up by a forecast (:mod:`env.sim.forecast`); none in a real run."""
        self.num_arrived = 0
        self.num_finished = 0
        self.num_failed = 0
        self.num_refused = 0
        """Requests the admission stage refused (also counted in ``num_failed``)."""
        self.finished: list[list[SimRequest]] = [[] for _ in self.tenant_names]
        self.arrived: list[list[SimRequest]] = [[] for _ in self.tenant_names]
        self._window_start_s = 0.0
        self._window_marks_finished = [0] * len(self.tenant_names)
        self._window_marks_arrived = [0] * len(self.tenant_names)
        self._window_marks_transfers = [0] * len(self.groups)
        self.window_counters: dict[int, tuple[int, int]] = {}
        self.transfer_bytes = 0.0
        self.transfer_failures = 0
        self.num_transfers = 0
        self.xfer_time_hist = Histogram(BUCKETS_NIXL_XFER_S)
        self.xfer_bytes_hist = Histogram(BUCKETS_NIXL_BYTES)
        for time_s, settings in net.changes():  # none without incidents: no events, same sequence numbers
            self._push(time_s, EVENT_NETWORK, settings, 0)

    # ------------------------------------------------------------------------------------------- setup helpers

    def _load_workloads(self, workloads: Mapping[str, RequestColumns], expected: Mapping[str, int]) -> None:
        arrivals, inputs, outputs, tenants, rows = [], [], [], [], []
        self._columns: list[RequestColumns | None] = [None] * len(self.tenant_names)
        self._expected_output: list[int | None] = []
        for ti, name in enumerate(self.tenant_names):
            columns = workloads.get(name)
            self._columns[ti] = columns
            if columns is None or len(columns) == 0:
                self._expected_output.append(expected.get(name))
                continue
            arrivals.append(columns.arrival_s)
            inputs.append(columns.input_tokens)
            outputs.append(columns.output_tokens)
            tenants.append(np.full(len(columns), ti, dtype=np.int64))
            rows.append(np.arange(len(columns), dtype=np.int64))
            self._expected_output.append(expected.get(name))
        if arrivals:
            arrival = np.concatenate(arrivals)
            order = np.argsort(arrival, kind="stable")
            self._arrival_s: list[float] = arrival[order].tolist()
            self._input: list[int] = np.maximum(np.concatenate(inputs)[order], 1).tolist()
            self._output: list[int] = np.maximum(np.concatenate(outputs)[order], 1).tolist()
            self._tenant_of: list[int] = np.concatenate(tenants)[order].tolist()
            self._row_of: list[int] = np.concatenate(rows)[order].tolist()
        else:
            self._arrival_s, self._input, self._output, self._tenant_of, self._row_of = [], [], [], [], []
        self.num_requests = len(self._arrival_s)
        # hash ids, keyed by tenant so sources do not collide: key = id * tenants + tenant
        self._hash_lists: list[list[int] | None] = []
        self._hash_offsets: list[list[int] | None] = []
        self._hash_block: list[int] = []
        count = max(len(self.tenant_names), 1)
        for ti, columns in enumerate(self._columns):
            if columns is not None and columns.has_hash_ids:
                self._hash_lists.append((columns.hash_ids * count + ti).tolist())
                self._hash_offsets.append(columns.hash_offsets.tolist())
            else:
                self._hash_lists.append(None)
                self._hash_offsets.append(None)
            self._hash_block.append(columns.hash_block_tokens if columns is not None else 512)

    # ------------------------------------------------------------------------------------------------ driving

    def run_until(self, t_s: float) -> None:
        """Process every event up to ``t_s`` (inclusive); afterwards ``now_s == t_s``."""
        if t_s < self.now_s:
            raise ValueError(f"cannot run backwards: now {self.now_s}, asked {t_s}")
        self._process(t_s)
        self.now_s = t_s

    def run(self, max_time_s: float | None = None) -> None:
        """Run until every request has arrived and finished (or until ``max_time_s``).

        Afterwards ``now_s`` is the time of the last event (or ``max_time_s`` when it stopped there).
        """
        limit = math.inf if max_time_s is None else max_time_s
        self._process(limit)
        if not math.isinf(limit) and (self._heap or self._next < self.num_requests):
            self.now_s = limit

    def _process(self, t_s: float) -> None:
        heap = self._heap
        arrivals = self._arrival_s
        n = self.num_requests
        pop = heapq.heappop
        while True:
            next_arrival = arrivals[self._next] if self._next < n else math.inf
            if heap and heap[0][0] <= next_arrival:
                if heap[0][0] > t_s:
                    break
                time_s, _, kind, obj, version = pop(heap)
                self.now_s = time_s
                if kind == EVENT_WAKE:
                    if version == obj.version:
                        self._wake(obj)
                elif kind == EVENT_LINK:
                    if version == obj.version:
                        self._link_event(obj)
                elif kind == EVENT_TRANSFER_START:
                    self._transfer_flow(obj)
                elif kind == EVENT_TRANSFER_READY:
                    self._transfer_ready(obj)
                elif kind == EVENT_TRANSFER_TIMEOUT:
                    self._transfer_timeout(obj)
                elif kind == EVENT_NETWORK:
                    self._network_change(obj)
                else:
                    self._instance_ready(obj)
            else:
                if next_arrival > t_s or self._next >= n:
                    break
                self.now_s = next_arrival
                self._arrive(self._next)
                self._next += 1

    @property
    def num_in_flight(self) -> int:
        """Arrived requests neither finished nor failed."""
        return self.num_arrived - self.num_finished - self.num_failed

    # ------------------------------------------------------------------------------------------------ arrivals

    def _hashes(self, tenant: int, row: int) -> tuple[int, ...]:
        flat = self._hash_lists[tenant]
        if flat is None:
            return ()
        offsets = self._hash_offsets[tenant]
        assert offsets is not None
        return tuple(flat[offsets[row] : offsets[row + 1]])

    def _arrive(self, index: int) -> None:
        now = self.now_s
        tenant = self._tenant_of[index]
        input_tokens = self._input[index]
        output_tokens = self._output[index]
        name = self.tenant_names[tenant]
        hashes = self._hashes(tenant, self._row_of[index])
        request_id = f"{name}-{self._row_of[index]}" if index < self.forecast_from else f"{name}-f{index}"
        request = SimRequest(index, request_id, tenant, now, input_tokens, output_tokens, hashes)
        self.requests[index] = request
        self.num_arrived += 1
        self.arrived[tenant].append(request)
        group = self.groups[self._tenant_group[tenant]]
        block = self._hash_block[tenant]

        # Placement and live state: the router's rules (policies.placement) over views of the instances.
        views = [decode_view(self, inst) for inst in group.decode]
        chosen = choose_decode(
            views,
            lambda v: v.instance.engine.prefix_hit_tokens(hashes, block, input_tokens) if hashes else 0,
            self.placement.affinity_slack_requests,
        )
        if chosen is None or input_tokens + output_tokens > chosen[0].instance.engine.config.kv_capacity_tokens:
            request.status = SimRequest.FAILED
            self.num_failed += 1
            return
        decode_v, hit = chosen
        decode = decode_v.instance
        prefill_v = choose_prefill([prefill_view(inst) for inst in group.prefill])
        prefill = None if prefill_v is None else prefill_v.instance
        live = build_live_state(
            decode_v,
            hit,
            prefill_v,
            None if prefill is None else prefill.prefill_rate,
            len(group.prefill),
            group.breaker.allows_remote(self.now_s),
        )
        columns = self._columns[tenant]
        expected = expected_output_tokens(
            output_tokens if self.requests_carry_max_tokens else None,
            self._expected_output[tenant],
            self.placement.default_output_tokens,
        )
        features = RequestFeatures(
            request.request_id, name, input_tokens, expected, columns.model if columns is not None else ""
        )
        decision = decide_route(features, self.thresholds[tenant], live)
        if self.admission.enabled and not self._admits(request, decision, live, decode, prefill, hit):
            return
        request.reason = decision.reason
        request.decode_instance = decode.index
        if decision.is_remote and prefill is not None:
            request.remote = True
            decode.incoming += 1
            group.breaker.sent_remote(now)
            er = EngineRequest(request.request_id, input_tokens, 1, hashes, block, prefill_only=True, tag=request)
            self._send_prefill(prefill, request, er)
        else:
            er = EngineRequest(request.request_id, input_tokens, output_tokens, hashes, block, tag=request)
            decode.engine.add_request(er, now)
            self._kick(decode)

    def _admits(
        self,
        request: SimRequest,
        decision: RouteDecision,
        live: LiveState,
        decode: SimInstance,
        prefill: SimInstance | None,
        hit_tokens: int,
    ) -> bool:
        """The admission stage (:mod:`policies.admission`); a refused request fails at arrival.

        The local queue is the decode engine's prompt tokens still to prefill (the router counts the whole prompts
        of its local legs without a first byte; the two agree while nothing has started, which is when it matters).
        """
        measured = None if prefill is None else prefill.prefill_rate
        rate = self.placement.initial_prefill_tokens_per_s if measured is None else measured.tokens_per_s
        estimate = estimated_ttft_s(
            decision, live, request.input_tokens - hit_tokens, decode.engine.queued_prefill_tokens, rate
        )
        if admits(self.admission, self.slo_ttft_s[request.tenant], estimate):
            return True
        request.reason = RouteReason.ADMISSION_REFUSED
        request.status = SimRequest.FAILED
        self.num_failed += 1
        self.num_refused += 1
        return False

    def _send_prefill(self, prefill: SimInstance, request: SimRequest, er: EngineRequest) -> None:
        """Start a prefill leg on ``prefill``; one that starts alone there is measured for the router's rate."""
        request.prefill_instance = prefill.index
        request.prefill_sent_s = self.now_s
        request.prefill_alone = prefill.assigned_requests == 0
        prefill.assigned_requests += 1
        prefill.assigned_prefill_tokens += er.prompt_tokens
        prefill.engine.add_request(er, self.now_s)
        self._kick(prefill)
