"""The gymnasium environment over the cluster simulator: one ``step()`` is one control interval.

:class:`PDClusterEnv` is a thin shell: the simulator (:mod:`env.sim.simulator`) does the dynamics, the shared
core (:mod:`policies`) turns windows into observations (:func:`policies.features.build_observation`), encoded
actions into :class:`~policies.schema.ControlAction` (:class:`policies.action_codec.ActionCodec`), and takes each
control interval's decision with the controller's own step (:func:`policies.control.control_step`: policy,
:class:`~policies.guard.SafetyGuard`, overrides, pool and threshold changes); :mod:`env.reward` prices the interval.
Registered as ``pdctl/PDCluster-v1`` in :mod:`env`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from env.perf.profile import OperatorProfile
from env.reward import RewardWeights, instance_changes, reward_terms, total
from env.scenario import Scenario, load_scenario
from env.sim.build import build_simulator, generate_workloads, load_profile
from env.sim.simulator import ClusterSimulator
from env.workloads.columns import RequestColumns
from policies.action_codec import ActionCodec
from policies.admission import AdmissionConfig
from policies.base import Policy, PolicyContext
from policies.control import ControlEffects, ControlInputs, ControlState, control_step, policy_context
from policies.features import Observation, ObservationContext, ObservationLayout, build_observation
from policies.guard import Clamp, GuardLimits, SafetyGuard
from policies.overrides import Override
from policies.schema import ControlAction, MetricWindow, PoolTargets, RoutingThresholds, Tenant, TenantGroup

__all__ = [
    "DEFAULT_SCENARIO",
    "ENV_ID",
    "SCENARIO_DIR",
    "SIM_EPOCH",
    "ControlStep",
    "PDClusterEnv",
    "resolve_scenario",
]

ENV_ID = "pdctl/PDCluster-v1"
SCENARIO_DIR = Path(__file__).resolve().parents[1] / "experiments" / "scenarios"
"""Where scenarios named without a path are looked up (``rag-surge-8`` → ``SCENARIO_DIR/rag-surge-8.yaml``)."""
DEFAULT_SCENARIO = "rag-surge-8"
SIM_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""Default wall time of simulated second 0 (override expiry is judged at ``wall_start + now_s``)."""
_WORKLOAD_CACHE_SIZE = 4


def resolve_scenario(spec: str | Path | Scenario, traces_dir: str | Path | None = None) -> Scenario:
    """A scenario from an instance, a YAML path, or a name in :data:`SCENARIO_DIR`.

    Raises:
        env.scenario.ScenarioError: the file is missing or invalid.
    """
    if isinstance(spec, Scenario):
        return spec
    path = Path(spec)
    if not path.suffix and not path.exists():
        path = SCENARIO_DIR / f"{spec}.yaml"
    return load_scenario(path, traces_dir=traces_dir)


@dataclass(frozen=True, slots=True)
class ControlStep:
    """What one control interval did: the action carried out, its clamps, instance changes and the reward terms.

    Attributes:
        action: the guarded action with active overrides laid over it (what reached the simulator).
        clamps: the guard's adjustments.
        changes: instances added, removed or flipped.
        reward_terms: the interval's reward terms.
        reward: their total.
        effects: everything the shared control step decided (:class:`~policies.control.ControlEffects`).
    """

    action: ControlAction
    clamps: tuple[Clamp, ...]
    changes: int
    reward_terms: dict[str, float]
    reward: float
    effects: ControlEffects


