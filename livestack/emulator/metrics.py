"""vLLM's ``/metrics`` for one emulated instance: names, types, HELP, labels and buckets of vLLM.

See ``reference/vllm-interface.md`` §5. Every metric carries ``model_name`` and ``engine`` ("0"); every
labelled child is created at startup so that each series exists at 0 before traffic. NIXL metrics are
registered because every emulated instance runs NixlConnector (``kv_both``). Durations are emulated seconds
(wall seconds divided by the time scale), so that scaled runs report the same values as real-time runs.

A decode leg's KV pull is reported as modelled (:class:`livestack.emulator.engine.TransferModel`): its whole
duration (pack, setup, bytes over the link, injected delay, unpack) as ``vllm:nixl_xfer_time_seconds``, as the
simulator observes it, and its pack (the layout conversion before the flow; 0 when both TP degrees match) as
``vllm:nixl_post_time_seconds``. As in vLLM, the whole pull is inside the decode leg's
``vllm:request_queue_time_seconds``,
``vllm:time_to_first_token_seconds`` and ``vllm:e2e_request_latency_seconds`` (timed from the arrival at the
instance). :data:`policies.stages.STAGE_SOURCES` maps these to the design's stages.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from env.sim.telemetry import (
    BUCKETS_ITERATION_TOKENS,
    BUCKETS_ITL_S,
    BUCKETS_LATENCY_S,
    BUCKETS_NIXL_BYTES,
    BUCKETS_NIXL_XFER_S,
    BUCKETS_TTFT_S,
    buckets_1_2_5,
)

__all__ = [
    "BUCKETS_ITL",
    "BUCKETS_LAT",
    "BUCKETS_TTFT",
    "EMULATOR_CLOCK_RESYNCS_METRIC",
    "EMULATOR_FIRST_TOKEN_DELAY_METRIC",
    "VllmMetrics",
    "buckets_125",
]

# vLLM's bucket families, defined once beside the simulator's counters (the two must agree).
BUCKETS_TTFT = BUCKETS_TTFT_S
BUCKETS_ITL = BUCKETS_ITL_S
BUCKETS_LAT = BUCKETS_LATENCY_S
BUCKETS_ITER = BUCKETS_ITERATION_TOKENS
BUCKETS_NIXL_TIME = BUCKETS_NIXL_XFER_S
BUCKETS_NIXL_DESCRIPTORS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
WAITING_REASONS = ("capacity", "deferred")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")

EMULATOR_FIRST_TOKEN_DELAY_METRIC = "pdctl_emulator_first_token_delay_seconds"
"""Not a vLLM metric: the emulator's lag behind its own model at each first token. A real engine's TTFT also
contains such delays (output processing, a busy host); here they are the only part of TTFT that the modelled
queue and prefill times do not contain, so a sum of TTFTs minus this is what the model alone accounts for."""
EMULATOR_CLOCK_RESYNCS_METRIC = "pdctl_emulator_clock_resyncs"
"""Not a vLLM metric (exposed as ``…_total``): how often the emulator's step clock fell further behind its model than
:data:`livestack.emulator.driver.MAX_LAG_S` and restarted from now. Each one stretched every running request's decode
by the lost time: latencies measured across it are the host's, not the model's."""


buckets_125 = buckets_1_2_5


class VllmMetrics:
    """The metric families of one vLLM engine, on an explicit registry."""

    def __init__(
        self,
        registry: CollectorRegistry,
        model_name: str,
        max_model_len: int,
        block_size: int,
        num_gpu_blocks: int,
        engine: str = "0",
    ) -> None:
        base = ("model_name", "engine")
        values = (model_name, engine)
        b125 = buckets_125(max_model_len)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, base, registry=registry, multiprocess_mode="mostrecent")

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, base, registry=registry)

        def hist(name: str, doc: str, buckets: Sequence[float], extra: tuple[str, ...] = ()) -> Histogram:
            return Histogram(name, doc, (*base, *extra), registry=registry, buckets=buckets)

        self.num_requests_running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        ).labels(*values)
        self.num_requests_waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        ).labels(*values)
        waiting_by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of requests waiting by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
            "Sum of all reasons equals vllm:num_requests_waiting.",
            (*base, "reason"),
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        self.waiting_capacity = waiting_by_reason.labels(*values, "capacity")
        self.waiting_deferred = waiting_by_reason.labels(*values, "deferred")
        sleep = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake.",
            (*base, "sleep_state"),
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        for state in SLEEP_STATES:
            sleep.labels(*values, state).set(1.0 if state == "awake" else 0.0)
        self.kv_cache_usage_perc = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        ).labels(*values)
        self.prefix_cache_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        ).labels(*values)
        self.prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        ).labels(*values)
        self.external_prefix_cache_queries = counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number "
            "of queried tokens.",
        ).labels(*values)
        self.external_prefix_cache_hits = counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of "
            "cached tokens.",
        ).labels(*values)
        self.num_preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        ).labels(*values)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(*values)
        by_source = Counter(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", (*base, "source"), registry=registry
        )
        self.prompt_tokens_by_source = {s: by_source.labels(*values, s) for s in PROMPT_SOURCES}
        self.prompt_tokens_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        ).labels(*values)
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.").labels(
            *values
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*base, "finished_reason"),
            registry=registry,
        )
        self.request_success = {r: success.labels(*values, r) for r in FINISHED_REASONS}
        self.request_prompt_tokens = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", b125
        ).labels(*values)
        self.request_generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", b125
        ).labels(*values)
        self.request_prefill_kv_computed_tokens = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            b125,
        ).labels(*values)
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", BUCKETS_ITER
        ).labels(*values)
        self.request_max_num_generation_tokens = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            b125,
        ).labels(*values)
        self.request_params_n = hist(
            "vllm:request_params_n", "Histogram of the n request parameter.", (1, 2, 5, 10, 20)
        ).labels(*values)
        self.request_params_max_tokens = hist(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", b125
        ).labels(*values)
        self.time_to_first_token = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", BUCKETS_TTFT
        ).labels(*values)
        self.inter_token_latency = hist(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", BUCKETS_ITL
        ).labels(*values)
        self.request_time_per_output_token = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            BUCKETS_ITL,
        ).labels(*values)
        self.e2e_request_latency = hist(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", BUCKETS_LAT
        ).labels(*values)
        self.request_queue_time = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            BUCKETS_LAT,
        ).labels(*values)
        self.request_inference_time = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            BUCKETS_LAT,
        ).labels(*values)
        self.request_prefill_time = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            BUCKETS_LAT,
        ).labels(*values)
        self.request_decode_time = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            BUCKETS_LAT,
        ).labels(*values)
        for name, doc in (
            ("vllm:estimated_flops_per_gpu", "Estimated number of floating point operations per GPU."),
            ("vllm:estimated_read_bytes_per_gpu", "Estimated number of bytes read from memory per GPU."),
            ("vllm:estimated_write_bytes_per_gpu", "Estimated number of bytes written to memory per GPU."),
        ):
            counter(name, doc).labels(*values)
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            (
                "block_size",
                "cache_dtype",
                "enable_prefix_caching",
                "engine",
                "gpu_memory_utilization",
                "num_gpu_blocks",
            ),
            registry=registry,
            multiprocess_mode="mostrecent",
        ).labels(str(block_size), "auto", "True", engine, "0.9", str(num_gpu_blocks)).set(1.0)
        # NixlConnector (kv_both): every emulated instance has one.
        self.nixl_xfer_time = hist(
            "vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache transfers.",
            BUCKETS_NIXL_TIME,
        ).labels(*values)  # fmt: skip
        self.nixl_post_time = hist(
            "vllm:nixl_post_time_seconds", "Histogram of transfer post time for NIXL KV Cache transfers.",
            (0.001, *BUCKETS_NIXL_TIME),
        ).labels(*values)  # fmt: skip
        self.nixl_bytes_transferred = hist(
            "vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV Cache transfers.",
            BUCKETS_NIXL_BYTES,
        ).labels(*values)  # fmt: skip
        self.nixl_num_descriptors = hist(
            "vllm:nixl_num_descriptors", "Histogram of number of descriptors per NIXL KV Cache transfers.",
            BUCKETS_NIXL_DESCRIPTORS,
        ).labels(*values)  # fmt: skip
        self.nixl_num_failed_transfers = counter(
            "vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers."
        ).labels(*values)
        self.nixl_num_failed_notifications = counter(
            "vllm:nixl_num_failed_notifications", "Number of failed NIXL KV Cache notifications."
        ).labels(*values)
        self.nixl_num_kv_expired_reqs = counter(
            "vllm:nixl_num_kv_expired_reqs", "Number of requests that had their KV expire."
        ).labels(*values)
        # The emulator's own (not vLLM's): how late first tokens reached their clients after the modelled instant.
        self.first_token_delay = hist(
            EMULATOR_FIRST_TOKEN_DELAY_METRIC,
            "Histogram of seconds between the modelled end of the step that produced a request's first token and "
            "its delivery (event-loop stalls; inside TTFT, outside the queue and prefill times).",
            BUCKETS_ITL,
        ).labels(*values)
        self.clock_resyncs = counter(
            EMULATOR_CLOCK_RESYNCS_METRIC,
            "Number of times the step clock fell further behind the model than the emulator's lag bound and "
            "restarted from now (a host stall; the running requests' decode was stretched by it).",
        ).labels(*values)
