"""Scenario files (shipped examples and error messages) and the ``pdctl sim`` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from env.scenario import ScenarioError, load_scenario, parse_scenario
from pdctl.cli import app

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("mixed-chat-rag-4p4d", "mixed-chat-rag-aggregated", "azure-conv-4p4d", "mooncake-conv-16")
SCENARIOS = [REPO / "experiments" / "scenarios" / f"{name}.yaml" for name in SHIPPED]
POLICY = REPO / "policies" / "examples" / "multi_tenant.yaml"
runner = CliRunner()

SMALL = """\
name: small
duration_s: 20
control_interval_s: 5
seed: 3
cluster: {profile: h200-llama3-8b, network: {failure_prob: 0.01}}
tenant_groups:
  - {name: interactive, gpu_budget: 3, prefill: 1, decode: 2}
tenants:
  - name: chatbot
    group: interactive
    slo: {ttft_p95_s: 0.5, tpot_p95_s: 0.05}
    workload:
      kind: poisson
      rate_rps: 20
      input_tokens: {kind: lognormal, median_tokens: 1500, sigma: 0.8, max_tokens: 16000}
      output_tokens: {kind: fixed, tokens: 150}
  - name: rag
    group: interactive
    workload: {kind: poisson, rate_rps: 3, input_tokens: {kind: fixed, tokens: 6000},
               output_tokens: {kind: fixed, tokens: 300}}
"""


def test_scenarios_ship_and_parse() -> None:
    for path in SCENARIOS:
        scenario = load_scenario(path)
        assert scenario.duration_s > 0
        assert scenario.tenants
        groups = scenario.groups_schema()
        assert set(groups) == {g.name for g in scenario.tenant_groups}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SMALL.replace("seed: 3", "seed: 3\nspeed: 1"), "small.yaml:5: speed: Extra inputs are not permitted"),
        (SMALL.replace("rate_rps: 20", "rate_rps: -1"), "small.yaml:14: tenants[0].workload.rate_rps:"),
        (SMALL.replace("group: interactive\n    slo", "group: nope\n    slo"), "unknown group 'nope'"),
        (SMALL.replace("prefill: 1, decode: 2", "prefill: 2, decode: 2"), "gpu_budget"),
        ("name: [1, 2\n", "small.yaml:2: not valid YAML"),
    ],
)
def test_invalid_scenarios_name_file_line_and_field(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert expected in str(info.value)
    assert "\n" not in info.value.problems[0]


def test_missing_scenario_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read scenario"):
        load_scenario(tmp_path / "absent.yaml")
    with pytest.raises(ScenarioError, match="mapping"):
        parse_scenario("- 1\n")


def test_pdctl_sim_runs_and_writes_json(tmp_path: Path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    out = tmp_path / "out.json"
    result = runner.invoke(app, ["sim", "--scenario", str(path), "--policy", f"file:{POLICY}", "--json", str(out)])
    assert result.exit_code == 0, result.output
    for word in ("chatbot", "rag", "TTFT", "TPOT", "SLO", "goodput", "GPU-seconds", "requests/s"):
        assert word in result.output
    summary = json.loads(out.read_text())
    assert summary["num_finished"] + summary["num_failed"] + summary["num_in_flight"] == summary["num_requests"] > 300
    tenants = {t["tenant"]: t for t in summary["tenants"]}
    assert tenants["chatbot"]["ttft_p50_s"] <= tenants["chatbot"]["ttft_p99_s"]
    for t in tenants.values():  # attainment is over arrivals (policies.scoring)
        assert t["slo_met"] <= t["finished"] <= t["arrived"]
        assert t["slo_attainment_frac"] == pytest.approx(t["slo_met"] / t["arrived"])
    assert summary["gpu_seconds"] >= 3 * 20
    again = runner.invoke(app, ["sim", "--scenario", str(path), "--policy", f"file:{POLICY}", "--seed", "3"])
    assert again.exit_code == 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--policy", "baseline:static"], "unknown baseline 'static'"),
        (["--policy", "learned:/nonexistent/artifact"], "/nonexistent/artifact/manifest.json: missing"),
        (["--policy", "file:/nonexistent/policy.yaml"], "/nonexistent/policy.yaml"),
        (["--policy", "nonsense"], "policy spec 'nonsense': expected one of file:PATH, baseline:NAME"),
    ],
)
def test_pdctl_sim_refuses_bad_policies(tmp_path: Path, args: list[str], expected: str) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    result = runner.invoke(app, ["sim", "--scenario", str(path), *args])
    assert result.exit_code == 2
    assert expected in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_pdctl_sim_bad_scenario_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(SMALL.replace("duration_s: 20", "duration_s: 20\nbogus_field: 1"))
    result = runner.invoke(app, ["sim", "--scenario", str(path), "--policy", f"file:{POLICY}"])
    assert result.exit_code == 2
    assert "bogus_field" in result.output
    assert str(path) in result.output
    missing = runner.invoke(app, ["sim", "--scenario", str(tmp_path / "nope.yaml"), "--policy", f"file:{POLICY}"])
    assert missing.exit_code == 2
    assert "nope.yaml" in missing.output
    trace = SMALL.replace(
        "workload: {kind: poisson, rate_rps: 3, input_tokens: {kind: fixed, tokens: 6000},\n"
        "               output_tokens: {kind: fixed, tokens: 300}}",
        "workload: {kind: trace_azure, path: /nonexistent/trace.csv}",
    )
    path.write_text(trace)
    result = runner.invoke(app, ["sim", "--scenario", str(path), "--policy", f"file:{POLICY}"])
    assert result.exit_code == 2
    assert "/nonexistent/trace.csv" in result.output
    assert "Traceback" not in result.output
