"""The per-instance engine: scheduling rules, KV accounting, prefix cache, preemption and the closed-form fast path."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from env.sim.decode_runs import DecodeRun
from env.sim.engine import EngineConfig, EngineRequest, InstanceEngine, Phase
from tests.sim.helpers import model


def _engine(capacity: int = 1_000_000, seqs: int = 64, budget: int = 2048, cache: bool = True) -> InstanceEngine:
    config = EngineConfig(
        kv_capacity_tokens=capacity, max_num_seqs=seqs, max_num_batched_tokens=budget, enable_prefix_caching=cache
    )
    return InstanceEngine(config, model())


def _drain(engine: InstanceEngine, fast: bool, t: float = 0.0) -> tuple[float, list[EngineRequest]]:
    done: list[EngineRequest] = []
    while not engine.is_idle:
        run = engine.plan_decode_run() if fast else None
        if run is not None:
            done += engine.commit_decode_run(run, run.num_steps, t)
            t += run.duration_s
        else:
            result = engine.step(t)
            assert result is not None
            t = result.end_s
            done += result.finished
    return t, done


@settings(max_examples=40, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(st.integers(1, 3000), st.integers(1, 300), st.booleans(), st.sampled_from([0.0, 0.05, 0.3])),
        min_size=1,
        max_size=40,
    ),
    capacity=st.sampled_from([20_000, 1_000_000]),
)
def test_fast_path_equals_step_by_step(shapes: list[tuple[int, int, bool, float]], capacity: int) -> None:
    """Closed-form runs (through completions, admitting transferred KV) equal a plain step loop."""
    results = []
    for fast in (False, True):
        engine = _engine(capacity=capacity)
        pending = sorted(
            (at, i, prompt, out, kv_ready)
            for i, (prompt, out, kv_ready, at) in enumerate(shapes)
            if prompt + out < capacity
        )
        t = 0.0
        done: list[EngineRequest] = []
        while pending or not engine.is_idle:
            while pending and pending[0][0] <= t:
                _, i, prompt, out, kv_ready = pending.pop(0)
                engine.add_request(EngineRequest(f"r{i}", prompt, out, kv_ready=kv_ready), t)
            if engine.is_idle:
                t = pending[0][0]
                continue
            next_arrival = pending[0][0] if pending else math.inf
            run = engine.plan_decode_run(t) if fast else None
            if run is not None:
                # an arrival interrupts the run at the first step boundary after it, as the simulator does
                steps = run.num_steps
                if next_arrival < t + run.duration_s:
                    steps = InstanceEngine.steps_covering(run, next_arrival - t)
                done += engine.commit_decode_run(run, steps, t)
                t += run.time_after_s(steps)
            else:
                result = engine.step(t)
                assert result is not None
                t = result.end_s
                done += result.finished
        end = t
        results.append((end, sorted((r.request_id, r.first_token_s, r.finished_s) for r in done), engine.steps))
        assert engine.kv_used_tokens == 0
        assert engine.counters.inter_token_latency.count > 0 or all(o == 1 for _, o, _, _ in shapes)
    (end_a, done_a, steps_a), (end_b, done_b, steps_b) = results
    assert steps_a == steps_b
    assert end_a == pytest.approx(end_b, rel=1e-9)
    for (ia, fa, za), (ib, fb, zb) in zip(done_a, done_b, strict=True):
        assert ia == ib
        assert fa == pytest.approx(fb, rel=1e-9)
        assert za == pytest.approx(zb, rel=1e-9)


def test_chunked_prefill_respects_budget_and_decodes_go_first() -> None:
    engine = _engine(budget=512)
    engine.add_request(EngineRequest("short", 10, 50), 0.0)
    first = engine.step(0.0)
    assert first is not None
    assert first.prefill_tokens == 10
    engine.add_request(EngineRequest("long", 2000, 5), first.end_s)
    t = first.end_s
    chunks = []
    while engine.get("long") is not None and engine.get("long").phase != Phase.DECODING:  # type: ignore[union-attr]
        result = engine.step(t)
        assert result is not None
        assert result.num_tokens <= 512
        assert result.decode_batch == 1  # the short request keeps decoding while the long one prefills
        chunks.append(result.prefill_tokens)
        t = result.end_s
    assert chunks == [511, 511, 511, 467]


def test_step_reports_tokens_first_token_and_finish() -> None:
    engine = _engine()
    engine.add_request(EngineRequest("a", 100, 3), 0.0)
    r1 = engine.step(0.0, report_tokens=True)
    assert r1 is not None
    assert r1.first_token == ["a"]
    assert r1.emitted == ["a"]
    r2 = engine.step(r1.end_s, report_tokens=True)
    assert r2 is not None
    assert r2.emitted == ["a"]
    assert not r2.finished
    r3 = engine.step(r2.end_s, report_tokens=True)
    assert r3 is not None
    assert [r.request_id for r in r3.finished] == ["a"]
    done = r3.finished[0]
    assert done.first_token_s == r1.end_s
    assert done.finished_s == r3.end_s
    assert engine.step(r3.end_s) is None


def test_prefill_only_pins_kv_until_release_and_kv_ready_skips_prefill() -> None:
    prefill = _engine()
    prefill.add_request(EngineRequest("x", 1000, 50, prefill_only=True), 0.0)
    result = prefill.step(0.0)
    assert result is not None
    assert [r.request_id for r in result.prefill_done] == ["x"]
    assert prefill.kv_used_tokens == 1000
    assert prefill.is_idle
    assert not prefill.is_empty
    prefill.release("x")
    assert prefill.kv_used_tokens == 0
    assert prefill.is_empty

    decode = _engine()
    decode.add_request(EngineRequest("x", 1000, 3, kv_ready=True), 1.0)
    assert decode.queued_prefill_tokens == 0
    step = decode.step(1.0)
    assert step is not None
    assert step.prefill_tokens == 0
    assert step.decode_batch == 1
    assert step.first_token == ["x"]
    _, done = _drain(decode, fast=False, t=step.end_s)
    assert [r.request_id for r in done] == ["x"]
    assert done[0].generated == 3


def test_preemption_by_recompute_when_kv_runs_out() -> None:
    engine = _engine(capacity=3000, budget=4096)
    for i in range(6):
        engine.add_request(EngineRequest(f"r{i}", 400, 400), 0.0)
    _, done = _drain(engine, fast=True)
    assert len(done) == 6
    assert engine.counters.num_preemptions > 0
    assert any(r.num_preemptions > 0 for r in done)
    assert all(r.generated == r.output_tokens for r in done)
    assert engine.kv_used_tokens == 0


def _step_until_preempted(engine: InstanceEngine) -> tuple[float, list[str]]:
    """Step ``engine`` until a step preempts; that step's end time and the ids it preempted."""
    t = 0.0
    for _ in range(10_000):
        result = engine.step(t)
        assert result is not None
        t = result.end_s
        if result.preempted:
            return t, result.preempted
    raise AssertionError("no step preempted")


