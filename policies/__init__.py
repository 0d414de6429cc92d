"""The pure decision core: schema, policy files, the per-request route decision and policies.

Imports nothing from the rest of the project; used by the simulator, the gym env, the router and the
controller alike.
"""

from policies.features import ObservationContext, ObservationLayout, build_observation, feature_table_hash
from policies.policy_file import (
    PolicyFile,
    PolicyFileError,
    ResolvedPolicy,
    TenantPolicy,
    load_policy_file,
    load_policy_text,
    resolve_policy,
)
from policies.routing import decide_route, rollout_sampled
from policies.schema import (
    SCHEMA_VERSION,
    ControlAction,
    FallbackAction,
    GroupWindow,
    LengthBucket,
    LiveState,
    MetricWindow,
    PoolTargets,
    RequestFeatures,
    Route,
    RouteDecision,
    RouteReason,
    RouteRule,
    RoutingThresholds,
    Slo,
    Tenant,
    TenantGroup,
    TenantWindow,
)

__all__ = [
    "SCHEMA_VERSION",
    "ControlAction",
    "FallbackAction",
    "GroupWindow",
    "LengthBucket",
    "LiveState",
    "MetricWindow",
    "ObservationContext",
    "ObservationLayout",
    "PolicyFile",
    "PolicyFileError",
    "PoolTargets",
    "RequestFeatures",
    "ResolvedPolicy",
    "Route",
    "RouteDecision",
    "RouteReason",
    "RouteRule",
    "RoutingThresholds",
    "Slo",
    "Tenant",
    "TenantGroup",
    "TenantPolicy",
    "TenantWindow",
    "build_observation",
    "decide_route",
    "feature_table_hash",
    "load_policy_file",
    "load_policy_text",
    "resolve_policy",
    "rollout_sampled",
]
