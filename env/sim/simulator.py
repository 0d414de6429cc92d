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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from env.perf.model import InterpolatedExecutionTimeModel, StepOverheads
from env.perf.profile import OperatorProfile
from env.scenario import NetworkConfig, Scenario
from env.sim.engine import EngineConfig, EngineRequest, InstanceEngine
from env.sim.placement import decode_view, prefill_view
from env.sim.records import SimRequest
from env.sim.telemetry import BUCKETS_NIXL_BYTES, BUCKETS_NIXL_XFER_S, Histogram
from env.sim.transfer import Link, Transfer
from env.sim.windows import group_window, instance_metrics, stage_records, tenant_window
from env.workloads.columns import RequestColumns
from policies.placement import (
    PlacementConfig,
    PrefillRate,
    build_live_state,
    choose_decode,
    choose_prefill,
    expected_output_tokens,
)
from policies.routing import decide_route
from policies.schema import (
    ControlAction,
    FallbackAction,
    GroupWindow,
    MetricWindow,
    RequestFeatures,
    RouteReason,
    RoutingThresholds,
    TenantWindow,
)

__all__ = ["ClusterSimulator", "InstanceRole", "InstanceState", "SimInstance", "kv_capacity_tokens"]

_WAKE = 0
_XFER_START = 1
_LINK = 2
_XFER_READY = 3
_XFER_TIMEOUT = 4
_READY = 5
_NETWORK = 6


class InstanceRole:
    """Instance roles."""

    PREFILL = "prefill"
    DECODE = "decode"
    AGGREGATED = "aggregated"


class InstanceState:
    """Instance lifecycle."""

    STARTING = "starting"
    ACTIVE = "active"
    DRAINING = "draining"
    STOPPED = "stopped"


