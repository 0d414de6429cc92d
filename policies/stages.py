"""Where each of the eight per-request stages (docs/design.md) is observed on a live stack.

A router speaking vLLM's P/D protocol sees only its own legs: it times four stages per request
(``pdctl_request_stage_seconds{stage,tenant,route}``). The other four happen inside the instances and reach
the router as one opaque wait (the decode leg's first byte), so they are read per instance from vLLM's own
``/metrics`` (``reference/vllm-interface.md`` §5.3-5.5), which the emulator exports with the same names,
types, labels and buckets. Every stage also has an instance-side view, so each one can be shown on a real
cluster with nothing but Prometheus.

Caveats a reader of the instance metrics must know (vLLM behaviour, not choices of pdctl):

* vLLM records a pulled request as *scheduled* only after its KV arrived, so ``vllm:request_queue_time_seconds``
  on a decode instance includes the whole KV wait of remote legs. The decode queue wait proper is that queue
  time minus the NIXL read's duration (:data:`DECODE_QUEUE_DERIVED_PROMQL`).
* ``vllm:nixl_xfer_time_seconds`` is the read's whole duration, from its post to its completion: it contains
  the post time (``vllm:nixl_post_time_seconds``, the pack) and, in pdctl's model, the unpack. vLLM has no
  metric for the unpack (the layout conversion when the two TP degrees differ); on a real instance a
  conversion done after the read completes lands in the queue time instead. The simulator and the emulator
  model the unpack as long as the pack, and observe the read's duration the same way
  (``env/sim/kv_transfers.py``, ``livestack/emulator/server.py``).
* The NIXL transfer metrics are observed by the instance that issues the read, the **decode** instance
  (pull mode); the prefill instance exposes none of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.schema import STAGES

__all__ = [
    "DECODE_QUEUE_DERIVED_PROMQL",
    "ROUTER_STAGE_METRIC",
    "ROUTER_TIMED_STAGES",
    "STAGE_SOURCES",
    "StageSource",
]

ROUTER_STAGE_METRIC = "pdctl_request_stage_seconds"
"""The router's per-request stage histogram (labels ``stage``, ``tenant``, ``route``)."""


@dataclass(frozen=True, slots=True)
class StageSource:
    """How one stage is observed: by the router per request, and from a vLLM histogram per instance."""

    stage: str
    router_timed: bool
    """The router times it per request (``pdctl_request_stage_seconds{stage=...}``)."""
    router_span: str
    """What the router's timing spans (empty when the router cannot time the stage)."""
    vllm_metric: str
    """The vLLM histogram (base name, no ``_bucket``/``_sum``/``_count``) the stage is read from per instance."""
    role: str
    """The pool whose instances observe it (``prefill`` or ``decode``)."""
    vllm_span: str
    """What the vLLM metric measures, and how it relates to the stage."""


STAGE_SOURCES: tuple[StageSource, ...] = (
    StageSource(
        "request_queue_wait", True, "arrival at the router -> first upstream request sent (parse, routing decision)",
        "vllm:request_queue_time_seconds", "prefill",
        "first QUEUED -> first SCHEDULED on the prefill instance (the queue of a remote prompt)",
    ),
    StageSource(
        "prefill_compute_time", True, "remote route: the prefill leg's round trip (queue and compute on P)",
        "vllm:request_prefill_time_seconds", "prefill",
        "first SCHEDULED -> first token on the prefill instance (the prompt's compute)",
    ),
    StageSource(
        "kv_cache_pack_time", False, "",
        "vllm:nixl_post_time_seconds", "decode",
        "preparing and posting the KV read on the decode instance (the layout conversion when the TP degrees "
        "differ; 0 in the model when they match)",
    ),
    StageSource(
        "kv_cache_transfer_time", False, "",
        "vllm:nixl_xfer_time_seconds", "decode",
        "duration of each completed NIXL read, post to completion (pack, setup, bytes over the link, unpack), "
        "observed by the decode instance",
    ),
    StageSource(
        "kv_cache_unpack_time", False, "",
        "vllm:nixl_xfer_time_seconds", "decode",
        "no vLLM metric of its own: inside the read's duration (the model makes it as long as the pack, "
        "vllm:nixl_post_time_seconds); a real instance may charge it to its queue time instead",
    ),
    StageSource(
        "decode_queue_wait", False, "",
        "vllm:request_queue_time_seconds", "decode",
        "first QUEUED -> first SCHEDULED on the decode instance; includes the KV wait of remote legs",
    ),
    StageSource(
        "first_token_emit_time", True,
        "decode leg sent -> its first byte (remote: KV pull + decode queue + one forward pass; local: decode "
        "queue + the whole prefill)",
        "vllm:request_prefill_time_seconds", "decode",
        "first SCHEDULED -> first token on the decode instance (remote leg: one forward pass of the last token)",
    ),
    StageSource(
        "per_token_decode_time", True, "mean gap between stream events after the first (TPOT as the client sees it)",
        "vllm:request_time_per_output_token_seconds", "decode",
        "decode time / (output tokens - 1) per request on the decode instance",
    ),
)  # fmt: skip
"""One entry per stage of :data:`policies.schema.STAGES`, in the same order."""

ROUTER_TIMED_STAGES: tuple[str, ...] = tuple(s.stage for s in STAGE_SOURCES if s.router_timed)
"""The stages the router times per request."""

DECODE_QUEUE_DERIVED_PROMQL = (
    "(sum by (instance_id) (rate(vllm:request_queue_time_seconds_sum[W])) "
    "- sum by (instance_id) (rate(vllm:nixl_xfer_time_seconds_sum[W]))) "
    "/ sum by (instance_id) (rate(vllm:request_queue_time_seconds_count[W]))"
)
"""Per decode instance, mean seconds per request spent queued outside the KV read: the decode queue wait (plus,
on a real instance, an unpack done after the read completes). ``W`` is the rate window."""

if tuple(s.stage for s in STAGE_SOURCES) != STAGES:  # pragma: no cover - a guard on the table above
    raise RuntimeError("STAGE_SOURCES must list policies.schema.STAGES in order")
