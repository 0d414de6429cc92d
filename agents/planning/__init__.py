"""Capacity planning with the simulator (``pdctl plan``): which P:D split and routing threshold serve a workload best.

:func:`plan` searches static configurations of one tenant group of ``N`` GPUs (``N // tp`` instances):

* **aggregated** — every instance serves prefill and decode (``aggregated`` role, every request local);
* **disaggregated** ``P:D`` with ``P + D = N // tp`` and ``P, D ≥ 1``, under one route level for every tenant:
  ``always_remote`` (every prompt prefilled remotely) or ``remote>=T`` for T in ``levels_tokens``
  (as :mod:`policies.route_levels` defines them: the project's rule with a crisp threshold: inputs ≥ T
  tokens, after prefix-cache hits, go remote; the seed's prefill-queue overload fallback stays on; no
  decode-pressure or expected-output condition).

Modules, each with one job:

* :mod:`agents.planning.inputs` — the workload source, ``--slo``, the GPU budget and the configurations
  (:class:`PlanConfig`, :func:`candidate_configs`);
* :mod:`agents.planning.probes` — one probe (a simulator run of a configuration at a rate multiplier), the
  probe cache keyed by the code version, and the process pool;
* :mod:`agents.planning.search` — the split/threshold search (shared bisection, coarse to fine, per tenant);
* :mod:`agents.planning.result` — capacities and their ranking, the Pareto front, ``plan.json`` and the
  emitted policy file;
* :mod:`agents.planning.coverage` — which part of the source the probes covered, compared with the whole;
* :mod:`agents.planning.validate` — the validation replay of the recommendation over the whole source;
* :mod:`agents.planning.policy_loop` — GPUs needed with a policy in the loop vs the best static split.
"""

from agents.planning.inputs import (
    DEFAULT_LEVELS_TOKENS,
    PlanConfig,
    PlanInputError,
    PlanSource,
    candidate_configs,
    configured_scenario,
    load_plan_scenario,
    load_plan_source,
    parse_slo,
)
from agents.planning.probes import PLAN_VERSION, Probe, ProbeRunner, code_version, run_probe
from agents.planning.result import Capacity, PlanResult, best_scenario, policy_document
from agents.planning.search import grid_scale, plan
from policies.route_levels import AGGREGATED, ALWAYS_REMOTE

__all__ = [
    "AGGREGATED",
    "ALWAYS_REMOTE",
    "DEFAULT_LEVELS_TOKENS",
    "PLAN_VERSION",
    "Capacity",
    "PlanConfig",
    "PlanInputError",
    "PlanResult",
    "PlanSource",
    "Probe",
    "ProbeRunner",
    "best_scenario",
    "candidate_configs",
    "code_version",
    "configured_scenario",
    "grid_scale",
    "load_plan_scenario",
    "load_plan_source",
    "parse_slo",
    "plan",
    "policy_document",
    "run_probe",
]
