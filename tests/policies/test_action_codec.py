from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import ObservationLayout, PoolTargets, RoutingThresholds, Tenant, TenantGroup
from policies.action_codec import MIN_REMOTE_LEVELS_TOKENS, ActionCodec

LAYOUT = ObservationLayout(max_groups=2, max_tenants=3)
CODEC = ActionCodec(LAYOUT)
TENANTS = (Tenant("chat", "g"), Tenant("rag", "g"))


def test_space_and_mask_shapes() -> None:
    space = CODEC.action_space()
    groups = (TenantGroup("g", ("chat", "rag"), gpu_budget=8),)
    mask = CODEC.masks(groups, {"g": PoolTargets(4, 4)}, num_tenants=2)
    assert mask.shape == (int(space.nvec.sum()),)
    noop = CODEC.noop(TENANTS, {})
    assert space.contains(noop)


def test_noop_keeps_pools_and_thresholds() -> None:
    groups = (TenantGroup("g", ("chat", "rag"), gpu_budget=8),)
    base = {"chat": RoutingThresholds(), "rag": RoutingThresholds(min_remote_input_tokens=4096)}
    action = CODEC.decode(CODEC.noop(TENANTS, base), TENANTS, groups, {"g": PoolTargets(3, 5)}, base)
    assert action.pools["g"] == PoolTargets(3, 5)
    assert action.thresholds["rag"].min_remote_input_tokens == 4096
    assert action.thresholds["chat"] == base["chat"]


def test_out_of_space_action_is_refused() -> None:
    with pytest.raises(ValueError, match="outside the action space"):
        CODEC.decode(np.full(len(CODEC.nvec), 99), TENANTS, (), {}, {})


@settings(max_examples=300, deadline=None)
@given(
    budget=st.integers(2, 16),
    min_prefill=st.integers(0, 2),
    min_decode=st.integers(1, 2),
    prefill=st.integers(0, 16),
    decode=st.integers(1, 16),
    data=st.data(),
)
def test_unmasked_pool_actions_stay_within_bounds_and_budget(
    budget: int, min_prefill: int, min_decode: int, prefill: int, decode: int, data: st.DataObject
) -> None:
    if min_prefill + min_decode > budget:
        return
    prefill = min(max(prefill, min_prefill), budget - min_decode)
    decode = min(max(decode, min_decode), budget - prefill)
    group = TenantGroup("g", ("chat",), gpu_budget=budget, min_prefill=min_prefill, min_decode=min_decode)
    current = {"g": PoolTargets(prefill, decode)}
    mask = CODEC.masks((group,), current, num_tenants=1)
    allowed_prefill = [i for i in range(3) if mask[i]]
    allowed_decode = [i for i in range(3) if mask[3 + i]]
    a = CODEC.noop((Tenant("chat", "g"),), {})
    a[0] = data.draw(st.sampled_from(allowed_prefill))
    a[1] = data.draw(st.sampled_from(allowed_decode))
    target = CODEC.decode(a, (Tenant("chat", "g"),), (group,), current, {}).pools["g"]
    assert target.num_prefill >= min_prefill
    assert target.num_decode >= min_decode
    assert target.num_instances <= budget


def test_threshold_levels_decode_with_a_consistent_gap() -> None:
    a = CODEC.noop(TENANTS, {})
    offset = 2 * LAYOUT.max_groups
    a[offset] = 0  # 256 tokens
    t = CODEC.decode(a, TENANTS, (), {}, {}).thresholds["chat"]
    assert t.min_remote_input_tokens == MIN_REMOTE_LEVELS_TOKENS[0]
    assert t.max_local_input_tokens <= t.min_remote_input_tokens


def test_codec_hash_changes_with_layout() -> None:
    assert CODEC.codec_hash() != ActionCodec(ObservationLayout(2, 4)).codec_hash()


