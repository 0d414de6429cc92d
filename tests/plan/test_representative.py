"""Representative planning: which part of the source probes cover, the validation replay, the Pareto rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import agents.planning.probes as probes_module
import agents.planning.validate as validate_module
from agents.planning import Capacity, PlanConfig, Probe, load_plan_source, parse_slo, plan, policy_document
from agents.planning.coverage import compare_stats, coverage_of, covered_interval_s, workload_stats
from agents.planning.result import pareto_front
from agents.planning.validate import validate
from env.scenario import Scenario
from env.workloads.traces.servegen import load_servegen_folder

SLO = parse_slo("ttft_p95=2s,tpot_p95=80ms")
_POISSON = {
    "kind": "poisson",
    "rate_rps": 1.0,
    "input_tokens": {"kind": "fixed", "tokens": 8},
    "output_tokens": {"kind": "fixed", "tokens": 8},
}


def _bursty_azure(path: Path, seed: int = 0) -> Path:
    """One hour at ~0.5 req/s with a 3-minute burst of ~10 req/s starting at minute 50."""
    rng = np.random.default_rng(seed)
    calm = np.sort(rng.uniform(0.0, 3600.0, 1800))
    burst = np.sort(rng.uniform(3000.0, 3180.0, 1800))
    times = np.sort(np.concatenate([calm, burst]))
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for t in times:
        whole = int(t)
        stamp = (
            f"2023-11-16 {10 + whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}.{int((t % 1) * 1e7):07d}"
        )
        lines.append(f"{stamp},{int(rng.integers(100, 3000))},{int(rng.integers(1, 100))}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _source(csv: Path, horizon_s: float | None = None, max_whole_requests: int = 50_000) -> object:
    return load_plan_source(csv, gpus=2, slo=SLO, horizon_s=horizon_s, max_whole_requests=max_whole_requests)


def test_default_replays_the_whole_trace_and_warns_of_nothing(tmp_path: Path) -> None:
    source = _source(_bursty_azure(tmp_path / "t.csv"))
    assert source.mode == "whole"  # type: ignore[attr-defined]
    coverage = coverage_of(source, 1.7)  # type: ignore[arg-type]
    assert coverage.covered.requests == coverage.whole.requests == 3600
    assert coverage.warnings == []
    assert coverage.whole.peak_minute_s == pytest.approx(3000.0, abs=180.0)
    assert coverage.whole.peak_to_mean > 3


def test_large_trace_is_planned_over_a_window_that_holds_its_peak(tmp_path: Path) -> None:
    source = _source(_bursty_azure(tmp_path / "t.csv"), max_whole_requests=600)
    assert source.mode == "peak-window"  # type: ignore[attr-defined]
    workload = source.scenario.tenants[0].workload  # type: ignore[attr-defined]
    start, length = workload.start_s, workload.duration_s
    assert length == pytest.approx(3600 * 600 / 3600, rel=0.05)
    busiest = coverage_of(source, 1.0).whole.peak_minute_s  # type: ignore[arg-type]
    assert covered_interval_s(source, 3.0) == (start, start + length)  # type: ignore[arg-type]
    assert start <= busiest
    assert busiest + 60 <= start + length
    assert not workload.repeat
    # a time-compressed window: a probe at x2 lasts half as long and replays the same requests
    from agents.planning.inputs import configured_scenario

    faster = configured_scenario(source.scenario, PlanConfig(1, 1, "always_remote"), 2.0)  # type: ignore[attr-defined]
    assert faster.duration_s == pytest.approx(length / 2)


def test_a_short_horizon_is_reported_with_what_it_leaves_out(tmp_path: Path) -> None:
    source = _source(_bursty_azure(tmp_path / "t.csv"), horizon_s=30.0)
    assert source.mode == "horizon"  # type: ignore[attr-defined]
    coverage = coverage_of(source, 2.0)  # type: ignore[arg-type]
    assert coverage.covered.span_s == pytest.approx(60.0)
    assert covered_interval_s(source, 2.0) == (0.0, 60.0)  # type: ignore[arg-type]
    assert "leaving out" in coverage.description
    assert coverage.warnings
    assert "differs materially" in coverage.warnings[0]
    assert any("busiest minute" in w for w in coverage.warnings)
    assert any("request rate" in w for w in coverage.warnings)


def test_compare_stats_names_each_material_difference() -> None:
    rng = np.random.default_rng(1)
    arrival = np.sort(rng.uniform(0, 600, 600))
    lengths = rng.integers(100, 200, 600)
    base = workload_stats(arrival, lengths, lengths, 600.0)
    assert compare_stats(base, base) == []
    doubled = workload_stats(np.sort(np.concatenate([arrival, arrival])), *(np.tile(lengths, 2),) * 2, 600.0)
    assert [w.split()[0] for w in compare_stats(doubled, base)] == ["request"]
    longer = workload_stats(arrival, lengths * 3, lengths, 600.0)
    assert any(w.startswith("input p50") for w in compare_stats(longer, base))


def _probe(config: PlanConfig, scale: float, attainment: float, offered: float = 1.0, per_gpu: float = 0.1) -> Probe:
    return Probe(config, scale, offered, offered * attainment, attainment, per_gpu, 100, 0.5, 0.0)


def test_validation_falls_back_to_the_next_configuration_that_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second, third = (
        PlanConfig(3, 1, "always_remote"),
        PlanConfig(2, 2, "always_remote"),
        PlanConfig(0, 4, "aggregated"),
    )
    verdict = {first: 0.7, second: 0.93, third: 0.99}
    seeds: list[int] = []

    def fake(scenario: Scenario, config: PlanConfig, rate_scale: float, stop: float | None = None) -> Probe:
        assert stop is None  # validation runs to the end
        seeds.append(scenario.seed)
        return _probe(config, rate_scale, verdict[config])

    monkeypatch.setattr(validate_module, "run_probe", fake)
    whole = Scenario.model_validate(
        {
            "name": "w",
            "duration_s": 10.0,
            "seed": 5,
            "tenant_groups": [{"name": "main", "gpu_budget": 4, "decode": 4}],
            "tenants": [{"name": "t", "group": "main", "slo": {"ttft_p95_s": 1.0}, "workload": _POISSON}],
        }
    )
    ranked = [Capacity(first, 2.0), Capacity(PlanConfig(1, 3, "remote>=512"), 0.0), Capacity(second, 1.5),
              Capacity(third, 1.0)]  # fmt: skip
    checked = validate(whole, ranked, 0.9)
    assert checked.recommended is ranked[2]
    assert [p.config for p in checked.replays] == [first, second]  # a configuration that sustained nothing is skipped
    assert [p.rate_scale for p in checked.replays] == [2.0, 1.5]  # each at its own sustainable rate
    assert seeds == [6, 6]  # a seed the search (seed 5) did not use
    assert checked.as_dict()["replays"][0]["passed"] is False
    verdict[second] = verdict[third] = 0.5
    failed = validate(whole, ranked, 0.9)
    assert not failed.passed
    assert len(failed.replays) == 3


class _FakeRunner:
    """Probes where two multipliers offer the same rate (the quiet first seconds of a trace)."""

    def run(self, pairs: object, exact: bool = False) -> list[Probe]:
        out = []
        for config, scale in pairs:  # type: ignore[attr-defined]
            offered = 2.0 if scale < 1.0 else 4.0 * scale
            per_gpu = 0.3 if config.num_prefill == 1 else 0.2 + 0.01 * scale
            out.append(_probe(config, scale, 0.95, offered, per_gpu))
        return out


def test_pareto_front_has_one_row_per_offered_rate_with_the_best_configuration() -> None:
    ranked = [Capacity(PlanConfig(2, 2, "always_remote"), 1.0), Capacity(PlanConfig(1, 3, "always_remote"), 1.0)]
    front, curves = pareto_front(_FakeRunner(), ranked, 1.0)  # type: ignore[arg-type]
    rates = [row["offered_rps"] for row in front]
    assert len(rates) == len(set(rates)) == 3  # 0.25, 0.5, 0.75 offer 2 req/s: one row; then 1.0 and 1.25
    assert rates == sorted(rates)
    assert all(row["label"] == "1P:3D always_remote" for row in front)
    assert len(curves["2P:2D always_remote"]) == 5


def test_plan_recommends_the_next_configuration_when_the_best_fails_validation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    capacity = {PlanConfig(0, 3, "aggregated"): 0.6, PlanConfig(1, 2, "always_remote"): 2.0}
    capacity.update({PlanConfig(2, 1, "always_remote"): 1.4, PlanConfig(1, 2, "remote>=1024"): 0.9})

    def cap(config: PlanConfig) -> float:
        return capacity.get(config, 0.3)

    def search_probe(scenario: Scenario, config: PlanConfig, rate_scale: float, stop: float | None = None) -> Probe:
        attainment = 1.0 if rate_scale <= cap(config) else 0.5
        return _probe(config, rate_scale, attainment, offered=rate_scale, per_gpu=rate_scale * attainment / 3)

    replayed: list[PlanConfig] = []

    def replay(scenario: Scenario, config: PlanConfig, rate_scale: float, stop: float | None = None) -> Probe:
        replayed.append(config)
        # on the whole source the search's best does not hold its rate; the runner-up does
        return _probe(config, rate_scale, 0.6 if config == PlanConfig(1, 2, "always_remote") else 0.95)

    monkeypatch.setattr(probes_module, "run_probe", search_probe)
    monkeypatch.setattr(validate_module, "run_probe", replay)
    scenario = Scenario.model_validate(
        {
            "name": "s",
            "duration_s": 10.0,
            "tenant_groups": [{"name": "main", "gpu_budget": 3, "decode": 3}],
            "tenants": [{"name": "t", "group": "main", "slo": {"ttft_p95_s": 1.0}, "workload": _POISSON}],
        }
    )
    result = plan(scenario, levels_tokens=(1024,), exhaustive=True)
    assert result.search_best is not None
    assert result.search_best.config == PlanConfig(1, 2, "always_remote")
    assert result.best.config == PlanConfig(2, 1, "always_remote")  # the next in the ranking, which passed
    assert replayed == [PlanConfig(1, 2, "always_remote"), PlanConfig(2, 1, "always_remote")]
    assert result.validated
    document = result.as_dict()
    assert document["best"]["label"] == "2P:1D always_remote"
    assert document["search_best"]["label"] == "1P:2D always_remote"
    assert [r["passed"] for r in document["validation"]["replays"]] == [False, True]
    assert "2P:1D" in policy_document(result)["description"]


def test_a_fitted_router_log_is_compared_with_its_own_requests(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    calm = rng.uniform(0.0, 1800.0, 300)
    burst = rng.uniform(900.0, 960.0, 300)  # one busy minute the stationary fit cannot keep
    rows = [
        json.dumps({"arrival_s": float(t), "input_tokens": int(rng.integers(100, 2000)), "output_tokens": 50})
        for t in np.sort(np.concatenate([calm, burst]))
    ]
    log = tmp_path / "router.jsonl"
    log.write_text("\n".join(rows) + "\n")
    source = load_plan_source(log, gpus=2, slo=SLO)
    assert source.mode == "fitted"
    assert source.observed is not None
    coverage = coverage_of(source, 1.0)
    assert coverage.whole.requests == 600
    assert coverage.whole.peak_to_mean > 5
    assert any("peak-to-mean" in w for w in coverage.warnings)
    assert "stationary" in coverage.warnings[0]


def test_a_servegen_day_is_planned_over_its_busiest_window(traces_dir: Path) -> None:
    folder = traces_dir / "servegen_deepseek_r1"
    source = load_plan_source(folder, gpus=16, slo=SLO)
    assert source.mode == "peak-window"
    workload = source.scenario.tenants[0].workload
    totals: dict[float, float] = {}
    for client in load_servegen_folder(folder):
        for start_s, rate_rps in zip(client.window_start_s, client.rate_rps, strict=True):
            totals[float(start_s)] = totals.get(float(start_s), 0.0) + float(rate_rps)
    assert totals[workload.start_s] == max(totals.values())  # type: ignore[union-attr]
    assert totals[workload.start_s] > 2 * sum(totals.values()) / len(totals)  # type: ignore[union-attr]
    coverage = coverage_of(source, 1.0)
    assert coverage.whole.span_s == pytest.approx(86400.0, abs=1.0)
    assert any("request rate" in w for w in coverage.warnings)
    assert "busiest window" in coverage.warnings[0]
