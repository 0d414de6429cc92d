"""Network incidents: validation, links changing rate mid-flight, failure and setup switches, telemetry, and the
guarantee that a scenario without incidents runs exactly as before."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from env.scenario import NetworkConfig, ScenarioError, load_scenario
from env.sim.records import SimRequest
from env.sim.simulator import ClusterSimulator
from policies.schema import FallbackAction, RouteReason
from tests.sim.helpers import REMOTE_ALWAYS, columns, random_columns, scenario, simulator

REPO = Path(__file__).resolve().parents[2]
KV_BYTES_PER_TOKEN = 131_072  # h200-llama3-8b, all TP shards

SMALL = """\
name: small
duration_s: 60
cluster:
  profile: h200-llama3-8b
  network:
    link_bandwidth_bytes_per_s: 4.5e+10
    failure_prob: 0.001
    incidents:
      - start_s: 10
        end_s: 20
        link_bandwidth_bytes_per_s: 2.0e+9
      - start_s: 30
        end_s: 40
        failure_prob: 0.1
tenant_groups:
  - {name: g, gpu_budget: 2, prefill: 1, decode: 1}
tenants:
  - name: t
    group: g
    workload: {kind: poisson, rate_rps: 1, input_tokens: {kind: fixed, tokens: 100},
               output_tokens: {kind: fixed, tokens: 10}}
