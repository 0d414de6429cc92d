"""Policies by name for a scenario: the registry grammar plus the simulator-only kinds grid:, expert:H and mpc:H.

Every spec is parsed and built by :mod:`policies.registry` (``file:``, ``baseline:``, ``learned:``,
``registry:``, ``watchdog[FALLBACK]:PRIMARY``). Importing this module registers three kinds there that need a
simulator and so exist only in evaluation:

* ``grid:`` — the best static configuration of :mod:`agents.grid_search` for the scenario (the caller passes the
  searched grid point): :func:`static_policy`, a :class:`policies.rules.FilePolicy` with fixed pools;
* ``expert:H`` — :class:`agents.lookahead.LookaheadPolicy`, the clairvoyant lookahead expert with an
  ``H``-interval horizon over :data:`EXPERT_TEACHERS` and the given static configurations (the best
  :data:`EXPERT_GRID_CANDIDATES` of the grid on the search seeds). It sees each episode's future, so it bounds
  what switching between those candidates can win rather than being a deployable policy;
* ``mpc:H`` — :class:`agents.mpc.MpcPolicy`, the model-predictive controller that does *not* look ahead: the same
  receding-horizon choice over :data:`agents.mpc.MPC_RULES` and one-instance pool moves, in copies of the simulator
  whose future is a persistence forecast of the traffic the router has seen.

:func:`make_policy` builds a spec for one scenario: relative ``file:`` and ``learned:`` paths are taken from the
working directory, else from the repository root; ``baseline:dynamo-throughput`` gets the per-instance
throughputs the calibrated performance model gives for the scenario (:func:`profiled_throughputs`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.lookahead import LookaheadPolicy
from agents.mpc import MPC_RULES, MpcPolicy
from env.perf.model import InterpolatedExecutionTimeModel
from env.scenario import Scenario
from env.sim.build import load_profile
from policies.base import Policy
from policies.baselines import BASELINES
from policies.policy_file import PolicyFile, resolve_policy
from policies.registry import (
    LoadOptions,
    PolicySpec,
    PolicySpecError,
    RegistryResolver,
    build_policy,
    register_kind,
)
from policies.route_levels import route_thresholds
from policies.rules import FilePolicy
from policies.schema import PoolTargets

__all__ = [
    "EXPERT_GRID_CANDIDATES",
    "EXPERT_TEACHERS",
    "REPO_ROOT",
    "SEED_POLICY_SPEC",
    "all_baseline_specs",
    "make_policy",
    "profiled_throughputs",
    "static_policy",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
SEED_POLICY_SPEC = "file:policies/examples/seed_pd_policy.yaml"
EXPERT_TEACHERS: tuple[str, ...] = (
    "baseline:aggregated",
    "baseline:dynamo-legacy",
    "baseline:vllm-proxy",
    "baseline:dynamo-isl-or-load",
    "baseline:queue_kv",
)
"""The rule policies among the candidates of ``expert:H``."""
EXPERT_GRID_CANDIDATES = 19
"""Static configurations among the candidates of ``expert:H`` (the best on the grid-search seeds; 19 is the whole
grid of a one-group scenario with four instances)."""
_MAX_EXPERT_HORIZON = 120


@dataclass(frozen=True, slots=True)
class _ForScenario:
    """What ``grid:`` and ``expert:H`` need (the ``extra`` of :class:`policies.registry.LoadOptions`)."""

    scenario: Scenario
    grid_point: Mapping[str, Any] | None
    candidate_points: Sequence[Mapping[str, Any]]


def profiled_throughputs(scenario: Scenario) -> tuple[float, float]:
    """Per-instance prefill and decode token throughput from the calibrated performance model (Dynamo's profile).

    Prefill: a full ``max_num_batched_tokens`` chunk per step. Decode: the largest batch whose step (at 2,048
    context tokens per sequence) stays within the tightest TPOT objective of the scenario (50 ms when none).
    """
    cluster = scenario.cluster
    profile = load_profile(scenario)
    prefill_model = InterpolatedExecutionTimeModel(profile, cluster.prefill_tp or cluster.tp)
    chunk = cluster.max_num_batched_tokens
    prefill_tokens_per_s = chunk / prefill_model.step_time_s(chunk, 1, 0, 0, [(chunk, 0)])
    targets = [t.slo.to_slo().tpot_target_s() for t in scenario.tenants]
    itl_target_s = min([t for t in targets if math.isfinite(t)], default=0.05)
    decode_model = InterpolatedExecutionTimeModel(profile, cluster.tp, max_batch=cluster.max_num_seqs)
    best = 1.0 / decode_model.decode_step_time_s(1, 2048)
    for batch in range(1, cluster.max_num_seqs + 1):
        step_s = decode_model.decode_step_time_s(batch, 2048 * batch)
        if step_s <= itl_target_s:
            best = batch / step_s
    return prefill_tokens_per_s, best


def static_policy(point: Mapping[str, Any], scenario: Scenario, spec: str = "grid:") -> FilePolicy:
    """The fixed configuration of one grid point (``{"pools": {group: [P, D]}, "route": level}``) for ``scenario``.

    Its id is the spec plus the configuration, e.g. ``grid:g0=1P3D/remote>=4096``.
    """
    del scenario  # every tenant gets the point's route level
    pools = {g: PoolTargets(int(p[0]), int(p[1])) for g, p in point["pools"].items()}
    label = ",".join(f"{g}={p[0]}P{p[1]}D" for g, p in point["pools"].items())
    return FilePolicy(route_thresholds(str(point["route"])), f"{spec}{label}/{point['route']}", pools)


def _for_scenario(options: LoadOptions, spec: PolicySpec) -> _ForScenario:
    if not isinstance(options.extra, _ForScenario):
        raise PolicySpecError(f"policy spec {str(spec)!r}: {spec.kind}: runs only in the simulator, for a scenario")
    return options.extra


def _grid(spec: PolicySpec, options: LoadOptions) -> Policy:
    extra = _for_scenario(options, spec)
    if extra.grid_point is None:
        raise PolicySpecError(f"policy spec {str(spec)!r}: grid: needs the grid-search result of the scenario")
    return static_policy(extra.grid_point, extra.scenario, str(spec))


def _expert(spec: PolicySpec, options: LoadOptions) -> Policy:
    extra = _for_scenario(options, spec)
    horizon = spec.argument
    if not horizon.isdigit() or not 1 <= int(horizon) <= _MAX_EXPERT_HORIZON:
        raise PolicySpecError(
            f"policy spec {str(spec)!r}: expert:H takes a horizon of 1-{_MAX_EXPERT_HORIZON} control intervals, "
            f"got {horizon!r}"
        )
    candidates = {name: build_policy(name, options) for name in EXPERT_TEACHERS}
    for point in extra.candidate_points:
        static = static_policy(point, extra.scenario)
        candidates[static.policy_id] = static
    return LookaheadPolicy(candidates, int(horizon), str(spec))


register_kind("grid", _grid, "grid: (evaluation only)", empty_argument=True)
register_kind("expert", _expert, "expert:H (evaluation only)")


def _mpc(spec: PolicySpec, options: LoadOptions) -> Policy:
    _for_scenario(options, spec)
    horizon = spec.argument
    if not horizon.isdigit() or not 1 <= int(horizon) <= _MAX_EXPERT_HORIZON:
        raise PolicySpecError(
            f"policy spec {str(spec)!r}: mpc:H takes a horizon of 1-{_MAX_EXPERT_HORIZON} control intervals, "
            f"got {horizon!r}"
        )
    return MpcPolicy({name: build_policy(name, options) for name in MPC_RULES}, int(horizon), str(spec))


register_kind("mpc", _mpc, "mpc:H (simulator only)")


def all_baseline_specs() -> list[str]:
    """Every named baseline, the seed rule file, and the grid-searched static optimum."""
    names = [*BASELINES, "dynamo-throughput", "queue_kv"]
    return [f"baseline:{n}" for n in names] + [SEED_POLICY_SPEC, "grid:"]


def make_policy(
    spec: str,
    scenario: Scenario,
    grid_point: Mapping[str, Any] | None = None,
    candidate_points: Sequence[Mapping[str, Any]] = (),
    resolver: RegistryResolver | None = None,
) -> Policy:
    """Build the policy a spec names, for one scenario (module docstring).

    ``grid:`` needs the searched ``grid_point``; ``expert:H`` takes ``candidate_points`` (static configurations)
    as candidates besides :data:`EXPERT_TEACHERS`, and is bound to its simulator by
    :func:`agents.runs.run_episode`; ``registry:`` needs the ``resolver``.

    Raises:
        policies.registry.PolicySpecError: one line naming the spec.
        policies.policy_file.PolicyFileError: a ``file:`` policy is invalid.
    """
    throughputs: list[tuple[float, float]] = []

    def baseline_params(name: str) -> Mapping[str, Any]:
        if name != "dynamo-throughput":
            return {}
        if not throughputs:
            throughputs.append(profiled_throughputs(scenario))
        prefill_tokens_per_s, decode_tokens_per_s = throughputs[0]
        return {"prefill_tokens_per_s": prefill_tokens_per_s, "decode_tokens_per_s": decode_tokens_per_s}

    options = LoadOptions(
        resolve_policy(PolicyFile()),
        fallback_dir=REPO_ROOT,
        resolver=resolver,
        baseline_params=baseline_params,
        extra=_ForScenario(scenario, grid_point, tuple(candidate_points)),
    )
    return build_policy(spec, options)
