"""The one episode loop: reset → observe → decide → control → drain, in the gym env.

Evaluation runs (:mod:`agents.harness`), ``pdctl sim``, the lookahead expert's copies (:mod:`agents.lookahead`)
and the capacity planner's probes (:mod:`agents.planning`) all drive :class:`env.gym_env.PDClusterEnv` through
:func:`run_episode`, one interval at a time with :func:`control_interval`, so a policy is judged by the same
code path wherever it runs. Control goes through the env's public methods only (``reset``, ``control``,
``drain``); the loop reads the simulated clock from ``env.sim``, and an episode with a stop check (the planner's
early stop) drains on ``env.sim`` one interval at a time before the final ``drain``.

:func:`episode_env` builds the env for a policy: a policy with fixed thresholds (:class:`policies.rules.FilePolicy`:
a policy file or a static configuration) is in force from the first simulated second (as a router started with
that file would be), every other policy starts from the seed's thresholds and decides after the first interval;
a learned policy fixes the slot layout it was trained on (:func:`policies.registry.fixed_layout`), for a rule
policy the env's layout grows to fit the scenario.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from env.gym_env import ControlStep, PDClusterEnv
from env.scenario import Scenario
from env.sim.simulator import ClusterSimulator
from env.workloads.config import DiurnalWorkload, GammaWorkload, PoissonWorkload, StepWorkload
from policies.base import Policy
from policies.registry import fixed_layout
from policies.rules import FilePolicy

__all__ = [
    "EnvBound",
    "Episode",
    "IntervalHook",
    "StopCheck",
    "control_interval",
    "episode_env",
    "run_episode",
    "running",
    "scale_bandwidth",
    "scale_rates",
]

IntervalHook = Callable[[PDClusterEnv, ControlStep], None]
"""Called after every control interval with what it did."""
StopCheck = Callable[[PDClusterEnv], bool]
"""Asked after every control interval and every ``control_interval_s`` of the drain; ``True`` ends the episode
there (what is still in flight stays unfinished)."""


@runtime_checkable
class EnvBound(Protocol):
    """A policy that acts in the simulator it runs in (the clairvoyant lookahead expert)."""

    def bind(self, env: PDClusterEnv) -> None:
        """Attach the env before the first decision."""
        ...


@dataclass(slots=True)
class Episode:
    """What :func:`run_episode` did.

    Attributes:
        sim: the simulator (drained unless ``stopped``).
        intervals: control intervals decided.
        stopped: whether the stop check ended the episode early (then in-flight requests were not drained).
    """

    sim: ClusterSimulator
    intervals: int
    stopped: bool = False


def running(env: PDClusterEnv) -> bool:
    """Whether the episode has control intervals left."""
    return bool(env.sim.now_s < env.scenario.duration_s - 1e-9)


def control_interval(env: PDClusterEnv, policy: Policy) -> ControlStep:
    """One control interval: the env's control step asks ``policy``, guards the decision and simulates it.

    The policy is asked on this interval's observation and context, as the controller's tick asks it
    (:func:`policies.control.control_step`).
    """
    return env.control(policy)


def run_episode(
    env: PDClusterEnv,
    policy: Policy,
    seed: int | None,
    on_interval: IntervalHook | None = None,
    at_horizon: Callable[[PDClusterEnv], None] | None = None,
    stop: StopCheck | None = None,
) -> Episode:
    """Reset ``env`` with ``seed``, let ``policy`` control every interval, then drain in-flight requests.

    A policy that needs the env (:class:`EnvBound`) is bound to it after the reset. ``on_interval`` sees every
    interval; ``at_horizon`` sees the env once the last interval is simulated, before the drain; ``stop`` may end
    the episode early (the capacity planner's probes stop once their SLO target is out of reach).
    """
    env.reset(seed=seed)
    if isinstance(policy, EnvBound):
        policy.bind(env)
    intervals = 0
    while running(env):
        step = control_interval(env, policy)
        intervals += 1
        if on_interval is not None:
            on_interval(env, step)
        if stop is not None and stop(env):
            return Episode(env.sim, intervals, stopped=True)
    if at_horizon is not None:
        at_horizon(env)
    if stop is not None and _drain_until(env, stop):
        return Episode(env.sim, intervals, stopped=True)
    return Episode(env.drain(), intervals)


def _drain_until(env: PDClusterEnv, stop: StopCheck) -> bool:
    """Drain in steps of one control interval, asking ``stop`` after each; whether it stopped the episode."""
    sim = env.sim
    end_s = env.scenario.duration_s + env.scenario.drain_s
    t = sim.now_s
    while t < end_s and (sim.num_in_flight > 0 or sim.num_arrived < sim.num_requests):
        t = min(t + env.scenario.control_interval_s, end_s)
        sim.run_until(t)
        if stop(env):
            return True
    return False


def episode_env(
    scenario: Scenario, policy: Policy, traces_dir: str | Path | None = None, **env_options: Any
) -> PDClusterEnv:
    """The env ``policy`` runs ``scenario`` in (module docstring); ``env_options`` go to the env as they are.

    Raises:
        ValueError: the scenario does not fit a learned policy's slot layout (one line naming the scenario).
    """
    if isinstance(policy, FilePolicy) and "base_thresholds" not in env_options:
        env_options["base_thresholds"] = {t.name: policy.thresholds_for(t.name) for t in scenario.tenants}
    return PDClusterEnv(scenario, layout=fixed_layout(policy), traces_dir=traces_dir, **env_options)


def scale_rates(scenario: Scenario, factor: float) -> Scenario:
    """The scenario with every tenant's request rate multiplied by ``factor`` (trace replays: ``rate_scale``)."""
    if factor == 1.0:
        return scenario
    tenants = []
    for tenant in scenario.tenants:
        w = tenant.workload
        update: dict[str, Any]
        if isinstance(w, PoissonWorkload | GammaWorkload):
            update = {"rate_rps": w.rate_rps * factor}
        elif isinstance(w, DiurnalWorkload):
            update = {"mean_rate_rps": w.mean_rate_rps * factor}
        elif isinstance(w, StepWorkload):
            segments = tuple(s.model_copy(update={"rate_rps": s.rate_rps * factor}) for s in w.segments)
            update = {"segments": segments}
        else:
            update = {"rate_scale": w.rate_scale * factor}
        tenants.append(tenant.model_copy(update={"workload": w.model_copy(update=update)}))
    return scenario.model_copy(update={"tenants": tenants, "name": f"{scenario.name}@x{factor:g}"})


def scale_bandwidth(scenario: Scenario, factor: float) -> Scenario:
    """The scenario with its KV-transfer link rate multiplied by ``factor`` (below 1: a degraded network).

    The base rate and every incident that sets a rate of its own are scaled; setup latency and failures are not.
    """
    if factor == 1.0:
        return scenario
    network = scenario.cluster.network
    incidents = [
        incident
        if incident.link_bandwidth_bytes_per_s is None
        else incident.model_copy(update={"link_bandwidth_bytes_per_s": incident.link_bandwidth_bytes_per_s * factor})
        for incident in network.incidents
    ]
    scaled = network.model_copy(
        update={"link_bandwidth_bytes_per_s": network.link_bandwidth_bytes_per_s * factor, "incidents": incidents}
    )
    cluster = scenario.cluster.model_copy(update={"network": scaled})
    return scenario.model_copy(update={"cluster": cluster, "name": f"{scenario.name}@bw{factor:g}"})
