"""The Grafana dashboard (deploy/grafana/pdctl.json): every PromQL expression parses (promtool) and names only
metrics that pdctl (router, controller) or vLLM (the emulator's metric set) export.

The exported names are collected from the code: each exporter's metrics are registered on a fresh
``CollectorRegistry`` and their sample names derived from the metric types (counter → ``_total``, histogram →
``_bucket``/``_sum``/``_count``, gauge → the name).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "deploy" / "grafana" / "pdctl.json"

# Grafana variables → values that make the expression plain PromQL
_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m", "$tenant": ".*", "$instance": ".*"}
_FUNCTIONS_AND_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "inf", "nan",
}  # fmt: skip


def exported_metric_names() -> set[str]:
    """Sample names the router, the controller and the emulated vLLM instances export."""
    from controller.telemetry import Telemetry
    from livestack.emulator.metrics import VllmMetrics
    from router.telemetry import RouterMetrics

    registries = []
    for build in (
        RouterMetrics,
        Telemetry,
        lambda r: VllmMetrics(r, model_name="m", max_model_len=32768, block_size=16, num_gpu_blocks=1000),
    ):
        registry = CollectorRegistry()
        build(registry)
        registries.append(registry)
    names: set[str] = set()
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("_sum", "_count", "_created"),
        "gauge": ("",),
        "info": ("_info",),
        "unknown": ("",),
    }
    for registry in registries:
        for family in registry.collect():
            names.update(family.name + s for s in suffixes[family.type])
            names.update(sample.name for sample in family.samples)
    return names


def _walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _walk_panels(panel.get("panels", []))


def dashboard_expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every panel target."""
    out = []
    for panel in _walk_panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            if target.get("expr"):
                out.append((panel.get("title", "?"), target["expr"]))
    return out


def template_metrics(dashboard: dict[str, Any]) -> list[str]:
    """Metric names in ``label_values(METRIC, label)`` template queries."""
    out = []
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        match = re.fullmatch(r"\s*label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*\w+\s*\)\s*", text)
        if var.get("type") == "query":
            assert match, f"template {var.get('name')}: unsupported query {text!r}"
            out.append(match.group(1))
    return out


def plain_promql(expr: str) -> str:
    """``expr`` with Grafana's variables replaced."""
    for name in sorted(_VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, _VARIABLES[name])
    assert "$" not in expr, f"unreplaced Grafana variable in {expr!r}"
    return expr


def metric_names(expr: str) -> set[str]:
    """Metric names referenced by a PromQL expression (a lexical scan, checked against the parser by promtool)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # label lists
    names = set()
    for match in re.finditer(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _FUNCTIONS_AND_KEYWORDS:
            continue
        names.add(name)
    return names


def promtool_parse(expressions: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``promtool check rules`` on a rules file with one recording rule per expression (the PromQL parser)."""
    promtool = shutil.which("promtool")
    assert promtool is not None
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{k}", "expr": e} for k, e in enumerate(expressions)
    ]}]}  # fmt: skip
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    return subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def test_dashboard_has_a_panel_for_every_part_of_the_pane(dashboard: dict[str, Any]) -> None:
    used = set().union(*(metric_names(plain_promql(e)) for _, e in dashboard_expressions(dashboard)))
    wanted = {
        "TTFT": "pdctl_router_ttft_seconds_bucket",
        "TPOT": "pdctl_router_tpot_seconds_bucket",
        "E2E": "pdctl_router_e2e_seconds_bucket",
        "queue waits": "vllm:request_queue_time_seconds_bucket",
        "transfer time": "vllm:nixl_xfer_time_seconds_sum",
        "failures": "pdctl_router_fallbacks_total",
        "route decisions": "pdctl_router_decisions_total",
        "cache hit rate": "vllm:prefix_cache_hits_total",
        "P/D counts": "pdctl_router_instance_role",
        "controller decisions": "pdctl_controller_decisions_total",
    }
    missing = {part: name for part, name in wanted.items() if name not in used}
    assert not missing, missing
    ids = [p["id"] for p in _walk_panels(dashboard["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_dashboard_metrics_are_exported_by_pdctl_or_vllm(dashboard: dict[str, Any]) -> None:
    exported = exported_metric_names()
    assert "pdctl_router_ttft_seconds_bucket" in exported
    assert "vllm:num_requests_waiting" in exported
    unknown: dict[str, list[str]] = {}
    for title, expr in dashboard_expressions(dashboard):
        names = metric_names(plain_promql(expr))
        assert names, f"{title}: no metric in {expr!r}"
        if names - exported:
            unknown[title] = sorted(names - exported)
    templated = [m for m in template_metrics(dashboard) if m not in exported]
    if templated:
        unknown["templating"] = templated
    assert not unknown, unknown


def test_metric_scan_finds_names_and_flags_unknown_ones() -> None:
    expr = 'histogram_quantile(0.95, sum by (le, tenant) (rate(pdctl_router_ttft_seconds_bucket{tenant=~"a|b"}[1m])))'
    assert metric_names(expr) == {"pdctl_router_ttft_seconds_bucket"}
    ratio = "sum(rate(vllm:prefix_cache_hits_total[1m])) / sum(rate(vllm:prefix_cache_queries_total[1m]))"
    assert metric_names(ratio) == {"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"}
    assert metric_names("time() - pdctl_controller_last_tick_timestamp_seconds") == {
        "pdctl_controller_last_tick_timestamp_seconds"
    }
    assert "pdctl_router_made_up_total" not in exported_metric_names()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not on the PATH (Debian package prometheus)")
def test_every_dashboard_expression_parses(dashboard: dict[str, Any], tmp_path: Path) -> None:
    expressions = [plain_promql(e) for _, e in dashboard_expressions(dashboard)]
    assert len(expressions) >= 20
    done = promtool_parse(expressions, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not on the PATH (Debian package prometheus)")
def test_promtool_check_refuses_a_broken_expression(tmp_path: Path) -> None:
    done = promtool_parse(["sum(rate(pdctl_router_requests_total[1m])"], tmp_path)
    assert done.returncode != 0


def test_dashboard_shows_every_stage_from_its_named_sources(dashboard: dict[str, Any]) -> None:
    """One panel per docs/design.md stage, reading the router's histogram (router-timed stages) and the vLLM
    metric :data:`policies.stages.STAGE_SOURCES` names for it; the derived decode-queue expression too."""
    from policies.schema import STAGES
    from policies.stages import ROUTER_STAGE_METRIC, STAGE_SOURCES

    exported = exported_metric_names()
    panels = {p.get("title", ""): p for p in _walk_panels(dashboard["panels"])}
    assert [s.stage for s in STAGE_SOURCES] == list(STAGES)
    for source in STAGE_SOURCES:
        titled = [p for title, p in panels.items() if title.endswith(f" {source.stage}")]
        assert len(titled) == 1, f"no single panel titled after stage {source.stage}"
        exprs = [plain_promql(t["expr"]) for t in titled[0]["targets"]]
        names = set().union(*(metric_names(e) for e in exprs))
        assert source.vllm_metric + "_sum" in names, (source.stage, source.vllm_metric)
        assert source.vllm_metric + "_sum" in exported, source.vllm_metric
        router_exprs = [e for e in exprs if ROUTER_STAGE_METRIC in e]
        if source.router_timed:
            assert router_exprs, f"{source.stage}: the router's stage histogram is not shown"
            assert all(f'stage="{source.stage}"' in e for e in router_exprs)
        else:
            assert not router_exprs, f"{source.stage}: the router does not time this stage"
