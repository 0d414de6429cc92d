"""Controller CPU per tick with 50 tenants and 64 instances (budget: under 100 ms).

The tick is the whole controller pipeline on the embedded default source: parse the router's and every
instance's ``/metrics`` text (realistic expositions: the router's ``RouterMetrics`` with 50 tenants × 2
routes, and the emulator's full vLLM metric set on each of 64 instances), diff counters, derive the window,
build the observation, run the queue/KV rule policy, the guard and the override merge, build the policy
document, and hand the plan to the dry-run actuator. Only the HTTP transfer is left out: the expositions are
served from memory (pre-rendered, as the servers would render them). CPU is measured with
``time.process_time`` around :meth:`ControlLoop.tick` on a virtual clock.

Run: ``PYTHONHASHSEED=0 python -m pytest benchmarks/controller -m benchmark -q -s -p no:randomly``
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from harness import figure, write_fragment
from prometheus_client import CollectorRegistry, generate_latest

from controller.audit import AuditLog
from controller.clock import VirtualClock
from controller.config import ControllerConfig
from controller.loop import ControlLoop
from controller.overrides import OverrideWatcher
from controller.runtime import build_runtime
from controller.sources.scrape import ScrapeReader
from controller.sources.source import MetricSource
from controller.sources.window import WindowBuilder
from controller.telemetry import Telemetry
from livestack.emulator.metrics import VllmMetrics
from router.telemetry import RequestRecord, RouterMetrics

pytestmark = [pytest.mark.benchmark]

NUM_TENANTS = 50
NUM_GROUPS = 8
INSTANCES_PER_GROUP = 8
BUDGET_S = 0.100
RESULTS = Path(__file__).resolve().parents[1] / "results" / "controller.md"
COMMAND = "PYTHONHASHSEED=0 python -m pytest benchmarks/controller -m benchmark -q -s -p no:randomly"


class MemoryScrapeReader(ScrapeReader):
    """The built-in scraper with the network replaced by pre-rendered expositions (parsing stays)."""

    def __init__(self, pages: dict[str, str], window_s: float) -> None:
        super().__init__("http://router/metrics", window_s, timeout_s=1.0)
        self.pages = pages

    async def _get(self, url: str) -> str | None:
        return self.pages.get(url)


def policy_yaml() -> str:
    groups = [
        {"name": f"g{g}", "gpu_budget": INSTANCES_PER_GROUP, "pools": {"prefill": {"min": 1}, "decode": {"min": 1}}}
        for g in range(NUM_GROUPS)
    ]
    tenants = [
        {
            "name": f"t{t:02d}",
            "group": f"g{t % NUM_GROUPS}",
            "slo": {"ttft_p95_ms": 300 if t % 5 else 50, "tpot_p95_ms": 60},
            "match": {"tenant_ids": [f"tenant-{t}"]},
        }
        for t in range(NUM_TENANTS)
    ]
    return yaml.safe_dump({"tenant_groups": groups, "tenants": tenants})


def instances() -> list[dict[str, Any]]:
    out = []
    for g in range(NUM_GROUPS):
        for i in range(INSTANCES_PER_GROUP):
            role = "prefill" if i < 2 else "decode"
            out.append({"id": f"g{g}-{role[0]}{i}", "group": f"g{g}", "role": role, "url": f"http://i/g{g}-{i}"})
    return out


class Cluster:
    """Router and instance metrics advanced by synthetic traffic between ticks."""

    def __init__(self, instance_list: list[dict[str, Any]], seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.router_registry = CollectorRegistry()
        self.router = RouterMetrics(self.router_registry)
        self.instances = instance_list
        self.registries: dict[str, CollectorRegistry] = {}
        self.metrics: dict[str, VllmMetrics] = {}
        for inst in instance_list:
            registry = CollectorRegistry()
            self.registries[inst["url"]] = registry
            self.metrics[inst["url"]] = VllmMetrics(registry, "meta-llama/Llama-3.1-8B-Instruct", 32768, 16, 27000)

    def advance(self) -> None:
        for t in range(NUM_TENANTS):
            for k in range(int(self.rng.integers(5, 15))):
                input_tokens = int(self.rng.integers(100, 8000))
                route = "remote_prefill" if input_tokens > 4096 else "local_prefill"
                ttft = float(self.rng.gamma(2.0, 0.05 if t % 5 else 0.2))
                self.router.record(
                    RequestRecord(
                        request_id=f"r{t}-{k}", arrival_ts=0.0, tenant=f"t{t:02d}", route=route, reason="x",
                        stream=True, input_tokens=input_tokens, expected_output_tokens=200,
                        output_tokens=int(self.rng.integers(20, 400)), ttft_s=ttft,
                        tpot_s=float(self.rng.gamma(2.0, 0.01)), e2e_s=ttft + 2.0,
                        stages={"request_queue_wait": 0.001, "first_token_emit_time": ttft},
                    )
                )  # fmt: skip
        for inst in self.instances:
            m = self.metrics[inst["url"]]
            for _ in range(int(self.rng.integers(3, 10))):
                m.request_queue_time.observe(float(self.rng.gamma(2.0, 0.1)))
                m.time_to_first_token.observe(float(self.rng.gamma(2.0, 0.05)))
                m.request_prompt_tokens.observe(float(self.rng.integers(100, 8000)))
                m.nixl_xfer_time.observe(float(self.rng.gamma(2.0, 0.01)))
            m.prefix_cache_queries.inc(5000)
            m.prefix_cache_hits.inc(float(self.rng.integers(0, 5000)))
            m.kv_cache_usage_perc.set(float(self.rng.uniform(0.1, 0.9)))
            m.num_requests_waiting.set(float(self.rng.integers(0, 6)))
            m.num_requests_running.set(float(self.rng.integers(0, 64)))

    def pages(self) -> dict[str, str]:
        pages = {"http://router/metrics": generate_latest(self.router_registry).decode()}
        for url, registry in self.registries.items():
            pages[f"{url}/metrics"] = generate_latest(registry).decode()
        return pages


async def test_tick_cpu_with_50_tenants_and_64_instances(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(policy_yaml())
    (tmp_path / "overrides").mkdir()
    config = ControllerConfig(
        mode="active",
        interval_s=10.0,
        policy="baseline:queue_kv",
        policy_file=tmp_path / "policy.yaml",
        override_dir=tmp_path / "overrides",
        audit_log=tmp_path / "audit.jsonl",
        instances=instances(),
        source={"kind": "scrape", "router_metrics_url": "http://router/metrics", "window_s": 30.0},
        guard={"hysteresis_ticks": 1, "cooldown_s": 0.0},
    )
    cluster = Cluster(config.model_dump()["instances"])
    rounds = []
    for _ in range(12):
        cluster.advance()
        rounds.append(cluster.pages())
    exposition_bytes = sum(len(text) for text in rounds[-1].values())
    reader = MemoryScrapeReader(rounds[0], window_s=30.0)
    runtime = build_runtime(config, generation=1, started_s=0.0)
    runtime = replace(runtime, source=MetricSource(reader, WindowBuilder(), 30.0, started_s=0.0))
    clock = VirtualClock(datetime.now(UTC))
    loop = ControlLoop(
        runtime, clock, Telemetry(CollectorRegistry()), AuditLog(config.audit_log), OverrideWatcher(config.override_dir)
    )
    cpu_s: list[float] = []
    wall_s: list[float] = []
    for index, pages in enumerate(rounds):
        reader.pages = pages
        await clock.advance(10.0)
        wall0, cpu0 = time.perf_counter(), time.process_time()
        record = await loop.tick()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        if index >= 2:  # ticks with a full window (two scrapes diffed)
            print(f"tick {index}: {cpu * 1e3:.1f} ms CPU")
            cpu_s.append(cpu)
            wall_s.append(wall)
    window = record.window
    assert len(window.tenants) == NUM_TENANTS + 1
    assert sum(1 for t in window.tenants.values() if t.request_rate_rps is not None) == NUM_TENANTS
    assert all(g.decode_kv_usage_frac is not None for g in window.groups.values())
    assert sum(g.num_prefill + g.num_decode for g in window.groups.values()) == 64
    median_ms, worst_ms = statistics.median(cpu_s) * 1e3, max(cpu_s) * 1e3
    wall_median_ms = statistics.median(wall_s) * 1e3
    verdict = "met" if median_ms < BUDGET_S * 1e3 else "missed"
    lines = [
        "# Controller tick benchmark",
        "",
        f"Command: `{COMMAND}`",
        f"(run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {platform.machine()}, Python {platform.python_version()},"
        " 2 CPUs shared with other jobs).",
        "",
        f"One tick = parse {NUM_GROUPS * INSTANCES_PER_GROUP + 1} `/metrics` expositions "
        f"({exposition_bytes / 1e6:.2f} MB of text: the router's metrics with {NUM_TENANTS} tenants, the emulator's "
        "full vLLM metric set per instance), diff against the previous scrape, derive the window, observation, "
        "queue/KV rule policy, guard, overrides, policy document, dry-run actuation, audit line. "
        f"{NUM_TENANTS} tenants in {NUM_GROUPS} tenant groups of {INSTANCES_PER_GROUP} instances "
        f"({NUM_GROUPS * INSTANCES_PER_GROUP} instances). HTTP transfer excluded (pages served from memory).",
        "",
        "| ticks measured | CPU median (ms) | CPU worst (ms) | wall median (ms) | budget (ms) |",
        "|---|---|---|---|---|",
        f"| {len(cpu_s)} | {median_ms:.1f} | {worst_ms:.1f} | {wall_median_ms:.1f} | {BUDGET_S * 1e3:.0f} |",
        "",
        f"Budget (median CPU per tick < {BUDGET_S * 1e3:.0f} ms): **{verdict}**.",
        "",
        "The worst tick is the one during which Python runs a full (generation-2) garbage collection; in this",
        "benchmark the process also holds the synthetic cluster (65 metric registries and 12 rounds of pre-rendered",
        "pages), which makes that pass slower than in the daemon. About half of a tick is parsing the expositions",
        "(only the ~8,700 sample lines the window reads: one C-level regex jumps from newline to newline through a",
        "prefix tree of the wanted names and skips the other ~480,000 lines, and a label set read in an earlier",
        "scrape is not parsed again), about a third answering the window's queries from the two scrapes diffed.",
        "",
    ]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines))
    write_fragment(
        "controller",
        "Controller tick (50 tenants, 64 instances)",
        COMMAND,
        [
            figure("tick CPU time", "50 tenants, 8 groups x 8 instances, scrape source", "ms",
                   [c * 1e3 for c in cpu_s], repeat="tick", target=f"median < {BUDGET_S * 1e3:.0f} ms", better="lower"),
            figure("tick wall time", "same", "ms", [w * 1e3 for w in wall_s], repeat="tick", better="lower"),
        ],
        notes=f"One tick parses {len(rounds[-1])} expositions ({exposition_bytes / 1e6:.2f} MB) and runs the whole "
        "pipeline to a dry-run actuation; see `benchmarks/results/controller.md`.",
    )  # fmt: skip
    print("\n".join(lines))
    assert median_ms < BUDGET_S * 1e3
