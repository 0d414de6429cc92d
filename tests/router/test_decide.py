from __future__ import annotations

from pathlib import Path

import pytest

from policies.admission import AdmissionConfig
from policies.policy_file import load_policy_text, resolve_policy
from policies.routing import decide_route
from policies.schema import LiveState, RequestFeatures, RouteReason
from router.config import EstimationConfig, InstanceConfig
from router.decide import Planner, prompt_text_of
from router.estimates import TransferHealth, prefix_blocks
from router.registry import InstanceRegistry

POLICY = resolve_policy(
    load_policy_text((Path(__file__).resolve().parents[2] / "policies" / "examples" / "multi_tenant.yaml").read_text())
)


def planner(**estimation: object) -> Planner:
    reg = InstanceRegistry(
        [
            InstanceConfig(id="p0", url="http://h:1", role="prefill"),
            InstanceConfig(id="d0", url="http://h:2", role="decode", max_num_seqs=4),
            InstanceConfig(id="d1", url="http://h:3", role="decode", max_num_seqs=4),
        ]
    )
    return Planner(reg, EstimationConfig.model_validate(estimation), TransferHealth(30, 8, 0.5))


@pytest.mark.parametrize(
    ("header", "api_key", "model", "tenant"),
    [
        ("chat", None, "", "chatbot"),
        ("chatbot", None, "", "chatbot"),
        (None, "sk-batch-ingest", "", "batch-summarization"),
        (None, None, "agent-tools", "agent"),
        (None, None, "summarize-v2", "batch-summarization"),
        ("unknown", None, "", "default"),
    ],
)
def test_tenant_identification(header: str | None, api_key: str | None, model: str, tenant: str) -> None:
    plan = planner().plan({"prompt": "x", "model": model}, POLICY, "r", header, api_key, 0.0)
    assert plan is not None
    assert plan.features.tenant == tenant


