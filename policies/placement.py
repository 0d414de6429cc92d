"""Placement: which instances serve a request, and the live state its route decision reads.

This is the one copy of the placement rules; the router (:mod:`router.decide`) and the simulator
(:mod:`env.sim.simulator`) both call it through a view of their instances (:class:`InstanceView`), so a policy
sees the same inputs in training, in evaluation and in production. Where the two copies used to differ, the
meaning a production router can actually know at decision time won:

* **Decode instance** (:func:`choose_decode`): among candidates whose load is within ``affinity_slack_requests``
  of the least-loaded one, the longest prefix hit, then the least load, then the first in order. (The router's
  rule. The simulator's old rule, prefix first without a bound, sends every request sharing a prefix to one
  instance however long its queue; a production router bounds affinity by load.)
* **Load** of a decode instance: the requests the router has placed on it and that have not finished,
  including remote ones whose prefill or KV transfer is still running. (A router knows exactly what it placed.)
* **Prefix hit**: the cached leading prompt tokens on the decode instance, at most the prompt length − 1
  (:func:`usable_prefix_hit_tokens`; vLLM always computes the last prompt token). The router estimates what is
  cached from what it sent there (:class:`router.estimates.PrefixTracker`), the simulator reads its engine.
* **Prefill instance** (:func:`choose_prefill`): the fewest queued prompt tokens, then the first in order.
  Queued prompt tokens are the whole prompts of the prefill legs in flight on it: a router knows what it sent,
  not how far the engine got through it.
* **Prefill queue wait**: queued prompt tokens / the instance's *measured* prefill rate, an EWMA over prefill
  legs that ran alone on their instance, starting from a configured rate (:class:`PrefillRate`). (The router's:
  a router cannot know an instance's true throughput; the simulator used the model's.)
* **Decode pressure**: ``max(active requests / max_num_seqs, KV usage when known)``, at most 1; active requests
  are those whose decode leg has started (running, waiting, or pulling KV).
* **Decode KV usage** (``decode_kv_usage_frac``): the KV usage last observed on the instance (vLLM's
  ``kv_cache_usage_perc``), ``None`` when unknown, *without* the arriving request. (The router's: vLLM does not
  say how many blocks a request will take before it schedules it; the simulator used to add the prompt.)
* **Prefill queue requests**: prefill legs in flight on the prefill instance.
* **Expected output** (:func:`expected_output_tokens`): the request's ``max_tokens``, else the tenant's
  expected output, else the configured default. (The router's: a request's own bound is the best estimate
  available; the simulator's synthetic requests carry ``max_tokens`` as the load generator sends it.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from policies.schema import LiveState

__all__ = [
    "InstanceView",
    "PlacementConfig",
    "PrefillRate",
    "build_live_state",
    "choose_decode",
    "choose_prefill",
    "expected_output_tokens",
    "usable_prefix_hit_tokens",
]


class InstanceView(Protocol):
    """What placement reads of one instance.

    The router's :class:`router.registry.Instance` and the simulator's :class:`env.sim.placement.SimInstanceView`
    both satisfy it.
    """

    @property
    def load_requests(self) -> int:
        """Requests placed on the instance and not finished (decode: with remote ones prefilling or transferring)."""
        ...

    @property
    def active_requests(self) -> int:
        """Legs in flight on the instance (decode: running, waiting or pulling KV; prefill: prefill legs)."""
        ...

    @property
    def queued_prefill_tokens(self) -> int:
        """Prompt tokens of the prefill legs in flight on the instance (whole prompts)."""
        ...

    @property
    def kv_usage_frac(self) -> float | None:
        """KV-cache usage as last observed (0-1), None when unknown."""
        ...

    @property
    def max_num_seqs(self) -> int:
        """The instance's ``--max-num-seqs``."""
        ...

    @property
    def max_num_batched_tokens(self) -> int:
        """The instance's ``--max-num-batched-tokens``."""
        ...


V = TypeVar("V", bound=InstanceView)


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """Settings of placement and of the estimates it reads.

    Attributes:
        affinity_slack_requests: a decode instance with a longer prefix hit is preferred if its load is at most
            this many requests above the least-loaded candidate's.
        default_output_tokens: expected output when the request has no ``max_tokens`` and the tenant no estimate.
        initial_prefill_tokens_per_s: prefill rate assumed before any prefill leg was measured.
        prefill_rate_weight_frac: EWMA weight of one measured prefill leg.
        prefill_rate_min_sample_tokens: shorter prefill legs are not measured (overheads dominate them).
    """

    affinity_slack_requests: int = 4
    default_output_tokens: int = 256
    initial_prefill_tokens_per_s: float = 20000.0
    prefill_rate_weight_frac: float = 0.2
    prefill_rate_min_sample_tokens: int = 256

    def __post_init__(self) -> None:
        if self.affinity_slack_requests < 0:
            raise ValueError(f"affinity_slack_requests must be >= 0, got {self.affinity_slack_requests}")
        if self.default_output_tokens < 1:
            raise ValueError(f"default_output_tokens must be >= 1, got {self.default_output_tokens}")
        if not self.initial_prefill_tokens_per_s > 0:
            raise ValueError(f"initial_prefill_tokens_per_s must be > 0, got {self.initial_prefill_tokens_per_s}")
        if not 0.0 < self.prefill_rate_weight_frac <= 1.0:
            raise ValueError(f"prefill_rate_weight_frac must be in (0, 1], got {self.prefill_rate_weight_frac}")

    def new_prefill_rate(self) -> PrefillRate:
        """A fresh prefill-rate estimate with these settings."""
        return PrefillRate(
            self.initial_prefill_tokens_per_s, self.prefill_rate_weight_frac, self.prefill_rate_min_sample_tokens
        )


