"""``pdctl plan`` on the command line: every kind of SOURCE, and bad input (one line, exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from agents.planning import PlanInputError, parse_slo
from pdctl.cli import app

REPO = Path(__file__).resolve().parents[2]
MIXED = REPO / "experiments" / "scenarios" / "mixed-chat-rag-4p4d.yaml"
runner = CliRunner()
FAST = ["--gpus", "2", "--horizon", "5", "--workers", "1", "--no-cache", "--quiet"]


def _plan(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["plan", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ttft_p95=2s,tpot_p95=80ms", {"ttft_p95_s": 2.0, "tpot_p95_s": 0.08}),
        ("tpot_p99=0.1", {"tpot_p99_s": 0.1}),
        (" ttft_p99 = 1500ms , ", {"ttft_p99_s": 1.5}),
    ],
)
def test_slo_syntax(text: str, expected: dict[str, float]) -> None:
    slo = parse_slo(text)
    for name, value in expected.items():
        assert getattr(slo, name) == pytest.approx(value)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("ttft_p95=2x", "ttft_p95"),
        ("ttft_p90=2s", "ttft_p90"),
        ("tpot_p95", "tpot_p95"),
        ("tpot_p95=0ms", "tpot_p95"),
        ("ttft_p95=1s,ttft_p95=2s", "ttft_p95"),
        ("", "--slo"),
    ],
)
def test_bad_slo_names_the_field(text: str, field: str) -> None:
    with pytest.raises(PlanInputError, match=field):
        parse_slo(text)


def _one_line_error(code: int, output: str, *needles: str) -> None:
    assert code == 2, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_bad_input_is_one_line_naming_the_file_or_field(tmp_path: Path, traces_dir: Path) -> None:
    azure = str(traces_dir / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv")
    _one_line_error(*_plan("--workload", str(tmp_path / "nope.csv"), "--slo", "ttft_p95=1s", *FAST), "nope.csv")
    _one_line_error(*_plan("--workload", azure, "--slo", "ttft_p95=1q", *FAST), "--slo", "ttft_p95")
    _one_line_error(*_plan("--workload", azure, "--gpus", "2"), "--slo")
    _one_line_error(*_plan("--workload", azure, "--slo", "ttft_p95=1s"), "--gpus")
    _one_line_error(*_plan("--workload", azure, "--slo", "ttft_p95=1s", "--gpus", "0"), "--gpus")
    _one_line_error(
        *_plan("--workload", azure, "--slo", "ttft_p95=1s", "--model-profile", "h200-llama9-1b", *FAST),
        "--model-profile",
    )
    _one_line_error(*_plan("--workload", str(MIXED), "--gpus", "1", "--tp", "2"), "--gpus")
    _one_line_error(*_plan("--workload", str(MIXED), "--model-profile", "h200-llama3-70b", *FAST), "--tp", "70b")
    _one_line_error(*_plan("--workload", str(MIXED), "--levels", "12,x", *FAST), "--levels")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nduration_s: 10\ntenant_groups: [{name: g, gpu_budget: 2, decode: 1}]\ntenants:\n"
                      "  - {name: t, group: g, bogus: 1, workload: {kind: poisson}}\n")  # fmt: skip
    _one_line_error(*_plan("--workload", str(broken), *FAST), "broken.yaml")
    fitted = tmp_path / "fitted.yaml"
    fitted.write_text("chat: {kind: poisson, rate_rps: -1}\n")
    _one_line_error(*_plan("--workload", str(fitted), "--slo", "ttft_p95=1s", *FAST), "fitted.yaml", "chat")


def test_a_bad_fitted_workload_names_its_field_and_a_non_stationary_one_asks_for_a_scenario(tmp_path: Path) -> None:
    """A fitted-workload file's problem is pydantic's field and message (not its help link), and a workload that runs
    a duration of its own (diurnal, step) is refused, since the file has none (it used to fail on a null duration)."""
    lengths = "input_tokens: {kind: fixed, tokens: 512}, output_tokens: {kind: fixed, tokens: 64}"
    missing = tmp_path / "missing.yaml"
    missing.write_text("chat: {kind: poisson, rate_rps: 2}\n")
    code, output = _plan("--workload", str(missing), "--slo", "ttft_p95=1s", *FAST)
    _one_line_error(code, output, "missing.yaml", "chat", "input_tokens: Field required", "and 1 more")
    assert "errors.pydantic.dev" not in output
    diurnal = tmp_path / "diurnal.yaml"
    diurnal.write_text(f"chat: {{kind: diurnal, mean_rate_rps: 2, peak_to_mean: 1.5, period_s: 600, {lengths}}}\n")
    code, output = _plan("--workload", str(diurnal), "--slo", "ttft_p95=1s", *FAST)
    _one_line_error(code, output, "diurnal.yaml", "kinds diurnal", "duration_s")
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(
        f"chat: {{kind: poisson, rate_rps: 2, {lengths}}}\n"
        f"batch: {{kind: step, segments: [[0, 1], [60, 3]], {lengths}}}\n"
    )
    code, output = _plan("--workload", str(mixed), "--slo", "ttft_p95=1s", *FAST)
    _one_line_error(code, output, "mixed.yaml", "kinds poisson, step", "duration_s")


def test_plan_of_a_trace_writes_results_and_a_valid_policy(tmp_path: Path, traces_dir: Path) -> None:
    azure = traces_dir / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
    policy = tmp_path / "policy.yaml"
    code, output = _plan(
        "--workload", str(azure), "--slo", "ttft_p95=2s,tpot_p95=80ms", "--out", str(tmp_path / "o"),
        "--emit-policy", str(policy), *FAST,
    )  # fmt: skip
    assert code == 0, output
    assert "best:" in output
    assert "max sustainable rate" in output
    document = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert document["gpus"] == 2
    assert {row["label"] for row in document["ranked"]} >= {"aggregated x2"}
    assert document["pareto"]
    assert document["max_sustainable_rps"] > 0
    # --horizon is a quick look: the report says what it leaves out and warns that the part differs from the whole
    assert "leaving out" in output
    assert "differs materially" in output
    assert document["coverage"]["mode"] == "horizon"
    assert all(p["covered_source_s"] == [0.0, pytest.approx(5.0 * p["rate_scale"])] for p in document["probes"])
    # the validation replay runs by default, over the whole trace, on a seed the search did not use
    assert "validation replay (whole source, seed 1)" in output
    validation = document["validation"]
    assert validation["seed"] == 1
    assert validation["replays"]
    assert validation["replays"][0]["num_arrived"] == document["coverage"]["whole"]["requests"]
    validate = runner.invoke(app, ["policy", "validate", str(policy)])
    assert validate.exit_code == 0, validate.output
    assert [t["name"] for t in yaml.safe_load(policy.read_text())["tenants"]] == ["default"]


def test_plan_of_a_fitted_workload_from_pdctl_profile(tmp_path: Path, traces_dir: Path) -> None:
    fitted = tmp_path / "fitted.yaml"
    azure = traces_dir / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    profile = runner.invoke(app, ["profile", str(azure), "--emit-workload", str(fitted), "--json", "-"])
    assert profile.exit_code == 0, profile.output
    code, output = _plan("--workload", str(fitted), "--slo", "ttft_p95=2s,tpot_p95=80ms", *FAST)
    assert code == 0, output
    assert "best:" in output


def test_an_unreachable_slo_is_reported_and_writes_no_policy(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    result = runner.invoke(
        app, ["plan", "--workload", str(MIXED), "--slo", "ttft_p95=1ms", "--emit-policy", str(policy), *FAST]
    )
    assert result.exit_code == 1
    assert "no configuration reaches 90% SLO attainment" in result.output
    assert not policy.exists()
