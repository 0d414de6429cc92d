"""Capacity planning with the simulator (``pdctl plan``); see :mod:`agents.planning.search`."""

from agents.planning.search import (
    AGGREGATED,
    ALWAYS_REMOTE,
    DEFAULT_LEVELS_TOKENS,
    PLAN_VERSION,
    PlanConfig,
    PlanInputError,
    PlanResult,
    Probe,
    best_scenario,
    candidate_configs,
    configured_scenario,
    load_plan_scenario,
    parse_slo,
    plan,
    policy_document,
)

__all__ = [
    "AGGREGATED",
    "ALWAYS_REMOTE",
    "DEFAULT_LEVELS_TOKENS",
    "PLAN_VERSION",
    "PlanConfig",
    "PlanInputError",
    "PlanResult",
    "Probe",
    "best_scenario",
    "candidate_configs",
    "configured_scenario",
    "load_plan_scenario",
    "parse_slo",
    "plan",
    "policy_document",
]
