"""Sources: the window derivation (sums before ratios, None for missing), the scraper."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from controller.sources.base import InstanceInfo, Query, Readout, SourceUnavailableError, Topology
from controller.sources.prometheus import promql
from controller.sources.scrape import ScrapeReader, Snapshot, parse_exposition
from controller.sources.source import MetricSource
from controller.sources.window import WindowBuilder, WindowQueries

TOPOLOGY = Topology.from_instances(
    [InstanceInfo("p0", "g", "prefill"), InstanceInfo("d0", "g", "decode"), InstanceInfo("d1", "g", "decode")]
)
Q = WindowQueries()
R, INST = Q.router(), Q.instances()


def test_promql_forms() -> None:
    assert promql(Query("increase", "m_total", ("tenant",)), 30) == "sum by (tenant) (increase(m_total[30000ms]))"
    assert promql(Query("gauge", "g", ("instance_id",)), 30) == "sum by (instance_id) (g)"
    assert promql(Query("quantile", "h", ("tenant",), 0.95), 5) == (
        "histogram_quantile(0.95, sum by (le, tenant) (increase(h_bucket[5000ms])))"
    )
    assert (
        promql(Query("buckets", "h", ("instance_id",)), 1.5) == "sum by (le, instance_id) (increase(h_bucket[1500ms]))"
    )


def readout(results: dict[Query, list[tuple[dict[str, str], float]]], window_s: float = 10.0) -> Readout:
    return Readout(results, window_s, 100.0)


def test_window_means_are_sums_over_sums_and_missing_is_none() -> None:
    results = {
        R["requests"]: [
            ({"tenant": "a", "route": "remote_prefill", "outcome": "ok"}, 6.0),
            ({"tenant": "a", "route": "local_prefill", "outcome": "ok"}, 3.0),
            ({"tenant": "a", "route": "local_prefill", "outcome": "error"}, 1.0),
        ],
        R["prompt_sum"]: [({"tenant": "a"}, 20000.0)],
        R["ttft_0.95"]: [({"tenant": "a"}, 0.8), ({"tenant": "b"}, math.nan)],
        # p0 took 1 request waiting 10 s; p1 (unknown to the topology, labelled on the series) 9 waiting 1 s each:
        # the group mean is 19/10 = 1.9 s, not the mean of means (5.5 s).
        INST["queue_sum"]: [
            ({"instance_id": "p0"}, 10.0),
            ({"instance_id": "p1", "group": "g", "role": "prefill"}, 9.0),
        ],
        INST["queue_count"]: [
            ({"instance_id": "p0"}, 1.0),
            ({"instance_id": "p1", "group": "g", "role": "prefill"}, 9.0),
        ],
        INST["kv_usage"]: [({"instance_id": "d0"}, 0.2), ({"instance_id": "d1"}, 0.6), ({"instance_id": "p0"}, 0.9)],
        INST["waiting"]: [({"instance_id": "p0"}, 4.0), ({"instance_id": "d0"}, 1.0)],
        INST["prompt_sum"]: [({"instance_id": "p0"}, 5000.0)],
        INST["prompt_count"]: [({"instance_id": "p0"}, 2.0)],
        INST["xfer_count"]: [({"instance_id": "d0"}, 8.0)],
        INST["xfer_failed"]: [({"instance_id": "d0"}, 2.0)],
        INST["xfer_buckets"]: [
            ({"instance_id": "d0", "le": "0.1"}, 4.0),
            ({"instance_id": "d0", "le": "+Inf"}, 8.0),
            ({"instance_id": "d1", "le": "0.1"}, 2.0),
            ({"instance_id": "d1", "le": "+Inf"}, 2.0),
        ],
        INST["prefix_hits"]: [({"instance_id": "d0"}, 30.0), ({"instance_id": "unknown-instance"}, 1e9)],
        INST["prefix_queries"]: [({"instance_id": "d0"}, 100.0)],
    }
    window = WindowBuilder().build(readout(results), TOPOLOGY, ["a", "b"], ["g", "h"], 100.0, 0.5)
    a, b = window.tenants["a"], window.tenants["b"]
    assert a.request_rate_rps == pytest.approx(1.0)
    assert a.remote_prefill_frac == pytest.approx(0.6)
    assert a.failed_rate_rps == pytest.approx(0.1)
    assert a.mean_input_tokens == pytest.approx(2000.0)
    assert a.ttft_p95_s == 0.8
    assert a.mean_output_tokens is None
    assert a.slo_attainment_frac is None
    assert b == type(b)(), "a tenant without series is unknown in every field, never zero"
    g = window.groups["g"]
    assert (g.num_prefill, g.num_decode) == (1, 2)
    assert g.prefill_queue_wait_s == pytest.approx(1.9)
    assert g.decode_kv_usage_frac == pytest.approx(0.4)
    assert g.prefill_kv_usage_frac == pytest.approx(0.9)
    assert g.prefill_queue_requests == 4.0
    assert g.decode_queue_requests == 1.0
    assert g.prefill_queued_tokens == pytest.approx(4 * 2500.0)
    assert g.kv_transfer_failure_frac == pytest.approx(0.2)
    assert g.kv_transfer_time_p95_s == 0.1, "rank in +Inf: the highest finite bound"
    assert g.prefix_cache_hit_frac == pytest.approx(0.3)
    assert g.decode_active_seqs is None
    h = window.groups["h"]
    assert (h.num_prefill, h.num_decode, h.decode_kv_usage_frac) == (0, 0, None)
    assert window.staleness_s == 0.5


def test_the_load_is_read_from_arrivals_as_in_the_simulator() -> None:
    """A backlog: 20 requests arrived in the 10-s window (18 routed, 2 refused), only 5 finished. The rate, the
    mean prompt and the remote share are the arrivals' (as ``env.sim.windows`` measures them), not the finished."""
    results = {
        R["requests"]: [
            ({"tenant": "a", "route": "remote_prefill", "outcome": "ok"}, 3.0),
            ({"tenant": "a", "route": "none", "outcome": "error"}, 2.0),
            ({"tenant": "a", "route": "rejected", "outcome": "error"}, 50.0),  # malformed bodies: no load, no failure
        ],
        R["prompt_sum"]: [({"tenant": "a"}, 3000.0)],
        R["decisions"]: [
            ({"tenant": "a", "route": "remote_prefill"}, 6.0),
            ({"tenant": "a", "route": "local_prefill"}, 12.0),
            ({"tenant": "b", "route": "local_prefill"}, 0.0),
        ],
        R["routed_prompt_sum"]: [({"tenant": "a"}, 36000.0), ({"tenant": "b"}, 0.0)],
    }
    window = WindowBuilder().build(readout(results), TOPOLOGY, ["a", "b"], ["g"], 100.0, 0.0)
    a, b = window.tenants["a"], window.tenants["b"]
    assert a.request_rate_rps == pytest.approx(2.0)
    assert a.mean_input_tokens == pytest.approx(2000.0)
    assert a.remote_prefill_frac == pytest.approx(1 / 3)
    assert a.failed_rate_rps == pytest.approx(0.2)
    assert b.request_rate_rps == 0.0, "a tenant seen before but idle in the window: no load, not unknown"
    assert b.mean_input_tokens is None
    assert b.remote_prefill_frac is None


