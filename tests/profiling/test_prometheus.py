"""Prometheus source against a small fake Prometheus HTTP API on loopback (real prometheus-api-client calls)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from livestack.profiling.prometheus import PrometheusSourceError, bucket_distribution, profile_prometheus

# cumulative bucket counts per histogram (le → count) and sums
HISTOGRAMS = {
    "vllm:request_prompt_tokens": ({"100": 50, "1000": 80, "5000": 95, "+Inf": 100}, 60_000.0),
    "vllm:request_generation_tokens": ({"50": 40, "200": 90, "1000": 100, "+Inf": 100}, 12_000.0),
    "vllm:time_to_first_token_seconds": ({"0.1": 60, "0.5": 95, "1.0": 100, "+Inf": 100}, 15.0),
    "vllm:inter_token_latency_seconds": ({"0.01": 500, "0.05": 9_000, "0.1": 10_000, "+Inf": 10_000}, 250.0),
    "vllm:e2e_request_latency_seconds": ({"1": 10, "5": 90, "10": 100, "+Inf": 100}, 350.0),
}


class _Handler(BaseHTTPRequestHandler):
    queries: list[str] = []  # noqa: RUF012 - test-only shared log

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)["query"][0]
        self.queries.append(query)
        result: list[dict[str, Any]]
        if url.path == "/api/v1/query_range":
            result = [{"metric": {}, "values": [[1000 + 60 * i, str(r)] for i, r in enumerate([1.0, 2.0, 3.0, 2.0])]}]
        else:
            name = next(n for n in HISTOGRAMS if n in query)
            buckets, total = HISTOGRAMS[name]
            if "_bucket" in query:
                result = [{"metric": {"le": le}, "value": [1000, str(c)]} for le, c in buckets.items()]
            else:
                result = [{"metric": {}, "value": [1000, str(total)]}]
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def fake_prometheus() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


START = datetime(2026, 1, 1, 0, 0, tzinfo=UTC)
END = datetime(2026, 1, 1, 1, 0, tzinfo=UTC)


def test_profile_from_vllm_histograms(fake_prometheus: str) -> None:
    profile = profile_prometheus(fake_prometheus, START, END)
    assert profile.source_kind == "prometheus"
    assert profile.num_requests == 100
    assert profile.input.mean == pytest.approx(600.0)
    assert profile.input.p50 == pytest.approx(100 + 900 * (50 - 50) / 30)
    assert profile.input.p90 == pytest.approx(1000 + 4000 * (90 - 80) / 15)
    # share ≥ 2048: interpolated inside (1000, 5000]
    assert profile.long_context_frac == pytest.approx(1 - (80 + 15 * (2048 - 1000) / 4000) / 100)
    assert profile.output.mean == pytest.approx(120.0)
    assert set(profile.latency) == {"ttft", "tpot", "e2e"}
    assert profile.latency["tpot"].p50_s == pytest.approx(0.01 + 0.04 * (5_000 - 500) / 8_500)
    assert profile.arrivals is not None
    assert profile.arrivals.rate_curve_rps == [1.0, 2.0, 3.0, 2.0]
    assert profile.arrivals.peak_to_mean == pytest.approx(1.5)
    assert any("3600s" in q for q in _Handler.queries)
    assert any("independent" in note for note in profile.notes)


def test_unreachable_prometheus_is_one_line() -> None:
    with pytest.raises(PrometheusSourceError) as info:
        profile_prometheus("http://127.0.0.1:9", START, END)
    assert str(info.value) == "http://127.0.0.1:9: Prometheus unreachable (connection failed)"


def test_empty_range_and_reversed_range(fake_prometheus: str) -> None:
    with pytest.raises(PrometheusSourceError, match="after"):
        profile_prometheus(fake_prometheus, END, START)


def test_bucket_parsing_sorts_and_accepts_inf() -> None:
    dist = bucket_distribution(
        [{"metric": {"le": "+Inf"}, "value": [0, "10"]}, {"metric": {"le": "1"}, "value": [0, "4"]}], 7.0
    )
    assert dist.upper_bounds.tolist()[0] == 1.0
    assert dist.count == 10
