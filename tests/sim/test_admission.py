"""The simulator behind the admission stage: it refuses only past the objective, and pays off under overload."""

from __future__ import annotations

import numpy as np

from env.scenario import Scenario
from env.sim.records import SimRequest
from env.workloads.columns import RequestColumns
from policies.admission import AdmissionConfig
from policies.schema import RouteReason, RoutingThresholds
from tests.sim.helpers import POISSON, columns, simulator

ON = AdmissionConfig(ttft_slack_frac=1.0)


def _scenario(ttft_p95_s: float) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "admission",
            "duration_s": 60.0,
            "tenant_groups": [{"name": "g", "gpu_budget": 2, "prefill": 1, "decode": 1}],
            "tenants": [{"name": "t", "group": "g", "workload": POISSON, "slo": {"ttft_p95_s": ttft_p95_s}}],
        }
    )


def _overload(n: int = 600) -> dict[str, RequestColumns]:
    # 8000-token prompts at 20 req/s: several times what one 8B prefill instance computes, for 30 s
    return {"t": columns(np.linspace(0.0, 30.0, n), 8000, 20)}


def _met(sim: object) -> int:
    from agents.harness import slo_met  # the scoring every evaluation uses

    return slo_met(sim, 0)  # type: ignore[arg-type]


def test_refused_requests_fail_at_arrival_and_the_rest_meet_their_objective() -> None:
    remote = RoutingThresholds(min_remote_input_tokens=0, max_local_input_tokens=0, require_decode_pool_pressure=False)
    off = simulator(_scenario(1.0), _overload(), thresholds=remote)
    off.run()
    on = simulator(_scenario(1.0), _overload(), thresholds=remote, admission=ON)
    on.run()
    assert off.num_refused == 0
    assert on.num_refused > 0
    assert on.num_failed >= on.num_refused
    refused = [r for r in on.requests if r is not None and r.reason is RouteReason.ADMISSION_REFUSED]
    assert len(refused) == on.num_refused
    assert all(r.status == SimRequest.FAILED and r.decode_instance < 0 for r in refused)
    assert on.num_arrived == on.num_finished + on.num_failed + on.num_in_flight
    assert _met(on) > 2 * _met(off)  # the queue no longer grows past every objective


def test_below_the_knee_nothing_is_refused_and_the_run_is_unchanged() -> None:
    light = {"t": columns(np.arange(0.0, 30.0, 1.0), 2000, 20)}
    off = simulator(_scenario(2.0), light)
    off.run()
    on = simulator(_scenario(2.0), light, admission=ON)
    on.run()
    assert on.num_refused == 0
    assert [r.first_token_s for r in on.requests if r] == [r.first_token_s for r in off.requests if r]


def test_a_tenant_without_a_ttft_objective_is_never_refused() -> None:
    scn = _scenario(1.0)
    scn = scn.model_copy(update={"tenants": [scn.tenants[0].model_copy(update={"slo": type(scn.tenants[0].slo)()})]})
    sim = simulator(scn, _overload(), admission=ON)
    sim.run()
    assert sim.num_refused == 0
