"""The controller warns while a policy fitted behind the router's admission stage runs without it (or at another slack).

The router reports its admission slack in ``GET /admin/state`` (and as ``pdctl_router_admission_ttft_slack_frac``);
the control loop reads it every tick through the router actuator, compares it with the slack the policy's manifest
says it was fitted behind, logs once per change and sets ``pdctl_controller_admission_mismatch``. Real router and
emulated instances on loopback; the metric source is a fixed readout (the pairing does not depend on traffic).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.actuators.router import AdmissionReading, RouterActuator, admission_mismatch
from controller.audit import AuditLog
from controller.clock import VirtualClock
from controller.loop import ControlLoop
from controller.overrides import OverrideWatcher
from controller.sources.base import Readout
from controller.telemetry import Telemetry
from tests.controller.test_loop import FakeReader, make_config, make_runtime
from tests.router.cluster import ADMIN_TOKEN, live_cluster

POLICY = """
pd_disaggregation_policy:
  remote_prefill: {min_input_tokens: 4096}
  local_prefill: {max_input_tokens: 2048}
tenant_groups:
  - {name: g, gpu_budget: 2, pools: {prefill: {min: 0, max: 1}, decode: {min: 1, max: 2}}}
tenants:
  - {name: chat, group: g, slo: {ttft_p95_ms: 5000, tpot_p95_ms: 1000}}
"""


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        ({"ttft_slack_frac": 1.0}, AdmissionReading(1.0)),
        ({"ttft_slack_frac": 2}, AdmissionReading(2.0)),
        ({"ttft_slack_frac": None}, AdmissionReading(None)),
        (None, None),  # a router that does not report it: unknown, never a mismatch
        ({}, None),
        ({"ttft_slack_frac": "1.0"}, None),
        ({"ttft_slack_frac": True}, None),
        ({"ttft_slack_frac": -1.0}, None),
        ({"ttft_slack_frac": float("nan")}, None),
    ],
)
def test_the_admission_block_is_read_or_unknown(block: object, expected: AdmissionReading | None) -> None:
    assert AdmissionReading.of(block) == expected


def test_only_a_policy_fitted_behind_the_stage_asks_for_it() -> None:
    assert admission_mismatch(None, AdmissionReading(None)) is None  # fitted without it: runs anywhere
    assert admission_mismatch(None, AdmissionReading(1.0)) is None
    assert admission_mismatch(1.0, AdmissionReading(1.0)) is None
    assert admission_mismatch(1.0, None) is None  # unknown: no warning
    off = admission_mismatch(1.0, AdmissionReading(None))
    assert off is not None
    assert "stage is off" in off
    assert "admission.ttft_slack_frac: 1" in off
    other = admission_mismatch(1.0, AdmissionReading(2.0))
    assert other is not None
    assert "runs at slack 2" in other


def _loop(tmp_path: Path, url: str, policy: str) -> tuple[ControlLoop, Telemetry]:
    config = make_config(
        tmp_path,
        policy=policy,
        instances=[{"id": "p0", "group": "g", "role": "prefill"}, {"id": "d0", "group": "g", "role": "decode"}],
        actuators=[{"kind": "router", "url": url, "token": ADMIN_TOKEN, "timeout_s": 5.0}],
    )
    (tmp_path / "policy.yaml").write_text(POLICY)
    telemetry = Telemetry(CollectorRegistry())
    loop = ControlLoop(
        make_runtime(config, FakeReader(Readout({}, 10.0, 0.0))),
        VirtualClock(),
        telemetry,
        AuditLog(config.audit_log),
        OverrideWatcher(config.override_dir),
    )
    return loop, telemetry


def _mismatch(telemetry: Telemetry) -> float | None:
    return telemetry.registry.get_sample_value("pdctl_controller_admission_mismatch")


@pytest.mark.integration
@pytest.mark.timeout(60)
async def test_learned_admission_behind_a_router_without_the_stage_is_flagged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with live_cluster(tmp_path, policy_yaml=POLICY) as c:
        async with c.session.get(c.url + "/metrics") as r:
            assert "pdctl_router_admission_ttft_slack_frac 0.0" in await r.text()
        loop, telemetry = _loop(tmp_path, c.url, "learned:admission")
        with caplog.at_level(logging.WARNING, logger="controller.loop"):
            first = await loop.tick()
            second = await loop.tick()
        await loop.runtime.close()
    assert _mismatch(telemetry) == 1.0
    warnings = [r.getMessage() for r in caplog.records if "admission stage" in r.getMessage()]
    assert len(warnings) == 1  # once per change, not every tick
    assert "fitted behind the router's admission stage at slack 1" in warnings[0]
    assert "stage is off" in warnings[0]
    records: list[Mapping[str, Any]] = [first.record, second.record]
    assert all("stage is off" in r["admission_mismatch"] for r in records)
    assert not any("admission" in reason for reason in loop.not_ready_reasons)  # a warning, never a reason to stop


@pytest.mark.integration
@pytest.mark.timeout(60)
@pytest.mark.parametrize(("policy", "slack", "expected"), [
    ("learned:admission", 1.0, 0.0),  # paired
    ("learned:admission", 2.0, 1.0),  # another slack
    ("learned:default", None, 0.0),  # fitted without it: fine without it
    ("learned:default", 1.0, 0.0),  # and fine behind it
])  # fmt: skip
async def test_the_router_reports_its_slack_and_the_controller_pairs_it(
    tmp_path: Path, policy: str, slack: float | None, expected: float
) -> None:
    overrides = {} if slack is None else {"admission": {"ttft_slack_frac": slack}}
    async with live_cluster(tmp_path, policy_yaml=POLICY, router_overrides=overrides) as c:
        async with c.session.get(c.url + "/metrics") as r:
            assert f"pdctl_router_admission_ttft_slack_frac {slack or 0.0}" in await r.text()
        loop, telemetry = _loop(tmp_path, c.url, policy)
        record = await loop.tick()
        await loop.runtime.close()
    actuator = loop.runtime.actuators[0]
    assert isinstance(actuator, RouterActuator)
    assert actuator.admission == AdmissionReading(slack)
    assert _mismatch(telemetry) == expected
    assert ("admission_mismatch" in record.record) == bool(expected)
