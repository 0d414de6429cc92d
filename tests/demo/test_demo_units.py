"""Unit tests of the demo's pure parts: scenario rescaling, policy scaling, SLO attainment, bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from env.scenario import load_scenario
from env.workloads.config import StepWorkload
from pdctl.cli import app
from pdctl.demo.config import (
    DEFAULT_POLICY_FILE,
    DEFAULT_SCENARIO,
    DemoInputError,
    DemoOptions,
    RequestSloBounds,
    controller_config,
    load_demo_scenario,
    rescale_scenario,
    scaled_policy_document,
    tenant_slos,
)
from pdctl.demo.monitor import _JsonlTail, remote_min_tokens
from pdctl.demo.report import surge_tenants, surge_window_s, tenant_outcomes


def test_rescaled_scenario_keeps_the_surge_mid_run() -> None:
    scenario = load_scenario(DEFAULT_SCENARIO)
    short = rescale_scenario(scenario, 30.0)
    assert short.duration_s == 30.0
    surge, others = surge_tenants(short)
    assert surge == "rag"
    assert others == ["chatbot"]
    assert surge_window_s(short, "rag") == pytest.approx((7.5, 22.5))
    rag = next(t for t in short.tenants if t.name == "rag").workload
    assert isinstance(rag, StepWorkload)
    assert [s.rate_rps for s in rag.segments] == [s.rate_rps for s in scenario.tenants[1].workload.segments]  # type: ignore[union-attr]


def test_demo_scenario_tenants_have_the_policy_files_objectives() -> None:
    scenario = load_demo_scenario(DemoOptions(duration_s=60, seed=3))
    assert scenario.seed == 3
    assert scenario.duration_s == 60
    slos = tenant_slos(scenario, DEFAULT_POLICY_FILE)
    assert slos == {"chatbot": RequestSloBounds(0.5, 0.05), "rag": RequestSloBounds(3.0, 0.08)}
    by_name = {t.name: t for t in scenario.tenants}
    assert by_name["chatbot"].slo.ttft_p95_s == 0.5
    assert by_name["rag"].slo.ttft_p95_s == 3.0


def test_policy_milliseconds_follow_the_time_scale() -> None:
    same = scaled_policy_document(DEFAULT_POLICY_FILE, 1.0)
    half = scaled_policy_document(DEFAULT_POLICY_FILE, 0.5)
    rag = next(t for t in half["tenants"] if t["name"] == "rag")
    assert rag["slo"]["ttft_p95_ms"] == 1500.0
    assert rag["pd_disaggregation_policy"]["remote_prefill"]["max_prefill_queue_wait_ms"] == 5000.0
    assert rag["pd_disaggregation_policy"]["remote_prefill"]["min_input_tokens"] == 1536
    assert remote_min_tokens(same, "rag") == 1536
    assert remote_min_tokens(same, "chatbot") == 2048


def test_controller_config_is_valid_for_both_sources(tmp_path: Path) -> None:
    from controller.config import load_config

    for prometheus_url in ("http://127.0.0.1:9", None):
        data = controller_config(
            mode="advisory", policy="baseline:queue_kv", policy_path=DEFAULT_POLICY_FILE, port=0,
            router_url="http://127.0.0.1:8", token="t", urls={"p0": "http://127.0.0.1:7", "d0": "http://127.0.0.1:6"},
            roles={"p0": "prefill", "d0": "decode"}, group="interactive", audit_log=tmp_path / "a.jsonl",
            override_dir=tmp_path, prometheus_url=prometheus_url, time_scale=0.5, interval_s=2.0,
        )  # fmt: skip
        path = tmp_path / "c.yaml"
        import yaml

        path.write_text(yaml.safe_dump(data))
        config = load_config(path)
        assert config.interval_s == 1.0
        assert config.mode == "advisory"
        assert config.source.kind == ("prometheus" if prometheus_url else "scrape")


def _req(
    tenant: str, ttft: float | None, tpot: float | None, status: int = 200, error: str | None = None
) -> dict[str, Any]:
    return {"tenant": tenant, "ttft_s": ttft, "tpot_s": tpot, "status": status, "error": error, "arrival_s": 0.0}


def test_attainment_counts_failures_as_misses_and_one_token_requests_as_tpot_met() -> None:
    slos = {"rag": RequestSloBounds(3.0, 0.08), "chat": RequestSloBounds(0.5, 0.05)}
    requests = [
        _req("rag", 1.0, 0.01),
        _req("rag", 4.0, 0.01),
        _req("rag", None, None, status=503, error="x"),
        _req("rag", 2.0, None),
        _req("chat", 0.1, 0.06),
    ]
    out = tenant_outcomes(requests, slos, duration_s=10.0)
    assert out["rag"].num_requests == 4
    assert out["rag"].num_ok == 3
    assert out["rag"].ttft_attainment_frac == pytest.approx(2 / 4)
    assert out["rag"].tpot_attainment_frac == pytest.approx(3 / 4)
    assert out["rag"].slo_attainment_frac == pytest.approx(2 / 4)
    assert out["rag"].goodput_rps == pytest.approx(0.2)
    assert out["chat"].tpot_attainment_frac == 0.0
    assert out["chat"].ttft_attainment_frac == 1.0


def test_jsonl_tail_returns_only_complete_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    tail = _JsonlTail(path)
    assert tail.read() == []
    path.write_text('{"a": 1}\n{"b"')
    assert tail.read() == [{"a": 1}]
    with path.open("a") as handle:
        handle.write(": 2}\n")
    assert tail.read() == [{"b": 2}]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--duration", "5"], "--duration"),
        (["--time-scale", "0"], "--time-scale"),
        (["--scenario", "/nonexistent.yaml"], "no such file"),
        (["--policy", "baseline:nope"], "--policy"),
        (["--policy", "nonsense"], "--policy"),
        (["--seed", "-1"], "--seed"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "out"), *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("pdctl demo:"), result.output
    assert needle in lines[0], result.output


def test_options_validation_names_the_flag() -> None:
    with pytest.raises(DemoInputError, match="--duration"):
        DemoOptions(duration_s=float("nan")).validate()


def test_dashboard_frame_and_plain_line_show_the_state() -> None:
    from rich.console import Console

    from pdctl.demo.dashboard import plain_line, render
    from pdctl.demo.monitor import ControllerView, Snapshot, TenantView

    snap = Snapshot(
        phase="controlled",
        t_s=42.0,
        duration_s=120.0,
        tenants=[
            TenantView("chatbot", 50, 0.092, 0.013, RequestSloBounds(0.5, 0.05), 2.5, 0.0, 0, 0, 2048),
            TenantView("rag", 115, 6.708, 0.014, RequestSloBounds(3.0, 0.08), 3.3, 0.89, 2, 0, 364),
        ],
        num_prefill=4,
        num_decode=4,
        num_pending=1,
        route_counts={"local_prefill": 75, "remote_prefill": 103},
        transfer_mean_s=0.0374,
        num_requests_total=178,
        controller=ControllerView(13, "active", "baseline:queue_kv", "interactive:prefill_pressure_shift", "x", 5),
        router_reachable=True,
    )
    console = Console(width=120, record=True)
    console.print(render(snap))
    text = console.export_text()
    for needle in ("6708 / 3000", "92 / 500", "prefill 4  decode 4", "89%", "37.4 ms", "prefill_pressure_shift"):
        assert needle in text, text
    line = plain_line(snap)
    assert "P/D 4/4" in line
    assert "rag: TTFTp95 6708/3000ms" in line
