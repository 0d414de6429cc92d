"""The planner on the real simulator: small budgets, short horizons (exhaustive search is cheap there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from agents.planning import PlanConfig, load_plan_scenario, parse_slo, plan, policy_document, run_probe
from env.scenario import Scenario
from pdctl.cli import app
from policies.policy_file import load_policy_file, load_policy_text, resolve_policy
from policies.routing import decide_route
from policies.schema import LiveState, RequestFeatures, Route

REPO = Path(__file__).resolve().parents[2]
MIXED = REPO / "experiments" / "scenarios" / "mixed-chat-rag-4p4d.yaml"
runner = CliRunner()


def _scenario(gpus: int, horizon_s: float) -> object:
    return load_plan_scenario(MIXED, gpus=gpus, horizon_s=horizon_s, slo=parse_slo("ttft_p95=2s,tpot_p95=80ms"))


def test_plan_split_is_within_one_instance_of_exhaustive_search() -> None:
    scenario = _scenario(4, 15.0)
    smart = plan(scenario, pareto=False)  # type: ignore[arg-type]
    full = plan(scenario, exhaustive=True, pareto=False)  # type: ignore[arg-type]
    assert abs(smart.best.config.num_prefill - full.best.config.num_prefill) <= 1, (
        smart.best.config.label,
        full.best.config.label,
    )
    assert smart.best.lo > 0
    assert smart.best.lo >= full.best.lo * 2 ** (-1 / 16)
    # the capacity is a real bracket: the best config sustains lo and fails hi
    at_lo = run_probe(smart.scenario, smart.best.config, smart.best.lo)
    assert at_lo.slo_attainment_frac >= 0.9
    assert smart.best.hi is not None
    assert run_probe(smart.scenario, smart.best.config, smart.best.hi).slo_attainment_frac < 0.9


def test_plan_is_deterministic_across_workers(tmp_path: Path) -> None:
    scenario = _scenario(3, 10.0)
    one = plan(scenario, workers=1)  # type: ignore[arg-type]
    two = plan(scenario, workers=2, cache_dir=tmp_path)  # type: ignore[arg-type]
    assert one.as_dict()["ranked"] == two.as_dict()["ranked"]
    assert one.pareto == two.pareto
    again = plan(scenario, workers=2, cache_dir=tmp_path)  # type: ignore[arg-type]
    assert again.num_cache_hits == again.num_probes
    assert again.as_dict()["ranked"] == one.as_dict()["ranked"]


def test_route_levels_are_crisp_thresholds() -> None:
    thresholds = PlanConfig(1, 3, "remote>=2048").thresholds()
    live = LiveState(num_prefill_instances=1)

    def route(tokens: int) -> Route:
        return decide_route(RequestFeatures("r", "t", tokens, expected_output_tokens=1), thresholds, live).route

    assert route(2047) is Route.LOCAL_PREFILL
    assert route(2048) is Route.REMOTE_PREFILL
    always = PlanConfig(1, 3, "always_remote").thresholds()
    assert decide_route(RequestFeatures("r", "t", 1, 1), always, live).route is Route.REMOTE_PREFILL


def test_emitted_policy_validates_and_replays_the_best_configuration(tmp_path: Path) -> None:
    out = tmp_path / "out"
    policy = tmp_path / "policy.yaml"
    code = runner.invoke(
        app,
        ["plan", "--workload", str(MIXED), "--gpus", "4", "--horizon", "15", "--workers", "1", "--no-cache",
         "--slo", "ttft_p95=2s,tpot_p95=80ms", "--out", str(out), "--emit-policy", str(policy), "--quiet"],
    )  # fmt: skip
    assert code.exit_code == 0, code.output
    document = json.loads((out / "plan.json").read_text())
    assert (out / "pareto.png").stat().st_size > 1000
    best = PlanConfig(**{k: document["best"][k] for k in ("num_prefill", "num_decode", "route")})
    # the controller's loader accepts it, with the best configuration's thresholds and pinned pools per tenant
    resolved = resolve_policy(load_policy_file(policy), str(policy))
    for tenant in ("chatbot", "rag"):
        assert resolved.thresholds_for(tenant) == best.thresholds()
        assert resolved.tenants[tenant].tenant.slo.ttft_p95_s == pytest.approx(2.0)
    group = resolved.groups["main"]
    assert (group.min_prefill, group.max_prefill) == (best.num_prefill,) * 2
    assert (group.min_decode, group.max_decode) == (best.num_decode,) * 2
    validate = runner.invoke(app, ["policy", "validate", str(policy)])
    assert validate.exit_code == 0, validate.output
    # pdctl sim on the deployed scenario with the policy file reproduces the plan's probe at the workload rate
    summary_file = tmp_path / "sim.json"
    sim = runner.invoke(
        app,
        ["sim", "--scenario", str(out / "best_scenario.yaml"), "--policy", f"file:{policy}", "--json",
         str(summary_file)],
    )  # fmt: skip
    assert sim.exit_code == 0, sim.output
    summary = json.loads(summary_file.read_text())
    reference = run_probe(Scenario.model_validate(document["scenario"]), best, 1.0)
    met = sum(round(t["goodput_rps"] * 15.0) for t in summary["tenants"])
    assert met / 15.0 == pytest.approx(reference.goodput_rps)
    assert sum(t["arrived"] for t in summary["tenants"]) == reference.num_arrived
    assert yaml.safe_load((out / "best_scenario.yaml").read_text())["tenant_groups"][0]["gpu_budget"] == 4


def test_policy_document_round_trips_for_every_kind_of_configuration() -> None:
    result = plan(_scenario(2, 5.0), pareto=False)  # type: ignore[arg-type]
    configs = (
        PlanConfig(0, 2, "aggregated"),
        PlanConfig(1, 1, "always_remote"),
        PlanConfig(1, 1, "remote>=512"),
        PlanConfig(1, 1, "remote>=512", (("rag", "always_remote"),)),
        PlanConfig(1, 1, "always_remote", (("chatbot", "remote>=8192"),)),
    )
    for config in configs:
        result.best = type(result.best)(config, 1.0, 1.1, 0.5)
        text = yaml.safe_dump(policy_document(result, "src"))
        resolved = resolve_policy(load_policy_text(text, "emitted"))
        for tenant in ("chatbot", "rag"):
            assert resolved.thresholds_for(tenant) == config.thresholds(tenant), (config.label, tenant)
        assert resolved.thresholds_for("someone-else") == config.thresholds()


@pytest.mark.slow
def test_plan_split_matches_exhaustive_search_on_eight_gpus() -> None:
    scenario = load_plan_scenario(MIXED, gpus=8, horizon_s=20.0)
    smart = plan(scenario, pareto=False, workers=2)
    full = plan(scenario, exhaustive=True, pareto=False, workers=2, per_tenant=False)
    assert abs(smart.best.config.num_prefill - full.best.config.num_prefill) <= 1, (
        smart.best.config.label,
        full.best.config.label,
    )
    assert smart.best.lo >= full.best.lo * 2 ** (-1 / 16)
    assert smart.num_probes < full.num_probes
