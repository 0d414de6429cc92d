"""End-of-run summary of a simulation: per-tenant latency quantiles, SLO attainment, goodput, cost, transfers."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from env.sim.records import SimRequest
from env.sim.simulator import ClusterSimulator
from policies.scoring import count_slo_met, quantiles, slo_attainment_frac

__all__ = ["SimTenantSummary", "SimulationSummary", "summarize"]

_QUANTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True, slots=True)
class SimTenantSummary:
    """One tenant's results over the whole run.

    Quantiles are exact, over finished requests (TPOT over those with more than one output token). SLO scores
    follow :mod:`policies.scoring`: ``slo_met`` counts the finished requests within both objectives,
    ``slo_attainment_frac`` = ``slo_met`` / ``arrived`` (failed and still unfinished requests count as misses;
    ``None`` when nothing arrived) and ``goodput_rps`` = ``slo_met`` per second of the horizon.
    """

    tenant: str
    arrived: int
    finished: int
    failed: int
    slo_met: int
    remote_prefill_frac: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None
    tpot_p99_s: float | None
    slo_attainment_frac: float | None
    goodput_rps: float | None


@dataclass(frozen=True, slots=True)
class SimulationSummary:
    """The whole run."""

    scenario: str
    policy: str
    seed: int
    simulated_s: float
    wall_s: float
    num_requests: int
    num_finished: int
    num_failed: int
    num_in_flight: int
    gpu_seconds: float
    transfer_bytes: float
    num_transfers: int
    transfer_failures: int
    tenants: list[SimTenantSummary]

    @property
    def requests_per_wall_s(self) -> float:
        """Simulated requests per wall-clock second."""
        return self.num_requests / self.wall_s if self.wall_s > 0 else float("inf")

    @property
    def simulated_s_per_wall_s(self) -> float:
        """Simulated seconds per wall-clock second."""
        return self.simulated_s / self.wall_s if self.wall_s > 0 else float("inf")

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly form (with the derived speed figures)."""
        out = asdict(self)
        out["requests_per_wall_s"] = self.requests_per_wall_s
        out["simulated_s_per_wall_s"] = self.simulated_s_per_wall_s
        return out


def summarize(
    sim: ClusterSimulator, wall_s: float, scenario: str = "", policy: str = "", seed: int = 0, horizon_s: float = 0.0
) -> SimulationSummary:
    """Summarise a finished (or stopped) run; goodput is per second of ``horizon_s`` (default: simulated time)."""
    horizon = horizon_s if horizon_s > 0 else max(sim.now_s, 1e-9)
    tenants: list[SimTenantSummary] = []
    for ti, name in enumerate(sim.tenant_names):
        finished: list[SimRequest] = sim.finished[ti]
        arrived = sim.arrived[ti]
        failed = sum(1 for r in arrived if r.status == SimRequest.FAILED)
        routed = [r for r in arrived if r.status != SimRequest.FAILED]
        ttft = np.array([r.ttft_s for r in finished], dtype=np.float64)
        tpot_all = np.array([r.tpot_s for r in finished], dtype=np.float64)
        tpot = np.array([r.tpot_s for r in finished if r.output_tokens > 1], dtype=np.float64)
        met = count_slo_met(ttft, tpot_all, sim.slo_ttft_s[ti], sim.slo_tpot_s[ti])
        ttft_q, tpot_q = quantiles(ttft, _QUANTILES), quantiles(tpot, _QUANTILES)
        tenants.append(
            SimTenantSummary(
                tenant=name,
                arrived=len(arrived),
                finished=len(finished),
                failed=failed,
                slo_met=met,
                remote_prefill_frac=(sum(1 for r in routed if r.remote) / len(routed)) if routed else None,
                ttft_p50_s=ttft_q[0],
                ttft_p95_s=ttft_q[1],
                ttft_p99_s=ttft_q[2],
                tpot_p50_s=tpot_q[0],
                tpot_p95_s=tpot_q[1],
                tpot_p99_s=tpot_q[2],
                slo_attainment_frac=slo_attainment_frac(met, len(arrived)),
                goodput_rps=met / horizon if arrived else None,
            )
        )
    return SimulationSummary(
        scenario=scenario,
        policy=policy,
        seed=seed,
        simulated_s=sim.now_s,
        wall_s=wall_s,
        num_requests=sim.num_requests,
        num_finished=sim.num_finished,
        num_failed=sim.num_failed,
        num_in_flight=sim.num_in_flight,
        gpu_seconds=sim.gpu_seconds(),
        transfer_bytes=sim.transfer_bytes,
        num_transfers=sim.num_transfers,
        transfer_failures=sim.transfer_failures,
        tenants=tenants,
    )
