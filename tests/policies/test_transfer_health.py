"""The KV-transfer breaker of the core (policies.transfer_health), and that the router and the simulator judge
with it under the same defaults."""

from __future__ import annotations

import pytest

from env.scenario import NetworkConfig
from policies.transfer_health import TransferBreaker
from router.config import HealthConfig
from router.estimates import TransferHealth


def test_opens_at_the_failed_fraction_once_enough_outcomes_are_in_the_window() -> None:
    changes: list[tuple[bool, int, int]] = []
    breaker = TransferBreaker(10.0, 4, 0.5, on_change=lambda *change: changes.append(change))
    for t in range(3):
        breaker.record(float(t), False)
    assert breaker.healthy(2.5)
    assert not breaker.is_open
    breaker.record(3.0, True)
    assert breaker.failure_frac(3.0) == 0.75
    assert not breaker.healthy(3.0)
    assert breaker.is_open
    assert changes == [(True, 3, 4)]
    # the failures age out one by one: at 10.5 s the first has left (2 of 3: too few), the breaker closes
    assert breaker.healthy(10.5)
    assert changes == [(True, 3, 4), (False, 2, 3)]
    assert breaker.failure_frac(13.5) is None  # all gone: the next remote request is the probe


def test_successes_keep_a_path_with_rare_failures_closed() -> None:
    breaker = TransferBreaker(30.0, 8, 0.5)
    for i in range(100):
        breaker.record(i * 0.25, ok=i % 3 != 0)  # a third fail
    assert breaker.healthy(25.0)
    assert breaker.failure_frac(25.0) == pytest.approx(1 / 3, abs=0.02)


def test_it_never_stays_open_without_new_outcomes() -> None:
    """An open breaker sends nothing; the window still empties and the path is tried again (half-open)."""
    breaker = TransferBreaker(30.0, 8, 0.5)
    for i in range(8):
        breaker.record(100.0 + i, False)
    assert not breaker.healthy(107.0)
    assert not breaker.healthy(129.9)  # all eight failures are still in the window
    assert breaker.healthy(130.1)  # the first has left: seven are too few to judge


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"window_s": 0.0}, "window_s"), ({"min_samples": 0}, "min_samples"), ({"unhealthy_frac": 1.5}, "unhealthy_frac")],
)
def test_bad_settings_name_the_parameter(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TransferBreaker(**kwargs)  # type: ignore[arg-type]


def test_router_and_simulator_judge_with_the_same_breaker_and_defaults() -> None:
    net, health = NetworkConfig(), HealthConfig()
    assert (net.health_window_s, net.health_min_samples, net.unhealthy_failure_frac) == (
        health.transfer_window_s,
        health.transfer_min_samples,
        health.transfer_unhealthy_frac,
    )
    router = TransferHealth(health.transfer_window_s, health.transfer_min_samples, health.transfer_unhealthy_frac)
    sim = TransferBreaker(net.health_window_s, net.health_min_samples, net.unhealthy_failure_frac)
    assert isinstance(router, TransferBreaker)
    outcomes = [(t * 0.7, (t * 7919) % 5 != 0 and not 40 <= t < 60) for t in range(200)]
    for now_s, ok in outcomes:
        router.record(now_s, ok)
        sim.record(now_s, ok)
        assert router.healthy(now_s + 0.1) == sim.healthy(now_s + 0.1)
        assert router.failure_frac(now_s) == sim.failure_frac(now_s)
