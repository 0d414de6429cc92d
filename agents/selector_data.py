"""Training data of the rule selector: every candidate rule run on every training scenario, group by group.

:func:`rule_rollout` runs one scenario and seed under one rule through the one episode loop
(:func:`agents.runs.run_episode`) and records, at every interval, each tenant group's selector input
(:func:`policies.rule_selector.group_features`, the rows the selector would read) and, once the run is drained,
each group's priority-weighted goodput (:func:`agents.harness.slo_met`, the scoring of :mod:`policies.scoring`).

Every rule runs every scenario, so the inputs cover the states each candidate leads to (the selector may run any
of them), and each group's label is known for every rule: :func:`selector_targets` turns the goodputs of a group
into a distribution over the rules (the best rule in hindsight, softened so that near-ties share the mass and a
rule far below the best gets almost none). The hindsight choice labels data only; the selector decides from the
window it sees.
"""

from __future__ import annotations

import math
import pickle
import time
from bisect import bisect_left
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import MISSING, dataclass, fields
from operator import attrgetter
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import numpy as np

from agents.harness import slo_met_arrivals_s
from agents.policy_specs import make_policy
from agents.process_map import map_in_processes
from agents.runs import episode_env, run_episode, scale_bandwidth, scale_rates
from env.gym_env import PDClusterEnv, resolve_scenario
from env.scenario import Scenario
from env.sim.build import generate_workloads
from env.sim.records import SimRequest
from env.sim.simulator import ClusterSimulator
from policies.admission import AdmissionConfig
from policies.base import Policy, PolicyContext
from policies.features import Observation
from policies.rule_selector import GROUP_INPUT_WIDTH, TRANSFER_COLUMNS, group_features
from policies.schema import ControlAction
from policies.scoring import meets_slo
from policies.set_features import build_set_observation

__all__ = [
    "ROLLOUT_CACHE_NAME",
    "GroupRollout",
    "RolloutTask",
    "SelectorDataset",
    "StopPlan",
    "cached_rollouts",
    "collect_rollouts",
    "rollout_stop_s",
    "rollout_stops",
    "rule_rollout",
    "selector_targets",
    "shared_transfer_inputs",
    "task_scenario",
    "window_goodput",
]

_ARRIVAL_S = attrgetter("arrival_s")

ROLLOUT_CACHE_NAME = "rollouts.pkl"
"""The rollouts of a selector run, kept per task in its output folder so a refit (another label window, loss or
width) does not simulate them again, and a run with more tasks simulates only those."""


@dataclass(frozen=True, slots=True)
class RolloutTask:
    """One scenario and seed under one rule (picklable: it crosses process boundaries)."""

    scenario_path: str
    rule: str
    """A baseline name (``dynamo-legacy``), run as ``baseline:NAME``."""
    seed: int
    traces_dir: str | None = None
    rate_scale: float = 1.0
    """Every tenant's request rate multiplied by this (:func:`agents.runs.scale_rates`): loads beyond the family's."""
    bandwidth_scale: float = 1.0
    """The KV-transfer link rate multiplied by this (:func:`agents.runs.scale_bandwidth`): networks beyond the
    family's."""
    admission_ttft_slack_frac: float | None = None
    """The rule runs behind the router's admission stage with this slack (:class:`policies.admission.AdmissionConfig`);
    None: every request admitted."""
    stop_s: float | None = None
    """Stop the episode once this much simulated time has passed (:func:`rollout_stop_s`), undrained; each group
    then keeps only the bins before its first request still in flight (:func:`rule_rollout`). None: the whole
    episode, drained. Cached tasks written before it read as None (``__setstate__``)."""
    late_misses: bool = False
    """With :attr:`stop_s`: a request in flight at the stop whose first token cannot come within its TTFT objective
    counts as the miss it is in the whole episode, so its bin can still be kept (:func:`_late_first_token`).
    Without it a stopped group keeps only the bins before its first request in flight, which under overload is
    early. Last, so cached tasks written before it read as False."""

    def __setstate__(self, state: Sequence[Any]) -> None:
        """Read a pickled task; fields added since it was written (at the end) take their defaults."""
        names = fields(self)
        for field, value in zip(names, state, strict=False):
            object.__setattr__(self, field.name, value)
        for field in names[len(state) :]:
            if field.default is MISSING:
                raise TypeError(f"RolloutTask: a pickled task lacks the field {field.name!r}")
            object.__setattr__(self, field.name, field.default)


