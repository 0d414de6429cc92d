"""The field table between policy-file keys and RoutingThresholds: one table, read and written both ways."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.documents import thresholds_block
from policies.policy_file import PolicyFile, TenantBlock, load_policy_data, load_policy_text, resolve_policy
from policies.schema import FallbackAction, RoutingThresholds
from policies.threshold_fields import THRESHOLD_FIELDS, read_thresholds, to_file_scale
from tests.policies.strategies import routing_thresholds


def _document(t: RoutingThresholds) -> dict[str, object]:
    return {"tenants": [{"name": "rag", **thresholds_block(t)}]}


def test_every_thresholds_field_is_written_by_exactly_one_row() -> None:
    written = [spec.name for spec in THRESHOLD_FIELDS if spec.write is not None]
    assert sorted(written) == sorted(f.name for f in fields(RoutingThresholds))


def test_every_key_path_exists_in_the_file_model() -> None:
    # An unset level reads nothing; a misspelt key path raises AttributeError here.
    assert read_thresholds(TenantBlock(name="rag"), tenant=True) == {"buckets": ()}
    assert read_thresholds(PolicyFile(), tenant=False) == {"disaggregation_enabled": True}


@settings(max_examples=100, deadline=None)
@given(routing_thresholds())
def test_thresholds_block_resolves_back_exactly(t: RoutingThresholds) -> None:
    document = _document(t)
    assert resolve_policy(load_policy_data(document)).thresholds_for("rag") == t
    # The same through the file format a person writes.
    assert resolve_policy(load_policy_text(yaml.safe_dump(document))).thresholds_for("rag") == t


def test_thresholds_block_writes_every_key_by_default() -> None:
    block = thresholds_block(RoutingThresholds())
    assert block["mode"] == "disaggregated"
    assert block["pd_disaggregation_policy"]["remote_prefill"] == {
        "min_input_tokens": 2048,
        "max_prefill_queue_wait_ms": 300.0,
        "min_expected_output_tokens": 128,
        "require_decode_pool_pressure": True,
        "decode_pressure_threshold_perc": 50.0,
    }
    assert block["fallback"] == {
        "on_kv_transfer_timeout": "local_aggregated_serving",
        "on_prefill_queue_overload": "local_prefill",
    }
    assert block["prompt_length_buckets"] == []
    assert "enabled_models" not in block["rollout"], "None (every model) has no spelling: inherited"
    assert "remote_prefill_when" not in block["rollout"], "the read-only alias is never written"


def test_retry_on_prefill_queue_overload_has_no_spelling_and_is_inherited() -> None:
    t = RoutingThresholds(on_prefill_queue_overload=FallbackAction.RETRY_REMOTE_PREFILL)
    block = thresholds_block(t)
    assert "on_prefill_queue_overload" not in block["fallback"]
    resolved = resolve_policy(load_policy_data(_document(t))).thresholds_for("rag")
    assert resolved == replace(t, on_prefill_queue_overload=FallbackAction.LOCAL_PREFILL)


@pytest.mark.parametrize(
    ("value", "scale", "written"),
    [(0.3, 1000.0, 300.0), (0.07, 100.0, 7.0), (0.57, 100.0, 57.0), (2.5e-9, 1000.0, 2.5e-06), (0.0, 1000.0, 0.0)],
)
def test_to_file_scale_writes_the_short_spelling(value: float, scale: float, written: float) -> None:
    assert to_file_scale(value, scale) == written
    assert to_file_scale(value, scale) / scale == value


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 1e9, allow_nan=False), st.sampled_from([1000.0, 100.0]))
def test_to_file_scale_reads_back_exactly(file_value: float, scale: float) -> None:
    typed = file_value / scale
    assert to_file_scale(typed, scale) / scale == typed


def test_resolution_reads_tenant_and_top_level_through_the_table() -> None:
    policy = load_policy_text(
        """
pd_disaggregation_policy:
  remote_prefill: {min_input_tokens: 4096, max_prefill_queue_wait_ms: 250}
rollout: {remote_prefill_when: {input_tokens_gte: 3000}}
tenants:
  - name: rag
    mode: aggregated_only
    prompt_length_buckets: [{max_input_tokens: 64, route: local_prefill}]
"""
    )
    resolved = resolve_policy(policy)
    default, rag = resolved.thresholds_for("default"), resolved.thresholds_for("rag")
    assert default.min_remote_input_tokens == 3000, "the rollout trigger wins over remote_prefill at one level"
    assert default.max_prefill_queue_wait_s == 0.25
    assert rag == replace(default, disaggregation_enabled=False, buckets=rag.buckets)
    assert [(b.route.value, b.min_input_tokens, b.max_input_tokens) for b in rag.buckets] == [("local_prefill", 0, 64)]