class PrefillRate:
    """Measured prefill throughput of one instance (tokens/s), for the queue-wait estimate.

    Args:
        initial_tokens_per_s: the rate assumed before any measurement.
        weight: EWMA weight of one measurement.
        min_sample_tokens: prefill legs shorter than this are not measured.
    """

    def __init__(self, initial_tokens_per_s: float, weight: float = 0.2, min_sample_tokens: int = 256) -> None:
        self.tokens_per_s = initial_tokens_per_s
        self.weight = weight
        self.min_sample_tokens = min_sample_tokens

    def observe(self, tokens: int, duration_s: float) -> None:
        """A prefill leg of ``tokens`` that ran alone on its instance took ``duration_s``."""
        if tokens >= self.min_sample_tokens and duration_s > 0:
            self.tokens_per_s += self.weight * (tokens / duration_s - self.tokens_per_s)

    def wait_s(self, queued_tokens: int) -> float:
        """Seconds before a new prefill starts behind ``queued_tokens``."""
        return max(queued_tokens, 0) / self.tokens_per_s


def choose_decode(
    candidates: Sequence[V], prefix_hit_tokens: Callable[[V], int], affinity_slack_requests: int
) -> tuple[V, int] | None:
    """The decode instance for a request and its prefix hit there, or None without candidates.

    Args:
        candidates: decode instances taking requests, in a stable order (the tie-break).
        prefix_hit_tokens: the request's estimated prefix-cache hit on an instance (tokens).
        affinity_slack_requests: how much more loaded than the least-loaded candidate a longer hit may be.
    """
    if not candidates:
        return None
    bound = min(c.load_requests for c in candidates) + affinity_slack_requests
    best: V | None = None
    best_hit = -1
    best_load = 0
    for inst in candidates:
        load = inst.load_requests
        if load > bound:
            continue
        hit = prefix_hit_tokens(inst)
        if hit > best_hit or (hit == best_hit and load < best_load):
            best, best_hit, best_load = inst, hit, load
    assert best is not None  # the least-loaded candidate is always within the bound
    return best, best_hit


def choose_prefill(candidates: Sequence[V]) -> V | None:
    """The prefill instance with the fewest queued prompt tokens (first in order on ties), or None."""
    best: V | None = None
    for inst in candidates:
        if best is None or inst.queued_prefill_tokens < best.queued_prefill_tokens:
            best = inst
    return best


def expected_output_tokens(max_tokens: int | None, tenant_expected_tokens: int | None, default_tokens: int) -> int:
    """The output length the route decision assumes: the request's bound, the tenant's estimate, the default."""
    if max_tokens is not None and max_tokens > 0:
        return max_tokens
    if tenant_expected_tokens:
        return tenant_expected_tokens
    return default_tokens


def usable_prefix_hit_tokens(cached_tokens: int, input_tokens: int) -> int:
    """Prompt tokens a prefix-cache hit saves: vLLM computes at least the last prompt token, so at most input - 1."""
    return max(min(cached_tokens, input_tokens - 1), 0)


def build_live_state(
    decode: InstanceView,
    prefix_hit_tokens: int,
    prefill: InstanceView | None,
    prefill_rate: PrefillRate | None,
    num_prefill_instances: int,
    kv_transfer_healthy: bool,
) -> LiveState:
    """The :class:`~policies.schema.LiveState` of one request (see the module docstring for each field).

    Args:
        decode: the chosen decode instance.
        prefix_hit_tokens: the request's prefix hit on it (at most the prompt length).
        prefill: the chosen prefill instance, None when none takes requests.
        prefill_rate: that instance's measured prefill rate (None: wait unknown).
        num_prefill_instances: prefill instances taking requests.
        kv_transfer_healthy: whether the prefill→decode transfer path is judged healthy.
    """
    kv = decode.kv_usage_frac
    pressure = decode.active_requests / decode.max_num_seqs
    if kv is not None:
        pressure = max(pressure, kv)
    wait_s: float | None = None
    if prefill is not None and prefill_rate is not None:
        wait_s = prefill_rate.wait_s(prefill.queued_prefill_tokens)
    return LiveState(
        prefill_queue_wait_s=wait_s,
        decode_pressure_frac=min(pressure, 1.0),
        prefix_hit_tokens=prefix_hit_tokens,
        kv_transfer_healthy=kv_transfer_healthy,
        num_prefill_instances=num_prefill_instances,
        prefill_queue_requests=None if prefill is None else prefill.active_requests,
        prefill_active_tokens=None if prefill is None else float(prefill.queued_prefill_tokens),
        prefill_max_batched_tokens=None if prefill is None else prefill.max_num_batched_tokens,
        decode_kv_usage_frac=kv,
    )