@dataclass(frozen=True, slots=True)
class GroupRollout:
    """One tenant group of one rollout: its inputs at every interval and its goodput over the episode."""

    scenario: str
    seed: int
    group: str
    rule: str
    inputs: np.ndarray
    """``[intervals, GROUP_INPUT_WIDTH]``."""
    weighted_goodput_rps: float
    offered_weighted_rps: float
    wall_s: float
    rate_scale: float = 1.0
    decision_s: np.ndarray | None = None
    """``[intervals]``: simulated time of each decision (the start of the interval it decides)."""
    bin_s: float = 0.0
    """Width of the bins below: the scenario's control interval."""
    met_weighted_per_bin: np.ndarray | None = None
    """``[bins]``: Σ priority over the group's requests that **arrived** in each bin and met both objectives."""
    bandwidth_scale: float = 1.0
    """The task's KV-link multiplier (:attr:`RolloutTask.bandwidth_scale`); last, so caches keep their field order."""


class _Recorder:
    """A policy that records the group inputs of every interval and decides as the wrapped rule."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.inputs: list[np.ndarray] = []
        self.decision_s: list[float] = []
        self._env: PDClusterEnv | None = None

    def bind(self, env: PDClusterEnv) -> None:
        """Keep the env, to stamp each decision with its simulated time."""
        self._env = env

    @property
    def policy_id(self) -> str:
        """The wrapped rule's id."""
        return self.inner.policy_id

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """Record the inputs, then decide as the rule."""
        grouped = context.grouped()
        self.decision_s.append(self._env.sim.now_s if self._env is not None else math.nan)
        self.inputs.append(group_features(build_set_observation(observation.window, grouped.observation_context())))
        return self.inner.decide(observation, context)


def task_scenario(scenario_path: str, traces_dir: str | None, rate_scale: float, bandwidth_scale: float) -> Scenario:
    """A rollout task's scenario: the file, its request rates and KV-link rate scaled as the task says."""
    scenario = scale_rates(resolve_scenario(Path(scenario_path), traces_dir), rate_scale)
    return scale_bandwidth(scenario, bandwidth_scale)


def rollout_stop_s(scenario: Scenario, seed: int, request_budget: int, min_intervals: int) -> float | None:
    """When a rollout of ``scenario`` (rates and link as it will run) stops to cost about ``request_budget`` requests.

    A rollout's cost grows with the requests it simulates, and a few scenarios (large groups of a small model at a
    high load) offer a hundred times the median's: cut at a request budget, they no longer decide how many
    scenarios a training run can afford. The stop is the end of the control interval in which the budget's last
    request arrives (episode seed ``seed``, as :func:`rule_rollout` draws it), but never before ``min_intervals``
    intervals, so every scenario still contributes windows of its own. None: the episode offers no more than the
    budget, or the stop would not come before its end.
    """
    streams = [columns.arrival_s for columns in generate_workloads(scenario, seed).values()]
    arrivals = np.sort(np.concatenate(streams)) if streams else np.zeros(0)
    if len(arrivals) <= request_budget:
        return None
    interval_s = scenario.control_interval_s
    stop_s = max(math.ceil(float(arrivals[request_budget - 1]) / interval_s), min_intervals) * interval_s
    return None if stop_s >= scenario.duration_s - 1e-9 else float(stop_s)


@dataclass(frozen=True, slots=True)
class StopPlan:
    """One rollout run whose stop is planned: its scenario file, rate and link scales, and episode seed."""

    scenario_path: str
    rate_scale: float
    bandwidth_scale: float
    seed: int
    request_budget: int
    min_intervals: int

    def stop_s(self) -> float | None:
        """:func:`rollout_stop_s` of the run's scenario as it will run."""
        scenario = task_scenario(self.scenario_path, None, self.rate_scale, self.bandwidth_scale)
        return rollout_stop_s(scenario, self.seed, self.request_budget, self.min_intervals)


