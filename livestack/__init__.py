"""pdctl package ``livestack``: tools that run against a live stack (emulated or real vLLM), see docs/design.md.

* :mod:`livestack.emulator` — emulated vLLM instances: real HTTP servers timed by the calibrated performance model
  and the simulator's instance engine (:mod:`env.perf`, :mod:`env.sim.engine`);
* :mod:`livestack.loadgen` — the load generator: replays a scenario, workload or trace against any OpenAI endpoint;
* :mod:`livestack.profiling` — workload profiling: records, distributions and live metrics to a profile and a
  verdict (used by the capacity planner).

It imports ``policies`` and ``env``'s performance model, instance engine, scenarios and workloads; the controller
and the router never import it (import-linter).
"""

__all__: list[str] = []
