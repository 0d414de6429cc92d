"""A rule selector's memory handed to a fresh selector: the same document back, the same decisions after it, and
malformed documents refused with one line naming the field."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from agents.evaluate import scenario_paths
from agents.policy_specs import make_policy
from agents.runs import episode_env, running
from env.gym_env import resolve_scenario
from policies.base import RemembersState
from policies.registry import inner_rule_selector, remembering_policy
from policies.rule_selector import RuleSelector

TRACES = Path(os.environ.get("PDCTL_TRACES", "data/traces"))


def _half_run() -> tuple[Any, Any, RuleSelector]:
    """``learned:default`` through the first half of network-incident-8 (it switches, bars and records outcomes)."""
    scenario = resolve_scenario(scenario_paths(["network-incident-8"])[0], TRACES)
    policy = make_policy("learned:default", scenario, None, ())
    env = episode_env(scenario, policy, TRACES)
    env.reset(seed=1000)
    while env.sim.now_s < scenario.duration_s / 2:
        env.control(policy)
    selector = inner_rule_selector(policy)
    assert selector is not None
    return env, policy, selector


def decide_alike_to_the_end(env: Any, policy: Any, fresh: Any) -> None:
    """Both policies decide every remaining interval of ``env`` on the same observation: the same actions."""
    while running(env):
        observation, context = env.observation(), env.policy_context()
        assert fresh.decide(observation, context) == policy.decide(observation, context)
        env.control(policy)


def test_learned_default_hands_its_memory_over_through_its_wrappers() -> None:
    scenario = resolve_scenario(scenario_paths(["network-incident-8"])[0], TRACES)
    policy = make_policy("learned:default", scenario, None, ())
    assert not isinstance(policy, RemembersState), "a label around the selector"
    assert remembering_policy(policy) is inner_rule_selector(policy)
    assert remembering_policy(make_policy("baseline:queue_kv", scenario, None, ())) is None, "a rule has no memory"


def test_a_fresh_selector_given_the_memory_decides_as_the_one_that_wrote_it() -> None:
    env, policy, selector = _half_run()
    document = json.loads(json.dumps(selector.memory_document()))
    assert document["groups"], "the run gave the selector something to remember"
    fresh_policy = make_policy("learned:default", env.scenario, None, ())
    fresh = inner_rule_selector(fresh_policy)
    assert fresh is not None
    fresh.restore_memory(document, 0.0)
    assert json.loads(json.dumps(fresh.memory_document())) == document
    decide_alike_to_the_end(env, policy, fresh_policy)


def test_the_memory_moves_onto_the_new_clock() -> None:
    _, _, selector = _half_run()
    document = selector.memory_document()
    group, state = next(iter(document["groups"].items()))
    fresh = RuleSelector(selector.manifest, selector.network, source=selector.source)
    fresh.restore_memory(document, -100.0)
    assert fresh.memory_document()["groups"][group]["started_s"] == pytest.approx(state["started_s"] - 100.0)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d.update(rules=["dynamo-legacy"]), "rules:"),
        (lambda d: d.update(groups=[]), "groups: expected a mapping"),
        (lambda d: next(iter(d["groups"].values())).update(rule="fastest"), ".rule: 'fastest' is not one of"),
        (lambda d: next(iter(d["groups"].values())).update(streak=-1), ".streak: expected a count"),
        (lambda d: next(iter(d["groups"].values())).update(move=[1.0]), ".move: expected"),
        (lambda d: next(iter(d["groups"].values())).update(started_s="x"), ".started_s: expected a number"),
        (lambda d: next(iter(d["groups"].values())).update(outcomes=[[1.0]]), ".outcomes: expected two numbers"),
        (lambda d: next(iter(d["groups"].values())).update(bars={"x": [1.0, 1]}), ".bars.x: not one of"),
        (lambda d: d["asked"].update(g9=[1, -1]), "asked.g9: expected [prefill, decode]"),
        (lambda d: d.update(transfer=[["pool", "g", 0, 1.0, 0.0]]), "transfer: expected"),
    ],
)
def test_a_malformed_memory_is_refused_with_one_line_and_changes_nothing(edit: Any, field: str) -> None:
    _, _, selector = _half_run()
    document = json.loads(json.dumps(selector.memory_document()))
    edit(document)
    fresh = RuleSelector(selector.manifest, selector.network, source=selector.source)
    before = fresh.memory_document()
    with pytest.raises(ValueError, match=re.escape(field)) as info:
        fresh.restore_memory(document, 0.0)
    assert "\n" not in str(info.value)
    assert fresh.memory_document() == before, "all of it or nothing"
