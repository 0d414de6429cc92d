"""Fuzz the override loader: any text is either an override or refused with one-line messages naming the file.

The loader is pure (text + base policy in, :class:`~policies.overrides.Override` or
:class:`~policies.policy_file.PolicyFileError` out), so "never a changed running policy" reduces to: the base
policy object is the same after every call, and an accepted override touches only tenants the base knows.
"""

from __future__ import annotations

import copy

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.overrides import load_override
from policies.policy_file import PolicyFileError, load_policy_text, resolve_policy

BASE_TEXT = """
pd_disaggregation_policy:
  remote_prefill: {min_input_tokens: 4096}
  local_prefill: {max_input_tokens: 2048}
tenant_groups:
  - {name: g, gpu_budget: 3, pools: {prefill: {min: 1, max: 2}, decode: {min: 1, max: 2}}}
tenants:
  - {name: chat, group: g, slo: {ttft_p95_ms: 5000, tpot_p95_ms: 1000}}
  - {name: rag, group: g, slo: {ttft_p95_ms: 20, tpot_p95_ms: 1000}}
"""
BASE = resolve_policy(load_policy_text(BASE_TEXT, "base.yaml"), "base.yaml")
KEYS = [
    "expires_at", "tenants", "name", "mode", "pd_disaggregation_policy", "remote_prefill", "local_prefill",
    "min_input_tokens", "max_input_tokens", "min_expected_output_tokens", "max_prefill_queue_wait_ms",
    "require_decode_pool_pressure", "prefer_local_on_prefix_hit", "prompt_length_buckets", "route", "slo",
    "tenant_groups", "fallback", "on_kv_transfer_timeout", "group",
]  # fmt: skip
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats()
    | st.text(max_size=10)
    | st.sampled_from(
        ["chat", "rag", "nobody", "aggregated_only", "disaggregated", "2026-01-01T00:00:00Z", "2099-01-01T00:00:00"]
    )
)
documents = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(KEYS), children, max_size=5),
    max_leaves=25,
)


def _check(text: str) -> None:
    before = copy.deepcopy(BASE)
    try:
        override = load_override(text, "o.yaml", BASE, "overrides/o.yaml")
    except PolicyFileError as exc:
        problems = [str(p) for p in exc.problems]
        assert problems
        for line in problems:
            assert line.startswith("overrides/o.yaml"), line
            assert "\n" not in line
    else:
        assert set(override.tenants) <= set(BASE.tenants)
        assert set(override.thresholds) == set(override.tenants)
    assert before == BASE  # the running (base) policy is never modified


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_structured_overrides(doc: object) -> None:
    _check(yaml.safe_dump(doc))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {"tenants": st.lists(st.fixed_dictionaries({"name": st.sampled_from(["chat", "rag", "x"])}, optional={
            "pd_disaggregation_policy": documents, "mode": scalars}), max_size=3)},
        optional={"expires_at": scalars, "mode": scalars, "pd_disaggregation_policy": documents},
    )
)  # fmt: skip
def test_near_valid_overrides(doc: dict[str, object]) -> None:
    _check(yaml.safe_dump(doc))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text(text: str) -> None:
    _check(text)
