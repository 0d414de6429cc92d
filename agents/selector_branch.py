"""Branched labels for the rule selector: each rule followed from the states the selector itself reaches (DAgger).

The recipe's labels (:func:`agents.selector_data.selector_targets`) attach to the state a rule's own rollout
reached at an interval what every rule's **own** rollout achieved from **its** state at that interval. A selector
that switches rules leaves those states: switched to from another rule's pools, a rule must first move them, and
no own-rollout label counts that move (``README-learned.md``, twenty-third session: on ``chatbot-8`` aggregated's
own rollout met 570 requests of a window, switched to from legacy's pools it met 266).

:func:`branched_rollout` runs a selector policy on a scenario and, once every ``every_intervals`` control intervals,
snapshots the simulator (a pickle round trip of the env, as the lookahead expert does) and follows each rule from
that state in its own copy until every request of each group arriving in the next ``window_intervals`` intervals
has ended or can no longer meet its objectives (:func:`branch`). Each group's label at that point is each rule's
priority-weighted count of those requests that met both objectives, measured from the same state on the same
arrivals, and its input is exactly what the selector's network read at that decision (:class:`BranchedGroup`).
:func:`with_branches` adds these samples to a recipe's dataset. A hindsight label, for training only; the selector
decides from the window it sees.
"""

from __future__ import annotations

import hashlib
import math
import pickle
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agents.harness import slo_met_arrivals_s
from agents.policy_specs import make_policy
from agents.runs import EnvBound, control_interval, episode_env, running
from agents.selector_data import SelectorDataset, task_scenario
from env.gym_env import PDClusterEnv
from env.sim.records import SimRequest
from env.sim.simulator import ClusterSimulator
from policies.admission import AdmissionConfig
from policies.base import Policy
from policies.learned import WEIGHTS_NAME
from policies.registry import inner_rule_selector
from policies.rule_selector import RuleSelector

__all__ = [
    "BRANCH_CACHE_NAME",
    "SETTLE_MARGIN_INTERVALS",
    "BranchTask",
    "BranchedGroup",
    "branch",
    "branched_rollout",
    "find_selector",
    "latest_finish_s",
    "policy_digest",
    "window_met",
    "window_settled",
    "with_branches",
]

SETTLE_MARGIN_INTERVALS = 4.0
"""How long past the latest end that meets both objectives a branch copy waits for a request of its window
(:func:`window_settled`), in control intervals."""

BRANCH_CACHE_NAME = "branches.pkl"
"""The branched rollouts of a recipe's DAgger rounds, kept per task in its output folder (as ``rollouts.pkl``)."""


@dataclass(frozen=True, slots=True)
class BranchTask:
    """One scenario and seed run by a selector policy, branched every ``every_intervals`` (picklable)."""

    scenario_path: str
    policy_spec: str
    """The policy that runs the scenario, e.g. ``learned:OUT/policy-round1``: a spec whose policy is, or wraps,
    a rule selector."""
    policy_digest: str
    """:func:`policy_digest` of the selector's weights, so a cached task is never served for other weights."""
    rules: tuple[str, ...]
    seed: int
    every_intervals: int
    window_intervals: int
    traces_dir: str | None = None
    rate_scale: float = 1.0
    bandwidth_scale: float = 1.0
    admission_ttft_slack_frac: float | None = None
    """As :attr:`agents.selector_data.RolloutTask.admission_ttft_slack_frac`: the run and its branches are behind the
    admission stage."""


@dataclass(frozen=True, slots=True)
class BranchedGroup:
    """One tenant group of one branched run: the selector's inputs and every rule's window count per branch point."""

    scenario: str
    seed: int
    group: str
    rate_scale: float
    bandwidth_scale: float
    inputs: np.ndarray
    """``[points, GROUP_INPUT_WIDTH]``: what the selector's network read at each branch point's decision."""
    met_weighted: np.ndarray
    """``[points, rules]``: Σ priority over the group's requests arriving in the window that met both objectives,
    each rule followed from the branch point's state."""
    decision_s: np.ndarray
    """``[points]``: simulated time of each branch point."""
    wall_s: float
    """The whole task's wall time (every group of a task carries the same)."""
    intervals: int
    """Control intervals simulated by the task: the selector's run plus every branch copy."""


def policy_digest(artifact: Path) -> str:
    """SHA-256 of an exported selector's weights file (the cache key of its branched rollouts)."""
    return hashlib.sha256((artifact / WEIGHTS_NAME).read_bytes()).hexdigest()


def window_met(sim: ClusterSimulator, env: PDClusterEnv, group: str, start_s: float, end_s: float) -> float:
    """Priority-weighted count of ``group``'s requests arriving in ``[start_s, end_s)`` that met both objectives."""
    total = 0.0
    for index, tenant in enumerate(env.tenants):
        if tenant.group != group:
            continue
        arrivals = np.asarray(slo_met_arrivals_s(sim, index))
        total += tenant.priority * float(((arrivals >= start_s) & (arrivals < end_s)).sum())
    return total


