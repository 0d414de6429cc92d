"""The simulator's placement adapter: its instances as :class:`policies.placement.InstanceView`.

The placement rules and the :class:`~policies.schema.LiveState` builder are :mod:`policies.placement` (one copy for
the router and the simulator); this module only reads the simulated instances the way the router reads its own
bookkeeping, at the last completed step boundary (:meth:`env.sim.simulator.ClusterSimulator.view`):

* decode load = running + waiting + remote requests on their way to it (prefilling or transferring);
* decode active requests = running + waiting + KV transfers into it (the router's decode legs in flight);
* KV usage = KV tokens used / capacity, as a metrics poll would read it (without the arriving request);
* a prefill instance's active requests and queued prompt tokens = the prefill legs placed on it and not done
  (whole prompts, as the router counts what it sent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from env.sim.instances import SimInstance

__all__ = ["SimInstanceView", "decode_view", "prefill_view"]


class _Observer(Protocol):
    def view(self, inst: SimInstance) -> tuple[int, int]: ...


@dataclass(frozen=True, slots=True)
class SimInstanceView:
    """A snapshot of one simulated instance as placement reads it (a :class:`policies.placement.InstanceView`)."""

    instance: SimInstance
    load_requests: int
    active_requests: int
    queued_prefill_tokens: int
    kv_usage_frac: float | None
    max_num_seqs: int
    max_num_batched_tokens: int


def decode_view(sim: _Observer, inst: SimInstance) -> SimInstanceView:
    """A decode (or aggregated) instance as placement reads it now."""
    running, kv_tokens = sim.view(inst)
    engine = inst.engine
    config = engine.config
    waiting = engine.num_waiting
    return SimInstanceView(
        inst,
        load_requests=running + waiting + inst.incoming,
        active_requests=running + waiting + inst.in_transfer,
        queued_prefill_tokens=inst.assigned_prefill_tokens,
        kv_usage_frac=min(kv_tokens / config.kv_capacity_tokens, 1.0),
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
    )


def prefill_view(inst: SimInstance) -> SimInstanceView:
    """A prefill instance as placement reads it now."""
    config = inst.engine.config
    return SimInstanceView(
        inst,
        load_requests=inst.assigned_requests,
        active_requests=inst.assigned_requests,
        queued_prefill_tokens=inst.assigned_prefill_tokens,
        kv_usage_frac=None,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
    )