def test_requests_refused_by_admission_are_load_and_failures_but_not_in_the_remote_share() -> None:
    """As ``env.sim.windows`` counts them: arrivals and failures, while the remote share is over what was placed."""
    results = {
        R["requests"]: [
            ({"tenant": "a", "route": "remote_prefill", "outcome": "ok"}, 3.0),
            ({"tenant": "a", "route": "refused", "outcome": "error"}, 4.0),
        ],
        R["decisions"]: [
            ({"tenant": "a", "route": "remote_prefill"}, 6.0),
            ({"tenant": "a", "route": "local_prefill"}, 12.0),
            ({"tenant": "a", "route": "refused"}, 4.0),
        ],
        R["routed_prompt_sum"]: [({"tenant": "a"}, 44000.0)],
    }
    a = WindowBuilder().build(readout(results), TOPOLOGY, ["a"], ["g"], 100.0, 0.0).tenants["a"]
    assert a.request_rate_rps == pytest.approx(2.2)
    assert a.mean_input_tokens == pytest.approx(2000.0)
    assert a.remote_prefill_frac == pytest.approx(1 / 3)
    assert a.failed_rate_rps == pytest.approx(0.4)


def exposition(requests: float, ttft: list[float], kv: float) -> str:
    registry = CollectorRegistry()
    counter = Counter("pdctl_router_requests", "r", ["tenant", "route", "outcome"], registry=registry)
    counter.labels("a", "local_prefill", "ok").inc(requests)
    hist = Histogram("pdctl_router_ttft_seconds", "t", ["tenant", "route"], buckets=(0.1, 1.0), registry=registry)
    for value in ttft:
        hist.labels("a", "local_prefill").observe(value)
    Gauge("vllm:kv_cache_usage_perc", "kv", registry=registry).set(kv)
    return generate_latest(registry).decode()


def kv_exposition(kv: float) -> str:
    registry = CollectorRegistry()
    Gauge("vllm:kv_cache_usage_perc", "kv", ["engine"], registry=registry).labels("0").set(kv)
    return generate_latest(registry).decode()


