"""Parity: the Prometheus source and the built-in scraper read the same emulated cluster into the same window.

One live cluster (emulated instances + router) is scraped by a real Prometheus and, at the same time, by the
controller's own scraper. Traffic runs strictly inside the window (quiet edges), so both sources see the
same requests; the windows are then compared field by field, and against the router's own request log.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from pathlib import Path

import pytest

from controller.sources.base import InstanceInfo, Topology
from controller.sources.prometheus import PrometheusReader
from controller.sources.scrape import ScrapeReader
from controller.sources.source import MetricSource
from controller.sources.window import WindowBuilder
from livestack.emulator.tokenizer import prompt_text
from router.telemetry import _PROMPT_TOKEN_BUCKETS, _TPOT_BUCKETS, _TTFT_BUCKETS
from tests.controller.harness import prometheus, wait_until
from tests.controller.stack import POLICY
from tests.router.cluster import live_cluster, stream_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

TENANTS = ["chat", "rag"]
GROUPS = ["interactive"]


def _bucket_distance(a: float | None, b: float | None, bounds: tuple[float, ...]) -> int:
    if a is None or b is None:
        return 0 if a is b else 99
    return abs(bisect.bisect_left(bounds, a) - bisect.bisect_left(bounds, b))


def _close(a: float | None, b: float | None, rel: float, abs_: float = 1e-9) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


async def test_prometheus_and_scraper_windows_agree(tmp_path: Path) -> None:
    async with live_cluster(tmp_path, num_prefill=1, num_decode=2, policy_yaml=POLICY) as cluster:
        instances = {iid: (url, "interactive") for iid, url in cluster.host.urls.items()}
        with prometheus(tmp_path, cluster.url, instances) as prom:
            topology = Topology.from_instances(
                [
                    InstanceInfo(iid, "interactive", "prefill" if iid.startswith("p") else "decode", url)
                    for iid, url in cluster.host.urls.items()
                ]
            )

            def scraping() -> bool:
                rows = prom.query("count_over_time(vllm:kv_cache_usage_perc[10s])")
                return len(rows) == 3 and all(float(r["value"][1]) >= 2 for r in rows)

            await wait_until(lambda: asyncio.to_thread(scraping), 30, what="Prometheus to scrape every instance")

            async def send(tenant: str, tokens: int, n: int) -> None:
                body = {"max_tokens": 6, "prompt": prompt_text(tokens, salt=f"{tenant}-{n}")}
                result = await stream_request(cluster.session, cluster.url, body, {"X-Tenant-Id": tenant})
                assert result.status == 200

            # Every series exists (and Prometheus has scraped it) before the window starts: the priming rounds have
            # the window's shape, so every (tenant, route) the window's traffic takes (routes depend on the decode
            # pressure that concurrent requests create) is already a series.
            for n in (-1, -2, -3):
                await asyncio.gather(send("chat", 120, n), send("rag", 5000, n), send("rag", 2500, n - 100))
                await asyncio.sleep(0.3)
            await asyncio.sleep(2.5)
            primed = len(cluster.records())
            scraper = ScrapeReader(f"{cluster.url}/metrics", window_s=60.0, timeout_s=2.0)
            builder = WindowBuilder()
            t0 = time.time()
            await scraper.scrape(topology, t0)
            await asyncio.sleep(1.5)

            for n in range(8):
                await asyncio.gather(send("chat", 120, n), send("rag", 5000, n), send("rag", 2500, n + 100))
                await asyncio.sleep(0.3)
            await asyncio.sleep(3.0)  # let Prometheus scrape the final counter values
            t1 = time.time()
            scrape_window = await MetricSource(scraper, builder, 60.0, t0).observe(topology, TENANTS, GROUPS, t1)
            prom_reader = PrometheusReader(prom.url, window_s=t1 - t0, timeout_s=5.0)
            prom_window = await MetricSource(prom_reader, builder, t1 - t0, t0).observe(topology, TENANTS, GROUPS, t1)
            await scraper.close()
            await prom_reader.close()
            assert scrape_window.error is None
            assert prom_window.error is None
            a, b = scrape_window.window, prom_window.window

    records = cluster.records()[primed:]
    for tenant in TENANTS:
        mine = [r for r in records if r["tenant"] == tenant]
        sa, sb = a.tenants[tenant], b.tenants[tenant]
        # Ground truth from the router's own request log.
        assert sa.request_rate_rps == pytest.approx(len(mine) / a.window_s, rel=1e-6)
        assert sa.mean_input_tokens == pytest.approx(sum(r["input_tokens"] for r in mine) / len(mine), rel=1e-6)
        # Prometheus extrapolates increase() to the window edges: rates agree within that, ratios closely.
        assert _close(sa.request_rate_rps, sb.request_rate_rps, rel=0.35), (sa, sb)
        assert _close(sa.mean_input_tokens, sb.mean_input_tokens, rel=0.02)
        assert _close(sa.mean_output_tokens, sb.mean_output_tokens, rel=0.02)
        assert _close(sa.remote_prefill_frac, sb.remote_prefill_frac, rel=0.05, abs_=0.02)
        # A histogram quantile is resolved to one bucket: with a handful of requests, one sample at the window
        # edge (Prometheus's scrape instants versus the scraper's) moves the interpolated value within or to the
        # neighbouring bucket. Agree within 5 %, or land in the same or an adjacent bucket.
        for field, buckets in (
            ("ttft_p50_s", _TTFT_BUCKETS), ("ttft_p95_s", _TTFT_BUCKETS), ("ttft_p99_s", _TTFT_BUCKETS),
            ("tpot_p50_s", _TPOT_BUCKETS), ("tpot_p95_s", _TPOT_BUCKETS), ("tpot_p99_s", _TPOT_BUCKETS),
        ):  # fmt: skip
            va, vb = getattr(sa, field), getattr(sb, field)
            assert _close(va, vb, rel=0.05) or _bucket_distance(va, vb, buckets) <= 1, (field, va, vb)
        # SLO attainment: the router's judgement of each request (its log's slo_met) over the successful ones
        ok = [r for r in mine if r["status"] == 200]
        assert ok
        assert sa.slo_attainment_frac == pytest.approx(sum(bool(r["slo_met"]) for r in ok) / len(ok), rel=1e-6)
        assert _close(sa.slo_attainment_frac, sb.slo_attainment_frac, rel=0.02, abs_=0.02)
        assert _close(sa.goodput_rps, sb.goodput_rps, rel=0.35)
        # Prompt length p95 (a histogram, like the latencies) and the router's prefix-hit estimate, from both.
        assert _close(sa.p95_input_tokens, sb.p95_input_tokens, rel=0.05) or (
            _bucket_distance(sa.p95_input_tokens, sb.p95_input_tokens, _PROMPT_TOKEN_BUCKETS) <= 1
        ), (sa.p95_input_tokens, sb.p95_input_tokens)
        inputs = sorted(r["input_tokens"] for r in mine)
        assert sa.p95_input_tokens is not None
        true_p95 = float(inputs[int(0.95 * (len(inputs) - 1))])
        assert _bucket_distance(sa.p95_input_tokens, true_p95, _PROMPT_TOKEN_BUCKETS) <= 1
        hit_frac = sum(r["prefix_hit_tokens"] for r in mine) / sum(r["input_tokens"] for r in mine)
        assert sa.prefix_cache_hit_frac == pytest.approx(hit_frac, rel=1e-6, abs=1e-9)
        assert _close(sa.prefix_cache_hit_frac, sb.prefix_cache_hit_frac, rel=0.05, abs_=0.02)
    assert a.tenants["rag"].remote_prefill_frac is not None
    assert a.tenants["rag"].remote_prefill_frac > 0
    ga, gb = a.groups["interactive"], b.groups["interactive"]
    assert (ga.num_prefill, ga.num_decode) == (gb.num_prefill, gb.num_decode) == (1, 2)
    for field in ("prefill_queue_wait_s", "prefix_cache_hit_frac", "kv_transfer_failure_frac"):
        assert _close(getattr(ga, field), getattr(gb, field), rel=0.05, abs_=1e-3), field
    for field in ("decode_kv_usage_frac", "prefill_kv_usage_frac", "decode_active_seqs", "prefill_queue_requests"):
        assert _close(getattr(ga, field), getattr(gb, field), rel=0.05, abs_=0.05), field
    assert ga.kv_transfer_time_p95_s is not None
    assert _close(ga.kv_transfer_time_p95_s, gb.kv_transfer_time_p95_s, rel=0.1)
