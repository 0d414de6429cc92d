from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from agents import evaluate as ev
from env.families import ARCHETYPES, FamilyError, generate_scenario, load_family, parse_family, scenario_yaml
from env.families.capacity import EngineShape, TenantDemand, group_capacity_rps, instance_tp
from env.scenario import parse_scenario

DEFAULT = Path(__file__).resolve().parents[2] / "experiments" / "families" / "default.yaml"


@pytest.fixture(scope="module")
def family_data() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(DEFAULT.read_text())
    return data


def _family(data: dict[str, Any], **changes: Any) -> Any:
    d = copy.deepcopy(data)
    for dotted, value in changes.items():
        node = d
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return parse_family(yaml.safe_dump(d), "fam.yaml")


def test_same_family_and_seed_give_the_same_bytes() -> None:
    family = load_family(DEFAULT)
    again = load_family(DEFAULT)
    for seed in (0, 17, 20005):
        assert scenario_yaml(family, seed) == scenario_yaml(again, seed)
    assert scenario_yaml(family, 1) != scenario_yaml(family, 2)


def test_splits_are_disjoint_and_addressable() -> None:
    family = load_family(DEFAULT)
    seeds = {name: set(family.split_seeds(name)) for name in ("train", "validation", "test")}
    assert seeds["train"].isdisjoint(seeds["validation"])
    assert seeds["train"].isdisjoint(seeds["test"])
    assert seeds["validation"].isdisjoint(seeds["test"])
    assert family.split_of(min(seeds["test"])) == "test"
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        family.split_seeds("dev")


def test_thirty_seeds_validate_round_trip_and_stay_in_bounds() -> None:
    family = load_family(DEFAULT)
    for seed in family.split_seeds("test")[:30]:
        scenario = generate_scenario(family, seed)
        assert parse_scenario(scenario_yaml(family, seed), f"seed {seed}") == scenario
        assert 1 <= len(scenario.tenant_groups) <= 3
        assert 1 <= len(scenario.tenants) <= 6
        assert all(4 <= g.gpu_budget <= 32 for g in scenario.tenant_groups)
        assert {t.group for t in scenario.tenants} == {g.name for g in scenario.tenant_groups}
        assert scenario.cluster.tp == instance_tp(scenario.cluster.profile, family.cluster.min_kv_tokens_per_instance)


def test_the_default_family_covers_every_knob() -> None:
    family = load_family(DEFAULT)
    seen: Counter[str] = Counter()
    for seed in range(60):
        scenario = generate_scenario(family, seed)
        text = scenario.description
        seen.update(part.strip() for part in text.split(";"))
        seen.update(f"groups={len(scenario.tenant_groups)}" for _ in [0])
        seen.update(t.name.rsplit("-", 1)[0] for t in scenario.tenants)
        seen.update(t.workload.kind for t in scenario.tenants)
    for pattern in ("steady", "diurnal", "surge", "flood", "ramp", "shift"):
        assert seen[f"pattern {pattern}"] > 0, pattern
    for network in ("healthy", "degraded", "incident"):
        assert seen[f"network {network}"] > 0, network
    for archetype in ARCHETYPES:
        assert seen[archetype] > 0, archetype
    assert all(seen[f"groups={n}"] > 0 for n in (1, 2, 3))
    assert {"poisson", "gamma", "diurnal", "step"} <= set(seen)


def test_capacity_comes_from_the_performance_model() -> None:
    chat = ARCHETYPES["chat"]
    demand = [TenantDemand(chat.input_tokens, chat.output_tokens, 0.06, 1.0)]
    big = group_capacity_rps(EngineShape("h200-llama3-70b", 2, 256, 8192), 4, demand)
    small = group_capacity_rps(EngineShape("h200-llama3-8b", 1, 256, 8192), 4, demand)
    assert 2 * group_capacity_rps(EngineShape("h200-llama3-70b", 2, 256, 8192), 2, demand) == pytest.approx(big)
    assert small > 2 * big  # the 8B model serves far more per instance
    rag = ARCHETYPES["rag"]
    heavy = [TenantDemand(rag.input_tokens, rag.output_tokens, 0.06, 1.0)]
    assert group_capacity_rps(EngineShape("h200-llama3-70b", 2, 256, 8192), 4, heavy) < big / 3
    assert instance_tp("h200-llama3-70b", 131072) == 2
    assert instance_tp("h200-llama3-8b", 131072) == 1


