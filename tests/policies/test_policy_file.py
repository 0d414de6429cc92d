from __future__ import annotations

import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import FallbackAction, Route, load_policy_file, load_policy_text, resolve_policy
from policies.policy_file import DEFAULT_TENANT, PolicyFile, PolicyFileError, dump_policy_yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "policies" / "examples"

SEED_PD = """\
pd_disaggregation_policy:
  remote_prefill:
    min_input_tokens: 2048
    max_prefill_queue_wait_ms: 300
    min_expected_output_tokens: 128
    require_decode_pool_pressure: true
  local_prefill:
    max_input_tokens: 1024
    prefer_when_prefix_cache_hit: true
fallback:
  on_kv_transfer_timeout: local_aggregated_serving
  on_prefill_queue_overload: local_prefill
"""

SEED_ROLLOUT = """\
rollout:
  enabled_models:
    - qwen-long-context-service
    - rag-answer-service
  traffic_percent: 5
  remote_prefill_when:
    input_tokens_gte: 4096
  stream_response: true
  fallback_to_aggregated: true
"""


def test_seed_disaggregation_block_loads_verbatim() -> None:
    resolved = resolve_policy(load_policy_text(SEED_PD, "seed.yaml"))
    t = resolved.thresholds_for(DEFAULT_TENANT)
    assert t.min_remote_input_tokens == 2048
    assert t.max_prefill_queue_wait_s == pytest.approx(0.3)
    assert t.min_expected_output_tokens == 128
    assert t.require_decode_pool_pressure is True
    assert t.max_local_input_tokens == 1024
    assert t.prefer_local_on_prefix_hit is True
    assert t.on_kv_transfer_timeout is FallbackAction.LOCAL_AGGREGATED_SERVING
    assert t.on_prefill_queue_overload is FallbackAction.LOCAL_PREFILL


def test_seed_rollout_block_loads_verbatim() -> None:
    resolved = resolve_policy(load_policy_text(SEED_ROLLOUT, "rollout.yaml"))
    t = resolved.thresholds_for(DEFAULT_TENANT)
    assert t.enabled_models == frozenset({"qwen-long-context-service", "rag-answer-service"})
    assert t.traffic_percent == 5.0
    assert t.min_remote_input_tokens == 4096
    assert resolved.tenants[DEFAULT_TENANT].stream_response is True


def test_both_seed_blocks_in_one_file() -> None:
    t = resolve_policy(load_policy_text(SEED_PD + SEED_ROLLOUT)).thresholds_for(DEFAULT_TENANT)
    # rollout's trigger wins over remote_prefill.min_input_tokens at the same level
    assert t.min_remote_input_tokens == 4096
    assert t.max_local_input_tokens == 1024


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_examples_validate(path: Path) -> None:
    resolve_policy(load_policy_file(path), str(path))


def test_multi_tenant_precedence() -> None:
    resolved = resolve_policy(load_policy_file(EXAMPLES / "multi_tenant.yaml"))
    rag = resolved.tenants["rag"]
    assert rag.thresholds.min_remote_input_tokens == 1536  # tenant field wins
    assert rag.thresholds.max_local_input_tokens == 1024  # inherited from the file's block
    assert rag.thresholds.require_decode_pool_pressure is False
    assert rag.tenant.slo.ttft_p95_s == pytest.approx(3.0)
    chat = resolved.tenants["chatbot"]
    assert chat.tenant.priority == 2.0
    assert chat.expected_output_tokens == 300
    assert resolved.tenants["agent"].thresholds.buckets[0].route is Route.LOCAL_PREFILL
    assert (
        resolved.tenants["batch-summarization"].thresholds.on_kv_transfer_timeout is FallbackAction.RETRY_REMOTE_PREFILL
    )
    assert resolved.tenants[DEFAULT_TENANT].tenant.slo.tpot_p95_s == pytest.approx(0.1)  # file-level SLO
    assert resolved.groups["interactive"].tenants == ("chatbot", "agent", "rag")


def test_tenant_identification_order() -> None:
    resolved = resolve_policy(load_policy_file(EXAMPLES / "multi_tenant.yaml"))
    assert resolved.identify_tenant("rag", None, "chat-service") == "rag"  # tenant name first
    assert resolved.identify_tenant("support-bot") == "chatbot"  # match.tenant_ids
    assert resolved.identify_tenant("nobody", "sk-batch-ingest") == "batch-summarization"  # API key
    assert resolved.identify_tenant(None, None, "agent-tools") == "agent"  # match.models
    assert resolved.identify_tenant(None, None, "summarize-v2") == "batch-summarization"  # routes
    assert resolved.identify_tenant(None, None, "unknown-model") == DEFAULT_TENANT


def test_aggregated_only_disables_every_tenant() -> None:
    text = (EXAMPLES / "aggregated_only.yaml").read_text() + "tenants:\n  - name: rag\n"
    resolved = resolve_policy(load_policy_text(text))
    assert all(not tp.thresholds.disaggregation_enabled for tp in resolved.tenants.values())


