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