def test_scraper_diffs_counters_and_handles_resets_and_new_series() -> None:
    reader = ScrapeReader(None, window_s=30.0, timeout_s=1.0)
    first: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    parse_exposition(exposition(10, [0.05] * 4, 0.1), {}, first)
    reader.remember(Snapshot(0.0, first, frozenset({""})))
    with pytest.raises(SourceUnavailableError):
        ScrapeReader(None, 30.0, 1.0).evaluate([R["requests"]])
    later: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    parse_exposition(exposition(25, [0.05] * 4 + [0.5] * 6, 0.7), {}, later)
    reader.remember(Snapshot(10.0, later, frozenset({""})))
    out = reader.evaluate(
        [R["requests"], R["ttft_0.5"], INST["kv_usage"], Query("gauge", "vllm:kv_cache_usage_perc", ())]
    )
    assert out.window_s == 10.0
    assert out.results[R["requests"]] == [({"tenant": "a", "route": "local_prefill", "outcome": "ok"}, 15.0)]
    [(labels, p50)] = out.results[R["ttft_0.5"]]
    assert labels == {"tenant": "a"}
    assert p50 == pytest.approx(0.1 + 0.9 * (3 / 6))
    assert out.results[INST["kv_usage"]] == [], "no instance_id label on this series"
    assert out.results[Query("gauge", "vllm:kv_cache_usage_perc", ())] == [({}, 0.7)]
    # A counter reset (restart) counts from zero.
    reset: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    parse_exposition(exposition(3, [], 0.7), {}, reset)
    reader.remember(Snapshot(20.0, reset, frozenset({""})))
    out = reader.evaluate([R["requests"]])
    assert out.results[R["requests"]][0][1] == 3.0


@pytest.fixture
async def metrics_server() -> AsyncIterator[tuple[str, dict[str, str]]]:
    state = {"router": exposition(1, [0.05], 0.0), "d0": kv_exposition(0.5)}

    async def router(request: web.Request) -> web.Response:
        del request
        return web.Response(text=state["router"])

    async def instance(request: web.Request) -> web.Response:
        del request
        return web.Response(text=state["d0"])

    app = web.Application()
    app.router.add_get("/metrics", router)
    app.router.add_get("/d0/metrics", instance)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        await runner.cleanup()


async def test_scraper_over_http_and_stale_when_everything_is_down(metrics_server: tuple[str, dict[str, str]]) -> None:
    url, state = metrics_server
    topology = Topology.from_instances(
        [InstanceInfo("d0", "g", "decode", f"{url}/d0"), InstanceInfo("d1", "g", "decode", "http://127.0.0.1:9")]
    )
    reader = ScrapeReader(f"{url}/metrics", window_s=30.0, timeout_s=1.0)
    source = MetricSource(reader, WindowBuilder(), 30.0, started_s=0.0)
    first = await source.observe(topology, ["a"], ["g"], 10.0)
    assert first.error is None
    assert first.window.tenants["a"].request_rate_rps is None, "one scrape: no increase yet"
    assert first.window.groups["g"].decode_kv_usage_frac == pytest.approx(0.5), "d1 is down: only d0 counts"
    state["router"] = exposition(7, [0.05] * 3, 0.0)
    state["d0"] = kv_exposition(0.25)
    second = await source.observe(topology, ["a"], ["g"], 16.0)
    assert second.window.tenants["a"].request_rate_rps == pytest.approx(1.0)
    assert second.window.window_s == pytest.approx(6.0)
    assert second.window.staleness_s == 0.0
    assert second.window.groups["g"].decode_kv_usage_frac == pytest.approx(0.25)
    await reader.close()
    dead = ScrapeReader("http://127.0.0.1:9/metrics", 30.0, 0.5)
    dead_source = MetricSource(dead, WindowBuilder(), 30.0, started_s=0.0)
    stale = await dead_source.observe(TOPOLOGY, ["a"], ["g"], 42.0)
    await dead.close()
    assert stale.error is not None
    assert stale.window.staleness_s == 42.0
    assert stale.window.tenants == {}
    assert (stale.window.groups["g"].num_prefill, stale.window.groups["g"].decode_kv_usage_frac) == (1, None)


def reference_parse(text: str, extra: dict[str, str]) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                out.setdefault(sample.name, {})[frozenset((*sample.labels.items(), *extra.items()))] = sample.value
    return out