def test_load_follows_the_capacity_fraction(family_data: dict[str, Any]) -> None:
    low = _family(family_data, load__capacity_frac={"min": 0.5, "max": 0.5}, patterns__weights={"steady": 1})
    high = _family(family_data, load__capacity_frac={"min": 1.0, "max": 1.0}, patterns__weights={"steady": 1})
    a, b = generate_scenario(low, 3), generate_scenario(high, 3)
    for ta, tb in zip(a.tenants, b.tenants, strict=True):
        assert tb.workload.rate_rps == pytest.approx(2 * ta.workload.rate_rps, rel=1e-3)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"splits__test": {"first": 9000, "last": 9100}},
            r"fam\.yaml:\d+: splits: test \(9000\.\.9100\) and train \(0\.\.9999\) overl",
        ),
        ({"tenants__count": {"min": 1, "max": 7}}, r"fam\.yaml:\d+: tenants\.count: .*1-6"),
        ({"groups__count": {"min": 0, "max": 2}}, r"fam\.yaml:\d+: groups\.count: .*1-3"),
        ({"tenants__archetypes": {"chat": 1, "poetry": 1}}, r"tenants\.archetypes: unknown archetype 'poetry'"),
        ({"cluster__profiles": {"a100-llama3-8b": 1}}, r"cluster\.profiles: unknown profile"),
        ({"load__capacity_frac": {"min": 1.5, "max": 0.3}}, r"load\.capacity_frac: max \(0\.3\) is below min"),
        ({"network__weights": {"healthy": 0}}, r"network\.weights: needs at least one positive weight"),
        ({"patterns__weights": {"weekly": 1}}, r"patterns\.weights\.weekly"),
        ({"groups__gpu_budget": {64: 1}}, r"groups\.gpu_budget\.64"),
        ({"episode__colour": "red"}, r"episode\.colour: Extra inputs are not permitted"),
    ],
)
def test_bad_family_is_refused_in_one_line(family_data: dict[str, Any], changes: dict[str, Any], expected: str) -> None:
    with pytest.raises(FamilyError, match=expected) as info:
        _family(family_data, **changes)
    assert "\n" not in str(info.value)


def test_unreadable_or_not_yaml_family(tmp_path: Path) -> None:
    with pytest.raises(FamilyError, match=r"missing\.yaml: cannot read family"):
        load_family(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(FamilyError, match=r"bad\.yaml:\d+: not valid YAML"):
        load_family(bad)
    bad.write_text("- a list\n")
    with pytest.raises(FamilyError, match="must be a mapping"):
        load_family(bad)


def test_generated_scenarios_simulate_under_a_baseline(family_data: dict[str, Any], tmp_path: Path) -> None:
    """Short episodes of several generated scenarios, including five tenants in one group, run end to end."""
    short = _family(
        family_data,
        episode__duration_s={"min": 60, "max": 60},
        episode__control_interval_s={10: 1},
        cluster__profiles={"h200-llama3-70b": 1},
        groups__gpu_budget={4: 1, 8: 1},
    )
    crowded = _family(
        family_data,
        episode__duration_s={"min": 60, "max": 60},
        episode__control_interval_s={10: 1},
        cluster__profiles={"h200-llama3-70b": 1},
        groups__count={"min": 1, "max": 1},
        groups__gpu_budget={8: 1},
        tenants__count={"min": 5, "max": 5},
        load__capacity_frac={"min": 0.3, "max": 0.3},
    )
    cases = [(short, 1), (short, 2), (crowded, 3)]
    for family, seed in cases:
        path = tmp_path / f"{family.name}-{seed}-{len(cases)}.yaml"
        path.write_text(scenario_yaml(family, seed))
        result = ev.run_one(ev.RunSpec("baseline:dynamo-legacy", str(path), 0))
        assert result.error is None
        total = next(r for r in result.rows if r["tenant"] == "ALL")
        assert total["arrived"] > 0
        assert total["finished"] > 0
    assert len(generate_scenario(crowded, 3).tenants) == 5


def test_cli_generates_by_range_and_by_split(tmp_path: Path) -> None:
    from pdctl.cli import app

    runner = CliRunner()
    first = runner.invoke(app, ["scenarios", "generate", "--family", str(DEFAULT), "--seeds", "5..7", "--out",
                                str(tmp_path / "a")])  # fmt: skip
    assert first.exit_code == 0, first.output
    again = runner.invoke(app, ["scenarios", "generate", "--family", str(DEFAULT), "--seeds", "5,6..7", "--out",
                                str(tmp_path / "b")])  # fmt: skip
    assert again.exit_code == 0, again.output
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == ["default-00005.yaml", "default-00006.yaml", "default-00007.yaml"]
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    split = runner.invoke(app, ["scenarios", "generate", "--family", str(DEFAULT), "--split", "validation",
                                "--limit", "2", "--out", str(tmp_path / "c")])  # fmt: skip
    assert split.exit_code == 0, split.output
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["default-10000.yaml", "default-10001.yaml"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--seeds", "3..1"], "ends before it starts"),
        (["--seeds", "x"], "is not a seed"),
        (["--split", "dev"], "unknown split 'dev'"),
        (["--seeds", "1", "--split", "test"], "exactly one of"),
        ([], "exactly one of"),
    ],
)
def test_cli_refuses_bad_options_in_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    from pdctl.cli import app

    result = CliRunner().invoke(app, ["scenarios", "generate", "--family", str(DEFAULT), "--out", str(tmp_path), *args])
    assert result.exit_code == 2
    assert expected in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_cli_refuses_a_bad_family_naming_file_and_field(tmp_path: Path) -> None:
    from pdctl.cli import app

    bad = tmp_path / "fam.yaml"
    bad.write_text(DEFAULT.read_text().replace("count: {min: 1, max: 6}", "count: {min: 1, max: 9}"))
    result = CliRunner().invoke(app, ["scenarios", "generate", "--family", str(bad), "--seeds", "1", "--out",
                                      str(tmp_path / "o")])  # fmt: skip
    assert result.exit_code == 2
    assert f"{bad}:" in result.output
    assert "tenants.count" in result.output