def test_a_step_that_preempts_admits_nothing() -> None:
    """As in vLLM V1, the victim (now the head of the queue) and the requests behind it wait for the next step."""
    engine = _engine(capacity=1000, seqs=2, budget=4096, cache=False)
    engine.add_request(EngineRequest("r0", 400, 400), 0.0)
    engine.add_request(EngineRequest("r1", 400, 400), 0.0)
    engine.add_request(EngineRequest("r2", 50, 5), 0.0)
    t, preempted = _step_until_preempted(engine)
    assert preempted == ["r1"]
    assert engine.num_running == 1
    assert [r.request_id for r in engine._waiting] == ["r1", "r2"]
    result = engine.step(t)
    assert result is not None
    assert not result.preempted
    assert result.prefill_tokens > 0  # the next step readmits the victim first
    assert engine._waiting[0].request_id == "r2"


@pytest.mark.parametrize("cache", [True, False])
def test_recompute_after_preemption_starts_from_its_own_cached_blocks(cache: bool) -> None:
    """A preempted request's full blocks stay cached in free KV; its recompute skips those still there."""
    engine = _engine(capacity=3000, seqs=2, budget=4096, cache=cache)
    engine.add_request(EngineRequest("r0", 1100, 800), 0.0)
    engine.add_request(EngineRequest("r1", 1100, 800), 0.0)
    t, preempted = _step_until_preempted(engine)
    assert preempted == ["r1"]
    victim = engine._waiting[0]
    target = victim.prompt_tokens + victim.generated
    assert victim.generated > 0
    assert target > 1024
    hit = 1024 if cache else 0  # two full 512-token blocks
    assert engine._lookup_cache(victim) == hit
    free = engine.config.kv_capacity_tokens - engine.kv_used_tokens - engine.num_decoding
    result = engine.step(t)
    assert result is not None
    assert result.prefill_tokens == min(target, free) - hit
    assert engine._cache_tokens == sum(engine._cache.values())
    assert not any(isinstance(key, tuple) for key in engine._cache)  # readmitted: the blocks are its KV again
    _, done = _drain(engine, fast=True, t=result.end_s)
    assert sorted(r.request_id for r in done) == ["r0", "r1"]
    assert all(r.generated == r.output_tokens for r in done)
    assert engine.kv_used_tokens == 0


