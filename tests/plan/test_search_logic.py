"""The planner's search on synthetic capacity landscapes (no simulator): bisection, elimination, coarse to fine."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import agents.planning.probes as probes_module
from agents.planning import (
    AGGREGATED,
    ALWAYS_REMOTE,
    Capacity,
    PlanConfig,
    Probe,
    ProbeRunner,
    candidate_configs,
    grid_scale,
    plan,
)
from agents.planning.result import rank_key
from agents.planning.search import shared_bisection
from agents.source_digest import source_digest
from env.scenario import Scenario

STEPS = 16
REPO = Path(__file__).resolve().parents[2]


def _scenario(gpus: int, tp: int = 1) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "synthetic",
            "duration_s": 10.0,
            "cluster": {"tp": tp},
            "tenant_groups": [{"name": "main", "gpu_budget": gpus, "decode": gpus // tp}],
            "tenants": [
                {
                    "name": "t",
                    "group": "main",
                    "slo": {"ttft_p95_s": 1.0},
                    "workload": {
                        "kind": "poisson",
                        "rate_rps": 1.0,
                        "input_tokens": {"kind": "fixed", "tokens": 8},
                        "output_tokens": {"kind": "fixed", "tokens": 8},
                    },
                }
            ],
        }
    )


def _landscape(peak_prefill: int, best_level: str, width: float) -> dict[str, object]:
    """A separable, unimodal capacity: best at ``peak_prefill`` and ``best_level``; aggregated in between."""

    def capacity(config: PlanConfig) -> float:
        if config.is_aggregated:
            return 1.5
        split = math.exp(-(((config.num_prefill - peak_prefill) / width) ** 2))
        level = 1.0 if config.route == best_level else 0.8
        return 0.5 + 3.0 * split * level

    return {"capacity": capacity}


def _fake_probe(capacity: object, calls: list[tuple[PlanConfig, float]]) -> object:
    def run_probe(scenario: Scenario, config: PlanConfig, rate_scale: float, stop: float | None = None) -> Probe:
        del scenario, stop
        calls.append((config, rate_scale))
        cap = capacity(config)  # type: ignore[operator]
        attainment = 1.0 if rate_scale <= cap else max(0.0, 0.9 - (rate_scale - cap))
        return Probe(
            config,
            rate_scale,
            10.0 * rate_scale,
            10.0 * rate_scale * attainment,
            attainment,
            rate_scale * attainment,
            100,
            0.5,
            0.0,
        )

    return run_probe


def test_candidates_respect_tp_and_levels() -> None:
    configs = candidate_configs(16 // 2, (1024, 4096))
    assert configs[0] == PlanConfig(0, 8, AGGREGATED)
    assert len(configs) == 1 + 7 * 3
    assert all(c.num_prefill + c.num_decode == 8 for c in configs)
    assert {c.route for c in configs[1:]} == {ALWAYS_REMOTE, "remote>=1024", "remote>=4096"}


def test_shared_bisection_brackets_each_survivor_to_one_grid_step(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[PlanConfig, float]] = []
    capacity = {PlanConfig(1, 3, ALWAYS_REMOTE): 2.3, PlanConfig(2, 2, ALWAYS_REMOTE): 0.3}
    monkeypatch.setattr(probes_module, "run_probe", _fake_probe(capacity.__getitem__, calls))
    with ProbeRunner(_scenario(4)) as runner:
        caps = shared_bisection(runner, list(capacity), target_frac=0.9, steps_per_doubling=STEPS)
    best = caps[PlanConfig(1, 3, ALWAYS_REMOTE)]
    assert best.lo <= 2.3 < best.hi  # type: ignore[operator]
    assert best.hi == pytest.approx(best.lo * grid_scale(1, STEPS))
    weak = caps[PlanConfig(2, 2, ALWAYS_REMOTE)]
    # rejected at the first rung it failed (x1), never bisected: only probed where the leader was alive
    assert weak.lo == 0.0
    assert weak.hi == 1.0
    assert sum(1 for c, _ in calls if c == PlanConfig(2, 2, ALWAYS_REMOTE)) == 1


def test_ladder_goes_down_when_nothing_passes_at_the_workload_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[PlanConfig, float]] = []
    monkeypatch.setattr(probes_module, "run_probe", _fake_probe(lambda c: 0.2, calls))
    with ProbeRunner(_scenario(2)) as runner:
        caps = shared_bisection(runner, [PlanConfig(0, 2, AGGREGATED)], target_frac=0.9, steps_per_doubling=STEPS)
    cap = caps[PlanConfig(0, 2, AGGREGATED)]
    assert cap.lo <= 0.2 < cap.hi  # type: ignore[operator]
    assert cap.lo > 0.2 / grid_scale(1, STEPS)


def _best_split(capacities: list[Capacity]) -> Capacity:
    return min(capacities, key=rank_key({}))


@settings(max_examples=40, deadline=None)
@example(num_instances=20, peak_frac=2 / 18, level="remote>=2048", width=1.0)
@example(num_instances=16, peak_frac=9 / 14, level=ALWAYS_REMOTE, width=1.5)
@given(
    num_instances=st.integers(min_value=5, max_value=20),
    peak_frac=st.floats(min_value=0.0, max_value=1.0),
    level=st.sampled_from([ALWAYS_REMOTE, "remote>=512", "remote>=2048", "remote>=8192"]),
    width=st.floats(min_value=1.0, max_value=6.0),
)
def test_coarse_to_fine_matches_exhaustive_on_unimodal_landscapes(
    num_instances: int, peak_frac: float, level: str, width: float
) -> None:
    peak = 1 + round(peak_frac * (num_instances - 2))
    capacity = _landscape(peak, level, width)["capacity"]
    results = {}
    with pytest.MonkeyPatch.context() as mp:
        for exhaustive in (False, True):
            calls: list[tuple[PlanConfig, float]] = []
            mp.setattr(probes_module, "run_probe", _fake_probe(capacity, calls))
            results[exhaustive] = (plan(_scenario(num_instances), exhaustive=exhaustive, pareto=False), len(calls))
    (smart, smart_calls), (full, full_calls) = results[False], results[True]
    assert abs(smart.best.config.num_prefill - full.best.config.num_prefill) <= 1
    assert smart.best.lo >= full.best.lo / grid_scale(1, STEPS)
    assert smart.best.config.is_aggregated == full.best.config.is_aggregated
    if num_instances >= 12:
        assert smart_calls < full_calls


def test_plan_is_independent_of_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    calls: list[tuple[PlanConfig, float]] = []
    capacity = _landscape(3, "remote>=2048", 2.0)["capacity"]
    monkeypatch.setattr(probes_module, "run_probe", _fake_probe(capacity, calls))
    first = plan(_scenario(8), cache_dir=tmp_path, pareto=True)  # type: ignore[arg-type]
    ran = len(calls)
    second = plan(_scenario(8), cache_dir=tmp_path, pareto=True)  # type: ignore[arg-type]
    assert len(calls) == ran  # every probe came from the cache
    assert second.num_cache_hits == second.num_probes > 0
    assert second.best == first.best
    assert second.pareto == first.pareto


def _two_tenant_scenario(gpus: int) -> Scenario:
    base = _scenario(gpus).model_dump()
    second = {**base["tenants"][0], "name": "u"}
    return Scenario.model_validate({**base, "tenants": [base["tenants"][0], second]})


def test_per_tenant_levels_are_refined_when_they_raise_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    def capacity(config: PlanConfig) -> float:
        if config.is_aggregated:
            return 1.0
        base = 2.0 if config.num_prefill == 2 else 1.5
        bonus = 0.5 if config.route == "remote>=2048" else 0.0
        bonus += 0.4 if config.route_for("u") == ALWAYS_REMOTE else 0.0
        return base + bonus

    calls: list[tuple[PlanConfig, float]] = []
    monkeypatch.setattr(probes_module, "run_probe", _fake_probe(capacity, calls))
    result = plan(_two_tenant_scenario(6), pareto=False)
    assert result.best.config == PlanConfig(2, 4, "remote>=2048", (("u", ALWAYS_REMOTE),))
    assert result.best.lo <= 2.9 < result.best.hi  # type: ignore[operator]
    assert any(s["stage"] == "per-tenant-1" for s in result.stages)
    # a refinement that does not help leaves the common level alone
    monkeypatch.setattr(probes_module, "run_probe", _fake_probe(lambda c: 1.0 if c.tenant_routes else 2.0, calls))
    assert plan(_two_tenant_scenario(6), pareto=False).best.config.tenant_routes == ()


def test_code_version_hashes_every_module_of_the_planner(tmp_path: Path) -> None:
    """The probe cache is keyed by the planner's own source: a change to any of its modules is a new version."""
    package = Path(probes_module.__file__).parent
    modules = sorted(p.name for p in package.glob("*.py"))
    assert {"inputs.py", "probes.py", "search.py", "result.py"} <= set(modules)
    root = tmp_path / "repo"
    for rel in probes_module._CODE_PATHS:  # a copy of the hashed source, to edit without touching the checkout
        source = REPO / rel
        target = root / rel
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    before = source_digest("plan", probes_module._CODE_PATHS, root)
    for name in modules:
        file = root / "agents" / "planning" / name
        original = file.read_text()
        file.write_text(original + "\n# changed\n")
        assert source_digest("plan", probes_module._CODE_PATHS, root) != before, name
        file.write_text(original)
    assert source_digest("plan", probes_module._CODE_PATHS, root) == before