def _only(data: dict[str, Any], pattern: str, **changes: Any) -> Any:
    return _family(data, patterns__weights={pattern: 1}, network__weights={"healthy": 1}, **changes)


def test_surge_and_flood_raise_one_tenant_for_a_window(family_data: dict[str, Any]) -> None:
    for pattern, knob, short in (("surge", "surge_factor", False), ("flood", "flood_factor", True)):
        family = _only(family_data, pattern, tenants__archetypes={"chat": 1, "rag": 1})
        low, high = getattr(family.patterns, knob).min, getattr(family.patterns, knob).max
        for seed in range(20):
            scenario = generate_scenario(family, seed)
            steps = [t for t in scenario.tenants if t.workload.kind == "step"]
            assert len(steps) == 1
            segments = steps[0].workload.segments  # type: ignore[union-attr]
            assert len(segments) == 3
            assert segments[0].start_s == 0.0 < segments[1].start_s < segments[2].start_s
            factor = segments[1].rate_rps / segments[0].rate_rps
            assert low * 0.999 <= factor <= high * 1.001
            assert segments[2].rate_rps == segments[0].rate_rps
            kinds = {ARCHETYPES[t.name.rsplit("-", 1)[0]].short for t in scenario.tenants}
            if short in kinds:  # the wanted kind is raised when the scenario has one (else any tenant)
                assert ARCHETYPES[steps[0].name.rsplit("-", 1)[0]].short == short


def test_ramp_climbs_past_capacity_and_shift_trades_shares(family_data: dict[str, Any]) -> None:
    ramp = _only(family_data, "ramp", load__capacity_frac={"min": 0.4, "max": 0.4})
    for seed in range(5):
        for tenant in generate_scenario(ramp, seed).tenants:
            rates = [s.rate_rps for s in tenant.workload.segments]  # type: ignore[union-attr]
            assert rates == sorted(rates)
            assert rates[-1] / rates[0] >= ramp.patterns.ramp_end_capacity_frac.min / 0.4 * 0.999
    shift = _only(family_data, "shift", groups__count={"min": 1, "max": 1}, tenants__count={"min": 3, "max": 3})
    tenants = generate_scenario(shift, 4).tenants
    before = [t.workload.segments[0].rate_rps for t in tenants]  # type: ignore[union-attr]
    after = [t.workload.segments[1].rate_rps for t in tenants]  # type: ignore[union-attr]
    assert after == before[::-1]


def test_network_kinds_follow_the_knobs(family_data: dict[str, Any]) -> None:
    degraded = _family(family_data, network__weights={"degraded": 1})
    incident = _family(family_data, network__weights={"incident": 1})
    for seed in range(10):
        net = generate_scenario(degraded, seed).cluster.network
        assert 1e9 * 0.99 <= net.link_bandwidth_bytes_per_s <= 1e10 * 1.01
        assert 0.02 * 0.99 <= net.failure_prob <= 0.1 * 1.01
        assert not net.incidents
        scenario = generate_scenario(incident, seed)
        assert 1 <= len(scenario.cluster.network.incidents) <= 2
        assert scenario.cluster.network.link_bandwidth_bytes_per_s == 4.5e10


def test_same_bytes_in_another_process(tmp_path: Path) -> None:
    """No hidden state: another interpreter (other hash seed) writes the same file."""
    import os
    import subprocess
    import sys

    family = load_family(DEFAULT)
    code = (
        "import sys; from env.families import load_family, scenario_yaml; "
        "sys.stdout.write(scenario_yaml(load_family(sys.argv[1]), 20004))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    command = [sys.executable, "-c", code, str(DEFAULT)]
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    assert out.stdout == scenario_yaml(family, 20004)