def window_settled(
    env: PDClusterEnv, group: str | None, start_s: float, end_s: float, margin_s: float = math.inf
) -> bool:
    """Whether the window's count is final: the window has ended and each of its requests has ended or missed.

    A request of the window is one of ``group`` (``None``: of any group) arriving in ``[start_s, end_s)``. One
    still in flight has missed once it has been in flight longer than meeting both objectives allows
    (:func:`latest_finish_s`) plus ``margin_s``: the simulator stamps a request's first token and its end when the
    decode run that emitted them is committed, which may be later than they happened (by at most 1.5 s measured on
    ``chatbot-8``); the margin covers that. ``inf`` (the default) waits for every request to end.
    """
    sim = env.sim
    now_s = sim.now_s
    if now_s < end_s - 1e-9:
        return False
    for index, tenant in enumerate(env.tenants):
        if group is not None and tenant.group != group:
            continue
        ttft_s, tpot_s = sim.slo_ttft_s[index], sim.slo_tpot_s[index]
        for request in reversed(sim.arrived[index]):  # arrival order: walk back from the newest
            if request.arrival_s < start_s:
                break
            if (
                request.arrival_s < end_s
                and request.status == SimRequest.IN_FLIGHT
                and now_s <= latest_finish_s(request.arrival_s, request.output_tokens, ttft_s, tpot_s) + margin_s
            ):
                return False
    return True


def latest_finish_s(arrival_s: float, output_tokens: int, ttft_s: float | None, tpot_s: float | None) -> float:
    """The latest a request can end and still meet both objectives (``inf`` when an objective is unset).

    Its first token by ``arrival_s + ttft_s``, then each further token ``tpot_s`` apart on average.
    """
    if ttft_s is None or tpot_s is None:
        return math.inf
    return arrival_s + ttft_s + tpot_s * max(output_tokens - 1, 0)


def branch(
    env: PDClusterEnv,
    rules: Sequence[str],
    window_intervals: int,
    group: str | None = None,
    margin_intervals: float = SETTLE_MARGIN_INTERVALS,
) -> tuple[np.ndarray, float, int]:
    """Follow each rule from ``env``'s state in its own copy until the window has settled.

    :func:`window_settled` decides, with a margin of ``margin_intervals`` control intervals.

    Returns ``[rules, groups]`` window counts (:func:`window_met`, groups in ``env.groups`` order), the wall
    seconds and the control intervals the copies simulated. With ``group`` set, each copy runs only until that
    group's window has settled (the other groups' counts may then be partial). ``env`` itself is not advanced.
    """
    start_s = env.sim.now_s
    interval_s = env.scenario.control_interval_s
    end_s = start_s + window_intervals * interval_s
    margin_s = margin_intervals * interval_s
    snapshot = pickle.dumps((env, [make_policy(f"baseline:{r}", env.scenario) for r in rules]))
    began = time.perf_counter()
    met = np.zeros((len(rules), len(env.groups)))
    intervals = 0
    for i in range(len(rules)):
        copy_env, copies = pickle.loads(snapshot)  # our own bytes, made just above (never a file)
        while running(copy_env) and not window_settled(copy_env, group, start_s, end_s, margin_s):
            control_interval(copy_env, copies[i])
            intervals += 1
        sim = copy_env.sim if running(copy_env) else copy_env.drain()
        for gi, g in enumerate(copy_env.groups):
            met[i, gi] = window_met(sim, copy_env, g.name, start_s, end_s)
    return met, time.perf_counter() - began, intervals


def find_selector(policy: Policy) -> RuleSelector:
    """The rule selector inside ``policy``, through labels and safety wrappers (:func:`inner_rule_selector`).

    Raises:
        ValueError: there is none.
    """
    selector = inner_rule_selector(policy)
    if selector is None:
        raise ValueError(f"policy {policy.policy_id}: no rule selector inside it")
    return selector