def test_never_level_routes_everything_locally() -> None:
    from policies import LiveState, RequestFeatures, decide_route

    a = CODEC.noop(TENANTS, {})
    a[2 * LAYOUT.max_groups] = len(MIN_REMOTE_LEVELS_TOKENS) - 1
    t = CODEC.decode(a, TENANTS, (), {}, {}).thresholds["chat"]
    busy = LiveState(prefill_queue_wait_s=0.0, decode_pressure_frac=1.0)
    for tokens in (100, 5000, 500_000):
        assert not decide_route(RequestFeatures("r", "chat", tokens, 1000), t, busy).is_remote


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_encode_inverts_decode(data: st.DataObject) -> None:
    groups = (TenantGroup("g", ("chat", "rag"), gpu_budget=16),)
    current = {"g": PoolTargets(4, 4)}
    a = np.array([data.draw(st.integers(0, int(n) - 1)) for n in CODEC.nvec])
    a[2:4] = 1  # unused group slot: no change
    offset = 2 * LAYOUT.max_groups
    a[offset + 2 * (len(CODEC.nvec) - offset) // LAYOUT.max_tenants :] = 0  # unused tenant slot
    action = CODEC.decode(a, TENANTS, groups, current, {})
    again = CODEC.encode(action, TENANTS, groups, current, action.thresholds)
    assert again.tolist() == a.tolist()


TARGETS = ActionCodec(ObservationLayout(max_groups=2, max_tenants=3, pool_actions="target"))


def test_target_encoding_has_its_own_hash_and_delta_hashes_are_unchanged() -> None:
    assert TARGETS.version == 4
    assert CODEC.version == 3
    assert TARGETS.codec_hash() != CODEC.codec_hash()
    # artifacts trained before pool targets existed keep loading: the delta hash is what it always was
    assert ActionCodec(ObservationLayout(2, 4)).codec_hash() == "601dc8c629a95449"


def test_unknown_pool_encoding_is_refused() -> None:
    with pytest.raises(ValueError, match="pool_actions"):
        ObservationLayout(2, 4, pool_actions="absolute")  # type: ignore[arg-type]


def test_target_noop_holds_the_current_counts() -> None:
    groups = (TenantGroup("g", ("chat", "rag"), gpu_budget=8),)
    current = {"g": PoolTargets(3, 5)}
    noop = TARGETS.noop(TENANTS, {}, groups, current)
    assert noop[:4].tolist() == [3, 5, 0, 0]
    assert not TARGETS.moves_pools(noop, groups, current)
    assert TARGETS.decode(noop, TENANTS, groups, current, {}).pools["g"] == PoolTargets(3, 5)


def test_a_target_moves_one_instance_per_pool_per_interval_and_then_holds() -> None:
    groups = (TenantGroup("g", ("chat", "rag"), gpu_budget=8),)
    pools = PoolTargets(3, 1)
    a = TARGETS.noop(TENANTS, {}, groups, {"g": pools})
    a[0], a[1] = 1, 3  # 3P1D -> 1P3D at a full budget: shift one instance per interval
    seen = []
    for _ in range(3):
        assert TARGETS.masks(groups, {"g": pools}, 2)[a[0]]
        pools = TARGETS.decode(a, TENANTS, groups, {"g": pools}, {}).pools["g"]
        seen.append((pools.num_prefill, pools.num_decode))
    assert seen == [(2, 2), (1, 3), (1, 3)]
    assert not TARGETS.moves_pools(a, groups, {"g": pools})


def test_target_masks_follow_pool_bounds_and_the_budget() -> None:
    group = TenantGroup("g", ("chat",), gpu_budget=8, min_prefill=1, min_decode=1, max_prefill=3)
    size = int(TARGETS.nvec[0])
    mask = TARGETS.masks((group,), {"g": PoolTargets(1, 7)}, num_tenants=1)
    prefill, decode = mask[:size], mask[size : 2 * size]
    # full budget: prefill may grow to its max of 3 (decode can give instances up); decode may shrink to its min
    # but cannot grow (prefill is at its min, nothing to shift from)
    assert np.flatnonzero(prefill).tolist() == [1, 2, 3]
    assert np.flatnonzero(decode).tolist() == [1, 2, 3, 4, 5, 6, 7]
    unused = mask[2 * size : 4 * size]
    assert np.flatnonzero(unused).tolist() == [0, size]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_target_encode_inverts_decode_for_reachable_targets(data: st.DataObject) -> None:
    groups = (TenantGroup("g", ("chat", "rag"), gpu_budget=16),)
    current = {"g": PoolTargets(4, 4)}
    a = TARGETS.noop(TENANTS, {}, groups, current)
    a[0] = data.draw(st.integers(3, 5))  # one step either way (or none): the decoded targets reach it
    a[1] = data.draw(st.integers(3, 5))
    action = TARGETS.decode(a, TENANTS, groups, current, {})
    again = TARGETS.encode(action, TENANTS, groups, current, action.thresholds)
    assert again.tolist() == a.tolist()