class PDClusterEnv(gym.Env[np.ndarray, np.ndarray]):
    """A prefill/decode-disaggregated LLM serving cluster under one control policy.

    ## Description

    A discrete-event simulation of vLLM instances serving a scenario's tenants (``env.sim``). Every request is
    routed, when it arrives, by the shared per-request rule (:func:`policies.routing.decide_route`) with its
    tenant's current thresholds; prefill runs remotely (then the KV cache crosses the network) or locally on the
    decode instance. The agent acts once per control interval (the scenario's ``control_interval_s``, as the live
    controller does): it moves each tenant group's prefill/decode instance counts and sets each tenant's routing
    thresholds. Every action passes through the controller's safety guard (bounds, GPU budget, one instance per
    pool per tick, cooldown, hysteresis, hold while instances start or drain) before it reaches the simulator,
    so training sees what production would do. New instances serve after ``startup_delay_s``; a role switch
    drains the instance first and takes ``role_switch_delay_s``.

    ## Action Space

    ``MultiDiscrete`` from :class:`policies.action_codec.ActionCodec` over a fixed slot layout
    (``layout.max_groups`` tenant-group slots, then ``layout.max_tenants`` tenant slots; by default 2 and 4:
    28 dimensions). Per group slot: ``prefill_delta`` and ``decode_delta`` (index 0, 1, 2 = −1, 0, +1 instance; an
    increase at a full budget takes the instance from the other pool), or with ``layout.pool_actions == "target"``
    ``prefill_target`` and ``decode_target`` (0 … 16 instances; the pools move one instance per interval towards
    them, with the same shift rule). Per tenant slot: levels of
    ``min_remote_input_tokens`` (256, 512, 1024, 2048, 4096, 8192, 16384, never), ``max_prefill_queue_wait_s``
    (0.1, 0.3, 1, 3), ``min_expected_output_tokens`` (0, 32, 128, 512), ``require_decode_pool_pressure`` and
    ``prefer_local_on_prefix_hit`` (0/1), and the per-request rule (0 = pdctl's, 1 = legacy Dynamo's queue-aware
    rule). Unused slots take only their first index (see :meth:`action_masks`).
    :meth:`step_control` takes a :class:`~policies.schema.ControlAction` directly, and :meth:`control` also a
    :class:`~policies.base.Policy` (how rule-based and baseline policies drive the same env). Every interval is
    one :func:`policies.control.control_step` — the controller's tick, decision half — carried out on the
    simulator.

    ## Observation Space

    ``Box(0, high, (layout.size,), float32)``: the shared feature vector of
    :meth:`policies.features.Observation.to_vector` — per slot every feature divided by its scale and clipped to
    ``[0, clip]``, then one known-flag (0/1) per feature, so "unknown" differs from zero. Features:

    | scope | feature | unit | scale | clip |
    |---|---|---|---|---|
    | group | `num_prefill_frac` | frac | 1 | 1 |
    | group | `num_decode_frac` | frac | 1 | 1 |
    | group | `pending_frac` | frac | 1 | 1 |
    | group | `prefill_queue_wait_s` | s | 1 | 10 |
    | group | `prefill_queued_tokens` | tokens | 65536 | 10 |
    | group | `decode_active_seqs` | seqs | 256 | 4 |
    | group | `decode_kv_usage_frac` | frac | 1 | 1 |
    | group | `prefill_kv_usage_frac` | frac | 1 | 1 |
    | group | `kv_transfer_time_p95_s` | s | 1 | 10 |
    | group | `kv_transfer_failure_frac` | frac | 1 | 1 |
    | group | `prefix_cache_hit_frac` | frac | 1 | 1 |
    | tenant | `request_rate_rps` | req/s | 50 | 10 |
    | tenant | `mean_input_tokens` | tokens | 16384 | 4 |
    | tenant | `p95_input_tokens` | tokens | 16384 | 4 |
    | tenant | `mean_output_tokens` | tokens | 1024 | 8 |
    | tenant | `ttft_p95_s` | s | 1 | 20 |
    | tenant | `tpot_p95_s` | s | 0.1 | 20 |
    | tenant | `ttft_slo_ratio` | ratio | 1 | 10 |
    | tenant | `tpot_slo_ratio` | ratio | 1 | 10 |
    | tenant | `slo_attainment_frac` | frac | 1 | 1 |
    | tenant | `goodput_rps` | req/s | 50 | 10 |
    | tenant | `remote_prefill_frac` | frac | 1 | 1 |
    | tenant | `prefix_cache_hit_frac` | frac | 1 | 1 |
    | tenant | `failed_rate_rps` | req/s | 1 | 10 |
    | tenant | `priority` | weight | 1 | 10 |
    | tenant | `min_remote_input_tokens` | tokens | 16384 | 4 |

    ## Rewards

    Per interval (:mod:`env.reward`): priority-weighted count of requests that finished meeting both their
    tenant's TTFT and TPOT objectives, minus ``gpu_cost_per_gpu_s`` × GPU-seconds, minus
    ``churn_cost_per_change`` × instances added/removed/flipped, minus ``failure_cost_per_request`` × failed
    requests. Each term is in ``info["reward_terms"]`` (costs negative).

    ## Starting State

    The scenario's initial deployment (or ``initial_pools``) with ``base_thresholds`` (default: the seed policy's
    values, :class:`~policies.schema.RoutingThresholds`). :meth:`reset` simulates the first control interval
    under them so the first observation carries data.

    ## Episode End

    Never terminated (serving has no terminal state). Truncated when the simulated clock reaches the scenario's
    ``duration_s`` (``ceil(duration_s / control_interval_s) − 1`` steps). Requests still in flight then are not
    scored by the env; :meth:`drain` lets them finish for end-of-run evaluation.

    ## Arguments

    ``scenario`` (name in ``experiments/scenarios``, path or :class:`~env.scenario.Scenario`; a reset may switch
    it with ``options={"scenario": ...}``), ``layout`` (given, it is fixed — what a learned policy was trained
    on — and a scenario with more groups or tenants than its slots is refused in one line; left out, the default
    layout grows to fit every scenario the env is given, so rule-based and baseline policies run scenarios of any
    size, and the spaces are those of the grown layout), ``reward_weights``, ``guard_limits`` (default: the
    controller's defaults), ``base_thresholds``, ``initial_pools`` (group → (prefill, decode)), ``traces_dir``,
    ``overrides`` (:class:`~policies.overrides.Override`, as the controller's override directory holds them; also
    :meth:`set_overrides`) and ``wall_start`` (wall time of simulated second 0, for override expiry).
    All randomness (workload arrivals and lengths, KV-transfer failures) is drawn from the seed given to
    :meth:`reset`; the same seed gives the same trajectory. Workloads are cached per (scenario, episode seed).

    ## Version History

    * v0: first version (observation features v1, action codec v1, reward terms goodput/gpu_cost/churn/failures).
    * v1: action codec v3 — the "never" remote level closes the gap (all local), and a per-tenant rule flag
      (pdctl / legacy Dynamo); the router's live state carries the peer rules' inputs.
    * v2: optional action codec v4 (``ObservationLayout(pool_actions="target")``): pool targets instead of deltas;
      the default layout keeps v3, so v1 artifacts and experiments are unchanged.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - the gymnasium attribute, never mutated

    def __init__(
        self,
        scenario: str | Path | Scenario = DEFAULT_SCENARIO,
        *,
        layout: ObservationLayout | None = None,
        reward_weights: RewardWeights | None = None,
        guard_limits: GuardLimits | None = None,
        base_thresholds: Mapping[str, RoutingThresholds] | None = None,
        initial_pools: Mapping[str, tuple[int, int]] | None = None,
        traces_dir: str | Path | None = None,
        overrides: Sequence[Override] = (),
        wall_start: datetime = SIM_EPOCH,
        admission: AdmissionConfig | None = None,
    ) -> None:
        self._fixed_layout = layout is not None
        self.admission = admission or AdmissionConfig()
        """The router's admission stage (:mod:`policies.admission`) the simulated cluster runs behind."""
        self._set_layout(layout or ObservationLayout())
        self.reward_weights = reward_weights or RewardWeights()
        self.guard = SafetyGuard(guard_limits or GuardLimits())
        self._base_override = dict(base_thresholds or {})
        self._initial_pools = dict(initial_pools or {})
        self._traces_dir = traces_dir
        self._overrides: tuple[Override, ...] = tuple(overrides)
        self.wall_start = wall_start
        self._profiles: dict[tuple[str, str, str], OperatorProfile] = {}
        self._workloads: OrderedDict[tuple[int, int], dict[str, RequestColumns]] = OrderedDict()
        self._set_scenario(resolve_scenario(scenario, traces_dir))
        self._sim: ClusterSimulator | None = None
        self._control = ControlState.start(self.base_thresholds)
        self._observation: Observation | None = None
        self._gpu_seconds_mark = 0.0
        self._episode_seed = 0

    # ------------------------------------------------------------------------------------------- scenario

    def _set_layout(self, layout: ObservationLayout) -> None:
        self.layout = layout
        self.codec = ActionCodec(layout)
        self.observation_space = layout.observation_space()
        self.action_space = self.codec.action_space()

    def _fit_layout(self, scenario: Scenario) -> None:
        """A given (fixed) layout must hold the scenario; without one the slots grow to fit it (never shrink)."""
        num_groups, num_tenants = len(scenario.tenant_groups), len(scenario.tenants)
        if num_groups <= self.layout.max_groups and num_tenants <= self.layout.max_tenants:
            return
        if self._fixed_layout:
            raise ValueError(
                f"scenario {scenario.name}: {num_groups} groups / {num_tenants} tenants "
                f"exceed the layout's {self.layout.max_groups} / {self.layout.max_tenants} slots"
            )
        self._set_layout(
            replace(
                self.layout,
                max_groups=max(self.layout.max_groups, num_groups),
                max_tenants=max(self.layout.max_tenants, num_tenants),
            )
        )

    def _set_scenario(self, scenario: Scenario) -> None:
        self._fit_layout(scenario)
        if self._initial_pools:
            groups = []
            for g in scenario.tenant_groups:
                pools = self._initial_pools.get(g.name)
                if pools is not None:
                    g = g.model_copy(update={"prefill": pools[0], "decode": pools[1], "aggregated": 0})
                groups.append(g)
            scenario = Scenario.model_validate({**scenario.model_dump(), "tenant_groups": groups})
        self.scenario = scenario
        tenants = scenario.tenants_schema()
        groups_schema = scenario.groups_schema()
        self.tenants: tuple[Tenant, ...] = tuple(tenants[t.name] for t in scenario.tenants)
        self.groups: tuple[TenantGroup, ...] = tuple(groups_schema[g.name] for g in scenario.tenant_groups)
        self.base_thresholds: dict[str, RoutingThresholds] = {
            t.name: self._base_override.get(t.name, RoutingThresholds()) for t in self.tenants
        }
        self._workloads.clear()

    def _profile(self) -> OperatorProfile:
        cluster = self.scenario.cluster
        key = (cluster.profile, str(cluster.profile_dir), str(cluster.hf_config))
        if key not in self._profiles:
            self._profiles[key] = load_profile(self.scenario)
        return self._profiles[key]

    def _workload(self, seed: int) -> dict[str, RequestColumns]:
        key = (id(self.scenario), seed)
        cached = self._workloads.get(key)
        if cached is None:
            cached = generate_workloads(self.scenario, seed)
            self._workloads[key] = cached
            while len(self._workloads) > _WORKLOAD_CACHE_SIZE:
                self._workloads.popitem(last=False)
        else:
            self._workloads.move_to_end(key)
        return cached

    # ------------------------------------------------------------------------------------------- gym API

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode: build the simulator for a fresh workload and simulate the first interval.

        Options: ``scenario`` (name, path or :class:`~env.scenario.Scenario`) switches the scenario.
        """
        super().reset(seed=seed)
        if options and options.get("scenario") is not None:
            self._set_scenario(resolve_scenario(options["scenario"], self._traces_dir))
        self._episode_seed = int(self.np_random.integers(0, 2**31 - 1))
        self._control = ControlState.start(self.base_thresholds)
        self._sim = build_simulator(
            self.scenario,
            dict(self.base_thresholds),
            self._episode_seed,
            profile=self._profile(),
            workloads=self._workload(self._episode_seed),
            admission=self.admission,
        )
        self._gpu_seconds_mark = 0.0
        window = self._advance()
        self._gpu_seconds_mark = self._sim.gpu_seconds()
        self._observation = build_observation(window, self._observation_context())
        info = {"now_s": self._sim.now_s, "episode_seed": self._episode_seed, "scenario": self.scenario.name}
        return self._observation.to_vector(self.layout), info

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Decode ``action`` against the running state, then :meth:`step_control` it."""
        decoded = self.codec.decode(
            np.asarray(action), self.tenants, self.groups, self.current_pools(), self.base_thresholds
        )
        return self.step_control(decoded)

    def step_control(self, action: ControlAction) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """One control interval under ``action``: guard, apply, simulate, observe and price it."""
        result = self.control(action)
        assert self._observation is not None
        obs = self._observation.to_vector(self.layout)
        truncated = self.sim.now_s >= self.scenario.duration_s - 1e-9
        info: dict[str, Any] = {
            "now_s": self.sim.now_s,
            "reward_terms": result.reward_terms,
            "num_clamps": len(result.clamps),
            "pools": {name: (p.num_prefill, p.num_decode) for name, p in self.current_pools().items()},
        }
        return obs, result.reward, False, truncated, info

    def restart_control(self, *, keep_memory: bool) -> None:
        """Start the control state again, as a restarted controller does; the simulated cluster runs on.

        ``keep_memory``: as a controller that keeps its memory file (:mod:`controller.control_memory`) restarts
        at once: the thresholds in force and the guard's memory carry on (:meth:`~policies.control.ControlState.
        after_restart`). Otherwise as one without it: the policy sees the base thresholds as current, the next step
        publishes the full table, and the guard starts empty (:meth:`~policies.control.ControlState.start`). The
        caller starts a fresh policy too, as a new process does.
        """
        if self._sim is None:
            raise RuntimeError("call reset() before restart_control()")
        if keep_memory:
            self._control = self._control.after_restart(keep_streaks=True)  # a simulated restart takes no time
        else:
            self._control = ControlState.start(self.base_thresholds)

    def control(self, decide: ControlAction | Policy) -> ControlStep:
        """One control interval: the shared :func:`~policies.control.control_step`, carried out on the simulator.

        ``decide`` is a policy (asked on this interval's observation and context, as the controller asks it) or
        an action already decided (a decoded agent action). Either passes the guard and the overrides; pool
        changes and a changed threshold table go to the simulator, which then runs one interval.
        """
        if self._sim is None or self._observation is None:
            raise RuntimeError("call reset() before step()")
        if self.sim.now_s >= self.scenario.duration_s - 1e-9:
            raise RuntimeError("the episode is over (truncated); call reset()")
        inputs = self._inputs(self._observation.window)
        effects = control_step(decide, inputs, self._control, self.guard)
        self._control = effects.next_state(applied=True)  # the simulator always carries an action out
        changes = instance_changes(inputs.current_pools, effects.pool_changes)
        self.sim.apply(
            ControlAction(
                thresholds=dict(effects.thresholds) if effects.publish else {}, pools=dict(effects.pool_changes)
            )
        )
        window = self._advance()
        gpu_seconds = self.sim.gpu_seconds() - self._gpu_seconds_mark
        self._gpu_seconds_mark += gpu_seconds
        terms = reward_terms(window, self.tenants, gpu_seconds, changes, self.reward_weights)
        self._observation = build_observation(window, self._observation_context())
        return ControlStep(effects.action, effects.clamps, changes, terms, total(terms), effects)

    def _advance(self) -> MetricWindow:
        sim = self.sim
        end = min(sim.now_s + self.scenario.control_interval_s, self.scenario.duration_s)
        sim.run_until(end)
        return sim.snapshot()

    def action_masks(self) -> np.ndarray:
        """Valid values of every action dimension (concatenated), as sb3-contrib's ``MaskablePPO`` reads them."""
        return self.codec.masks(self.groups, self.current_pools(), len(self.tenants))

    # ------------------------------------------------------------------------------------------- state

    @property
    def sim(self) -> ClusterSimulator:
        """The running simulator (after :meth:`reset`)."""
        if self._sim is None:
            raise RuntimeError("call reset() first")
        return self._sim

    @property
    def num_steps(self) -> int:
        """Steps in one episode of the current scenario."""
        return max(math.ceil(self.scenario.duration_s / self.scenario.control_interval_s) - 1, 0)

    def observation(self) -> Observation:
        """The named observation of the last interval."""
        if self._observation is None:
            raise RuntimeError("call reset() first")
        return self._observation

    def offered_weighted_rps(self) -> float:
        """Σ priority × arrivals / duration of the running episode's workload (req/s).

        The weighted goodput if every request met its objectives: the episode's ceiling, whose scale grows with
        the cluster.
        """
        workloads = self._workload(self._episode_seed)
        duration_s = self.scenario.duration_s
        weighted = sum(
            t.priority * int(np.count_nonzero(workloads[t.name].arrival_s < duration_s)) for t in self.tenants
        )
        return weighted / duration_s

    def current_pools(self) -> dict[str, PoolTargets]:
        """Per group the instances serving or on their way to a role (starting, switching): the running targets."""
        out: dict[str, PoolTargets] = {}
        for gi, group in enumerate(self.groups):
            counts = self.sim.pool_counts(gi)
            out[group.name] = PoolTargets(
                counts["prefill"] + counts["pending_prefill"], counts["decode"] + counts["pending_decode"]
            )
        return out

    @property
    def thresholds(self) -> dict[str, RoutingThresholds]:
        """Routing thresholds in force per tenant (the policy's, with active overrides laid over them)."""
        published = self._control.published
        return dict(published if published is not None else self.base_thresholds)

    @property
    def overrides(self) -> tuple[Override, ...]:
        """Overrides known to the env (expired ones included; they no longer apply)."""
        return self._overrides

    def set_overrides(self, overrides: Sequence[Override]) -> None:
        """Replace the overrides (what dropping files into, or removing them from, the controller's directory does).

        They take effect at the next control step, for the tenants they name, until ``expires_at`` (judged at
        ``wall_start + now_s``).
        """
        self._overrides = tuple(overrides)

    def now(self) -> datetime:
        """Wall time of the simulated clock: ``wall_start`` plus the simulated seconds."""
        return self.wall_start + timedelta(seconds=self.sim.now_s)

    def _inputs(self, window: MetricWindow) -> ControlInputs:
        return ControlInputs(
            window=window,
            tenants=self.tenants,
            groups=self.groups,
            current_pools=self.current_pools(),
            base_thresholds=dict(self.base_thresholds),
            now_s=self.sim.now_s,
            interval_s=self.scenario.control_interval_s,
            now=self.now(),
            overrides=self._overrides,
        )

    def policy_context(self) -> PolicyContext:
        """What a :class:`~policies.base.Policy` decides against now (the context the control step builds)."""
        return policy_context(self._inputs(self.observation().window), self._control)

    def _observation_context(self) -> ObservationContext:
        return ObservationContext(
            tenants=self.tenants, groups=self.groups, thresholds=dict(self._control.policy_thresholds)
        )

    def drain(self) -> ClusterSimulator:
        """Let in-flight requests finish (up to the scenario's ``drain_s``) and return the simulator."""
        sim = self.sim
        sim.run(max_time_s=self.scenario.duration_s + self.scenario.drain_s)
        return sim
