from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from livestack.emulator.metrics import BUCKETS_ITL, BUCKETS_LAT, BUCKETS_TTFT, VllmMetrics, buckets_125

# name -> type, from reference/vllm-interface.md §5.3-5.4 (family names as the parser reports them)
EXPECTED = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_waiting_by_reason": "gauge",
    "vllm:engine_sleep_state": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:external_prefix_cache_queries": "counter",
    "vllm:external_prefix_cache_hits": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:prompt_tokens_by_source": "counter",
    "vllm:prompt_tokens_cached": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_prefill_kv_computed_tokens": "histogram",
    "vllm:iteration_tokens_total": "histogram",
    "vllm:request_max_num_generation_tokens": "histogram",
    "vllm:request_params_n": "histogram",
    "vllm:request_params_max_tokens": "histogram",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:cache_config_info": "gauge",
    "vllm:nixl_xfer_time_seconds": "histogram",
    "vllm:nixl_post_time_seconds": "histogram",
    "vllm:nixl_bytes_transferred": "histogram",
    "vllm:nixl_num_descriptors": "histogram",
    "vllm:nixl_num_failed_transfers": "counter",
    "vllm:nixl_num_failed_notifications": "counter",
    "vllm:nixl_num_kv_expired_reqs": "counter",
}


def _families() -> dict[str, object]:
    registry = CollectorRegistry()
    VllmMetrics(registry, "Qwen/Qwen3-0.6B", 8192, 16, 27000)
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_names_types_and_base_labels_match_vllm() -> None:
    families = _families()
    for name, kind in EXPECTED.items():
        assert name in families, name
        family = families[name]
        assert family.type == kind, name  # type: ignore[attr-defined]
        for sample in family.samples:  # type: ignore[attr-defined]
            assert sample.labels.get("engine") == "0", (name, sample)
            if name != "vllm:cache_config_info":
                assert sample.labels["model_name"] == "Qwen/Qwen3-0.6B"


def test_children_exist_at_zero_before_traffic() -> None:
    families = _families()

    def values(name: str, label: str) -> dict[str, float]:
        return {
            s.labels[label]: s.value
            for s in families[name].samples  # type: ignore[attr-defined]
            if s.name.endswith("_total") or s.name == name
        }

    assert values("vllm:request_success", "finished_reason") == dict.fromkeys(
        ("stop", "length", "abort", "error", "repetition"), 0.0
    )
    assert values("vllm:num_requests_waiting_by_reason", "reason") == {"capacity": 0.0, "deferred": 0.0}
    assert values("vllm:prompt_tokens_by_source", "source") == dict.fromkeys(
        ("local_compute", "local_cache_hit", "external_kv_transfer"), 0.0
    )
    info = next(s for s in families["vllm:cache_config_info"].samples)  # type: ignore[attr-defined]
    assert info.labels["block_size"] == "16"
    assert info.labels["num_gpu_blocks"] == "27000"
    assert info.labels["enable_prefix_caching"] == "True"
    assert "gpu_memory_utilization" in info.labels


def _bounds(name: str) -> list[float]:
    family = _families()[name]
    return [
        float(s.labels["le"])
        for s in family.samples  # type: ignore[attr-defined]
        if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"
    ]


def test_bucket_lists_match_vllm() -> None:
    assert _bounds("vllm:time_to_first_token_seconds") == list(BUCKETS_TTFT)
    assert BUCKETS_TTFT[0] == 0.001
    assert BUCKETS_TTFT[-1] == 2560.0
    assert len(BUCKETS_TTFT) == 22
    assert _bounds("vllm:inter_token_latency_seconds") == list(BUCKETS_ITL)
    assert len(BUCKETS_ITL) == 19
    assert _bounds("vllm:e2e_request_latency_seconds") == list(BUCKETS_LAT)
    assert BUCKETS_LAT[-1] == 7680.0
    assert _bounds("vllm:request_prompt_tokens") == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
    assert buckets_125(8192) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
    assert _bounds("vllm:nixl_bytes_transferred") == [float(2**k) for k in range(11, 34, 2)]
    assert _bounds("vllm:iteration_tokens_total")[-1] == 16384