def test_a_preempted_request_loses_its_last_cached_block_first() -> None:
    engine = _engine(capacity=3000, seqs=2, budget=4096)
    engine.add_request(EngineRequest("r0", 1100, 800), 0.0)
    engine.add_request(EngineRequest("r1", 1100, 800), 0.0)
    _step_until_preempted(engine)
    victim = engine._waiting[0]
    engine._evict_cache(engine._cache_tokens - 512)  # room for one block less
    assert engine._lookup_cache(victim) == 512


def test_kv_usage_stays_within_capacity_while_running() -> None:
    engine = _engine(capacity=5000, budget=1024)
    rng = np.random.default_rng(3)
    for i in range(30):
        engine.add_request(EngineRequest(f"r{i}", int(rng.integers(10, 2000)), int(rng.integers(1, 200))), 0.0)
    t = 0.0
    while not engine.is_idle:
        result = engine.step(t)
        assert result is not None
        assert 0 <= engine.kv_used_tokens <= engine.config.kv_capacity_tokens
        assert 0.0 <= engine.kv_usage_frac <= 1.0
        t = result.end_s


def test_prefix_cache_hits_skip_prefill_and_evict_lru() -> None:
    engine = _engine(capacity=10_000)
    hashes = (1, 2, 3, 4)
    engine.add_request(EngineRequest("a", 2100, 1, hashes, 512), 0.0)
    _drain(engine, fast=False)
    assert engine.prefix_hit_tokens(hashes, 512, 2100) == 2048
    engine.add_request(EngineRequest("b", 2100, 1, hashes, 512), 10.0)
    result = engine.step(10.0)
    assert result is not None
    assert result.prefill_tokens == 2100 - 2048
    assert engine.counters.prefix_cache_hits == 2048
    assert engine.counters.prefix_cache_queries == 4200
    # the cache never keeps more than the free KV: a big request evicts the least recently used blocks
    engine.add_request(EngineRequest("c", 9000, 1, (10, 11), 512), 20.0)
    _drain(engine, fast=False, t=20.0)
    assert engine.prefix_hit_tokens(hashes, 512, 2100) < 2048
    # at least the last prompt token is computed even on a full hit
    assert engine.prefix_hit_tokens((10, 11), 512, 1024) == 1023


def test_steps_covering_inverts_run_time() -> None:
    engine = _engine()
    for i in range(8):
        engine.add_request(EngineRequest(f"r{i}", 500 + i, 100), 0.0)
    t = 0.0
    while (run := engine.plan_decode_run()) is None:
        result = engine.step(t)
        assert result is not None
        t = result.end_s
    for k in (1, 2, 7, run.num_steps - 1):
        elapsed = run.time_after_s(k) - 1e-7
        assert InstanceEngine.steps_covering(run, elapsed) == k
        assert InstanceEngine.steps_covering(run, run.time_after_s(k) + 1e-7) == min(k + 1, run.num_steps)
    assert InstanceEngine.steps_covering(run, 0.0) == 1


