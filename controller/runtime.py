"""Everything one config generation owns, built (and validated) from a :class:`ControllerConfig`.

Building does all the loading — policy file, policy, source, actuators — so that a reload can validate the
whole new configuration before anything is swapped. Building opens no connection (sessions are lazy).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from controller.actuators.base import Actuator
from controller.actuators.dryrun import DryRunActuator
from controller.actuators.kubernetes import KubernetesActuator, Workload
from controller.actuators.router import RouterActuator
from controller.config import (
    ControllerConfig,
    DryRunActuatorConfig,
    KubernetesActuatorConfig,
    PrometheusSourceConfig,
    RouterActuatorConfig,
    WatchdogConfig,
)
from controller.policy_registry import RegistryPolicy
from controller.sources.base import InstanceInfo, SeriesReader, Topology
from controller.sources.prometheus import PrometheusReader
from controller.sources.scrape import ScrapeReader
from controller.sources.source import MetricSource
from controller.sources.window import WindowBuilder, WindowQueries
from policies.base import Policy
from policies.guard import SafetyGuard
from policies.policy_file import PolicyFileError, ResolvedPolicy, load_policy_file, resolve_policy
from policies.registry import PolicySpecError, layout_problem, load_policy
from policies.rules import FilePolicy
from policies.schema import PoolTargets, Tenant, TenantGroup
from policies.watchdog import SloWatchdog

__all__ = ["Runtime", "RuntimeConfigError", "build_runtime"]


class RuntimeConfigError(ValueError):
    """The configuration could not be turned into a runtime; the message says why (one or more lines)."""


@dataclass(frozen=True, slots=True)
class Runtime:
    """One generation: config, base policy, policy, guard, source and actuators."""

    generation: int
    config: ControllerConfig
    base: ResolvedPolicy
    policy: Policy
    guard: SafetyGuard
    source: MetricSource
    actuators: tuple[Actuator, ...]
    tenants: tuple[Tenant, ...]
    groups: tuple[TenantGroup, ...]
    topology: Topology

    async def close(self) -> None:
        """Close the source and every actuator."""
        await self.source.close()
        for actuator in self.actuators:
            await actuator.close()


def _actuator(
    config: RouterActuatorConfig | KubernetesActuatorConfig | DryRunActuatorConfig, groups: tuple[TenantGroup, ...]
) -> Actuator:
    if isinstance(config, RouterActuatorConfig):
        token = config.token.get_secret_value() if config.token is not None else os.environ.get(config.token_env)
        return RouterActuator(config.url, token, config.timeout_s, groups)
    if isinstance(config, KubernetesActuatorConfig):
        token = config.token.get_secret_value() if config.token is not None else None
        if token is None and config.token_file is not None and not config.token_file.is_file():
            raise RuntimeConfigError(f"kubernetes actuator: cannot read token_file {config.token_file}: no such file")
        workloads = {
            name: (Workload(g.prefill.kind, g.prefill.name), Workload(g.decode.kind, g.decode.name))
            for name, g in config.groups.items()
        }
        return KubernetesActuator(
            config.api_url,
            config.namespace,
            token,
            workloads,
            config.timeout_s,
            config.ca_file,
            config.insecure_skip_tls_verify,
            token_file=config.token_file,
            bounds=groups,
        )
    return DryRunActuator()


def _initial_topology(config: ControllerConfig, groups: tuple[TenantGroup, ...]) -> Topology:
    instances = tuple(InstanceInfo(i.id, i.group, i.role, i.url) for i in config.instances)
    if instances:
        return Topology.from_instances(instances)
    # No instance list: start from each group's minimum pools until an actuator reads the real counts.
    return Topology(pools={g.name: PoolTargets(g.min_prefill, g.min_decode) for g in groups})


def _watched(policy: Policy, watchdog: WatchdogConfig, config: ControllerConfig, base: ResolvedPolicy) -> SloWatchdog:
    """``policy`` under the SLO ``watchdog`` (its fallback loaded against ``base``)."""
    spec = watchdog.fallback
    fallback: Policy
    if spec == "policy_file":
        fallback = FilePolicy(base, f"file:{config.policy_file}")
    else:
        fallback = load_policy(spec, base, asdict(config.rules) if spec == "baseline:queue_kv" else {})
    return SloWatchdog(policy, fallback, watchdog.params())


def build_runtime(config: ControllerConfig, generation: int, started_s: float) -> Runtime:
    """Load and check everything ``config`` names.

    Raises:
        RuntimeConfigError: the policy file, the policy spec or a cross-reference is invalid.
    """
    try:
        base = resolve_policy(load_policy_file(config.policy_file), str(config.policy_file))
        policy: Policy
        if config.policy.startswith("registry:"):
            policy = RegistryPolicy(config.policy, base, tracking_uri=config.mlflow_tracking_uri)
        else:
            params = asdict(config.rules) if config.policy == "baseline:queue_kv" else config.baseline_params
            policy = load_policy(config.policy, base, params)
        if config.watchdog is not None:
            policy = _watched(policy, config.watchdog, config, base)
    except (PolicyFileError, PolicySpecError) as exc:
        raise RuntimeConfigError(str(exc)) from None
    groups = tuple(base.groups.values())
    tenants = tuple(tp.tenant for tp in base.tenants.values())
    layout = layout_problem(policy, [t.name for t in tenants], [g.name for g in groups], base.grouped_tenant_names())
    if layout is not None:
        raise RuntimeConfigError(layout)
    group_names = {g.name for g in groups}
    problems = [
        f"instance {i.id!r} names tenant group {i.group!r}, not in {config.policy_file}"
        for i in config.instances
        if i.group not in group_names
    ]
    for actuator in config.actuators:
        if isinstance(actuator, KubernetesActuatorConfig):
            problems.extend(
                f"kubernetes actuator names tenant group {name!r}, not in {config.policy_file}"
                for name in actuator.groups
                if name not in group_names
            )
    if problems:
        raise RuntimeConfigError("\n".join(problems))
    reader: SeriesReader
    if isinstance(config.source, PrometheusSourceConfig):
        token_env = config.source.bearer_token_env
        reader = PrometheusReader(
            config.source.url,
            config.source.window_s,
            config.source.timeout_s,
            os.environ.get(token_env) if token_env else None,
        )
        builder = WindowBuilder(WindowQueries(config.source.instance_label))
    else:
        reader = ScrapeReader(config.source.router_metrics_url, config.source.window_s, config.source.timeout_s)
        builder = WindowBuilder()
    source = MetricSource(reader, builder, config.source.window_s, started_s)
    return Runtime(
        generation=generation,
        config=config,
        base=base,
        policy=policy,
        guard=SafetyGuard(config.guard.limits()),
        source=source,
        actuators=tuple(_actuator(a, groups) for a in config.actuators),
        tenants=tenants,
        groups=groups,
        topology=_initial_topology(config, groups),
    )