def test_estimates_and_expected_output() -> None:
    p = planner()
    plan = p.plan({"prompt": "a" * 4001, "max_tokens": 33}, POLICY, "r", "chat", None, 0.0)
    assert plan is not None
    assert plan.features.input_tokens == 1001
    assert plan.features.expected_output_tokens == 33
    tenant_default = p.plan({"prompt": "a"}, POLICY, "r", "chat", None, 0.0)
    assert tenant_default is not None
    assert tenant_default.features.expected_output_tokens == 300  # chatbot's expected_output_tokens
    built_in = p.plan({"prompt": "a"}, POLICY, "r", None, None, 0.0)
    assert built_in is not None
    assert built_in.features.expected_output_tokens == 256
    chat = {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": [{"text": "yo"}]}]}
    assert prompt_text_of(chat) == "<|user|>hello\n<|assistant|>yo\n"


def test_the_decision_is_decide_route_on_the_gathered_state() -> None:
    p = planner()
    reg = p.registry
    reg.acquire(reg.instances["p0"], 40_000)
    reg.acquire(reg.instances["d0"])
    reg.acquire(reg.instances["d1"])
    reg.acquire(reg.instances["d1"])
    body = {"prompt": "w" * 4 * 5000, "max_tokens": 400, "model": "rag-answer-service"}
    plan = p.plan(body, POLICY, "req-1", None, None, 0.0)
    assert plan is not None
    assert plan.decode.id == "d0"  # least loaded (no prefix hits yet)
    expected_live = LiveState(
        prefill_queue_wait_s=40_000 / 20_000.0,
        decode_pressure_frac=1 / 4,
        prefix_hit_tokens=0,
        kv_transfer_healthy=True,
        num_prefill_instances=1,
        prefill_queue_requests=1,
        prefill_active_tokens=40_000.0,
        prefill_max_batched_tokens=8192,
        decode_kv_usage_frac=None,
    )
    features = RequestFeatures("req-1", "rag", 5000, 400, "rag-answer-service")
    assert plan.decision == decide_route(features, POLICY.thresholds_for("rag"), expected_live)
    assert plan.decision.reason.value == "prefill_queue_overload"  # 2 s wait > rag's 0.8 s bound
    assert plan.prefill is None


def test_decode_choice_prefers_prefix_hits_within_the_slack() -> None:
    p = planner(affinity_slack_requests=1)
    text = "z" * 4 * 3000
    p.tracker(p.registry.instances["d1"]).record(prefix_blocks(text, 64 * 4))
    p.registry.acquire(p.registry.instances["d1"])
    plan = p.plan({"prompt": text}, POLICY, "r", None, None, 0.0)
    assert plan is not None
    assert plan.decode.id == "d1"
    assert plan.prefix_hit_tokens == 2944
    p.registry.acquire(p.registry.instances["d1"])  # now 2 more in flight than d0: beyond the slack
    plan = p.plan({"prompt": text}, POLICY, "r", None, None, 0.0)
    assert plan is not None
    assert plan.decode.id == "d0"
    assert plan.prefix_hit_tokens == 0


def test_no_decode_instance_means_no_plan() -> None:
    p = planner()
    for inst in p.registry.instances.values():
        inst.healthy = False
    assert p.plan({"prompt": "x"}, POLICY, "r", None, None, 0.0) is None


def test_a_remote_plan_counts_on_its_decode_instance_until_the_decode_leg_starts() -> None:
    p = planner(affinity_slack_requests=0)
    body = {"prompt": "q" * 4 * 6000, "max_tokens": 400, "model": "rag-answer-service"}
    first = p.plan(body, POLICY, "r1", None, None, 0.0)
    assert first is not None
    assert first.decision.is_remote
    assert first.prefill is not None
    assert (first.decode.id, first.decode.incoming, first.decode.load_requests) == ("d0", 1, 1)
    second = p.plan(body, POLICY, "r2", None, None, 0.0)
    assert second is not None
    assert second.decode.id == "d1"  # d0 already holds the first request, still prefilling
    p.decode_leg_started(first)
    p.decode_leg_started(second)
    assert [i.incoming for i in p.registry.instances.values()] == [0, 0, 0]
    local = p.plan({"prompt": "short"}, POLICY, "r3", None, None, 0.0)
    assert local is not None
    assert local.prefill is None
    p.decode_leg_started(local)  # a local plan was never counted: nothing to undo
    assert local.decode.incoming == 0


def test_a_half_open_breaker_lets_only_its_probes_go_remote() -> None:
    """The planner asks the breaker (policies.transfer_health) per request and tells it which went remote."""
    reg = InstanceRegistry(
        [
            InstanceConfig(id="p0", url="http://h:1", role="prefill"),
            InstanceConfig(id="d0", url="http://h:2", role="decode", max_num_seqs=64),
        ]
    )
    p = Planner(reg, EstimationConfig(), TransferHealth(10.0, 4, 0.5, probe_requests=2))
    for t in range(4):
        p.transfer_health.record(float(t), False)
    body = {"prompt": "q" * 4 * 6000, "max_tokens": 400, "model": "rag-answer-service"}
    reasons = []
    for k, now_s in enumerate((5.0, 13.0, 13.1, 13.2, 13.3)):
        plan = p.plan(body, POLICY, f"r{k}", None, None, now_s)
        assert plan is not None
        reasons.append(plan.decision.reason.value)
        p.decode_leg_started(plan)
    # open until 13 s; then two probes go remote and the rest stay local until their outcomes are in
    assert reasons == ["kv_transfer_unhealthy", "long_prompt", "long_prompt"] + ["kv_transfer_unhealthy"] * 2
    p.transfer_health.record(14.0, True)
    p.transfer_health.record(14.1, True)
    plan = p.plan(body, POLICY, "r9", None, None, 14.2)
    assert plan is not None
    assert plan.decision.is_remote
    assert p.transfer_health.healthy(14.2)


def test_admission_refuses_once_the_queue_it_would_join_is_past_the_ttft_objective() -> None:
    reg = InstanceRegistry(
        [
            InstanceConfig(id="p0", url="http://h:1", role="prefill"),
            InstanceConfig(id="d0", url="http://h:2", role="decode"),
        ]
    )
    p = Planner(reg, EstimationConfig(), TransferHealth(30, 8, 0.5), AdmissionConfig(ttft_slack_frac=1.0))
    body = {"prompt": "a" * 16000}  # 4000 tokens: 0.2 s at the initial 20000 tokens/s; chatbot's TTFT p95 is 0.5 s
    admitted = p.plan(body, POLICY, "r1", "chat", None, 0.0)
    assert admitted is not None
    assert not admitted.refused
    if admitted.prefill is not None:
        Planner.decode_leg_started(admitted)
    reg.instances["d0"].awaiting_first_token_tokens = 8000  # +0.4 s on the local route
    reg.instances["p0"].in_flight_prefill_tokens = 8000  # +0.4 s on the remote route
    refused = p.plan(body, POLICY, "r2", "chat", None, 0.0)
    assert refused is not None
    assert refused.refused
    assert refused.decision.reason is RouteReason.ADMISSION_REFUSED
    assert refused.prefill is None
    assert reg.instances["d0"].incoming == 0
    rag = p.plan(body, POLICY, "r3", "rag", None, 0.0)  # a 3 s objective: still admitted
    assert rag is not None
    assert not rag.refused
    off = planner().plan(body, POLICY, "r4", "chat", None, 0.0)
    assert off is not None
    assert not off.refused
