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

from typing import Protocol

from env.sim.decode_runs import DecodeRun, DecodeRuns
from env.sim.instances import SimInstance

__all__ = ["SimInstanceView", "decode_view", "prefill_view"]


class _Observer(Protocol):
    now_s: float

    def view_running(self, inst: SimInstance) -> int: ...


class SimInstanceView:
    """A snapshot of one simulated instance as placement reads it (a :class:`policies.placement.InstanceView`).

    Every field is the instance's state when the view was made. A decode instance's KV usage inside a closed-form
    decode run costs an exact step count, and placement reads it only for the chosen instance, so it is computed
    on first access from what the view captured (the run, the time into it and the static KV tokens), which later
    events do not change: the value is the same whenever it is read.
    """

    __slots__ = (
        "_elapsed_s",
        "_kv_static_tokens",
        "_kv_usage_frac",
        "_run",
        "active_requests",
        "instance",
        "load_requests",
        "max_num_batched_tokens",
        "max_num_seqs",
        "queued_prefill_tokens",
    )

    def __init__(
        self,
        instance: SimInstance,
        load_requests: int,
        active_requests: int,
        queued_prefill_tokens: int,
        kv_usage_frac: float | None,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        run: DecodeRun | None = None,
        elapsed_s: float = 0.0,
        kv_static_tokens: int = 0,
    ) -> None:
        self.instance = instance
        self.load_requests = load_requests
        self.active_requests = active_requests
        self.queued_prefill_tokens = queued_prefill_tokens
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self._kv_usage_frac = kv_usage_frac
        self._run = run
        self._elapsed_s = elapsed_s
        self._kv_static_tokens = kv_static_tokens

    @property
    def kv_usage_frac(self) -> float | None:
        """KV usage (0-1) without the arriving request; None for a prefill instance."""
        run = self._run
        if run is not None:
            kv_tokens = self._kv_static_tokens + DecodeRuns.run_context_tokens(run, self._elapsed_s)
            self._kv_usage_frac = min(kv_tokens / self.instance.engine.config.kv_capacity_tokens, 1.0)
            self._run = None
        return self._kv_usage_frac


def decode_view(sim: _Observer, inst: SimInstance) -> SimInstanceView:
    """A decode (or aggregated) instance as placement reads it now."""
    engine = inst.engine
    config = engine.config
    running = sim.view_running(inst)
    waiting = engine.num_waiting
    run = inst.run  # inside a run the KV usage is computed when read (see SimInstanceView)
    return SimInstanceView(
        inst,
        running + waiting + inst.incoming,
        running + waiting + inst.in_transfer,
        inst.assigned_prefill_tokens,
        min(engine.kv_used_tokens / config.kv_capacity_tokens, 1.0) if run is None else None,
        config.max_num_seqs,
        config.max_num_batched_tokens,
        run,
        0.0 if run is None else sim.now_s - inst.run_start_s,
        engine._kv_static,
    )


def prefill_view(inst: SimInstance) -> SimInstanceView:
    """A prefill instance as placement reads it now."""
    config = inst.engine.config
    return SimInstanceView(
        inst,
        inst.assigned_requests,
        inst.assigned_requests,
        inst.assigned_prefill_tokens,
        None,
        config.max_num_seqs,
        config.max_num_batched_tokens,
    )
