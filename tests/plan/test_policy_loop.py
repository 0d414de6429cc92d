"""``pdctl plan --policy``: GPUs needed with a policy in the loop vs the best static split (small, fast)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from agents.planning import load_plan_source, parse_slo, run_probe
from agents.planning.inputs import candidate_configs
from agents.planning.policy_loop import _fewest, policy_capacity, starting_pools, with_instances
from agents.policy_specs import make_policy
from pdctl.cli import app

runner = CliRunner()


def _tiny(path: Path, rate_rps: float = 14.0) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "duration_s": 40.0,
                "seed": 3,
                "cluster": {"profile": "h200-llama3-8b", "tp": 1},
                "tenant_groups": [{"name": "g", "gpu_budget": 4, "prefill": 2, "decode": 2}],
                "tenants": [
                    {
                        "name": "chat",
                        "group": "g",
                        "slo": {"ttft_p95_s": 0.5, "tpot_p95_s": 0.05},
                        "workload": {
                            "kind": "poisson",
                            "rate_rps": rate_rps,
                            "input_tokens": {"kind": "lognormal", "median_tokens": 3000, "sigma": 0.5},
                            "output_tokens": {"kind": "lognormal", "median_tokens": 200, "sigma": 0.5},
                        },
                    }
                ],
            }
        )
    )
    return path


@pytest.mark.parametrize("threshold", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("start", [1, 4, 6])
def test_fewest_finds_the_threshold_of_a_monotone_answer(threshold: int, start: int) -> None:
    asked: list[int] = []

    def passes(n: int) -> bool:
        asked.append(n)
        return n >= threshold

    assert _fewest(passes, start) == threshold
    assert len(asked) <= 8
    assert _fewest(lambda n: False, start) is None


def test_starting_pools_split_half_and_keep_one_of_each() -> None:
    assert starting_pools(1).label == "aggregated x1"
    assert (starting_pools(2).num_prefill, starting_pools(2).num_decode) == (1, 1)
    assert (starting_pools(7).num_prefill, starting_pools(7).num_decode) == (4, 3)
    assert starting_pools(4, 0.9).num_decode == 1


def test_gpus_needed_is_the_fewest_that_meet_the_target(tmp_path: Path) -> None:
    source = load_plan_source(_tiny(tmp_path / "tiny.yaml"), gpus=4, slo=parse_slo("ttft_p95=0.5s,tpot_p95=50ms"))
    spec = "baseline:dynamo-legacy"
    found = policy_capacity(
        source.whole, spec, lambda s: make_policy(spec, s), budget_instances=4, levels_tokens=(1024,)
    )
    assert found.static_instances is not None
    assert found.policy_instances is not None
    assert found.gpus_saved == found.static_gpus - found.policy_gpus  # type: ignore[operator]
    # the static answer is tight: some configuration passes with that many instances and none with one fewer
    n = found.static_instances

    def best_static(instances: int) -> float:
        scenario = with_instances(source.whole, instances)
        return max(run_probe(scenario, c, 1.0).slo_attainment_frac for c in candidate_configs(instances, (1024,)))

    assert best_static(n) >= 0.9
    if n > 1:
        assert best_static(n - 1) < 0.9
    # the policy's answer is tight too (its episodes are recorded)
    passed = {e["instances"]: e["passed"] for e in found.episodes if e["rate_scale"] == 1.0}
    assert passed[found.policy_instances] is True
    if found.policy_instances > 1:
        assert passed[found.policy_instances - 1] is False
    assert found.policy_rate_scale > 0
    assert found.policy_rate_rps > 0


def test_plan_with_a_policy_reports_gpus_in_the_output_and_plan_json(tmp_path: Path) -> None:
    out = tmp_path / "o"
    result = runner.invoke(
        app,
        ["plan", "--workload", str(_tiny(tmp_path / "tiny.yaml")), "--policy", "baseline:dynamo-legacy",
         "--levels", "1024", "--workers", "1", "--no-cache", "--quiet", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "Policy in the loop: baseline:dynamo-legacy" in result.output
    assert "GPUs needed at 1x" in result.output
    document = json.loads((out / "plan.json").read_text())
    assert document["policy"]["spec"] == "baseline:dynamo-legacy"
    assert document["policy"]["static_gpus"] >= 1
    assert document["validation"]["replays"]


@pytest.mark.parametrize("spec", ["baseline:no-such-rule", "file:/no/such/policy.yaml", "nonsense"])
def test_a_bad_policy_spec_is_one_line_naming_the_parameter(tmp_path: Path, spec: str) -> None:
    result = runner.invoke(
        app, ["plan", "--workload", str(_tiny(tmp_path / "tiny.yaml")), "--policy", spec, "--quiet", "--no-cache"]
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "--policy" in lines[0]
