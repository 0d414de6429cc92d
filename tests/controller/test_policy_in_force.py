"""The router actuator compares typed policies: equal exactly when the per-tenant thresholds are equal,
whatever the spelling of the two documents (key order, ``300`` or ``300.0``, defaults written or omitted)."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.actuators.router import policy_in_force
from policies.documents import thresholds_block
from policies.schema import RoutingThresholds
from tests.policies.strategies import routing_thresholds

DEFAULT_BLOCK = thresholds_block(RoutingThresholds())
TOP_LEVEL_KEYS = ("mode", "pd_disaggregation_policy", "fallback", "rollout")


def _respell(draw: st.DrawFn, value: Any, default: Any) -> Any:
    """``value`` with mapping keys shuffled, integral floats maybe written as ints, defaults maybe omitted."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        keys = draw(st.permutations(list(value)))
        for key in keys:
            sub_default = default.get(key) if isinstance(default, dict) else None
            if value[key] == sub_default and not isinstance(value[key], dict) and draw(st.booleans()):
                continue  # the same as the inherited default: leave it out
            out[key] = _respell(draw, value[key], sub_default)
        return out
    if isinstance(value, list):
        return [_respell(draw, item, None) for item in value]
    if isinstance(value, float) and value.is_integer() and draw(st.booleans()):
        return int(value)
    return value


@st.composite
def spellings(draw: st.DrawFn, t: RoutingThresholds) -> dict[str, Any]:
    """One of the many documents that give tenant ``rag`` the thresholds ``t``."""
    document: dict[str, Any] = {}
    if draw(st.booleans()):
        document["version"] = 1
    if draw(st.booleans()):
        document["description"] = draw(st.text(max_size=10))
    if draw(st.booleans()):  # the built-in defaults, written out at the top level
        document.update({key: DEFAULT_BLOCK[key] for key in TOP_LEVEL_KEYS})
    document["tenants"] = [{"name": "rag", **thresholds_block(t)}]
    respelt: dict[str, Any] = _respell(draw, document, {"tenants": None})
    respelt["tenants"][0] = _respell(draw, document["tenants"][0], DEFAULT_BLOCK)
    return respelt


@st.composite
def threshold_pairs(draw: st.DrawFn) -> tuple[RoutingThresholds, RoutingThresholds]:
    """Equal, one field apart, or unrelated."""
    first = draw(routing_thresholds())
    kind = draw(st.sampled_from(["same", "one field", "other"]))
    if kind == "same":
        return first, first
    other = draw(routing_thresholds())
    if kind == "one field":
        name = draw(st.sampled_from([f.name for f in fields(RoutingThresholds)]))
        try:
            return first, replace(first, **{name: getattr(other, name)})
        except ValueError:  # max_local above min_remote: keep the unrelated pair
            pass
    return first, other


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_comparison_is_equal_exactly_when_the_thresholds_are(data: st.DataObject) -> None:
    first, second = data.draw(threshold_pairs())
    live = data.draw(spellings(first))
    planned = data.draw(spellings(second))
    live_policy, planned_policy = policy_in_force(live), policy_in_force(planned)
    assert live_policy is not None
    assert planned_policy is not None
    assert live_policy.thresholds_for("rag") == first
    assert planned_policy.thresholds_for("rag") == second
    assert (live_policy == planned_policy) == (first == second)
    # What the router reports went through JSON: the typed reading does not change.
    assert policy_in_force(json.loads(json.dumps(live))) == live_policy


def test_a_document_the_router_would_refuse_is_never_in_force() -> None:
    assert policy_in_force({"mode": "sideways"}) is None
    assert policy_in_force({"pd_disaggregation_policy": {"remote_prefill": {"min_input_tokens": 2048.0}}}) is None
    assert policy_in_force(["not", "a", "mapping"]) is None
    assert policy_in_force(None) is None


def test_exponent_spelt_floats_are_read_as_numbers() -> None:
    """Regression: the earlier text comparison re-read JSON as YAML, where ``1e-05`` is a string, so such a
    live policy never compared equal and was re-published every tick."""
    document = {"pd_disaggregation_policy": {"remote_prefill": {"max_prefill_queue_wait_ms": 1e-05}}}
    assert json.dumps(document).count("1e-05") == 1
    policy = policy_in_force(json.loads(json.dumps(document)))
    assert policy is not None
    assert policy.thresholds_for("default").max_prefill_queue_wait_s == 1e-08