def branched_rollout(task: BranchTask) -> list[BranchedGroup]:
    """Run ``task`` and return one :class:`BranchedGroup` per tenant group (module docstring).

    The points are the middle decision of each block of ``every_intervals`` (decisions ``every // 2``,
    ``every // 2 + every``, …), so a short episode and a group's first minutes are branched too. The first
    decision (no traffic seen yet) is never a point; one whose window would run past the episode's end is not either.
    """
    began = time.perf_counter()
    scenario = task_scenario(task.scenario_path, task.traces_dir, task.rate_scale, task.bandwidth_scale)
    policy = make_policy(task.policy_spec, scenario, None, ())
    selector = find_selector(policy)
    scores = selector.network.scores
    read: list[np.ndarray] = []

    def recorded(inputs: np.ndarray) -> np.ndarray:
        read.append(np.array(inputs, dtype=np.float32, copy=True))
        return scores(inputs)

    object.__setattr__(selector.network, "scores", recorded)  # frozen dataclass: observe, do not change
    env = episode_env(scenario, policy, task.traces_dir, admission=AdmissionConfig(task.admission_ttft_slack_frac))
    env.reset(seed=task.seed)
    if isinstance(policy, EnvBound):
        policy.bind(env)
    interval_s = scenario.control_interval_s
    inputs: list[np.ndarray] = []
    met: list[np.ndarray] = []
    times_s: list[float] = []
    decision = 0
    intervals = 0
    while running(env):
        now_s = env.sim.now_s
        point = (
            decision % task.every_intervals == task.every_intervals // 2
            and decision > 0
            and now_s + task.window_intervals * interval_s <= scenario.duration_s + 1e-9
        )
        if point:
            counts, _wall_s, copied = branch(env, task.rules, task.window_intervals)
            intervals += copied
        before = len(read)
        control_interval(env, policy)
        intervals += 1
        decision += 1
        if point and len(read) > before:  # the network read this state (a decision with groups)
            inputs.append(read[-1])
            met.append(counts.T)  # [groups, rules]
            times_s.append(now_s)
    wall_s = time.perf_counter() - began
    out = []
    for gi, group in enumerate(env.groups):
        out.append(
            BranchedGroup(
                scenario=scenario.name,
                seed=task.seed,
                group=group.name,
                rate_scale=task.rate_scale,
                bandwidth_scale=task.bandwidth_scale,
                inputs=np.stack([x[gi] for x in inputs]) if inputs else np.zeros((0, 0), dtype=np.float32),
                met_weighted=np.stack([m[gi] for m in met]) if met else np.zeros((0, len(task.rules))),
                decision_s=np.asarray(times_s, dtype=np.float64),
                wall_s=wall_s,
                intervals=intervals,
            )
        )
    return out


def with_branches(
    data: SelectorDataset, branches: Sequence[BranchedGroup], temperature_frac: float, group_weight: float = 1.0
) -> SelectorDataset:
    """``data`` with the branched samples added (module docstring).

    Each branched group with a labelled point weighs ``group_weight`` times what one of ``data``'s groups weighs
    (its points in proportion to their best rule's window count, as the recipe's windows; points where no rule met
    a request are left out). Weights are then normalised to a mean of 1 over all samples, as in ``data``.

    Raises:
        ValueError: ``temperature_frac`` or ``group_weight`` is not positive, or a group's label width is not
            ``data``'s number of rules.
    """
    if temperature_frac <= 0:
        raise ValueError(f"temperature_frac must be > 0, got {temperature_frac}")
    if group_weight <= 0:
        raise ValueError(f"group_weight must be > 0, got {group_weight}")
    rules = data.ratios.shape[1]
    unit = math.fsum(data.weights.tolist()) / max(data.groups, 1)  # what one recipe group weighs now
    xs, rs, ws = [data.inputs], [], [data.weights.astype(np.float64)]
    labelled = 0
    for group in branches:
        if len(group.met_weighted) == 0:
            continue
        if group.met_weighted.shape[1] != rules:
            raise ValueError(f"scenario {group.scenario} group {group.group}: {group.met_weighted.shape[1]} rules, "
                             f"the dataset has {rules}")  # fmt: skip
        importance = group.met_weighted.max(1)
        keep = importance > 0
        if not keep.any():
            continue
        labelled += 1
        xs.append(group.inputs[keep].astype(np.float32))
        rs.append((group.met_weighted[keep] / importance[keep, None]).astype(np.float32))
        ws.append(group_weight * unit * importance[keep] / importance[keep].sum())
    ratios = np.concatenate(rs) if rs else np.zeros((0, rules), np.float32)
    logits = (ratios - 1.0) / temperature_frac
    targets = np.exp(logits - logits.max(1, keepdims=True, initial=-np.inf))
    targets /= targets.sum(1, keepdims=True)
    weights = np.concatenate(ws)
    return SelectorDataset(
        inputs=np.concatenate(xs).astype(np.float32),
        targets=np.concatenate([data.targets, targets.astype(np.float32)]),
        ratios=np.concatenate([data.ratios, ratios.astype(np.float32)]),
        label_mask=np.concatenate([data.label_mask, np.ones((len(ratios), rules), np.float32)]),
        weights=(weights * len(weights) / max(math.fsum(weights.tolist()), 1e-12)).astype(np.float32),
        groups=data.groups + labelled,
        best_counts=data.best_counts,
    )
