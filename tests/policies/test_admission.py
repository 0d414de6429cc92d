"""The admission stage's core: the TTFT estimate on each route and the admit/refuse rule."""

from __future__ import annotations

import math

import pytest

from policies.admission import AdmissionConfig, admits, estimated_ttft_s
from policies.schema import LiveState, Route, RouteDecision, RouteReason

REMOTE = RouteDecision(Route.REMOTE_PREFILL, RouteReason.LONG_PROMPT)
LOCAL = RouteDecision(Route.LOCAL_PREFILL, RouteReason.SHORT_PROMPT)


def test_remote_estimate_is_the_prefill_queue_wait_plus_the_own_prompt() -> None:
    live = LiveState(prefill_queue_wait_s=1.5)
    assert estimated_ttft_s(REMOTE, live, 2000, 999_999, 10_000.0) == pytest.approx(1.7)


def test_local_estimate_reads_the_decode_instance_queue() -> None:
    live = LiveState(prefill_queue_wait_s=100.0)  # the prefill queue is not the one a local request joins
    assert estimated_ttft_s(LOCAL, live, 1000, 9000, 10_000.0) == pytest.approx(1.0)


def test_remote_without_a_known_prefill_wait_is_estimated_as_local() -> None:
    assert estimated_ttft_s(REMOTE, LiveState(), 1000, 4000, 10_000.0) == pytest.approx(0.5)


def test_refuses_only_past_the_objective_times_the_slack() -> None:
    on = AdmissionConfig(ttft_slack_frac=1.0)
    assert admits(on, 1.0, 1.0)
    assert not admits(on, 1.0, 1.0001)
    assert admits(AdmissionConfig(ttft_slack_frac=2.0), 1.0, 1.9)
    assert admits(AdmissionConfig(), 1.0, 1e9)  # off
    assert admits(on, math.inf, 1e9)  # a tenant without a TTFT objective


@pytest.mark.parametrize(("slack", "retry"), [(0.0, 1.0), (-1.0, 1.0), (math.nan, 1.0), (math.inf, 1.0), (1.0, -1.0)])
def test_bad_settings_are_refused_in_one_line(slack: float, retry: float) -> None:
    with pytest.raises(ValueError, match="admission"):
        AdmissionConfig(slack, retry)
