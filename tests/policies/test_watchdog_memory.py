"""The SLO watchdog's memory handed to a fresh watchdog: a hold under way goes on, trips keep doubling, the
fallback's evidence and the primary's own memory come back; a memory written before the watchdog remembered is its
primary's alone; malformed documents are refused with one line naming the field."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from agents.evaluate import scenario_paths
from agents.policy_specs import make_policy
from agents.runs import episode_env
from env.gym_env import resolve_scenario
from policies.registry import inner_rule_selector, remembering_policy
from policies.watchdog import WATCHDOG_MEMORY_KIND, SloWatchdog
from tests.policies.test_selector_memory import decide_alike_to_the_end
from tests.policies.test_watchdog import run, watchdog

TRACES = Path(os.environ.get("PDCTL_TRACES", "data/traces"))


def _mid_hold() -> SloWatchdog:
    """A watchdog tripped twice (trigger 1, hold 3 then 6), two decisions into its second hold."""
    wd = watchdog(trigger_intervals=1, hold_intervals=3, backoff=2.0, max_hold_intervals=10)
    assert run(wd, primary=0.1, fallback=0.9, ticks=7) == "PFFFPFF"
    assert wd.state.trips == 2
    assert wd.state.hold_left_intervals == 4
    return wd


def test_a_restored_watchdog_goes_on_with_the_hold_and_the_doubling() -> None:
    wd = _mid_hold()
    document = json.loads(json.dumps(wd.memory_document()))
    assert document["kind"] == WATCHDOG_MEMORY_KIND
    assert document["primary"] is None, "its primary (a test rule) remembers nothing"
    restored = watchdog(trigger_intervals=1, hold_intervals=3, backoff=2.0, max_hold_intervals=10)
    restored.restore_memory(document, 0.0)
    assert json.loads(json.dumps(restored.memory_document())) == document
    # The rest of the second hold, the primary's one window, then the third hold, twice as long: as if no restart.
    assert run(restored, primary=0.1, fallback=0.9, ticks=16) == "FFFFPFFFFFFFFFFP"
    assert run(wd, primary=0.1, fallback=0.9, ticks=16) == "FFFFPFFFFFFFFFFP"
    # Started again instead, it hands the group back at once and its next hold is the first trip's.
    fresh = watchdog(trigger_intervals=1, hold_intervals=3, backoff=2.0, max_hold_intervals=10)
    assert run(fresh, primary=0.1, fallback=0.9, ticks=6) == "PFFFPF"


def test_a_watchdog_over_a_selector_hands_both_memories_over_and_decides_on_as_before() -> None:
    scenario = resolve_scenario(scenario_paths(["network-incident-8"])[0], TRACES)
    spec = "watchdog[baseline:dynamo-legacy]:learned:default"
    policy = make_policy(spec, scenario, None, ())
    assert isinstance(policy, SloWatchdog)
    assert remembering_policy(policy) is policy, "the watchdog is the outermost layer that remembers"
    env = episode_env(scenario, policy, TRACES)
    env.reset(seed=1000)
    while env.sim.now_s < scenario.duration_s / 2:
        env.control(policy)
    document = json.loads(json.dumps(policy.memory_document()))
    selector = inner_rule_selector(policy)
    assert selector is not None
    assert document["primary"] == json.loads(json.dumps(selector.memory_document()))
    assert document["primary"]["groups"], "the run gave the selector something to remember"
    fresh = make_policy(spec, scenario, None, ())
    assert isinstance(fresh, SloWatchdog)
    fresh.restore_memory(document, 0.0)
    assert json.loads(json.dumps(fresh.memory_document())) == document
    decide_alike_to_the_end(env, policy, fresh)


def test_a_memory_from_before_the_watchdog_remembered_is_its_primarys() -> None:
    """A control memory file written by the previous build holds the selector's document under a watchdog's id."""
    scenario = resolve_scenario(scenario_paths(["network-incident-8"])[0], TRACES)
    spec = "watchdog[baseline:dynamo-legacy]:learned:default"
    policy = make_policy(spec, scenario, None, ())
    env = episode_env(scenario, policy, TRACES)
    env.reset(seed=1000)
    for _ in range(12):
        env.control(policy)
    selector = inner_rule_selector(policy)
    assert selector is not None
    old_file = json.loads(json.dumps(selector.memory_document()))
    fresh = make_policy(spec, scenario, None, ())
    assert isinstance(fresh, SloWatchdog)
    fresh.restore_memory(old_file, 0.0)
    taken = fresh.memory_document()
    assert taken["primary"] == old_file
    assert taken["state"]["trips"] == 0, "the watchdog's own record starts again"
    with pytest.raises(ValueError, match="kind: expected 'slo-watchdog', got None"):
        watchdog().restore_memory(old_file, 0.0)  # a primary that keeps no memory: nothing to give it to


def test_the_move_clocks_move_onto_the_new_clock() -> None:
    document = watchdog(trigger_intervals=5).memory_document()
    document["moves"] = {"g": [30.0, 45.0]}
    document["primary_pools"] = {"g": [3, 1]}
    fresh = watchdog(trigger_intervals=5)
    fresh.restore_memory(document, -100.0)
    assert fresh.memory_document()["moves"] == {"g": [-70.0, -55.0]}


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["state"].update(trips=-1), "state.trips: expected a count"),
        (lambda d: d["state"].pop("hold_left_intervals"), "state: missing ['hold_left_intervals']"),
        (lambda d: d["state"].update(in_fallback="yes"), "state.in_fallback: expected true or false"),
        (lambda d: d["state"].update(primary_error=3), "state.primary_error: expected text"),
        (lambda d: d.update(restore_splits={"g": [0.5]}), "restore_splits.g: expected two numbers"),
        (lambda d: d.update(evidence={}), "evidence: expected a list"),
        (lambda d: d["evidence"][0].update(groups="g"), "evidence[0].groups: expected a list of names"),
        (lambda d: d["evidence"][0].update(windows=[[1.0]]), "evidence[0].windows: expected two numbers"),
        (lambda d: d.update(hold_groups=[1]), "hold_groups: expected a list of names"),
        (lambda d: d.update(streak_attainment=["x"]), "streak_attainment[0]: expected a number"),
        (lambda d: d.update(tripped_at_frac="x"), "tripped_at_frac: expected a number"),
        (lambda d: d.update(primary_pools={"g": [1, -1]}), "primary_pools.g: expected [prefill, decode]"),
        (lambda d: d.update(moves={"g": [1.0]}), "moves.g: expected [moving since, settled since]"),
        (lambda d: d.update(primary_decided_last=None), "primary_decided_last: expected true or false"),
        (lambda d: d.update(primary={"rules": []}), "primary: memory for test:all-prefill, which keeps none"),
    ],
)
def test_a_malformed_memory_is_refused_with_one_line_and_changes_nothing(edit: Any, field: str) -> None:
    document = json.loads(json.dumps(_mid_hold().memory_document()))
    assert document["evidence"], "the holds left evidence"
    edit(document)
    fresh = watchdog(trigger_intervals=1, hold_intervals=3, backoff=2.0, max_hold_intervals=10)
    before = fresh.memory_document()
    with pytest.raises(ValueError, match=re.escape(field)) as info:
        fresh.restore_memory(document, 0.0)
    assert "\n" not in str(info.value)
    assert fresh.memory_document() == before, "all of it or nothing"
