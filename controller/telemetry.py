"""The controller's Prometheus metrics (``pdctl_controller_*``), on an explicit registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Telemetry"]

_TICK_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Telemetry:
    """Every metric the daemon exports; one instance per registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        p = "pdctl_controller_"
        self.tick_duration = Histogram(
            p + "tick_duration_seconds", "Duration of one control tick.", buckets=_TICK_BUCKETS_S, registry=registry
        )
        self.ticks = Counter(p + "ticks_total", "Control ticks run.", ["result"], registry=registry)
        self.last_tick = Gauge(p + "last_tick_timestamp_seconds", "Wall time of the last tick.", registry=registry)
        self.decisions = Counter(
            p + "decisions_total", "Decisions by action and reason.", ["action", "reason"], registry=registry
        )
        self.dropped = Counter(
            p + "decisions_dropped_total", "Decisions dropped: computed under an older generation.", registry=registry
        )
        self.staleness = Gauge(
            p + "observation_staleness_seconds", "Age of the newest observed sample at tick time.", registry=registry
        )
        self.stale = Gauge(p + "observation_stale", "1 when the observation is stale (holding).", registry=registry)
        self.source_errors = Counter(
            p + "source_errors_total", "Ticks whose source could not be read.", registry=registry
        )
        self.override_active = Gauge(p + "override_active", "Active override files.", registry=registry)
        self.rollback_active = Gauge(
            p + "rollback_active", "1 while a rollback (aggregated-only) file is active.", registry=registry
        )
        self.override_refused = Gauge(
            p + "override_refused", "1 for each override file currently refused.", ["file"], registry=registry
        )
        self.override_refusals = Counter(
            p + "override_refusals_total", "Override files refused (invalid).", registry=registry
        )
        self.watchdog_fallback = Gauge(
            p + "watchdog_fallback",
            "1 while the SLO watchdog's fallback policy decides instead of the configured policy.",
            registry=registry,
        )
        self.watchdog_trips = Counter(
            p + "watchdog_trips", "Times the SLO watchdog handed control to its fallback.", registry=registry
        )
        self.watchdog_attainment = Gauge(
            p + "watchdog_slo_attainment_ratio",
            "Priority- and rate-weighted SLO attainment of the last window, as the SLO watchdog saw it.",
            registry=registry,
        )
        self.admission_mismatch = Gauge(
            p + "admission_mismatch",
            "1 while the policy was fitted behind the router's admission stage at a slack the router does not run "
            "(or with the stage off there); the log says which.",
            registry=registry,
        )
        self.policy_info = Gauge(
            p + "policy_info", "Running policy (value 1).", ["policy_id", "generation", "mode"], registry=registry
        )
        self.policy_loads = Counter(
            p + "policy_loads",
            "Registry policy versions loaded (ok) or refused (error).",
            ["result"],
            registry=registry,
        )
        self.actuations = Counter(
            p + "actuations_total", "Actuations by actuator and outcome.", ["actuator", "outcome"], registry=registry
        )
        self.actuation_errors = Counter(
            p + "actuation_errors_total",
            "Actuations that did not apply (rejected, failed, unknown, held).",
            ["actuator", "outcome"],
            registry=registry,
        )
        self.policy_errors = Counter(
            p + "policy_errors_total",
            "Ticks on which the policy (or the SLO watchdog's primary) raised; the tick held or the fallback decided.",
            registry=registry,
        )
        self.policy_drifts = Counter(
            p + "router_policy_drifts_total",
            "Ticks that found a router running another policy than the one last published to it (a restarted "
            "router, or another writer); the whole table is published again.",
            registry=registry,
        )
        self.reloads = Counter(p + "config_reloads_total", "Config reloads by result.", ["result"], registry=registry)
        self.control_memory_unwritten = Gauge(
            p + "control_memory_unwritten",
            "1 while the control memory file cannot be written (a restart would forget the thresholds and holds).",
            registry=registry,
        )

    def set_policy(self, policy_id: str, generation: int, mode: str) -> None:
        """Replace the policy info series."""
        self.policy_info.clear()
        self.policy_info.labels(policy_id=policy_id, generation=str(generation), mode=mode).set(1)
