"""Override files (validation, scope, merge, expiry, rollback, precedence) and policy documents (round trip)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.documents import policy_document
from policies.overrides import Override, apply_overrides, load_override
from policies.policy_file import PolicyFileError, load_policy_file, load_policy_text, resolve_policy
from policies.schema import ControlAction, FallbackAction, PoolTargets, RoutingThresholds

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "policies" / "examples").glob("*.yaml"))
BASE = resolve_policy(load_policy_file(Path(EXAMPLES[0]).parent / "multi_tenant.yaml"))
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def rag_override(min_tokens: int, name: str = "o.yaml", expires: datetime | None = None) -> Override:
    doc: dict[str, object] = {
        "tenants": [{"name": "rag", "pd_disaggregation_policy": {"remote_prefill": {"min_input_tokens": min_tokens}}}]
    }
    if expires is not None:
        doc["expires_at"] = expires.isoformat()
    return load_override(yaml.safe_dump(doc), name, BASE)


def test_override_keeps_every_key_it_does_not_set() -> None:
    override = rag_override(1500)
    assert override.tenants == ("rag",)
    base = BASE.tenants["rag"].thresholds
    assert override.thresholds["rag"] == RoutingThresholds(
        **{**{f: getattr(base, f) for f in base.__dataclass_fields__}, "min_remote_input_tokens": 1500}
    )
    assert not override.rollback


def test_top_level_blocks_apply_to_the_named_tenants() -> None:
    text = "fallback: {on_kv_transfer_timeout: retry_remote_prefill}\ntenants:\n  - name: chatbot\n"
    override = load_override(text, "f.yaml", BASE)
    assert override.tenants == ("chatbot",)
    assert override.thresholds["chatbot"].on_kv_transfer_timeout is FallbackAction.RETRY_REMOTE_PREFILL


def test_rollback_file_covers_every_tenant() -> None:
    text = (EXAMPLES[0].parent / "aggregated_only.yaml").read_text()
    override = load_override(text, "rollback.yaml", BASE)
    assert override.rollback
    assert set(override.tenants) == set(BASE.tenants)
    assert all(not t.disaggregation_enabled for t in override.thresholds.values())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tenants:\n  - name: nobody\n", "tenant 'nobody' is not in the policy"),
        ("tenant_groups:\n  - {name: g, gpu_budget: 2}\n", "tenant_groups: not allowed in an override"),
        ("tenants:\n  - name: rag\n    slo: {ttft_p95_ms: 10}\n", "tenants[0].slo: not allowed in an override"),
        ("tenants:\n  - name: rag\n    pd_disaggregation_policy: {remote_prefill: {min_input_tokens: 10}}\n",
         "max_local_input_tokens must be <= min_remote_input_tokens"),
        ("tenants: [\n", "not valid YAML"),
        ("expires_at: tomorrow\n", "expires_at"),
        ("mode: sometimes\n", "mode"),
    ],
)  # fmt: skip
def test_invalid_overrides_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(PolicyFileError) as info:
        load_override(text, "bad.yaml", BASE)
    assert message in str(info.value)


def test_overrides_win_for_named_tenants_until_they_expire() -> None:
    policy_thresholds = {"rag": RoutingThresholds(min_remote_input_tokens=3000), "chatbot": RoutingThresholds()}
    action = ControlAction(thresholds=policy_thresholds, pools={"interactive": PoolTargets(2, 6)}, reason="r")
    override = rag_override(1100, expires=NOW + timedelta(minutes=5))
    merged = apply_overrides(action, [override], NOW)
    assert merged.action.thresholds["rag"].min_remote_input_tokens == 1100
    assert merged.action.thresholds["chatbot"] == policy_thresholds["chatbot"]
    assert merged.action.pools == action.pools
    assert merged.active == ("o.yaml",)
    assert merged.tenants == ("rag",)
    assert "override:o.yaml" in merged.action.reason
    expired = apply_overrides(action, [override], NOW + timedelta(minutes=5))
    assert expired.action == action
    assert expired.active == ()


def test_later_file_name_wins_and_rollback_wins_over_all() -> None:
    action = ControlAction()
    first, second = rag_override(1200, "10-a.yaml"), rag_override(1300, "20-b.yaml")
    merged = apply_overrides(action, [second, first], NOW)
    assert merged.action.thresholds["rag"].min_remote_input_tokens == 1300
    rollback = load_override("mode: aggregated_only\n", "00-rollback.yaml", BASE)
    merged = apply_overrides(action, [second, rollback, first], NOW)
    assert merged.rollback
    assert all(not t.disaggregation_enabled for t in merged.action.thresholds.values())
    assert set(merged.action.thresholds) == set(BASE.tenants)


@settings(max_examples=60, deadline=None)
@given(
    mins=st.lists(st.integers(1024, 20000), min_size=1, max_size=4),
    offsets_s=st.lists(st.integers(-600, 600), min_size=4, max_size=4),
)
def test_merge_properties(mins: list[int], offsets_s: list[int]) -> None:
    overrides = [rag_override(m, f"{i:02d}.yaml", NOW + timedelta(seconds=offsets_s[i])) for i, m in enumerate(mins)]
    action = ControlAction(thresholds={"chatbot": RoutingThresholds()}, reason="p")
    merged = apply_overrides(action, overrides, NOW)
    active = [o for o in overrides if o.is_active(NOW)]
    if active:
        assert merged.action.thresholds["rag"].min_remote_input_tokens == mins[overrides.index(active[-1])]
    else:
        assert merged.action == action
    assert merged.action.thresholds["chatbot"] == RoutingThresholds()
    # Idempotent on what it sets, and order-independent in its inputs.
    again = apply_overrides(merged.action, overrides, NOW)
    assert again.action.thresholds == merged.action.thresholds
    assert apply_overrides(action, list(reversed(overrides)), NOW).action == merged.action


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_policy_document_round_trips_every_example(path: Path) -> None:
    resolved = resolve_policy(load_policy_file(path))
    document = policy_document(resolved, ControlAction())
    again = resolve_policy(load_policy_text(yaml.safe_dump(document)))
    assert again.tenants == resolved.tenants
    assert (again.groups, again.tenant_ids, again.api_keys, again.models) == (
        resolved.groups,
        resolved.tenant_ids,
        resolved.api_keys,
        resolved.models,
    )


thresholds = st.builds(
    lambda local, gap, wait_ms, out, pressure, perc, prefix, traffic, enabled, on_kv: RoutingThresholds(
        disaggregation_enabled=enabled, min_remote_input_tokens=local + gap, max_local_input_tokens=local,
        max_prefill_queue_wait_s=wait_ms / 1000.0, min_expected_output_tokens=out,
        require_decode_pool_pressure=pressure, decode_pressure_threshold_frac=perc / 100.0,
        prefer_local_on_prefix_hit=prefix, traffic_percent=traffic, on_kv_transfer_timeout=on_kv,
    ),
    st.integers(0, 16384), st.integers(0, 16384), st.integers(0, 10_000), st.integers(0, 4096), st.booleans(),
    st.integers(0, 100), st.booleans(), st.sampled_from([0.0, 5.0, 37.5, 100.0]), st.booleans(),
    st.sampled_from(list(FallbackAction)),
)  # fmt: skip


@settings(max_examples=80, deadline=None)
@given(rag=thresholds)
def test_policy_document_carries_action_thresholds_exactly(rag: RoutingThresholds) -> None:
    document = policy_document(BASE, ControlAction(thresholds={"rag": rag, "not-a-tenant": RoutingThresholds()}))
    again = resolve_policy(load_policy_text(yaml.safe_dump(document)))
    assert again.tenants["rag"].thresholds == rag
    assert again.tenants["chatbot"] == BASE.tenants["chatbot"]
    assert "not-a-tenant" not in again.tenants
