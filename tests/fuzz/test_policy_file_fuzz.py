"""Fuzz the policy-file loader: any input is either accepted or refused with one-line messages, never a crash."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.policy_file import PolicyFileError, load_policy_text, resolve_policy

KEYS = [
    "pd_disaggregation_policy",
    "remote_prefill",
    "local_prefill",
    "min_input_tokens",
    "max_input_tokens",
    "max_prefill_queue_wait_ms",
    "fallback",
    "on_kv_transfer_timeout",
    "rollout",
    "traffic_percent",
    "tenants",
    "name",
    "group",
    "slo",
    "ttft_p95_ms",
    "tenant_groups",
    "gpu_budget",
    "pools",
    "prefill",
    "decode",
    "min",
    "max",
    "routes",
    "model",
    "tenant",
    "mode",
    "expires_at",
    "prompt_length_buckets",
    "route",
    "rule",
]
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["local_prefill", "remote_prefill", "aggregated_only", "2026-01-01T00:00:00Z"])
)
documents = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), children, max_size=5)
    ),
    max_leaves=30,
)


def _check(text: str) -> None:
    problems = []
    try:
        resolve_policy(load_policy_text(text, "fuzz.yaml"), "fuzz.yaml")
    except PolicyFileError as exc:
        problems = [str(p) for p in exc.problems]
        assert problems
    for line in problems:
        assert line.startswith("fuzz.yaml")
        assert "\n" not in line


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_structured_documents(doc: object) -> None:
    _check(yaml.safe_dump({"pd_disaggregation_policy": doc} if not isinstance(doc, dict) else doc))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text(text: str) -> None:
    _check(text)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decoded_leniently(data: bytes) -> None:
    _check(data.decode("utf-8", "replace"))