def test_tenant_mode_overrides_file_mode() -> None:
    text = "mode: aggregated_only\ntenants:\n  - name: rag\n    mode: disaggregated\n"
    resolved = resolve_policy(load_policy_text(text))
    assert resolved.thresholds_for("rag").disaggregation_enabled
    assert not resolved.thresholds_for(DEFAULT_TENANT).disaggregation_enabled


def test_expiry() -> None:
    policy = load_policy_text("expires_at: 2026-01-01T00:00:00Z\nmode: aggregated_only\n")
    assert policy.is_expired(datetime(2026, 1, 2, tzinfo=UTC))
    assert not policy.is_expired(datetime(2025, 12, 31, tzinfo=UTC))


# ------------------------------------------------------------------------------------- malformed files

MALFORMED: list[tuple[str, str, str, int | None]] = [
    # (id, yaml text, expected field path in the message, expected line)
    ("unknown-top-key", "pd_disagregation_policy: {}\n", "pd_disagregation_policy", 1),
    (
        "unknown-nested-key",
        SEED_PD.replace("min_input_tokens: 2048", "min_input_token: 2048"),
        "pd_disaggregation_policy.remote_prefill.min_input_token",
        3,
    ),
    (
        "string-for-int",
        SEED_PD.replace("2048", '"2048"'),
        "pd_disaggregation_policy.remote_prefill.min_input_tokens",
        3,
    ),
    ("float-for-int", SEED_PD.replace("2048", "2048.5"), "pd_disaggregation_policy.remote_prefill.min_input_tokens", 3),
    (
        "negative-tokens",
        SEED_PD.replace("max_input_tokens: 1024", "max_input_tokens: -1"),
        "pd_disaggregation_policy.local_prefill.max_input_tokens",
        8,
    ),
    (
        "negative-wait",
        SEED_PD.replace("300", "-300"),
        "pd_disaggregation_policy.remote_prefill.max_prefill_queue_wait_ms",
        4,
    ),
    (
        "bool-as-string",
        SEED_PD.replace("pressure: true", "pressure: yes please"),
        "pd_disaggregation_policy.remote_prefill.require_decode_pool_pressure",
        6,
    ),
    (
        "inverted-thresholds",
        SEED_PD.replace("max_input_tokens: 1024", "max_input_tokens: 4096"),
        "pd_disaggregation_policy",
        2,
    ),
    (
        "percent-over-100",
        SEED_ROLLOUT.replace("traffic_percent: 5", "traffic_percent: 101"),
        "rollout.traffic_percent",
        5,
    ),
    (
        "percent-negative",
        SEED_ROLLOUT.replace("traffic_percent: 5", "traffic_percent: -1"),
        "rollout.traffic_percent",
        5,
    ),
    (
        "unknown-fallback",
        SEED_PD.replace("on_kv_transfer_timeout: local_aggregated_serving", "on_kv_transfer_timeout: give_up"),
        "fallback.on_kv_transfer_timeout",
        11,
    ),
    (
        "overload-cannot-retry",
        SEED_PD.replace("on_prefill_queue_overload: local_prefill", "on_prefill_queue_overload: retry_remote_prefill"),
        "fallback.on_prefill_queue_overload",
        12,
    ),
    ("duplicate-tenants", "tenants:\n  - name: rag\n  - name: rag\n", "tenants", 2),
    ("duplicate-yaml-key", "mode: aggregated_only\nmode: disaggregated\n", "mode", 2),
    ("not-yaml", "pd_disaggregation_policy: [unclosed\n", "", None),
    ("not-a-mapping", "- just\n- a list\n", "", 1),
    ("empty-file", "", "", None),
    (
        "enabled-models-not-list",
        SEED_ROLLOUT.replace(
            "  enabled_models:\n    - qwen-long-context-service\n    - rag-answer-service\n",
            "  enabled_models: rag-answer-service\n",
        ),
        "rollout.enabled_models",
        2,
    ),
    ("unknown-mode", "mode: half\n", "mode", 1),
    ("slo-quantiles-inverted", "slo: {ttft_p95_ms: 900, ttft_p99_ms: 500}\n", "slo", 1),
    ("slo-zero", "slo: {tpot_p95_ms: 0}\n", "slo.tpot_p95_ms", 1),
    ("tenant-without-name", "tenants:\n  - priority: 2\n", "tenants[0].name", 2),
    (
        "tenant-unknown-group",
        "tenant_groups:\n  - {name: a, gpu_budget: 4}\ntenants:\n  - {name: x, group: b}\n",
        "tenants[0].group",
        4,
    ),
    (
        "pool-min-above-max",
        "tenant_groups:\n  - name: a\n    gpu_budget: 8\n    pools: {prefill: {min: 3, max: 2}}\n",
        "tenant_groups[0].pools.prefill",
        4,
    ),
    (
        "pools-exceed-budget",
        "tenant_groups:\n  - name: a\n    gpu_budget: 2\n    pools: {prefill: {min: 2}, decode: {min: 2}}\n",
        "tenant_groups[0]",
        2,
    ),
    (
        "bucket-inverted",
        "tenants:\n  - name: a\n    prompt_length_buckets:\n"
        "      - {min_input_tokens: 10, max_input_tokens: 5, route: local_prefill}\n",
        "tenants[0].prompt_length_buckets[0]",
        4,
    ),
    (
        "bucket-unknown-route",
        "tenants:\n  - name: a\n    prompt_length_buckets:\n      - {route: sideways}\n",
        "tenants[0].prompt_length_buckets[0].route",
        4,
    ),
    ("route-unknown-tenant", "routes:\n  - {model: m, tenant: ghost}\n", "routes[0].tenant", 2),
    ("negative-priority", "tenants:\n  - {name: a, priority: -1}\n", "tenants[0].priority", 2),
    ("bad-tenant-name", "tenants:\n  - {name: 'has space'}\n", "tenants[0].name", 2),
    (
        "tenant-level-inversion",
        SEED_PD + "tenants:\n  - name: rag\n    pd_disaggregation_policy:\n"
        "      remote_prefill: {min_input_tokens: 512}\n",
        "tenants[0].pd_disaggregation_policy",
        16,
    ),
    ("bad-version", "version: 2\n", "version", 1),
    ("bad-expiry", "expires_at: someday\n", "expires_at", 1),
]