def rollout_stops(plans: Sequence[StopPlan], workers: int) -> list[float | None]:
    """Every plan's :meth:`StopPlan.stop_s`, in order, over ``workers`` processes (each generates a workload).

    The stops are planned before any rollout starts, so run one by one they left all but one core idle (26 s of a
    560-scenario training run on 2 cores); each is a pure function of its plan, so the order of work changes nothing.
    """
    return map_in_processes(StopPlan.stop_s, plans, workers, chunksize=max(1, len(plans) // (8 * max(workers, 1))))


def _known_bins(
    sim: ClusterSimulator, tenants: Sequence[int], bin_s: float, bins: int, late_misses: bool = False
) -> int:
    """How many leading bins of a stopped run hold only requests whose outcome the stop already fixes.

    A request that finished or failed before the stop has the whole episode's outcome: the run up to the stop is
    the episode's own, and nothing after it reaches back. A request still in flight could yet meet its objectives
    or miss them (the simulator records a closed-form decode run's tokens when the run ends, so a missing first
    token does not mean a missed TTFT), unless ``late_misses`` and :func:`_late_first_token` proves its first
    token comes after its TTFT objective: then it misses in the whole episode too. A bin that does not end before
    the stop is not known either. Each tenant's requests are in arrival order, so its first undecided one ends the
    known bins.
    """
    known = min(bins, math.floor(sim.now_s / bin_s + 1e-9))
    for ti in tenants:
        ttft_objective_s = sim.slo_ttft_s[ti]
        for request in sim.arrived[ti]:
            if request.arrival_s >= known * bin_s:
                break
            if request.status == SimRequest.IN_FLIGHT and not (
                late_misses and _late_first_token(sim, request, ttft_objective_s)
            ):
                known = int(request.arrival_s // bin_s)
                break
    return known


def _late_first_token(sim: ClusterSimulator, request: SimRequest, ttft_objective_s: float) -> bool:
    """Whether ``request``, in flight at ``sim.now_s``, gets its first token after its TTFT objective whatever follows.

    Its first token is emitted by its decode instance's engine, at the end of a step that starts no earlier than
    the request is first scheduled there. Until then (not routed yet, in prefill or KV transfer, or waiting in the
    decode engine's queue) it comes after ``now_s``; once scheduled, after ``first_scheduled_s``. A request whose
    earliest first token is already past its objective (:func:`policies.scoring.meets_slo`, as every request is
    scored) is a miss, whatever the rest of the episode does.
    """
    earliest_s = sim.now_s
    if request.decode_instance >= 0:
        engine_request = sim.instances[request.decode_instance].engine.get(request.request_id)
        if engine_request is not None and not math.isnan(engine_request.first_scheduled_s):
            earliest_s = engine_request.first_scheduled_s
    return not meets_slo(earliest_s - request.arrival_s, None, ttft_objective_s)  # the scoring core's TTFT test


def rule_rollout(task: RolloutTask) -> list[GroupRollout]:
    """Run ``task`` and return one :class:`GroupRollout` per tenant group (module docstring).

    With :attr:`RolloutTask.stop_s` the episode ends there, undrained, and each group keeps the bins before its
    first request still in flight (:func:`_known_bins`): those bins are exactly what the whole
    episode would have recorded, since nothing after the stop reaches back. Its goodput and offered load are then
    over those bins.
    """
    start = time.perf_counter()
    scenario = task_scenario(task.scenario_path, task.traces_dir, task.rate_scale, task.bandwidth_scale)
    recorder = _Recorder(make_policy(f"baseline:{task.rule}", scenario))
    env = episode_env(
        scenario, recorder.inner, task.traces_dir, admission=AdmissionConfig(task.admission_ttft_slack_frac)
    )
    stop_s = task.stop_s
    stop = None if stop_s is None else (lambda e: e.sim.now_s >= stop_s - 1e-9)
    episode = run_episode(env, recorder, task.seed, stop=stop)
    sim = episode.sim
    duration_s = scenario.duration_s
    bin_s = scenario.control_interval_s
    edges = np.arange(math.ceil(duration_s / bin_s) + 1) * bin_s
    inputs = np.stack(recorder.inputs) if recorder.inputs else np.zeros((0, len(env.groups), GROUP_INPUT_WIDTH))
    wall_s = time.perf_counter() - start
    out = []
    for gi, group in enumerate(env.groups):
        members = [(ti, t) for ti, t in enumerate(env.tenants) if t.group == group.name]
        met_per_bin = np.zeros(len(edges) - 1)
        for ti, tenant in members:
            met_per_bin += tenant.priority * np.histogram(slo_met_arrivals_s(sim, ti), bins=edges)[0]
        span_s, counted_before_s = duration_s, math.inf  # every arrival falls in a bin
        if episode.stopped:
            known = _known_bins(sim, [ti for ti, _ in members], bin_s, len(met_per_bin), task.late_misses)
            met_per_bin = met_per_bin[:known]
            counted_before_s = known * bin_s
            span_s = max(counted_before_s, bin_s)
        offered = sum(  # each tenant's requests are in arrival order
            t.priority * bisect_left(sim.arrived[ti], counted_before_s, key=_ARRIVAL_S) for ti, t in members
        )
        out.append(
            GroupRollout(
                scenario=scenario.name,
                seed=task.seed,
                group=group.name,
                rule=task.rule,
                inputs=inputs[:, gi, :].astype(np.float32),
                weighted_goodput_rps=float(met_per_bin.sum()) / span_s,
                offered_weighted_rps=offered / span_s,
                wall_s=wall_s,
                rate_scale=task.rate_scale,
                decision_s=np.asarray(recorder.decision_s, dtype=np.float64),
                bin_s=bin_s,
                met_weighted_per_bin=met_per_bin,
                bandwidth_scale=task.bandwidth_scale,
            )
        )
    return out


class _Timed(Protocol):
    """A task's per-group result: it carries the task's wall time."""

    @property
    def wall_s(self) -> float: ...


TaskT = TypeVar("TaskT", bound=Hashable)
ResultT = TypeVar("ResultT", bound=_Timed)


def collect_rollouts(
    tasks: Sequence[TaskT],
    workers: int,
    on_done: Callable[[int, int], None] | None = None,
    on_task: Callable[[int, list[ResultT]], None] | None = None,
    run: Callable[[TaskT], list[ResultT]] | None = None,
) -> list[list[ResultT]]:
    """Run ``tasks`` by ``run`` over ``workers`` processes; each task's results, in task order.

    ``run`` is a module-level function (default :func:`rule_rollout`).

    ``on_task(index, rollouts)`` is called as each task finishes (``index`` into ``tasks``), then
    ``on_done(done, total)``. If either raises, or a task fails, or the run is stopped, the tasks not yet started
    are cancelled and the exception propagates once the running ones end.
    """
    results: list[list[ResultT]] = [[] for _ in tasks]
    if run is None:
        run = cast(Callable[[TaskT], list[ResultT]], rule_rollout)  # looked up now: a test may replace it

    def finished(index: int, rollouts: list[ResultT], done: int) -> None:
        results[index] = rollouts
        if on_task is not None:
            on_task(index, rollouts)
        if on_done is not None:
            on_done(done, len(tasks))

    if workers <= 1:
        for i, task in enumerate(tasks):
            finished(i, run(task), i + 1)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(run, task): i for i, task in enumerate(tasks)}
            try:
                for done, future in enumerate(as_completed(futures), start=1):
                    finished(futures[future], future.result(), done)
            except BaseException:  # stopped (Ctrl-C) or failed: start no queued task, wait only for running ones
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    return results


_CACHE_FORMAT = 3


def _read_cache(path: Path) -> dict[Any, tuple[list[Any], float]]:
    if not path.exists():
        return {}
    try:
        with path.open("rb") as fh:
            cached = pickle.load(fh)  # written by cached_rollouts into the run's own folder
        if isinstance(cached, dict) and cached.get("format") == _CACHE_FORMAT:
            return dict(cached["entries"])
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, TypeError, KeyError, ValueError):
        pass
    return {}


def _write_cache(path: Path, entries: dict[Any, tuple[list[Any], float]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as fh:
        pickle.dump({"format": _CACHE_FORMAT, "entries": entries}, fh)
    tmp.replace(path)


def cached_rollouts(
    path: Path,
    tasks: Sequence[TaskT],
    workers: int,
    on_done: Callable[[int, int], None] | None = None,
    checkpoint_s: float = 300.0,
    run: Callable[[TaskT], list[ResultT]] | None = None,
) -> tuple[list[ResultT], float]:
    """The results of ``tasks`` run by ``run``, in task order, and the seconds they took, cached per task at ``path``.

    ``run`` is a module-level function (default :func:`rule_rollout`).

    Tasks the cache holds are read; the others are run (:func:`collect_rollouts`; ``on_done`` counts only them)
    and added, so a run that adds a rate scale or scenarios simulates only what is new. The cache is rewritten with
    the tasks finished so far at least every ``checkpoint_s`` seconds (as a task finishes) and at the end, so a run
    that is stopped resumes from its last checkpoint. The wall time between two writes is shared among the tasks
    finished in it, in proportion to their own process time; the seconds returned are the sum over ``tasks``, which
    for a run from scratch in one go is exactly its wall time. A task names its scenario file, which the recipe
    writes under its output folder, so the cache serves reruns into the same folder. The cache is the run's own
    output (a pickle written here); a file that cannot be read, or is of another format, is replaced.
    """
    entries = _read_cache(path)
    missing = [task for task in dict.fromkeys(tasks) if task not in entries]
    if missing:
        pending: list[tuple[TaskT, list[ResultT]]] = []
        mark = time.perf_counter()

        def checkpoint() -> None:
            nonlocal mark
            now = time.perf_counter()
            own_s = [per_task[0].wall_s if per_task else 0.0 for _task, per_task in pending]
            total_own_s = math.fsum(own_s)
            for (task, per_task), own in zip(pending, own_s, strict=True):
                share = (now - mark) * own / total_own_s if total_own_s > 0 else (now - mark) / len(pending)
                entries[task] = (per_task, share)
            pending.clear()
            mark = now
            _write_cache(path, entries)

        def keep(index: int, rollouts: list[ResultT]) -> None:
            pending.append((missing[index], rollouts))
            if time.perf_counter() - mark >= checkpoint_s:
                checkpoint()

        collect_rollouts(missing, workers, on_done, keep, run)
        if pending:
            checkpoint()
    rollouts = [r for task in tasks for r in entries[task][0]]
    return rollouts, math.fsum(entries[task][1] for task in tasks)


@dataclass(frozen=True, slots=True)
class SelectorDataset:
    """Inputs, soft rule targets and sample weights (each group of each scenario weighs 1 in all)."""

    inputs: np.ndarray
    """``[samples, GROUP_INPUT_WIDTH]``."""
    targets: np.ndarray
    """``[samples, rules]``, rows sum to 1."""
    ratios: np.ndarray
    """``[samples, rules]``: each rule's goodput over the best rule's, for the sample's group (in [0, 1])."""
    label_mask: np.ndarray
    """``[samples, rules]``: 1 where a ratio is a label the ``ratio`` loss fits, 0 where it is left out (all 1
    unless :func:`selector_targets` was asked for ``own_rule_labels``)."""
    weights: np.ndarray
    """``[samples]``."""
    groups: int
    """Labelled (scenario, seed, group) triples."""
    best_counts: dict[str, int]
    """How many of them each rule is best on."""


def _per_bin(rollout: GroupRollout) -> np.ndarray:
    """The rollout's per-bin record (:attr:`GroupRollout.met_weighted_per_bin`).

    Raises:
        ValueError: it has none.
    """
    if rollout.decision_s is None or rollout.met_weighted_per_bin is None or rollout.bin_s <= 0:
        raise ValueError(f"scenario {rollout.scenario} rule {rollout.rule}: the rollout has no per-interval record")
    return rollout.met_weighted_per_bin


def window_goodput(rollout: GroupRollout, window_intervals: int, bins: int | None = None) -> np.ndarray:
    """``[intervals]``: the weighted goodput of the requests arriving in ``window_intervals`` bins from each decision.

    ``bins`` counts only the first so many bins (the rollouts of a group stopped early know different numbers).

    Raises:
        ValueError: the rollout has no per-bin record, or ``window_intervals`` is not positive.
    """
    if window_intervals < 1:
        raise ValueError(f"window_intervals must be >= 1, got {window_intervals}")
    per_bin = _per_bin(rollout)
    cumulative = np.concatenate([[0.0], np.cumsum(per_bin)])
    bins = len(per_bin) if bins is None else min(bins, len(per_bin))
    assert rollout.decision_s is not None  # checked by _per_bin
    first = np.clip(np.round(rollout.decision_s / rollout.bin_s).astype(np.int64), 0, bins)
    last = np.minimum(first + window_intervals, bins)
    out: np.ndarray = cumulative[last] - cumulative[first]
    return out


def shared_transfer_inputs(per_rule: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The rollouts' inputs of one group, each interval's unknown KV-transfer features taken from a sibling's.

    ``per_rule`` are the inputs ``[intervals, GROUP_INPUT_WIDTH]`` of one group under each rule, interval by
    interval the same arrivals and the same network. A rule that transfers nothing (``aggregated``) sees no
    transfer features; the network it would see is the one its siblings measured at that interval, so its
    unknown transfer features (:data:`policies.rule_selector.TRANSFER_COLUMNS`) are filled from the first rule
    (in ``per_rule`` order) that knew them. This is the data a selector with a transfer memory
    (:class:`policies.rule_selector.TransferMemory`) needs: without it, every aggregated state in the data is blind
    to the network, and a selector that switched to ``aggregated`` for an incident learns nothing that keeps it there.
    """
    out = [np.array(x, copy=True) for x in per_rule]
    intervals = min((len(x) for x in out), default=0)
    for value, known in TRANSFER_COLUMNS:
        for target in out:
            missing = target[:intervals, known] == 0
            for source in per_rule:
                fill = missing & (source[:intervals, known] > 0)
                target[:intervals, value][fill] = source[:intervals, value][fill]
                target[:intervals, known][fill] = source[:intervals, known][fill]
                missing &= ~fill
    return out


def selector_targets(
    rollouts: Sequence[GroupRollout],
    rules: Sequence[str],
    temperature_frac: float,
    window_intervals: int | None = None,
    share_transfer: bool = False,
    balance_best_rules: bool = False,
    own_rule_labels: bool = False,
    equal_window_weights: bool = False,
) -> SelectorDataset:
    """Targets per labelled group: each rule's goodput over the best rule's, and a soft best-rule distribution.

    The soft target is ``softmax((goodput / best − 1) / temperature_frac)`` over ``rules``.

    With ``window_intervals`` unset a group's goodput is its whole episode's, the same label at every interval.
    With it set, the sample of interval *k* is labelled by what each rule's rollout achieved on the requests
    arriving in the ``window_intervals`` intervals from *k* on (:func:`window_goodput`; every rule's rollout sees
    the same arrivals), so an incident or a surge is labelled where it happens; each window then weighs in
    proportion to its best rule's goodput, and windows where nothing met its objectives are left out. Rollouts
    stopped at a request budget (:func:`rule_rollout`) know their first bins only, not all as many: a group's windows
    count the bins every rule's rollout knows, so a decision past them has an empty window and is left out.

    With ``share_transfer`` each rollout's unknown KV-transfer features are taken from a sibling rollout of the
    same group and interval (:func:`shared_transfer_inputs`).

    A group whose every rule has zero goodput teaches nothing and is left out. Each group's samples are all its
    rollouts' intervals (under every rule), weighted to 1 in all. With ``balance_best_rules`` a group instead
    weighs in inverse proportion to how many groups share its best rule (over the whole episode, as counted in
    :attr:`SelectorDataset.best_counts`), so the groups each rule is best on weigh the same in all: a rule best on
    few groups is not outvoted by the rule best on most.

    With ``own_rule_labels`` a rollout's samples are labelled only for the rule that made them
    (:attr:`SelectorDataset.label_mask`): rule *q*'s ratio at a state reached under rule *r* ≠ *q* is what *q*'s
    own rollout achieved from *its* state at that interval, not what switching to *q* from this state would, so
    it is left out of the loss. Each output then learns, on the states its own rule reaches, how that rule fares
    from them; a rule that has run the group into a backlog is labelled by the backlog it left.

    With ``equal_window_weights`` (windowed labels only) every labelled window of a group weighs the same, so a
    group's few high-goodput windows do not outvote its many ordinary ones; the group still weighs 1 in all.

    Raises:
        ValueError: a group lacks a rollout of some rule, or ``temperature_frac`` is not positive.
    """
    if temperature_frac <= 0:
        raise ValueError(f"temperature_frac must be > 0, got {temperature_frac}")
    by_group: dict[tuple[str, int, float, str, float], dict[str, GroupRollout]] = {}
    for rollout in rollouts:
        key = (rollout.scenario, rollout.seed, rollout.rate_scale, rollout.group, rollout.bandwidth_scale)
        by_group.setdefault(key, {})[rollout.rule] = rollout
    xs: list[np.ndarray] = []
    rs: list[np.ndarray] = []
    ws: list[np.ndarray] = []
    ms: list[np.ndarray] = []
    ws_best: list[int] = []  # each ws entry's group's best rule
    best_counts = dict.fromkeys(rules, 0)
    labelled = 0
    for key, per_rule in sorted(by_group.items()):
        missing = [r for r in rules if r not in per_rule]
        if missing:
            raise ValueError(f"scenario {key[0]} seed {key[1]} group {key[3]}: no rollout of rule {missing[0]}")
        goodput = np.array([per_rule[r].weighted_goodput_rps for r in rules], dtype=np.float64)
        if float(goodput.max()) <= 0:
            continue
        intervals = len(per_rule[rules[0]].inputs)
        if intervals == 0:
            continue
        if window_intervals is None:
            ratios = np.repeat((goodput / goodput.max())[None, :], intervals, axis=0)
            importance = np.ones(intervals)
        else:
            # rollouts stopped early know their first bins only, and not all as many: label on the bins all know
            known = min(len(_per_bin(per_rule[r])) for r in rules)
            windowed = np.stack([window_goodput(per_rule[r], window_intervals, known) for r in rules], axis=1)
            importance = windowed.max(1)
            ratios = windowed / np.maximum(importance, 1e-12)[:, None]
        keep = importance > 0  # a decision past the bins every rollout knows has an empty window
        if not keep.any():
            continue
        labelled += 1
        best = int(np.argmax(goodput))
        best_counts[rules[best]] += 1
        weight = np.ones(int(keep.sum())) if equal_window_weights else importance[keep]
        share = weight / weight.sum() / len(rules)
        inputs = [per_rule[rule].inputs for rule in rules]
        if share_transfer:
            inputs = shared_transfer_inputs(inputs)
        for index, x in enumerate(inputs):
            xs.append(x[keep])
            rs.append(ratios[keep])
            labelled_rules = np.eye(len(rules), dtype=np.float32)[index] if own_rule_labels else 1.0
            ms.append(np.broadcast_to(labelled_rules, (int(keep.sum()), len(rules))).astype(np.float32))
            ws.append(share)
            ws_best.append(best)
    if not xs:
        raise ValueError("no labelled group: every rollout had zero goodput")
    if balance_best_rules:
        counts = [best_counts[rule] for rule in rules]
        winners = sum(1 for c in counts if c > 0)
        ws = [w * labelled / (winners * counts[b]) for w, b in zip(ws, ws_best, strict=True)]
    ratios_all = np.concatenate(rs)
    logits = (ratios_all - 1.0) / temperature_frac
    targets = np.exp(logits - logits.max(1, keepdims=True))
    targets /= targets.sum(1, keepdims=True)
    weights = np.concatenate(ws)
    return SelectorDataset(
        inputs=np.concatenate(xs).astype(np.float32),
        targets=targets.astype(np.float32),
        ratios=ratios_all.astype(np.float32),
        label_mask=np.concatenate(ms),
        weights=(weights * len(weights) / max(math.fsum(weights), 1e-12)).astype(np.float32),
        groups=labelled,
        best_counts=best_counts,
    )
