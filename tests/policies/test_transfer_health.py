"""The KV-transfer breaker of the core (policies.transfer_health): closed, open and half-open, and that the router and
the simulator judge with it under the same defaults."""

from __future__ import annotations

import pytest

from env.scenario import NetworkConfig
from policies.transfer_health import BreakerState, TransferBreaker
from router.config import HealthConfig
from router.estimates import TransferHealth


def _breaker(changes: list[tuple[BreakerState, int, int]], probes: int = 2) -> TransferBreaker:
    return TransferBreaker(10.0, 4, 0.5, probes, on_change=lambda *change: changes.append(change))


def test_opens_at_the_failed_fraction_once_enough_outcomes_are_in_the_window() -> None:
    changes: list[tuple[BreakerState, int, int]] = []
    breaker = _breaker(changes)
    for t in range(3):
        breaker.record(float(t), False)
    assert breaker.healthy(2.5)  # three outcomes: too few to judge
    assert breaker.allows_remote(2.5)
    breaker.record(3.0, True)
    assert breaker.failure_frac(3.0) == 0.75
    assert not breaker.healthy(3.0)
    assert not breaker.allows_remote(12.9)  # open for window_s from 3.0
    assert changes == [("open", 3, 4)]


def test_half_open_lets_a_round_of_probes_through_and_closes_on_their_success() -> None:
    changes: list[tuple[BreakerState, int, int]] = []
    breaker = _breaker(changes)
    for t in range(4):
        breaker.record(float(t), False)
    assert breaker.allows_remote(13.0)  # 3.0 + window_s: half-open
    assert breaker.state == "half_open"
    assert not breaker.healthy(13.0)  # not healthy until the probes say so
    breaker.sent_remote(13.0)
    assert breaker.allows_remote(13.1)
    breaker.sent_remote(13.1)
    assert not breaker.allows_remote(13.2)  # both probe slots taken: the rest stay local
    breaker.record(13.5, True)
    assert breaker.state == "half_open"
    assert breaker.allows_remote(13.5)  # a slot is free again, but one outcome does not decide
    breaker.record(13.6, True)
    assert breaker.healthy(13.6)
    assert breaker.failure_frac(13.6) is None  # closed with an empty window: old failures do not count again
    assert changes == [("open", 4, 4), ("half_open", 0, 0), ("closed", 0, 2)]


def test_failed_probes_open_it_again_for_another_window() -> None:
    changes: list[tuple[BreakerState, int, int]] = []
    breaker = _breaker(changes)
    for i in range(4):
        breaker.record(float(i), False)
    for t in (13.0, 13.1):
        assert breaker.allows_remote(t)
        breaker.sent_remote(t)
    breaker.record(13.5, False)
    breaker.record(13.6, True)  # one of two failed: 0.5 >= unhealthy_frac
    assert breaker.state == "open"
    assert not breaker.allows_remote(23.5)
    assert breaker.allows_remote(23.6)
    assert [c[0] for c in changes] == ["open", "half_open", "open", "half_open"]


def test_a_lost_probe_is_given_up_after_a_window() -> None:
    breaker = TransferBreaker(10.0, 4, 0.5, probe_requests=1)
    for t in range(4):
        breaker.record(float(t), False)
    assert breaker.allows_remote(13.0)
    breaker.sent_remote(13.0)  # its outcome never comes (the request was lost)
    assert not breaker.allows_remote(22.9)
    assert breaker.allows_remote(23.0)


def test_successes_keep_a_path_with_rare_failures_closed() -> None:
    breaker = TransferBreaker(30.0, 8, 0.5)
    for i in range(100):
        breaker.record(i * 0.25, ok=i % 3 != 0)  # a third fail
    assert breaker.healthy(25.0)
    assert breaker.failure_frac(25.0) == pytest.approx(1 / 3, abs=0.02)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"window_s": 0.0}, "window_s"),
        ({"min_samples": 0}, "min_samples"),
        ({"unhealthy_frac": 1.5}, "unhealthy_frac"),
        ({"probe_requests": 0}, "probe_requests"),
    ],
)
def test_bad_settings_name_the_parameter(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TransferBreaker(**kwargs)  # type: ignore[arg-type]


def test_router_and_simulator_judge_with_the_same_breaker_and_defaults() -> None:
    net, health = NetworkConfig(), HealthConfig()
    assert (net.health_window_s, net.health_min_samples, net.unhealthy_failure_frac, net.health_probe_requests) == (
        health.transfer_window_s,
        health.transfer_min_samples,
        health.transfer_unhealthy_frac,
        health.transfer_probe_requests,
    )
    router = TransferHealth(health.transfer_window_s, health.transfer_min_samples, health.transfer_unhealthy_frac, 2)
    sim = TransferBreaker(net.health_window_s, net.health_min_samples, net.unhealthy_failure_frac, 2)
    assert isinstance(router, TransferBreaker)
    states = set()
    for t in range(400):
        now_s = t * 0.7
        ok = (t * 7919) % 5 != 0 and not 40 <= t < 150
        allowed = router.allows_remote(now_s)
        assert allowed == sim.allows_remote(now_s)
        if allowed:
            router.sent_remote(now_s)
            sim.sent_remote(now_s)
            router.record(now_s + 0.3, ok)
            sim.record(now_s + 0.3, ok)
        assert router.state == sim.state
        assert router.failure_frac(now_s + 0.3) == sim.failure_frac(now_s + 0.3)
        states.add(router.state)
    assert states == {"closed", "open", "half_open"}