@pytest.mark.parametrize(("text", "field", "line"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_files_are_refused_naming_the_field(text: str, field: str, line: int | None) -> None:
    with pytest.raises(PolicyFileError) as info:
        resolve_policy(load_policy_text(text, "bad.yaml"), "bad.yaml")
    problems = info.value.problems
    assert problems, "at least one problem"
    first = problems[0]
    assert first.source == "bad.yaml"
    assert first.field_path == field or first.field_path.startswith(field), str(info.value)
    if line is not None:
        assert first.line == line, str(info.value)
    message = str(first)
    assert message.startswith("bad.yaml"), message
    assert "\n" not in message


def test_at_least_twenty_malformed_cases() -> None:
    assert len(MALFORMED) >= 20


def test_every_problem_is_reported_not_only_the_first() -> None:
    text = SEED_PD.replace("2048", '"x"').replace("300", "-1")
    with pytest.raises(PolicyFileError) as info:
        load_policy_text(text, "two.yaml")
    assert len(info.value.problems) == 2


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match="cannot read"):
        load_policy_file(tmp_path / "missing.yaml")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(PolicyFileError, match=str(binary)):
        load_policy_file(binary)


# ---------------------------------------------------------------------------------------------- round trip

_tokens = st.integers(min_value=0, max_value=200_000)
_ms = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def policy_documents(draw: st.DrawFn) -> dict[str, object]:
    low = draw(_tokens)
    high = draw(st.integers(min_value=low, max_value=400_000))
    doc: dict[str, object] = {
        "pd_disaggregation_policy": {
            "remote_prefill": {
                "min_input_tokens": high,
                "max_prefill_queue_wait_ms": draw(_ms),
                "min_expected_output_tokens": draw(_tokens),
                "require_decode_pool_pressure": draw(st.booleans()),
            },
            "local_prefill": {"max_input_tokens": low, "prefer_when_prefix_cache_hit": draw(st.booleans())},
        },
        "fallback": {
            "on_kv_transfer_timeout": draw(
                st.sampled_from(["local_aggregated_serving", "local_prefill", "retry_remote_prefill"])
            ),
            "on_prefill_queue_overload": draw(st.sampled_from(["local_aggregated_serving", "local_prefill"])),
        },
        "mode": draw(st.sampled_from(["disaggregated", "aggregated_only"])),
    }
    if draw(st.booleans()):
        doc["rollout"] = {
            "traffic_percent": draw(st.floats(min_value=0, max_value=100, allow_nan=False)),
            "enabled_models": draw(st.lists(st.text("abcdef-", min_size=1, max_size=8), max_size=3)),
        }
    names = draw(st.lists(st.text("abcxyz", min_size=1, max_size=6), unique=True, max_size=4))
    doc["tenants"] = [
        {
            "name": n,
            "priority": draw(st.floats(min_value=0.1, max_value=10)),
            "slo": {"ttft_p95_ms": draw(st.floats(min_value=1, max_value=1e5))},
        }
        for n in names
    ]
    return doc


@settings(max_examples=60, deadline=None)
@given(policy_documents())
def test_policy_round_trip(doc: dict[str, object]) -> None:
    first = load_policy_text(yaml.safe_dump(doc), "gen.yaml")
    again = load_policy_text(dump_policy_yaml(first), "dumped.yaml")
    assert again == first
    assert resolve_policy(again) == resolve_policy(first)


def test_round_trip_of_examples() -> None:
    for path in EXAMPLES.glob("*.yaml"):
        first = load_policy_file(path)
        assert load_policy_text(dump_policy_yaml(first)) == first


def test_policy_file_model_is_frozen() -> None:
    policy = PolicyFile()
    with pytest.raises(Exception, match="frozen"):
        policy.mode = "aggregated_only"  # type: ignore[misc]


def test_docstring_format_mentions_every_top_level_key() -> None:
    import policies.policy_file as module

    doc = textwrap.dedent(module.__doc__ or "")
    for key in PolicyFile.model_fields:
        assert f"{key}:" in doc, key