"""


def _net(base: dict[str, Any], *incidents: dict[str, Any]) -> dict[str, Any]:
    return {"network": {**base, "incidents": list(incidents)}}


# ------------------------------------------------------------------------------------------------ validation


def test_a_valid_incident_list_parses_into_changes(tmp_path: Path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    net = load_scenario(path).cluster.network
    changes = [(t, c.link_bandwidth_bytes_per_s, c.failure_prob) for t, c in net.changes()]
    assert changes == [(10, 2e9, 0.001), (20, 4.5e10, 0.001), (30, 4.5e10, 0.1), (40, 4.5e10, 0.001)]
    assert net.at(15).link_bandwidth_bytes_per_s == 2e9
    assert net.at(20).link_bandwidth_bytes_per_s == 4.5e10  # the end is exclusive
    assert net.at(15).incidents == []
    assert net.at(0).incidents == []
    assert NetworkConfig().changes() == []
    adjacent = NetworkConfig.model_validate(
        {"incidents": [{"start_s": 1, "end_s": 2, "failure_prob": 0.5}, {"start_s": 2, "end_s": 3, "failure_prob": 1}]}
    )
    assert [(t, c.failure_prob) for t, c in adjacent.changes()] == [(1, 0.5), (2, 1.0), (3, 0.0)]


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("end_s: 20", "end_s: 10", "small.yaml:10: cluster.network.incidents[0].end_s: must be after start_s (10)"),
        ("end_s: 40", "end_s: 61", "small.yaml:13: cluster.network.incidents[1].end_s: must be within the episode"),
        (
            "start_s: 30",
            "start_s: 15",
            "small.yaml:12: cluster.network.incidents[1].start_s: incidents must be sorted and not overlap",
        ),
        (
            "        link_bandwidth_bytes_per_s: 2.0e+9\n",
            "",
            "small.yaml:9: cluster.network.incidents[0]: Value error, an incident must override at least one of",
        ),
        (
            "link_bandwidth_bytes_per_s: 2.0e+9",
            "link_bandwidth_bytes_per_s: 0",
            "small.yaml:11: cluster.network.incidents[0].link_bandwidth_bytes_per_s: Input should be greater than 0",
        ),
        (
            "failure_prob: 0.1",
            "failure_prob: 1.5",
            "small.yaml:14: cluster.network.incidents[1].failure_prob: Input should be less than or equal to 1",
        ),
        (
            "failure_prob: 0.1",
            "failure_prob: 0.1\n        timeout_s: 1",
            "small.yaml:15: cluster.network.incidents[1].timeout_s: Extra inputs are not permitted",
        ),
    ],
)
def test_invalid_incidents_name_file_line_and_field(tmp_path: Path, old: str, new: str, expected: str) -> None:
    assert old in SMALL
    path = tmp_path / "small.yaml"
    path.write_text(SMALL.replace(old, new, 1))
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert expected in str(info.value)
    assert len(info.value.problems) == 1


def test_the_shipped_incident_scenario_parses() -> None:
    scn = load_scenario(REPO / "experiments" / "scenarios" / "network-incident-8.yaml")
    changes = [(t, c.link_bandwidth_bytes_per_s, c.failure_prob) for t, c in scn.cluster.network.changes()]
    assert changes == [(300, 2e9, 0.1), (600, 4.5e10, 0.001)]
    assert scn.duration_s == 900


# ------------------------------------------------------------------------------------------------ the link


def _one_transfer(network: dict[str, Any], tokens: int = 4096) -> SimRequest:
    sim = simulator(scenario(1, 1, cluster={"network": network}), {"t": columns([0.0], tokens, 10)})
    sim.run()
    request = sim.requests[0]
    assert request is not None
    assert request.remote
    assert request.status == SimRequest.FINISHED
    return request


def test_a_transfer_in_flight_follows_the_rate_of_each_period() -> None:
    base = {"link_bandwidth_bytes_per_s": 1e9, "setup_latency_s": 0.002, "timeout_s": 100.0}
    healthy = _one_transfer(base)
    flow_start_s = healthy.kv_ready_s - healthy.transfer_s + 0.002  # the network does not change the prefill
    start_s, end_s, slow = flow_start_s + 0.2, flow_start_s + 0.4, 1e8
    request = _one_transfer(
        {**base, "incidents": [{"start_s": start_s, "end_s": end_s, "link_bandwidth_bytes_per_s": slow}]}
    )
    size = 4096 * KV_BYTES_PER_TOKEN
    before = (start_s - flow_start_s) * 1e9  # at the old rate until the drop
    during = (end_s - start_s) * slow  # at the incident's rate until recovery
    after_s = (size - before - during) / 1e9  # the rest at the base rate again
    assert request.transfer_failures == 0
    assert request.transfer_s == pytest.approx(0.002 + (end_s - flow_start_s) + after_s, rel=1e-9)
    assert request.transfer_s - healthy.transfer_s == pytest.approx((end_s - start_s) * (1 - slow / 1e9), rel=1e-9)
    # dropping for good: the rest of the bytes at the new rate
    dropped = _one_transfer(
        {**base, "incidents": [{"start_s": start_s, "end_s": 100, "link_bandwidth_bytes_per_s": slow}]}
    )
    assert dropped.transfer_s == pytest.approx(0.002 + (start_s - flow_start_s) + (size - before) / slow, rel=1e-9)
    # recovering: a flow started during the incident ends early at the restored rate (not at its old projection)
    recovered = _one_transfer(
        {**base, "incidents": [{"start_s": 0, "end_s": flow_start_s + 0.1, "link_bandwidth_bytes_per_s": slow}]}
    )
    assert recovered.transfer_s == pytest.approx(0.002 + 0.1 + (size - 0.1 * slow) / 1e9, rel=1e-9)


def test_two_flows_share_the_new_rate() -> None:
    base = {"link_bandwidth_bytes_per_s": 1e9, "setup_latency_s": 0.0, "timeout_s": 100.0}
    sim = simulator(scenario(1, 1, cluster={"network": base}), {"t": columns([0.0, 0.0], 2000, 5)})
    sim.run()
    healthy = [r for r in sim.requests if r is not None]
    # the link is busy from the first flow's start to the last one's end: both sets of bytes at the link's rate
    first_s = min(r.kv_ready_s - r.transfer_s for r in healthy)
    last_s = max(r.kv_ready_s for r in healthy)
    size = 2000 * KV_BYTES_PER_TOKEN
    assert last_s - first_s == pytest.approx(2 * size / 1e9, rel=1e-9)
    switch_s = first_s + 0.5 * size / 1e9
    incident = {"start_s": switch_s, "end_s": 100, "link_bandwidth_bytes_per_s": 5e8}
    sim = simulator(scenario(1, 1, cluster=_net(base, incident)), {"t": columns([0.0, 0.0], 2000, 5)})
    sim.run()
    slowed = [r for r in sim.requests if r is not None]
    # work-conserving across the switch: half a transfer's bytes at 1 GB/s, the other 1.5 at 0.5 GB/s
    assert max(r.kv_ready_s for r in slowed) - first_s == pytest.approx(0.5 * size / 1e9 + 1.5 * size / 5e8, rel=1e-9)


def test_a_drop_that_would_pass_the_deadline_arms_the_timeout() -> None:
    base = {"link_bandwidth_bytes_per_s": 1e9, "setup_latency_s": 0.0, "timeout_s": 1.0}
    healthy = _one_transfer(base)
    assert healthy.transfer_failures == 0
    assert healthy.transfer_s < 1.0
    flow_start_s = healthy.kv_ready_s - healthy.transfer_s
    incident = {"start_s": flow_start_s + 0.1, "end_s": 100, "link_bandwidth_bytes_per_s": 1e8}
    sim = simulator(scenario(1, 1, cluster=_net(base, incident)), {"t": columns([0.0], 4096, 10)})
    sim.run()
    request = sim.requests[0]
    assert request is not None
    assert request.status == SimRequest.FINISHED
    assert request.transfer_failures == 1
    assert not request.remote  # served locally after the timeout
    assert request.transfer_s == pytest.approx(1.0, abs=1e-9)
    assert sim.instances[0].link.flows == []


def test_failure_probability_and_setup_latency_switch_for_new_transfers() -> None:
    base = {"link_bandwidth_bytes_per_s": 1e9, "setup_latency_s": 0.001, "failure_prob": 0.0, "timeout_s": 100.0}
    base["unhealthy_failure_frac"] = 1.0  # the breaker never opens here (its window always holds successes too)
    failing = {"start_s": 10, "end_s": 20, "failure_prob": 1.0}
    slow_setup = {"start_s": 20, "end_s": 30, "setup_latency_s": 0.25}  # adjacent: one change at 20 s
    arrivals = np.arange(0.5, 40.0, 1.0)
    thresholds = replace(REMOTE_ALWAYS, on_kv_transfer_timeout=FallbackAction.LOCAL_AGGREGATED_SERVING)
    sim = simulator(
        scenario(1, 1, cluster=_net(base, failing, slow_setup)), {"t": columns(arrivals, 1000, 5)}, thresholds
    )
    sim.run()
    size = 1000 * KV_BYTES_PER_TOKEN
    assert sim.num_finished == len(arrivals)
    for request in sim.requests:
        assert request is not None
        in_failing = 10 < request.arrival_s < 20
        assert request.transfer_failures == (1 if in_failing else 0)
        if in_failing:
            continue
        setup_s = 0.25 if 20 < request.arrival_s < 30 else 0.001
        assert request.transfer_s == pytest.approx(setup_s + size / 1e9, rel=1e-9)
    assert sim.transfer_failures == 10


def test_the_transfer_breaker_opens_in_an_incident_probes_it_and_closes_after_it() -> None:
    """The router's breaker (policies.transfer_health) in the simulator: open while transfers fail, one round of
    probes per window while the incident lasts, closed once a round of probes succeeds.

    Until the seventeenth session the simulator judged health by a failure average that moved only on new
    transfers, so once open it stayed open for the rest of the episode (nothing is sent while it is open).
    """
    base = {
        "link_bandwidth_bytes_per_s": 1e9,
        "failure_prob": 0.0,
        "timeout_s": 100.0,
        "unhealthy_failure_frac": 0.5,
        "health_window_s": 5.0,
        "health_min_samples": 3,
        "health_probe_requests": 2,
    }
    failing = {"start_s": 10, "end_s": 20, "failure_prob": 1.0}
    arrivals = np.arange(0.25, 40.0, 0.5)
    thresholds = replace(REMOTE_ALWAYS, on_kv_transfer_timeout=FallbackAction.LOCAL_AGGREGATED_SERVING)
    sim = simulator(scenario(1, 1, cluster=_net(base, failing)), {"t": columns(arrivals, 1000, 5)}, thresholds)
    sim.run()
    assert sim.num_finished == len(arrivals)
    requests = [r for r in sim.requests if r is not None]
    failed = [r.arrival_s for r in requests if r.transfer_failures]
    unhealthy = [r.arrival_s for r in requests if r.reason is RouteReason.KV_TRANSFER_UNHEALTHY]
    # a burst until the window holds as many failures as successes (10 ok in the 5 s before the incident) ...
    burst = [t for t in failed if t < 12.5]
    assert burst == [10.25, 10.75, 11.25, 11.75, 12.25]
    # ... then local for a window, one round of two probes that fail, local for another window
    assert failed[len(burst) :] == [17.75, 18.25]
    assert unhealthy[0] == 12.75
    assert unhealthy[-1] < 20 + 5.0
    # a round of probes after the incident succeeds: remote prefill is back for good
    after = [r for r in requests if r.arrival_s > unhealthy[-1]]
    assert after
    assert all(r.remote and r.transfer_failures == 0 for r in after)
    assert sim.groups[0].breaker.healthy(sim.now_s)


def test_transfer_windows_show_the_incident_and_the_recovery() -> None:
    base = {"link_bandwidth_bytes_per_s": 4.5e10, "setup_latency_s": 0.001, "timeout_s": 5.0}
    incident = {"start_s": 30, "end_s": 60, "link_bandwidth_bytes_per_s": 2e9, "failure_prob": 0.1}
    cols = random_columns(np.random.default_rng(11), 450, 5.0, max_input=6000, max_output=50)
    sim = simulator(scenario(2, 2, cluster=_net(base, incident)), {"t": cols}, seed=4)
    p95: list[float] = []
    failures: list[float] = []
    for end_s in range(10, 91, 10):
        sim.run_until(float(end_s))
        group = sim.snapshot().groups["g"]
        assert group.kv_transfer_time_p95_s is not None
        assert group.kv_transfer_failure_frac is not None
        p95.append(group.kv_transfer_time_p95_s)
        failures.append(group.kv_transfer_failure_frac)
    # windows ending at 10..30 s, 40..60 s (the incident), 70..90 s; the one ending at 70 s still holds transfers
    # that started before the recovery
    before, during, after = p95[:3], p95[3:6], p95[7:]
    assert min(during) > 5 * max(before)
    assert max(after) < 2 * max(before)
    assert max(failures[:3] + failures[7:]) == 0.0
    assert sum(failures[3:6]) > 0.0


# ------------------------------------------------------------------------------------------------ no change


def test_incidents_are_the_only_events_pushed_at_construction() -> None:
    assert simulator(scenario(1, 1), {})._heap == []
    incident = {"start_s": 1, "end_s": 2, "failure_prob": 0.5}
    heap = simulator(scenario(1, 1, cluster=_net({}, incident)), {})._heap
    assert [entry[0] for entry in heap] == [1, 2]


def _finish_times(sim: ClusterSimulator) -> list[tuple[float, float, float, int]]:
    return [(r.first_token_s, r.finished_s, r.transfer_s, r.transfer_failures) for r in sim.requests if r is not None]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    start_s=st.floats(0.0, 10.0),
    length_s=st.floats(0.1, 10.0),
    slow=st.floats(1e8, 4.5e10),
    failure_prob=st.sampled_from([0.0, 0.2, 1.0]),
)
def test_incidents_lose_nothing_and_a_no_op_incident_changes_nothing(
    seed: int, start_s: float, length_s: float, slow: float, failure_prob: float
) -> None:
    rng = np.random.default_rng(seed)
    cols = random_columns(rng, 120, 15.0, max_input=6000)
    base = {"link_bandwidth_bytes_per_s": 4.5e10, "failure_prob": 0.1, "timeout_s": 2.0}
    end_s = start_s + length_s
    plain = simulator(scenario(2, 2, cluster={"network": base}), {"t": cols}, seed=seed)
    plain.run()
    # an incident that overrides with the base values: extra events only, same draws, same results
    no_op = {"start_s": start_s, "end_s": end_s, **{k: base[k] for k in ("link_bandwidth_bytes_per_s", "failure_prob")}}
    same = simulator(scenario(2, 2, cluster=_net(base, no_op)), {"t": cols}, seed=seed)
    same.run()
    assert _finish_times(same) == _finish_times(plain)
    changed = {"start_s": start_s, "end_s": end_s, "link_bandwidth_bytes_per_s": slow, "failure_prob": failure_prob}
    sim = simulator(scenario(2, 2, cluster=_net(base, changed)), {"t": cols}, seed=seed)
    sim.run()
    assert sim.num_finished + sim.num_failed == 120
    for request in sim.requests:
        assert request is not None
        assert request.arrival_s <= request.first_token_s <= request.finished_s
    assert all(inst.link.flows == [] for inst in sim.instances)


def _eval_row(policy: str, scenario_name: str, seed: int) -> dict[str, str]:
    path = REPO / "experiments" / "results" / "baselines" / "results_seeds.csv"
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            key = (row["policy"], row["scenario"], row["seed"], row["tenant"])
            if key == (policy, scenario_name, str(seed), "ALL"):
                return row
    raise AssertionError(f"{path}: no ALL row for {policy} on {scenario_name}, seed {seed}")


def test_a_scenario_without_incidents_reproduces_the_committed_evaluation() -> None:
    from agents.evaluate import RunSpec, run_one

    expected = _eval_row("baseline:dynamo-legacy", "rag-surge-8", 0)
    result = run_one(RunSpec("baseline:dynamo-legacy", str(REPO / "experiments/scenarios/rag-surge-8.yaml"), 0))
    row = result.rows[-1]
    assert row["tenant"] == "ALL"
    assert row["weighted_goodput_rps"] == float(expected["weighted_goodput_rps"])  # exact: bit-for-bit the same run
    assert (row["arrived"], row["finished"]) == (int(expected["arrived"]), int(expected["finished"]))
    assert row["transfer_bytes"] == float(expected["transfer_bytes"])
    assert row["episode_return"] == float(expected["episode_return"])