def test_fast_parser_equals_prometheus_client_on_real_expositions() -> None:
    from livestack.emulator.metrics import VllmMetrics
    from router.telemetry import RequestRecord, RouterMetrics

    registry = CollectorRegistry()
    vllm = VllmMetrics(registry, "meta-llama/Llama-3.1-8B-Instruct", 32768, 16, 27000)
    vllm.time_to_first_token.observe(0.3)
    vllm.kv_cache_usage_perc.set(0.42)
    router_registry = CollectorRegistry()
    router = RouterMetrics(router_registry)
    for tenant in ("chat", 'we"ird\\tenant\nname', "rag"):
        router.record(
            RequestRecord("r", 0.0, tenant, "remote_prefill", "long_prompt", True, 3000, 100, ttft_s=0.2, tpot_s=0.01)
        )
    texts = (generate_latest(registry).decode(), generate_latest(router_registry).decode())
    # each text twice and under two endpoints: the second read of a label set comes from the parser's memo
    for text, extra in [(text, {"instance_id": x}) for text in texts for x in ("x", "y", "x")]:
        mine: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
        parse_exposition(text, extra, mine)
        reference = reference_parse(text, extra)
        assert mine.keys() == reference.keys()
        for name, series in reference.items():
            assert mine[name].keys() == series.keys(), name
            for key, value in series.items():
                assert mine[name][key] == value or (math.isnan(value) and math.isnan(mine[name][key]))
    wanted = frozenset({"pdctl_router_requests_total", "vllm:kv_cache_usage_perc"})
    only: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    parse_exposition(generate_latest(router_registry).decode(), {}, only, wanted)
    assert set(only) == {"pdctl_router_requests_total"}


_NAME_PARTS = st.sampled_from(["vllm:", "vllm:num_", "requests", "_total", "_bucket", "kv", "x"])


@given(
    wanted=st.frozensets(st.lists(_NAME_PARTS, min_size=1, max_size=3).map("".join), min_size=1, max_size=6),
    lines=st.lists(
        st.tuples(st.lists(_NAME_PARTS, min_size=1, max_size=3).map("".join),
                  st.sampled_from(['{a="1"} 2', " 3", "\t4", "_created 5", "{} 6", "", "# HELP"])),
        max_size=12,
    ),
)  # fmt: skip
def test_the_line_filter_keeps_exactly_the_lines_of_wanted_names(
    wanted: frozenset[str], lines: list[tuple[str, str]]
) -> None:
    from controller.sources.scrape import _line_filter

    text = "\n".join(name + rest for name, rest in lines)
    expected = [
        line
        for line in text.split("\n")
        if any(line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " ", "\t") for name in wanted)
    ]
    assert _line_filter(wanted).findall("\n" + text) == expected


def test_malformed_exposition_is_refused_whole() -> None:
    with pytest.raises(ValueError, match="Invalid labels"):
        parse_exposition('m{a="1",garbage,b="2"} 3\n', {}, {})


values = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)


@given(
    finished=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["remote_prefill", "local_prefill"]),
                                st.sampled_from(["ok", "error"]), values), max_size=8),
    queue=st.lists(st.tuples(st.sampled_from(["p0", "d0", "d1"]), values, values), max_size=6),
    kv=st.lists(st.tuples(st.sampled_from(["p0", "d0", "d1"]), st.floats(0.0, 1.0)), max_size=3,
                unique_by=lambda x: x[0]),
    window_s=st.floats(0.5, 120.0),
)  # fmt: skip
def test_window_fields_are_finite_fractions_in_range_or_unknown(
    finished: list[tuple[str, str, str, float]],
    queue: list[tuple[str, float, float]],
    kv: list[tuple[str, float]],
    window_s: float,
) -> None:
    results = {
        R["requests"]: [({"tenant": t, "route": r, "outcome": o}, v) for t, r, o, v in finished],
        INST["queue_sum"]: [({"instance_id": i}, s) for i, s, _ in queue],
        INST["queue_count"]: [({"instance_id": i}, c) for i, _, c in queue],
        INST["kv_usage"]: [({"instance_id": i}, v) for i, v in kv],
    }
    window = WindowBuilder().build(Readout(results, window_s, 0.0), TOPOLOGY, ["a", "b"], ["g"], 0.0, 0.0)
    for tenant in window.tenants.values():
        for name in ("remote_prefill_frac", "slo_attainment_frac"):
            value = getattr(tenant, name)
            assert value is None or 0.0 <= value <= 1.0
        for name in ("request_rate_rps", "failed_rate_rps"):
            value = getattr(tenant, name)
            assert value is None or (math.isfinite(value) and value >= 0.0)
        if tenant.request_rate_rps is not None and tenant.failed_rate_rps is not None:
            assert tenant.failed_rate_rps <= tenant.request_rate_rps + 1e-9
    group = window.groups["g"]
    for name in ("decode_kv_usage_frac", "prefill_kv_usage_frac"):
        value = getattr(group, name)
        assert value is None or 0.0 <= value <= 1.0
    wait = group.prefill_queue_wait_s
    prefill = [(s, c) for i, s, c in queue if i == "p0"]
    if wait is not None:
        assert wait == pytest.approx(sum(s for s, _ in prefill) / sum(c for _, c in prefill))