def _planned_run(outputs: list[int], prompt_tokens: int) -> tuple[InstanceEngine, DecodeRun]:
    """An engine part-way into its requests and the multi-segment decode run it plans next."""
    engine = _engine()
    for i, out in enumerate(outputs):
        engine.add_request(EngineRequest(f"r{i}", prompt_tokens + i, out), 0.0)
    t = 0.0
    while (run := engine.plan_decode_run(t, max_segments=8)) is None:
        result = engine.step(t)
        assert result is not None
        t = result.end_s
    return engine, run


def _probe_times(run: DecodeRun, fractions: list[float]) -> list[float]:
    """Elapsed times around every segment end (one ulp either side) and at the given fractions of the run."""
    times = [0.0, run.duration_s * 2.0]
    for end_s in run.end_times_s:
        times += [math.nextafter(end_s, 0.0), end_s, math.nextafter(end_s, math.inf)]
    times += [f * run.duration_s for f in fractions]
    return times


@settings(max_examples=40, deadline=None)
@given(
    outputs=st.lists(st.integers(2, 60), min_size=1, max_size=12),
    prompt_tokens=st.integers(1, 2000),
    fractions=st.lists(st.floats(0.0, 1.0), max_size=20),
)
def test_run_observer_views_equal_committing_the_completed_steps(
    outputs: list[int], prompt_tokens: int, fractions: list[float]
) -> None:
    """What an observer reads mid-run equals the engine after committing the steps completed by then.

    ``run_running`` skips the exact step count except at the current segment's end; probing one ulp either side
    of every segment end checks that it still agrees with ``run_done_steps`` there.
    """
    engine, run = _planned_run(outputs, prompt_tokens)
    for elapsed_s in _probe_times(run, fractions):
        done = InstanceEngine.run_done_steps(run, elapsed_s)
        assert 0 <= done <= run.num_steps
        running, kv_tokens = engine.run_view(run, elapsed_s)
        assert running == engine.run_running(run, elapsed_s)
        assert kv_tokens == engine._kv_static + InstanceEngine.run_context_tokens(run, elapsed_s)
        if done == 0:
            assert running == len(engine._decoding) + len(engine._prefilling)
            continue
        replica, replica_run = _planned_run(outputs, prompt_tokens)
        replica.commit_decode_run(replica_run, done, 0.0)
        assert running == len(replica._decoding) + len(replica._prefilling)
        assert kv_tokens == replica.kv_used_tokens


def test_run_running_follows_the_step_count_where_rounding_splits_a_segment_end() -> None:
    """A segment end time rounded above its formula value: the steps fit before it, and its finishers count."""
    engine, run = _planned_run([5, 10, 10, 20], 100)
    assert len(run.end_steps) >= 2
    assert run.finishers
    i = 1
    start_s = run.end_times_s[i - 1]
    exact_s = start_s + run.segment_time_s(i, run.end_steps[i] - run.end_steps[i - 1])
    run.end_times_s[i] = exact_s + 1e-9  # as if the running sum had rounded up
    steps0 = engine.steps
    for elapsed_s in (exact_s, exact_s + 5e-10, math.nextafter(exact_s, 0.0)):
        done = InstanceEngine.run_done_steps(run, elapsed_s)
        expected = len(engine._decoding) + len(engine._prefilling)
        expected -= sum(1 for entry in run.finishers if entry[0] - steps0 <= done)
        assert engine.run_running(run, elapsed_s) == expected
    assert InstanceEngine.run_done_steps(run, exact_s) == run.end_steps[i]


def test_abort_frees_everything() -> None:
    engine = _engine()
    engine.add_request(EngineRequest("a", 300, 100), 0.0)
    engine.add_request(EngineRequest("b", 300, 100), 0.0)
    engine.step(0.0)
    assert engine.abort("a") is not None
    assert engine.abort("b") is not None
    assert engine.is_empty
    assert engine.kv_used_tokens == 0
    assert engine.queued_prefill_tokens == 0
    assert engine.abort("zzz") is None


def test_config_rejects_impossible_values() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        EngineConfig(kv_capacity_tokens=100, max_num_seqs=64, max_num_batched_tokens=32)
    with pytest.raises(ValueError, match="prompt_tokens"):
        EngineRequest("x", 0, 1)
    assert math.isnan(EngineRequest("y", 5, 1).finished_s)
