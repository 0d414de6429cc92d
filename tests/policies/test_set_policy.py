"""The layout-free set policy: relative features, pool-move codec, permutation-invariant network, artifacts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from policies import SCHEMA_VERSION, GroupWindow, MetricWindow, PoolTargets, RoutingThresholds, TenantWindow
from policies.artifacts import load_learned
from policies.base import PolicyContext
from policies.features import ObservationContext, build_observation
from policies.learned import MANIFEST_NAME, WEIGHTS_NAME, LearnedPolicy, PolicyLoadError
from policies.schema import RouteRule, Slo, Tenant, TenantGroup
from policies.set_codec import HOLD, POOL_MOVES, TENANT_DIMS, SetActionCodec, pool_move
from policies.set_features import (
    SET_GROUP_FEATURES,
    SET_TENANT_FEATURES,
    SetLayout,
    SetObservation,
    build_set_observation,
    set_feature_hash,
)
from policies.set_network import SetNetwork
from policies.set_policy import SetPolicy

LEARNED = Path(__file__).resolve().parents[2] / "experiments" / "results" / "learned"
LAYOUT = SetLayout()
CODEC = SetActionCodec(LAYOUT)


def _group(name: str, gpus: int, tp: int, tenants: tuple[str, ...]) -> TenantGroup:
    n = gpus // tp
    return TenantGroup(name, tenants, gpus, min_prefill=0, max_prefill=n - 1, min_decode=1, max_decode=n,
                       gpus_per_instance=tp)  # fmt: skip


def _window(groups: dict[str, GroupWindow], tenants: dict[str, TenantWindow]) -> MetricWindow:
    return MetricWindow(end_s=10.0, window_s=10.0, tenants=tenants, groups=groups)


def _tenant_window(rate_rps: float) -> TenantWindow:
    return TenantWindow(
        request_rate_rps=rate_rps,
        mean_input_tokens=2000.0,
        p95_input_tokens=6000.0,
        mean_output_tokens=200.0,
        ttft_p95_s=1.5,
        tpot_p95_s=0.04,
        slo_attainment_frac=0.8,
        goodput_rps=0.8 * rate_rps,
        remote_prefill_frac=0.5,
        failed_rate_rps=0.0,
    )


def _group_window(prefill: int, decode: int) -> GroupWindow:
    return GroupWindow(
        num_prefill=prefill,
        num_decode=decode,
        prefill_queue_wait_s=0.2,
        prefill_queued_tokens=8192.0 * prefill,
        decode_active_seqs=40.0 * decode,
        decode_kv_usage_frac=0.5,
        kv_transfer_time_p95_s=0.05,
        kv_transfer_failure_frac=0.0,
        prefix_cache_hit_frac=0.1,
        prefill_queue_requests=2.0 * prefill,
        decode_queue_requests=0.0,
    )


CHAT = Tenant("chat", "g", Slo(ttft_p95_s=1.0, tpot_p95_s=0.06), priority=2.0)


# ------------------------------------------------------------------------------------------- features


def test_features_do_not_see_the_size_of_the_group() -> None:
    """4 instances at 2P2D with rate r read the same as 12 instances at 6P6D with rate 3r (per instance)."""
    rows = []
    for gpus, prefill, rate in ((8, 2, 4.0), (24, 6, 12.0)):
        context = ObservationContext((CHAT,), (_group("g", gpus, 2, ("chat",)),), {"chat": RoutingThresholds()})
        window = _window({"g": _group_window(prefill, prefill)}, {"chat": _tenant_window(rate)})
        rows.append(build_set_observation(window, context))
    small, large = rows
    assert small.tenant_rows[0] == pytest.approx(large.tenant_rows[0])
    bound = [f.name for f in SET_GROUP_FEATURES].index("prefill_bound_frac")  # bounds 0..n-1 differ by one
    assert [v for i, v in enumerate(small.group_rows[0]) if i != bound] == pytest.approx(
        [v for i, v in enumerate(large.group_rows[0]) if i != bound]
    )
    vector = small.to_vector(LAYOUT)
    assert LAYOUT.observation_space().contains(vector)


def test_latencies_are_relative_to_each_tenants_objective() -> None:
    loose = Tenant("batch", "g", Slo(ttft_p95_s=10.0, tpot_p95_s=0.2))
    context = ObservationContext((CHAT, loose), (_group("g", 8, 2, ("chat", "batch")),), {})
    window = _window({"g": _group_window(2, 2)}, {"chat": _tenant_window(2.0), "batch": _tenant_window(2.0)})
    obs = build_set_observation(window, context)
    names = [f.name for f in SET_TENANT_FEATURES]
    ttft = names.index("ttft_slo_ratio")
    assert obs.tenant_rows[0][ttft] == pytest.approx(1.5)
    assert obs.tenant_rows[1][ttft] == pytest.approx(0.15)
    share = names.index("rate_share_frac")
    assert obs.tenant_rows[0][share] == pytest.approx(0.5)
    # no thresholds known: the level features are unknown (known flag 0), not zero
    vector = obs.to_vector(LAYOUT)
    _, tenants, _, tenant_mask, membership = LAYOUT.split(vector)
    level = names.index("remote_level_frac")
    assert tenants[0, len(names) + level] == 0.0
    assert tenants[0, len(names) + ttft] == 1.0
    assert tenant_mask.tolist() == [1, 1, 0, 0, 0, 0]
    assert membership[:2, 0].tolist() == [1, 1]


def test_missing_series_are_unknown_not_zero() -> None:
    context = ObservationContext((CHAT,), (_group("g", 8, 2, ("chat",)),), {})
    obs = build_set_observation(_window({}, {}), context)
    vector = obs.to_vector(LAYOUT)
    groups, tenants, group_mask, _, _ = LAYOUT.split(vector)
    assert group_mask.tolist() == [1, 0, 0]
    assert groups[0, len(SET_GROUP_FEATURES) :].sum() == 0.0
    priority = [f.name for f in SET_TENANT_FEATURES].index("priority_rel")
    assert tenants[0, len(SET_TENANT_FEATURES) + priority] == 1.0  # context facts stay known


def test_beyond_the_maximum_is_refused_in_one_line() -> None:
    tenants = tuple(Tenant(f"t{i}", "g", Slo(ttft_p95_s=1.0)) for i in range(7))
    context = ObservationContext(tenants, (_group("g", 8, 2, tuple(t.name for t in tenants)),), {})
    obs = build_set_observation(_window({}, {}), context)
    with pytest.raises(ValueError, match=r"^1 groups / 7 tenants exceed the set policy's maximum of 3 groups / 6"):
        obs.to_vector(LAYOUT)
    with pytest.raises(ValueError, match="group 'h' is not among"):
        build_set_observation(_window({}, {}), ObservationContext((Tenant("x", "h"),), (), {}))


# ------------------------------------------------------------------------------------------- codec


def test_pool_moves_flip_at_a_full_budget_and_add_below_it() -> None:
    group = _group("g", 8, 2, ("chat",))  # 4 instances, prefill 0..3, decode 1..4
    assert pool_move(group, PoolTargets(2, 2), +1) == PoolTargets(3, 1)
    assert pool_move(group, PoolTargets(2, 2), -1) == PoolTargets(1, 3)
    assert pool_move(group, PoolTargets(1, 2), +1) == PoolTargets(2, 2)
    assert pool_move(group, PoolTargets(1, 2), -1) == PoolTargets(1, 3)
    assert pool_move(group, PoolTargets(3, 1), +1) is None  # decode would fall below its minimum
    assert pool_move(group, PoolTargets(0, 4), -1) is None
    masks = CODEC.masks((group,), {"g": PoolTargets(3, 1)}, num_tenants=1)
    assert masks[:3].tolist() == [True, True, False]
    assert masks[3:9].tolist() == [False, True, False, False, True, False]  # padded groups: hold only
    tenant_part = masks[9:]
    assert tenant_part[: sum(TENANT_DIMS)].all()
    assert tenant_part[sum(TENANT_DIMS) : sum(TENANT_DIMS) + TENANT_DIMS[0]].tolist() == [True] + [False] * 7


def test_decode_and_encode_round_trip() -> None:
    groups = (_group("a", 8, 2, ("chat",)), _group("b", 32, 2, ("rag",)))
    tenants = (CHAT, Tenant("rag", "b", Slo(ttft_p95_s=4.0)))
    current = {"a": PoolTargets(2, 2), "b": PoolTargets(8, 8)}
    base = {t.name: RoutingThresholds() for t in tenants}
    encoded = np.zeros(len(CODEC.nvec), dtype=np.int64)
    encoded[:3] = [2, 0, HOLD]
    encoded[3 : 3 + 6] = [5, 1, 2, 1, 1, 1]  # chat: 8192 tokens, 0.3 s, 128, flags, legacy rule
    decoded = CODEC.decode(encoded, tenants, groups, current, base)
    assert decoded.pools == {"a": PoolTargets(3, 1), "b": PoolTargets(7, 9)}
    assert decoded.thresholds["chat"].rule is RouteRule.DYNAMO_LEGACY
    assert decoded.thresholds["chat"].max_local_input_tokens == 8192
    again = CODEC.encode(decoded, tenants, groups, current, base)
    assert again.tolist() == encoded.tolist()
    with pytest.raises(ValueError, match="outside the action space"):
        CODEC.decode(encoded + 100, tenants, groups, current, base)


# ------------------------------------------------------------------------------------------- network


def _random_tensors(layout: SetLayout, hidden: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    shapes = {
        "tenant_encoder.0": (hidden, layout.tenant_width + layout.group_width),
        "tenant_encoder.1": (hidden, hidden),
        "group_encoder.0": (hidden, layout.group_width + 2 * hidden),
        "group_encoder.1": (hidden, hidden),
        "group_head": (len(POOL_MOVES), 2 * hidden),
        "tenant_head": (sum(TENANT_DIMS), 3 * hidden),
    }
    for name, shape in shapes.items():
        tensors[f"{name}.weight"] = rng.normal(scale=0.5, size=shape).astype(np.float32)
        tensors[f"{name}.bias"] = rng.normal(scale=0.5, size=shape[0]).astype(np.float32)
    return tensors


def random_observation(rng: np.random.Generator, num_groups: int, num_tenants: int) -> SetObservation:
    """Random rows (some unknown values) with every group holding at least one tenant."""

    def row(width: int) -> tuple[float | None, ...]:
        return tuple(None if rng.random() < 0.1 else float(rng.uniform(0, 3)) for _ in range(width))

    assignment = list(range(num_groups)) + [int(rng.integers(num_groups)) for _ in range(num_tenants - num_groups)]
    return SetObservation(
        group_rows=tuple(row(len(SET_GROUP_FEATURES)) for _ in range(num_groups)),
        tenant_rows=tuple(row(len(SET_TENANT_FEATURES)) for _ in range(num_tenants)),
        tenant_group=tuple(assignment),
    )


def _split_logits(logits: np.ndarray, layout: SetLayout) -> tuple[np.ndarray, np.ndarray]:
    cut = layout.max_groups * len(POOL_MOVES)
    return logits[:cut].reshape(layout.max_groups, -1), logits[cut:].reshape(layout.max_tenants, -1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shuffling_tenants_or_groups_permutes_the_outputs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    network = SetNetwork.from_tensors(_random_tensors(LAYOUT, 16, seed), LAYOUT, 2)
    obs = random_observation(rng, 3, 6)
    groups, tenants = _split_logits(network.logits(obs.to_vector(LAYOUT)), LAYOUT)

    tenant_perm = rng.permutation(6)
    shuffled = SetObservation(
        obs.group_rows,
        tuple(obs.tenant_rows[i] for i in tenant_perm),
        tuple(obs.tenant_group[i] for i in tenant_perm),
    )
    g2, t2 = _split_logits(network.logits(shuffled.to_vector(LAYOUT)), LAYOUT)
    np.testing.assert_allclose(t2, tenants[tenant_perm], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g2, groups, rtol=1e-5, atol=1e-5)

    group_perm = rng.permutation(3)
    new_index = {int(old): new for new, old in enumerate(group_perm)}
    regrouped = SetObservation(
        tuple(obs.group_rows[i] for i in group_perm), obs.tenant_rows, tuple(new_index[g] for g in obs.tenant_group)
    )
    g3, t3 = _split_logits(network.logits(regrouped.to_vector(LAYOUT)), LAYOUT)
    np.testing.assert_allclose(g3, groups[group_perm], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(t3, tenants, rtol=1e-5, atol=1e-5)


def test_padding_does_not_change_the_real_slots() -> None:
    """The same two groups and three tenants give the same logits in a 3/6 layout and a wider 5/9 one."""
    rng = np.random.default_rng(4)
    obs = random_observation(rng, 2, 3)
    wide = SetLayout(max_groups=5, max_tenants=9)
    tensors = _random_tensors(LAYOUT, 16, 4)
    narrow_g, narrow_t = _split_logits(
        SetNetwork.from_tensors(tensors, LAYOUT, 2).logits(obs.to_vector(LAYOUT)), LAYOUT
    )
    wide_g, wide_t = _split_logits(SetNetwork.from_tensors(tensors, wide, 2).logits(obs.to_vector(wide)), wide)
    np.testing.assert_allclose(wide_g[:2], narrow_g[:2], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(wide_t[:3], narrow_t[:3], rtol=1e-5, atol=1e-5)


def test_bad_tensors_are_refused_naming_them() -> None:
    tensors = _random_tensors(LAYOUT, 16, 0)
    del tensors["group_head.bias"]
    with pytest.raises(ValueError, match=r"^group_head.bias: missing tensor$"):
        SetNetwork.from_tensors(tensors, LAYOUT, 2)
    tensors = _random_tensors(LAYOUT, 16, 0)
    tensors["tenant_head.weight"] = tensors["tenant_head.weight"][:5]
    tensors["tenant_head.bias"] = tensors["tenant_head.bias"][:5]
    with pytest.raises(ValueError, match=r"tenant_head\.weight: 5 outputs, expected 22"):
        SetNetwork.from_tensors(tensors, LAYOUT, 2)


# ------------------------------------------------------------------------------------------- artifacts


def write_set_artifact(root: Path, **manifest_overrides: object) -> None:
    root.mkdir(parents=True, exist_ok=True)
    save_file(_random_tensors(LAYOUT, 16, 7), str(root / WEIGHTS_NAME))
    manifest = {
        "format": "pdctl-set-policy",
        "schema_version": SCHEMA_VERSION,
        "feature_hash": set_feature_hash(),
        "codec_hash": CODEC.codec_hash(),
        "num_encoder_layers": 2,
        "hidden_width": 16,
    }
    manifest.update(manifest_overrides)
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))


def test_set_artifact_decides_on_any_layout_up_to_the_maximum(tmp_path: Path) -> None:
    write_set_artifact(tmp_path)
    policy = load_learned(tmp_path)
    assert isinstance(policy, SetPolicy)
    for num_groups, gpus in ((1, (12,)), (3, (4, 16, 32))):
        groups = tuple(_group(f"g{i}", b, 2, (f"t{i}",)) for i, b in enumerate(gpus))
        tenants = tuple(Tenant(f"t{i}", f"g{i}", Slo(ttft_p95_s=1.0)) for i in range(num_groups))
        pools = {g.name: PoolTargets(g.max_instances // 2, g.max_instances - g.max_instances // 2) for g in groups}
        window = _window(
            {g.name: _group_window(pools[g.name].num_prefill, pools[g.name].num_decode) for g in groups},
            {t.name: _tenant_window(3.0) for t in tenants},
        )
        context = PolicyContext(tenants, groups, pools, {t.name: RoutingThresholds() for t in tenants})
        action = policy.decide(build_observation(window, context.observation_context()), context)
        assert set(action.pools) == {g.name for g in groups}
        for g in groups:  # one move at most, inside the budget
            assert abs(action.pools[g.name].num_prefill - pools[g.name].num_prefill) <= 1
            assert action.pools[g.name].num_instances <= g.max_instances
        assert set(action.thresholds) == {t.name for t in tenants}
    seven = tuple(Tenant(f"t{i}", "g0", Slo(ttft_p95_s=1.0)) for i in range(7))
    group = _group("g0", 8, 2, tuple(t.name for t in seven))
    context = PolicyContext(seven, (group,), {"g0": PoolTargets(2, 2)}, {})
    with pytest.raises(ValueError, match="1 groups / 7 tenants exceed"):
        policy.decide(build_observation(_window({}, {}), context.observation_context()), context)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"codec_hash": "0" * 16}, "codec_hash: artifact has"),
        ({"feature_hash": "0" * 16}, "feature_hash: artifact has"),
        ({"hidden_width": 8}, "hidden_width: 8, the weights have 16"),
        ({"num_encoder_layers": 3}, r"tenant_encoder.2.weight: missing tensor"),
        ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
    ],
)
def test_bad_set_artifacts_are_refused_in_one_line(tmp_path: Path, override: dict[str, object], message: str) -> None:
    write_set_artifact(tmp_path, **override)
    with pytest.raises(PolicyLoadError, match=message) as info:
        load_learned(tmp_path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "name", ["generalist-targets-policy", "generalist-wide-policy", "generalist-expert-policy", "generalist-policy"]
)
def test_shipped_slot_artifacts_still_load_as_before(name: str) -> None:
    policy = load_learned(LEARNED / name)
    assert isinstance(policy, LearnedPolicy)
    reference = LearnedPolicy.load(LEARNED / name)
    x = np.random.default_rng(0).uniform(0, 1, reference.manifest.layout.size).astype(np.float32)
    assert policy.act(x).tolist() == reference.act(x).tolist()


def test_the_policy_spec_grammar_loads_set_artifacts_for_every_command(tmp_path: Path) -> None:
    """``learned:DIR``, ``watchdog:learned:DIR`` and a registry download all reach the set runtime, with no slots."""
    from policies.policy_file import PolicyFile, resolve_policy
    from policies.registry import PolicySpecError, fixed_layout, load_policy

    write_set_artifact(tmp_path / "set")
    base = resolve_policy(PolicyFile())
    for spec in (f"learned:{tmp_path / 'set'}", f"watchdog:learned:{tmp_path / 'set'}", "registry:models:/x@champion"):
        policy = load_policy(spec, base, resolver=lambda _uri: tmp_path / "set")
        assert fixed_layout(policy) is None  # any layout up to the maximum: the env grows to fit
        inner = getattr(policy, "primary", policy)
        assert isinstance(getattr(inner, "inner", None), SetPolicy)
    write_set_artifact(tmp_path / "bad", codec_hash="0" * 16)
    with pytest.raises(PolicySpecError, match=r"codec_hash: artifact has '0000000000000000'"):
        load_policy(f"learned:{tmp_path / 'bad'}", base)


def test_a_live_policy_files_implicit_default_tenant_is_left_as_it_is() -> None:
    """A resolved policy file adds the ``default`` tenant in a group ``default`` no file declares; the shipped set
    policy decides for the declared tenants and leaves ``default``'s thresholds alone (it used to raise every tick,
    so on a live controller ``learned:default`` never acted and its watchdog's fallback decided instead)."""
    from pdctl.demo.config import DEFAULT_POLICY_FILE
    from policies.policy_file import load_policy_file, resolve_policy

    base = resolve_policy(load_policy_file(DEFAULT_POLICY_FILE), str(DEFAULT_POLICY_FILE))
    tenants = tuple(tp.tenant for tp in base.tenants.values())
    groups = tuple(base.groups.values())
    assert "default" in {t.name for t in tenants}
    assert "default" not in {g.name for g in groups}
    pools = {"interactive": PoolTargets(2, 6)}
    thresholds = {name: tp.thresholds for name, tp in base.tenants.items()}
    context = PolicyContext(tenants, groups, pools, thresholds, base_thresholds=thresholds)
    window = _window(
        {"interactive": _group_window(2, 6)}, {t.name: _tenant_window(2.0) for t in tenants if t.name != "default"}
    )
    policy = load_learned(LEARNED / "generalist-family-warm-policy")
    assert isinstance(policy, SetPolicy)
    action = policy.decide(build_observation(window, context.observation_context()), context)
    assert set(action.thresholds) == {"chatbot", "rag"}
    assert set(action.pools) <= {"interactive"}


def test_the_load_time_layout_check_counts_only_the_tenants_a_set_policy_decides_for() -> None:
    """Six declared tenants plus the implicit ``default`` one fit the six-tenant layout: default is never decided."""
    from policies.registry import layout_problem

    policy = load_learned(LEARNED / "generalist-family-warm-policy")
    declared = [f"t{i}" for i in range(6)]
    assert layout_problem(policy, [*declared, "default"], ["g0"], declared) is None
    refused = layout_problem(policy, [*declared, "default"], ["g0"], [*declared, "t6"])
    assert refused is not None
    assert refused.endswith("the policy file has 1 / 7")
