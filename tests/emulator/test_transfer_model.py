"""The emulator's KV-pull duration: the scenario's network settings and its incidents over the emulated clock."""

from __future__ import annotations

import pytest

from env.scenario import NetworkConfig
from livestack.emulator.engine import TransferModel

BYTES_PER_TOKEN = 1_000_000  # 1 MB a token: 1000 tokens are 1 GB


def _model(**network: object) -> TransferModel:
    return TransferModel(NetworkConfig.model_validate(network), BYTES_PER_TOKEN, tp=1)


def test_base_settings_without_a_start_time_or_incidents() -> None:
    base = _model(link_bandwidth_bytes_per_s=1e9, setup_latency_s=0.01, layout_bandwidth_bytes_per_s=1e10)
    assert base.duration_s(0) == 0.0
    assert base.duration_s(1000) == pytest.approx(0.01 + 1.0)
    assert base.duration_s(1000, remote_tp=2) == pytest.approx(0.01 + 1.0 + 2 * 0.1)
    assert base.layout_s(1000, remote_tp=2) == pytest.approx(0.1)  # the pack, and the unpack again
    assert base.layout_s(1000, remote_tp=1) == base.layout_s(1000) == base.layout_s(0, remote_tp=2) == 0.0
    assert base.duration_s(1000, start_s=50.0) == base.duration_s(1000)
    incident = {"start_s": 10, "end_s": 20, "link_bandwidth_bytes_per_s": 1e8}
    with_incident = _model(link_bandwidth_bytes_per_s=1e9, setup_latency_s=0.01, incidents=[incident])
    assert with_incident.duration_s(1000) == base.duration_s(1000)  # no start time: the base settings


def test_a_pull_crossing_an_incident_pays_each_period_at_its_rate() -> None:
    incident = {"start_s": 10, "end_s": 20, "link_bandwidth_bytes_per_s": 1e8, "setup_latency_s": 0.5}
    model = _model(link_bandwidth_bytes_per_s=1e9, setup_latency_s=0.0, incidents=[incident])
    assert model.duration_s(1000, start_s=0.0) == pytest.approx(1.0)  # done before the incident
    # starts 0.5 s before the drop: 0.5 GB at 1 GB/s, the other 0.5 GB at 0.1 GB/s
    assert model.duration_s(1000, start_s=9.5) == pytest.approx(0.5 + 5.0)
    # starts inside: the incident's setup latency, then 0.1 GB/s until 20 s, the rest at 1 GB/s
    assert model.duration_s(1000, start_s=18.5) == pytest.approx(0.5 + 1.0 + 0.9)
    assert model.setup_latency_s(18.5) == 0.5
    assert model.setup_latency_s(20.0) == 0.0
    assert model.setup_latency_s() == 0.0
    assert model.duration_s(1000, start_s=20.0) == pytest.approx(1.0)  # over: the base settings again