def kv_capacity_tokens(
    profile: OperatorProfile, tp: int, gpu_memory_utilization: float, activation_reserve_bytes: float
) -> int:
    """KV tokens one instance holds: (memory x utilisation - weights - activations) / KV bytes per token (per GPU)."""
    free = profile.gpu_memory_bytes * gpu_memory_utilization - profile.model.weight_bytes(tp) - activation_reserve_bytes
    return max(int(free // profile.model.kv_bytes_per_token(tp)), 1)


class SimInstance:
    """One simulated instance (engine plus lifecycle and run bookkeeping)."""

    __slots__ = (
        "assigned_prefill_tokens",
        "assigned_requests",
        "busy",
        "created_s",
        "engine",
        "group",
        "in_transfer",
        "incoming",
        "index",
        "link",
        "name",
        "next_role",
        "prefill_rate",
        "prefill_rate_tokens_per_s",
        "ready_s",
        "result",
        "role",
        "run",
        "run_start_s",
        "run_steps",
        "state",
        "stopped_s",
        "tp",
        "version",
    )

    def __init__(self, index: int, group: int, role: str, engine: InstanceEngine, link: Link, tp: int) -> None:
        self.index = index
        self.name = f"{role}-{index}"
        self.group = group
        self.role = role
        self.next_role: str | None = role
        self.state = InstanceState.ACTIVE
        self.engine = engine
        self.link = link
        self.tp = tp
        self.busy = False
        self.version = 0
        self.run: Any = None
        self.run_start_s = 0.0
        self.run_steps = 0
        self.result: Any = None
        self.incoming = 0
        """Remote requests placed on this decode instance and not yet handed to its engine."""
        self.in_transfer = 0
        """Of those, the ones whose prefill is done (KV on its way)."""
        self.assigned_requests = 0
        """Prefill legs placed on this prefill instance and not yet done."""
        self.assigned_prefill_tokens = 0
        """Their prompt tokens."""
        self.prefill_rate: PrefillRate | None = None
        """The router's measured prefill rate of this instance (set by the simulator)."""
        self.created_s = 0.0
        self.ready_s = 0.0
        self.stopped_s = math.nan
        self.prefill_rate_tokens_per_s = 1.0

    @property
    def serves_decode(self) -> bool:
        """Decode or aggregated role."""
        return self.role != InstanceRole.PREFILL

    def load(self) -> int:
        """Requests held or on their way (the router's load measure)."""
        engine = self.engine
        return len(engine._decoding) + len(engine._prefilling) + len(engine._waiting) + self.incoming


@dataclass(slots=True)
class _GroupState:
    name: str
    tenants: list[int]
    gpu_budget: int
    gpus_per_instance: int
    min_prefill: int
    max_prefill: int | None
    min_decode: int
    max_decode: int | None
    instances: list[SimInstance] = field(default_factory=list)
    prefill: list[SimInstance] = field(default_factory=list)
    decode: list[SimInstance] = field(default_factory=list)
    targets: tuple[int, int] | None = None
    retargeting: bool = False
    recent_transfers: int = 0
    recent_failures: float = 0.0
    transfer_log: list[tuple[float, float, bool]] = field(default_factory=list)


class ClusterSimulator:
    """A simulated P/D cluster (see the module docstring).

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
    ) -> None:
        self.scenario = scenario
        self.placement = placement or PlacementConfig()
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
        self.groups: list[_GroupState] = []
        for g in scenario.tenant_groups:
            self.groups.append(
                _GroupState(
                    name=g.name,
                    tenants=[i for i, t in enumerate(scenario.tenants) if t.group == g.name],
                    gpu_budget=g.gpu_budget,
                    gpus_per_instance=scenario.gpus_per_instance,
                    min_prefill=g.prefill_pool.min,
                    max_prefill=g.prefill_pool.max,
                    min_decode=max(g.decode_pool.min, 1),
                    max_decode=g.decode_pool.max,
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
        self.num_arrived = 0
        self.num_finished = 0
        self.num_failed = 0
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
            self._push(time_s, _NETWORK, settings, 0)

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

    def _new_instance(self, group_index: int, role: str, ready: bool) -> SimInstance:
        tp = self._prefill_tp if role == InstanceRole.PREFILL else self.scenario.cluster.tp
        engine = InstanceEngine(self._engine_configs[tp], self._models[tp])
        inst = SimInstance(
            len(self.instances), group_index, role, engine, Link(self._net.link_bandwidth_bytes_per_s), tp
        )
        inst.prefill_rate_tokens_per_s = self._prefill_rate(tp)
        inst.prefill_rate = self.placement.new_prefill_rate()
        inst.created_s = self.now_s
        self.instances.append(inst)
        group = self.groups[group_index]
        group.instances.append(inst)
        if ready:
            self._activate(inst)
        else:
            inst.state = InstanceState.STARTING
            inst.ready_s = self.now_s + self.scenario.cluster.startup_delay_s
            self._push(inst.ready_s, _READY, inst, 0)
        return inst

    def _prefill_rate(self, tp: int) -> float:
        tokens = self._engine_configs[tp].max_num_batched_tokens
        step = self._models[tp].step_time_s(tokens, 1, 0, 0, [(tokens, 0)])
        return tokens / step

    def _activate(self, inst: SimInstance) -> None:
        inst.state = InstanceState.ACTIVE
        inst.next_role = inst.role
        inst.name = f"{inst.role}-{inst.index}"
        group = self.groups[inst.group]
        (group.prefill if inst.role == InstanceRole.PREFILL else group.decode).append(inst)

    def _push(self, time_s: float, kind: int, obj: Any, version: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time_s, self._seq, kind, obj, version))

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
                if kind == _WAKE:
                    if version == obj.version:
                        self._wake(obj)
                elif kind == _LINK:
                    if version == obj.version:
                        self._link_event(obj)
                elif kind == _XFER_START:
                    self._transfer_flow(obj)
                elif kind == _XFER_READY:
                    self._transfer_ready(obj)
                elif kind == _XFER_TIMEOUT:
                    self._transfer_timeout(obj)
                elif kind == _NETWORK:
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
        request = SimRequest(index, f"{name}-{self._row_of[index]}", tenant, now, input_tokens, output_tokens, hashes)
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
            group.recent_failures < self._net.unhealthy_failure_frac,
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
        request.reason = decision.reason
        request.decode_instance = decode.index
        if decision.is_remote and prefill is not None:
            request.remote = True
            decode.incoming += 1
            er = EngineRequest(request.request_id, input_tokens, 1, hashes, block, prefill_only=True, tag=request)
            self._send_prefill(prefill, request, er)
        else:
            er = EngineRequest(request.request_id, input_tokens, output_tokens, hashes, block, tag=request)
            decode.engine.add_request(er, now)
            self._kick(decode)

    def _send_prefill(self, prefill: SimInstance, request: SimRequest, er: EngineRequest) -> None:
        """Start a prefill leg on ``prefill``; one that starts alone there is measured for the router's rate."""
        request.prefill_instance = prefill.index
        request.prefill_sent_s = self.now_s
        request.prefill_alone = prefill.assigned_requests == 0
        prefill.assigned_requests += 1
        prefill.assigned_prefill_tokens += er.prompt_tokens
        prefill.engine.add_request(er, self.now_s)
        self._kick(prefill)

    # ------------------------------------------------------------------------------------------------ instances

    def view(self, inst: SimInstance) -> tuple[int, int]:
        """``(running requests, KV tokens used)`` of an instance as an observer sees them now.

        In the middle of a closed-form decode run the engine's counters are those of the run's start; the view
        accounts for the steps completed by now, so what the router sees does not depend on how runs are planned.
        """
        engine = inst.engine
        run = inst.run
        if run is None:
            return len(engine._decoding) + len(engine._prefilling), engine.kv_used_tokens
        return engine.run_view(run, self.now_s - inst.run_start_s)

    def _kick(self, inst: SimInstance) -> None:
        if not inst.busy:
            self._start_next(inst)
            return
        run = inst.run
        if run is not None and (len(run.end_steps) > 1 or inst.engine.can_admit_waiting()):
            steps = InstanceEngine.steps_covering(run, self.now_s - inst.run_start_s)
            if steps < inst.run_steps:
                inst.run_steps = steps
                inst.version += 1
                self._push(inst.run_start_s + run.time_after_s(steps), _WAKE, inst, inst.version)

    def _start_next(self, inst: SimInstance) -> None:
        engine = inst.engine
        run = engine.plan_decode_run(self.now_s, max_segments=self.max_run_segments)
        inst.version += 1
        if run is not None:
            inst.run = run
            inst.run_start_s = self.now_s
            inst.run_steps = run.num_steps
            inst.busy = True
            self._push(self.now_s + run.duration_s, _WAKE, inst, inst.version)
            return
        result = engine.step(self.now_s)
        if result is None:
            inst.busy = False
            if inst.state == InstanceState.DRAINING:
                self._maybe_drained(inst)
            return
        inst.result = result
        inst.busy = True
        self._push(result.start_s + result.duration_s, _WAKE, inst, inst.version)

    def _wake(self, inst: SimInstance) -> None:
        run = inst.run
        if run is not None:
            finished = inst.engine.commit_decode_run(run, inst.run_steps, inst.run_start_s)
            inst.run = None
        else:
            result = inst.result
            inst.result = None
            for er in result.prefill_done:
                self._prefill_done(inst, er)
            finished = result.finished
        for er in finished:
            self._finish(er)
        inst.busy = False
        self._start_next(inst)

    def _finish(self, er: EngineRequest) -> None:
        request: SimRequest = er.tag
        request.finished_s = er.finished_s
        request.first_token_s = er.first_token_s
        request.decode_scheduled_s = er.first_scheduled_s
        if not request.remote or not math.isnan(request.fallback_s):
            # prefilled on this (decode/aggregated) instance
            if math.isnan(request.queue_wait_s):
                request.queue_wait_s = er.first_scheduled_s - request.arrival_s
            request.prefill_compute_s += er.prefill_done_s - er.first_scheduled_s
        request.status = SimRequest.FINISHED
        self.num_finished += 1
        self.finished[request.tenant].append(request)

    # ------------------------------------------------------------------------------------------------ transfers

    def _prefill_done(self, prefill: SimInstance, er: EngineRequest) -> None:
        request: SimRequest = er.tag
        prefill.assigned_requests -= 1
        prefill.assigned_prefill_tokens -= er.prompt_tokens
        if request.prefill_alone and prefill.prefill_rate is not None:
            prefill.prefill_rate.observe(er.prompt_tokens, self.now_s - request.prefill_sent_s)
        if math.isnan(request.queue_wait_s):
            request.queue_wait_s = er.first_scheduled_s - request.arrival_s
        request.prefill_compute_s += er.prefill_done_s - er.first_scheduled_s
        decode = self.instances[request.decode_instance]
        decode.in_transfer += 1
        cached = decode.engine.prefix_hit_tokens(request.hash_ids, er.hash_block_tokens, er.prompt_tokens)
        size = float((er.prompt_tokens - cached) * self.kv_bytes_per_token)
        layout = size * self._layout_s_per_byte
        net = self._net
        fails = net.failure_prob > 0 and float(self.rng.random()) < net.failure_prob
        xfer = Transfer(request, er, prefill, decode, prefill.link, size, self.now_s, layout, layout, fails)
        request.pack_s = layout
        request.transfer_bytes += size
        self.num_transfers += 1
        # The timeout event is armed only when the transfer could miss its deadline (see _reschedule_link).
        xfer.deadline_s = self.now_s + net.timeout_s
        delay = net.setup_latency_s + layout
        if delay + layout >= net.timeout_s:
            self._arm_timeout(xfer)
        if delay > 0:
            self._push(self.now_s + delay, _XFER_START, xfer, 0)
        else:
            self._transfer_flow(xfer)

    def _transfer_flow(self, xfer: Transfer) -> None:
        if xfer.state != Transfer.PENDING:
            return
        link = xfer.link
        link.add(xfer, self.now_s)
        self._reschedule_link(link)

    def _arm_timeout(self, xfer: Transfer) -> None:
        xfer.armed = True
        self._push(xfer.deadline_s, _XFER_TIMEOUT, xfer, 0)

    def _reschedule_link(self, link: Link) -> None:
        link.version += 1
        flows = link.flows
        if flows:
            self._push(link.next_completion_s(), _LINK, link, link.version)
            # Shares change only here, so a flow whose projected end (plus unpack) passes its deadline is found
            # here, before the deadline: arm its timeout then.
            per_byte_s = len(flows) / link.bandwidth_bytes_per_s
            start = link.last_update_s
            for flow in flows:
                if (
                    not flow.armed
                    and start + max(flow.remaining_bytes, 0.0) * per_byte_s + flow.unpack_s > flow.deadline_s
                ):
                    self._arm_timeout(flow)

    def _link_event(self, link: Link) -> None:
        for xfer in link.pop_finished(self.now_s):
            if xfer.unpack_s > 0:
                xfer.state = Transfer.UNPACKING
                self._push(self.now_s + xfer.unpack_s, _XFER_READY, xfer, 0)
            else:
                self._transfer_ready(xfer)
        self._reschedule_link(link)

    def _network_change(self, net: NetworkConfig) -> None:
        """Switch to ``net``'s settings now: links change rate mid-flight; new transfers use its failure and setup."""
        self._net = net
        bandwidth = net.link_bandwidth_bytes_per_s
        for inst in self.instances:
            link = inst.link
            if link.bandwidth_bytes_per_s != bandwidth:
                link.set_bandwidth(bandwidth, self.now_s)
                self._reschedule_link(link)

    def _transfer_ready(self, xfer: Transfer) -> None:
        if xfer.state == Transfer.ABANDONED:
            return
        xfer.state = Transfer.DONE
        request: SimRequest = xfer.request
        elapsed = self.now_s - xfer.start_s
        request.transfer_s += self.now_s - xfer.start_s - xfer.pack_s - xfer.unpack_s
        request.unpack_s = xfer.unpack_s
        group = self.groups[xfer.prefill.group]
        if xfer.fails:
            self._transfer_failed(xfer, group)
            return
        self._log_transfer(group, elapsed, False)
        self.transfer_bytes += xfer.bytes_total
        self.xfer_time_hist.observe(elapsed)
        self.xfer_bytes_hist.observe(xfer.bytes_total)
        self._release_prefill(xfer)
        decode: SimInstance = xfer.decode
        decode.incoming -= 1
        decode.in_transfer -= 1
        request.kv_ready_s = self.now_s
        er: EngineRequest = xfer.engine_request
        ready = EngineRequest(
            request.request_id,
            er.prompt_tokens,
            request.output_tokens,
            request.hash_ids,
            er.hash_block_tokens,
            kv_ready=True,
            tag=request,
        )
        decode.engine.add_request(ready, self.now_s)
        self._kick(decode)

    def _transfer_timeout(self, xfer: Transfer) -> None:
        if xfer.state in (Transfer.DONE, Transfer.ABANDONED):
            return
        if xfer.state == Transfer.FLOWING:
            xfer.link.remove(xfer, self.now_s)
            self._reschedule_link(xfer.link)
        request: SimRequest = xfer.request
        request.transfer_s += self.now_s - xfer.start_s
        self._transfer_failed(xfer, self.groups[xfer.prefill.group])

    def _log_transfer(self, group: _GroupState, elapsed_s: float, failed: bool) -> None:
        group.transfer_log.append((self.now_s, elapsed_s, failed))
        # exponentially weighted failure fraction over roughly the last 20 transfers
        group.recent_failures = 0.95 * group.recent_failures + (0.05 if failed else 0.0)

    def _release_prefill(self, xfer: Transfer) -> None:
        prefill: SimInstance = xfer.prefill
        prefill.engine.release(xfer.engine_request.request_id)
        if prefill.state == InstanceState.DRAINING and not prefill.busy:
            self._maybe_drained(prefill)

    def _transfer_failed(self, xfer: Transfer, group: _GroupState) -> None:
        xfer.state = Transfer.ABANDONED
        request: SimRequest = xfer.request
        request.transfer_failures += 1
        self.transfer_failures += 1
        self._log_transfer(group, self.now_s - xfer.start_s, True)
        self._release_prefill(xfer)
        decode: SimInstance = xfer.decode
        decode.in_transfer -= 1
        action = self.thresholds[request.tenant].on_kv_transfer_timeout
        if action == FallbackAction.RETRY_REMOTE_PREFILL and not request.retried:
            others = [p for p in self.groups[decode.group].prefill if p is not xfer.prefill]
            if others:
                request.retried = True
                target = choose_prefill([prefill_view(p) for p in others])
                assert target is not None
                block = xfer.engine_request.hash_block_tokens
                er = EngineRequest(
                    request.request_id, request.input_tokens, 1, request.hash_ids, block, prefill_only=True, tag=request
                )
                self._send_prefill(target.instance, request, er)
                return
        decode.incoming -= 1
        request.remote = False
        request.reason = RouteReason.FALLBACK_TRANSFER_FAILED
        request.fallback_s = self.now_s
        local = EngineRequest(
            request.request_id, request.input_tokens, request.output_tokens, request.hash_ids,
            xfer.engine_request.hash_block_tokens, tag=request,
        )  # fmt: skip
        decode.engine.add_request(local, self.now_s)
        self._kick(decode)
        if decode.state == InstanceState.DRAINING:
            self._maybe_drained(decode)

    # ------------------------------------------------------------------------------------------------ pools

    def apply(self, action: ControlAction) -> None:
        """Apply a policy's action: per-tenant thresholds now; pool targets through drains and start-ups."""
        for tenant, thresholds in action.thresholds.items():
            index = self._tenant_index.get(tenant)
            if index is not None:
                self.thresholds[index] = thresholds
        for group_name, targets in action.pools.items():
            for gi, group in enumerate(self.groups):
                if group.name == group_name:
                    self._retarget(gi, targets.num_prefill, targets.num_decode)

    def _future_role(self, inst: SimInstance) -> str | None:
        if inst.state == InstanceState.STOPPED:
            return None
        return inst.next_role

    def _retarget(self, group_index: int, want_prefill: int, want_decode: int) -> None:
        """Move a group toward targets; remembered, and retried when a drained instance frees its GPUs.

        GPUs are counted per instance at its TP degree (prefill instances at ``prefill_tp``). Role flips
        (drain, then restart in the other role) are used only when both roles have the same TP degree.
        """
        group = self.groups[group_index]
        group.targets = (want_prefill, want_decode)
        if group.retargeting:
            return
        group.retargeting = True
        try:
            self._retarget_once(group_index, want_prefill, want_decode)
        finally:
            group.retargeting = False

    def _retarget_once(self, group_index: int, want_prefill: int, want_decode: int) -> None:  # noqa: C901
        group = self.groups[group_index]
        prefill_tp, decode_tp = self._prefill_tp, self.scenario.cluster.tp
        if group.max_prefill is not None:
            want_prefill = min(want_prefill, group.max_prefill)
        if group.max_decode is not None:
            want_decode = min(want_decode, group.max_decode)
        want_prefill = max(want_prefill, group.min_prefill)
        want_decode = max(want_decode, group.min_decode)
        budget = group.gpu_budget
        if want_prefill * prefill_tp + want_decode * decode_tp > budget:
            # over budget (a guard should have clamped it): keep the prefill target, decode gets the rest
            want_prefill = min(want_prefill, max((budget - group.min_decode * decode_tp) // prefill_tp, 0))
            want_decode = (budget - want_prefill * prefill_tp) // decode_tp

        def future(role_is_prefill: bool) -> list[SimInstance]:
            out = []
            for inst in group.instances:
                role = self._future_role(inst)
                if role is not None and (role == InstanceRole.PREFILL) == role_is_prefill:
                    out.append(inst)
            return out

        def by_load(insts: list[SimInstance]) -> list[SimInstance]:
            return sorted(insts, key=lambda i: (i.state != InstanceState.STARTING, i.load(), -i.index))

        delta_prefill = want_prefill - len(future(True))
        delta_decode = want_decode - len(future(False))
        if prefill_tp == decode_tp:
            while delta_prefill > 0 and delta_decode < 0:
                candidates = [i for i in by_load(future(False)) if i.state == InstanceState.ACTIVE]
                if not candidates:
                    break
                self._begin_drain(candidates[0], InstanceRole.PREFILL)
                delta_prefill -= 1
                delta_decode += 1
            while delta_decode > 0 and delta_prefill < 0:
                candidates = [i for i in by_load(future(True)) if i.state == InstanceState.ACTIVE]
                if not candidates:
                    break
                self._begin_drain(candidates[0], InstanceRole.DECODE)
                delta_prefill += 1
                delta_decode -= 1
        # shrink first, so that the GPUs of stopped instances can serve the growth
        for is_prefill, delta in ((True, delta_prefill), (False, delta_decode)):
            for inst in by_load(future(is_prefill))[: max(-delta, 0)]:
                self._begin_drain(inst, None)
        used = sum(i.tp for i in group.instances if i.state != InstanceState.STOPPED)
        while delta_prefill > 0 and used + prefill_tp <= budget:
            self._new_instance(group_index, InstanceRole.PREFILL, ready=False)
            delta_prefill -= 1
            used += prefill_tp
        while delta_decode > 0 and used + decode_tp <= budget:
            self._new_instance(group_index, InstanceRole.DECODE, ready=False)
            delta_decode -= 1
            used += decode_tp

    def _begin_drain(self, inst: SimInstance, next_role: str | None) -> None:
        group = self.groups[inst.group]
        if inst in group.prefill:
            group.prefill.remove(inst)
        if inst in group.decode:
            group.decode.remove(inst)
        inst.next_role = next_role
        if inst.state == InstanceState.STARTING:
            if next_role is None:
                self._stop(inst)
            else:
                inst.role = next_role
            return
        inst.state = InstanceState.DRAINING
        self._maybe_drained(inst)

    def _maybe_drained(self, inst: SimInstance) -> None:
        if inst.state != InstanceState.DRAINING or inst.busy or inst.incoming or not inst.engine.is_empty:
            return
        if inst.next_role is None:
            self._stop(inst)
            return
        tp = self._prefill_tp if inst.next_role == InstanceRole.PREFILL else self.scenario.cluster.tp
        inst.role = inst.next_role
        inst.tp = tp
        inst.engine = InstanceEngine(self._engine_configs[tp], self._models[tp], inst.engine.counters)
        inst.prefill_rate_tokens_per_s = self._prefill_rate(tp)
        inst.state = InstanceState.STARTING
        inst.ready_s = self.now_s + self.scenario.cluster.role_switch_delay_s
        self._push(inst.ready_s, _READY, inst, 0)

    def _stop(self, inst: SimInstance) -> None:
        inst.state = InstanceState.STOPPED
        inst.next_role = None
        inst.stopped_s = self.now_s
        group = self.groups[inst.group]
        if group.targets is not None and not group.retargeting:
            self._retarget(inst.group, *group.targets)  # its GPUs may now let a pending start-up happen

    def _instance_ready(self, inst: SimInstance) -> None:
        if inst.state != InstanceState.STARTING:
            return
        self._activate(inst)
        self._kick(inst)

    # ------------------------------------------------------------------------------------------------ telemetry

    def gpu_seconds(self, group: int | None = None) -> float:
        """GPU-seconds of every instance (starting, serving or draining) so far."""
        total = 0.0
        for inst in self.instances:
            if group is not None and inst.group != group:
                continue
            end = inst.stopped_s if not math.isnan(inst.stopped_s) else self.now_s
            total += max(end - inst.created_s, 0.0) * inst.tp
        return total

    def pool_counts(self, group: int) -> dict[str, int]:
        """Active and pending instance counts of a group."""
        g = self.groups[group]
        out = {"prefill": len(g.prefill), "decode": len(g.decode), "pending_prefill": 0, "pending_decode": 0}
        for inst in g.instances:
            if inst.state in (InstanceState.STARTING, InstanceState.DRAINING) and inst.next_role is not None:
                key = "pending_prefill" if inst.next_role == InstanceRole.PREFILL else "pending_decode"
                out[key] += 1
        return out

    def instance_metrics(self) -> dict[str, dict[str, Any]]:
        """Per instance: vLLM-named counters, gauges and histograms (see :func:`env.sim.windows.instance_metrics`)."""
        return instance_metrics(self)

    def stage_records(self) -> dict[str, np.ndarray]:
        """Columns of every finished request (see :func:`env.sim.windows.stage_records`)."""
        return stage_records(self)

    def snapshot(self) -> MetricWindow:
        """Statistics since the previous snapshot (or the start), as the shared metric-window type."""
        now = self.now_s
        window = max(now - self._window_start_s, 1e-9)
        tenants: dict[str, TenantWindow] = {}
        for ti, name in enumerate(self.tenant_names):
            arrived = self.arrived[ti][self._window_marks_arrived[ti] :]
            finished = self.finished[ti][self._window_marks_finished[ti] :]
            self._window_marks_arrived[ti] = len(self.arrived[ti])
            self._window_marks_finished[ti] = len(self.finished[ti])
            tenants[name] = tenant_window(self, ti, arrived, finished, window)
        groups: dict[str, GroupWindow] = {}
        for gi, group in enumerate(self.groups):
            log = group.transfer_log[self._window_marks_transfers[gi] :]
            self._window_marks_transfers[gi] = len(group.transfer_log)
            groups[group.name] = group_window(self, gi, log)
        self._window_start_s = now
        return MetricWindow(end_s=now, window_s=window, tenants=tenants, groups=groups)
