"""Rule policies: FilePolicy, the queue/KV pool-sizing rule, its threshold moves; the policy registry."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from policies.base import Policy, PolicyContext
from policies.features import build_observation
from policies.policy_file import load_policy_text, resolve_policy
from policies.registry import BASELINES, PolicySpecError, load_policy, parse_policy_spec
from policies.route_levels import route_thresholds
from policies.rules import FilePolicy, QueueKvParams, QueueKvPolicy
from policies.schema import ControlAction, GroupWindow, MetricWindow, PoolTargets, RoutingThresholds, TenantWindow

POLICY = """
pd_disaggregation_policy:
  remote_prefill: {min_input_tokens: 4096}
  local_prefill: {max_input_tokens: 2048}
tenant_groups:
  - {name: g, gpu_budget: 4, pools: {prefill: {min: 1, max: 3}, decode: {min: 1, max: 3}}}
tenants:
  - {name: chat, group: g, slo: {ttft_p95_ms: 500, tpot_p95_ms: 50}}
  - {name: rag, group: g, slo: {ttft_p95_ms: 1000, tpot_p95_ms: 80}}
"""
RESOLVED = resolve_policy(load_policy_text(POLICY))
TENANTS = tuple(tp.tenant for name, tp in RESOLVED.tenants.items() if name != "default")
GROUPS = tuple(RESOLVED.groups.values())
BASE = {name: tp.thresholds for name, tp in RESOLVED.tenants.items()}


def ctx(current: PoolTargets, thresholds: dict[str, RoutingThresholds] | None = None) -> PolicyContext:
    return PolicyContext(TENANTS, GROUPS, {"g": current}, thresholds or BASE, BASE, now_s=0.0, interval_s=10.0)


def decide(
    policy: Policy,
    current: PoolTargets,
    tenants: dict[str, TenantWindow],
    group: GroupWindow | None = None,
    thresholds: dict[str, RoutingThresholds] | None = None,
) -> ControlAction:
    group = group or GroupWindow(current.num_prefill, current.num_decode, decode_kv_usage_frac=0.4)
    window = MetricWindow(100.0, 10.0, tenants, {"g": group})
    context = ctx(current, thresholds)
    return policy.decide(build_observation(window, context.observation_context()), context)


CALM = TenantWindow(request_rate_rps=2.0, ttft_p95_s=0.2, tpot_p95_s=0.02, mean_input_tokens=500)


def test_file_policy_publishes_the_file_and_holds_pools() -> None:
    action = decide(FilePolicy(RESOLVED, "file:x"), PoolTargets(1, 3), {"chat": CALM})
    assert action.thresholds == {t.name: BASE[t.name] for t in TENANTS}  # every tenant of the context
    assert action.pools == {}
    assert action.policy_id == "file:x"
    # a tenant the file does not name gets the file's default tenant's thresholds
    stranger = replace(TENANTS[0], name="stranger")
    context = replace(ctx(PoolTargets(1, 3)), tenants=(*TENANTS, stranger))
    window = MetricWindow(100.0, 10.0, {}, {"g": GroupWindow(1, 3)})
    observation = build_observation(window, context.observation_context())
    thresholds = FilePolicy(RESOLVED, "file:x").decide(observation, context).thresholds
    assert thresholds["stranger"] == BASE["default"] != RoutingThresholds()


def test_static_file_policy_asks_for_its_pools_and_one_level_everywhere() -> None:
    level = route_thresholds("remote>=512")
    policy = FilePolicy(level, "grid:g=2P2D/remote>=512", {"g": PoolTargets(2, 2)})
    action = decide(policy, PoolTargets(1, 3), {"chat": CALM})
    assert action.thresholds == {"chat": level, "rag": level}
    assert action.pools == {"g": PoolTargets(2, 2)}
    assert policy.thresholds_for("anyone") == level


def test_prefill_pressure_at_full_budget_shifts_a_decode_instance() -> None:
    hot = TenantWindow(request_rate_rps=2.0, ttft_p95_s=3.0, tpot_p95_s=0.02, mean_input_tokens=6000)
    action = decide(QueueKvPolicy(), PoolTargets(1, 3), {"chat": CALM, "rag": hot})
    assert action.pools == {"g": PoolTargets(2, 2)}
    assert "g:prefill_pressure_shift" in action.reason


def test_prefill_pressure_with_room_adds_a_prefill_instance() -> None:
    group = GroupWindow(1, 2, decode_kv_usage_frac=0.4, prefill_queue_wait_s=2.0)
    action = decide(QueueKvPolicy(), PoolTargets(1, 2), {"chat": CALM}, group)
    assert action.pools == {"g": PoolTargets(2, 2)}


def test_decode_pressure_moves_toward_decode() -> None:
    tpot_hot = TenantWindow(request_rate_rps=2.0, ttft_p95_s=0.2, tpot_p95_s=0.2, mean_input_tokens=500)
    action = decide(QueueKvPolicy(), PoolTargets(2, 2), {"chat": tpot_hot})
    assert action.pools == {"g": PoolTargets(1, 3)}
    group = GroupWindow(2, 2, decode_kv_usage_frac=0.95)
    action = decide(QueueKvPolicy(), PoolTargets(2, 2), {"chat": CALM}, group)
    assert action.pools == {"g": PoolTargets(1, 3)}


def test_both_pressures_at_full_budget_hold() -> None:
    hot = TenantWindow(request_rate_rps=2.0, ttft_p95_s=3.0, tpot_p95_s=0.3)
    action = decide(QueueKvPolicy(), PoolTargets(2, 2), {"chat": hot})
    assert action.pools == {"g": PoolTargets(2, 2)}
    assert "both_pressure_no_room" in action.reason


def test_unknown_signals_give_no_opinion() -> None:
    group = GroupWindow(1, 3)
    action = decide(QueueKvPolicy(), PoolTargets(1, 3), {}, group)
    assert action.pools == {}
    assert action.thresholds == {}


def test_scale_in_only_when_allowed_and_everything_is_slack() -> None:
    slack = TenantWindow(request_rate_rps=1.0, ttft_p95_s=0.05, tpot_p95_s=0.005)
    group = GroupWindow(2, 2, decode_kv_usage_frac=0.1, prefill_queue_wait_s=0.0)
    assert decide(QueueKvPolicy(), PoolTargets(2, 2), {"chat": slack, "rag": slack}, group).pools == {
        "g": PoolTargets(2, 2)
    }
    allowed = QueueKvPolicy(QueueKvParams(allow_scale_in=True))
    target = decide(allowed, PoolTargets(2, 2), {"chat": slack, "rag": slack}, group).pools["g"]
    assert target.num_instances == 3


def test_long_prompts_missing_ttft_lower_the_remote_threshold_of_that_tenant_only() -> None:
    rag_hot = TenantWindow(request_rate_rps=2.0, ttft_p95_s=2.5, tpot_p95_s=0.02, mean_input_tokens=3000)
    action = decide(QueueKvPolicy(), PoolTargets(1, 3), {"chat": CALM, "rag": rag_hot})
    assert set(action.thresholds) == {"rag"}
    assert action.thresholds["rag"].min_remote_input_tokens == 3072
    assert action.thresholds["rag"].max_local_input_tokens == 2048
    assert "rag:lower_remote_threshold 4096->3072" in action.reason
    # The local bound follows down once the remote threshold passes it; the floor stops the descent.
    low = {**BASE, "rag": RoutingThresholds(min_remote_input_tokens=300, max_local_input_tokens=300)}
    action = decide(QueueKvPolicy(), PoolTargets(1, 3), {"chat": CALM, "rag": rag_hot}, thresholds=low)
    assert action.thresholds["rag"].min_remote_input_tokens == 256
    assert action.thresholds["rag"].max_local_input_tokens == 256


def test_short_prompts_missing_ttft_do_not_move_the_threshold() -> None:
    short = TenantWindow(request_rate_rps=2.0, ttft_p95_s=2.5, tpot_p95_s=0.02, mean_input_tokens=300)
    assert decide(QueueKvPolicy(), PoolTargets(1, 3), {"rag": short}).thresholds == {}


def test_comfortable_tenant_relaxes_back_toward_its_file_thresholds() -> None:
    lowered = {**BASE, "rag": RoutingThresholds(min_remote_input_tokens=1000, max_local_input_tokens=1000)}
    calm = TenantWindow(request_rate_rps=2.0, ttft_p95_s=0.1, tpot_p95_s=0.01, mean_input_tokens=3000)
    action = decide(QueueKvPolicy(), PoolTargets(1, 3), {"chat": CALM, "rag": calm}, thresholds=lowered)
    assert action.thresholds["rag"].min_remote_input_tokens == 1334
    near = {**BASE, "rag": RoutingThresholds(min_remote_input_tokens=4000, max_local_input_tokens=2000)}
    action = decide(QueueKvPolicy(), PoolTargets(1, 3), {"chat": CALM, "rag": calm}, thresholds=near)
    assert action.thresholds["rag"].min_remote_input_tokens == 4096
    assert action.thresholds["rag"].max_local_input_tokens == 2048


def test_params_are_checked() -> None:
    with pytest.raises(ValueError, match="threshold_step_frac"):
        QueueKvParams(threshold_step_frac=1.5)
    with pytest.raises(ValueError, match="low_ratio"):
        QueueKvParams(low_ratio=2.0)


def test_registry_builds_file_and_baseline_policies(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(POLICY)
    file_policy = load_policy(f"file:{path}", RESOLVED)
    assert isinstance(file_policy, FilePolicy)
    assert file_policy.policy_id == f"file:{path}"
    relative = load_policy("file:p.yaml", RESOLVED, base_dir=tmp_path)
    assert isinstance(relative, FilePolicy)
    rule = load_policy("baseline:queue_kv", RESOLVED, {"threshold_step_frac": 0.5})
    assert isinstance(rule, QueueKvPolicy)
    assert rule.params.threshold_step_frac == 0.5
    assert isinstance(rule, Policy)
    assert "queue_kv" in BASELINES


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("baseline:nope", "unknown baseline 'nope' (known: "),
        ("learned:artifacts/x", "manifest.json: missing"),
        ("registry:models:/pdctl@champion", "registry policies need an MLflow registry client"),
        ("registry:pdctl", "registry:models:/NAME@ALIAS"),
        ("magic:x", "expected one of file:PATH"),
        ("file:", "expected one of file:PATH"),
    ],
)
def test_registry_errors_are_one_line(spec: str, message: str) -> None:
    with pytest.raises(PolicySpecError) as info:
        load_policy(spec, RESOLVED)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_every_peer_baseline_loads_by_name() -> None:
    for name in ("aggregated", "vllm-proxy", "dynamo-isl-bounding", "dynamo-load", "keda-queue", "wva-saturation"):
        policy = load_policy(f"baseline:{name}", RESOLVED)
        assert policy.policy_id == f"baseline:{name}"
    throughput = load_policy(
        "baseline:dynamo-throughput", RESOLVED, {"prefill_tokens_per_s": 1e4, "decode_tokens_per_s": 1e3}
    )
    assert throughput.policy_id == "baseline:dynamo-throughput"
    with pytest.raises(PolicySpecError, match="needs prefill_tokens_per_s"):
        load_policy("baseline:dynamo-throughput", RESOLVED)


def test_registry_spec_through_a_resolver(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text("pd_disaggregation_policy: {remote_prefill: {min_input_tokens: 3000}}\n")
    seen: list[str] = []

    def resolver(uri: str) -> Path:
        seen.append(uri)
        return tmp_path

    policy = load_policy("registry:models:/rules@champion", RESOLVED, resolver=resolver)
    assert seen == ["models:/rules@champion"]
    assert isinstance(policy, FilePolicy)
    assert policy.policy_id == "registry:models:/rules@champion"

    def failing(uri: str) -> Path:
        raise ValueError(f"{uri}: not found in the registry")

    with pytest.raises(PolicySpecError, match="not found in the registry"):
        load_policy("registry:models:/rules@champion", RESOLVED, resolver=failing)


def test_bad_baseline_params_are_refused() -> None:
    with pytest.raises(PolicySpecError, match="bad parameters"):
        load_policy("baseline:queue_kv", RESOLVED, {"no_such_param": 1})


def test_parse_policy_spec() -> None:
    assert str(parse_policy_spec("registry:models:/pdctl@champion")) == "registry:models:/pdctl@champion"
