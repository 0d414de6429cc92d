"""The placement core: decode and prefill choice, expected output, prefix hit, live state, prefill rate."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from policies.placement import (
    PlacementConfig,
    PrefillRate,
    build_live_state,
    choose_decode,
    choose_prefill,
    expected_output_tokens,
    usable_prefix_hit_tokens,
)


@dataclass(frozen=True)
class View:
    """An instance as placement reads it (satisfies policies.placement.InstanceView)."""

    name: str
    load_requests: int = 0
    active_requests: int = 0
    queued_prefill_tokens: int = 0
    kv_usage_frac: float | None = None
    max_num_seqs: int = 100
    max_num_batched_tokens: int = 8192
    hit_tokens: int = 0


def _hit(view: View) -> int:
    return view.hit_tokens


def test_a_longer_prefix_hit_wins_only_within_the_slack() -> None:
    idle = View("idle", load_requests=2)
    warm = View("warm", load_requests=6, hit_tokens=1024)
    assert choose_decode([idle, warm], _hit, 4) == (warm, 1024)
    assert choose_decode([idle, warm], _hit, 3) == (idle, 0)  # 6 > 2 + 3: affinity gives way to load


def test_decode_ties_go_to_the_least_loaded_then_the_first() -> None:
    a, b, c = View("a", load_requests=3, hit_tokens=512), View("b", 1, hit_tokens=512), View("c", 1, hit_tokens=512)
    assert choose_decode([a, b, c], _hit, 4) == (b, 512)
    assert choose_decode([], _hit, 4) is None


def test_prefill_choice_is_the_fewest_queued_tokens_first_on_ties() -> None:
    a, b, c = View("a", queued_prefill_tokens=900), View("b", queued_prefill_tokens=100), View("c")
    assert choose_prefill([a, b]) is b
    assert choose_prefill([c, View("d")]) is c
    assert choose_prefill([]) is None


@pytest.mark.parametrize(
    ("max_tokens", "tenant", "expected"), [(40, 300, 40), (None, 300, 300), (None, None, 256), (0, 0, 256)]
)
def test_expected_output_is_max_tokens_then_the_tenant_then_the_default(
    max_tokens: int | None, tenant: int | None, expected: int
) -> None:
    assert expected_output_tokens(max_tokens, tenant, 256) == expected


def test_a_prefix_hit_saves_at_most_the_prompt_less_one_token() -> None:
    assert usable_prefix_hit_tokens(1024, 1024) == 1023
    assert usable_prefix_hit_tokens(512, 2000) == 512
    assert usable_prefix_hit_tokens(64, 0) == 0


def test_live_state_reads_the_chosen_instances() -> None:
    decode = View("d", load_requests=9, active_requests=5, kv_usage_frac=0.3)
    prefill = View("p", active_requests=2, queued_prefill_tokens=4000, max_num_batched_tokens=2048)
    live = build_live_state(decode, 512, prefill, PrefillRate(20000.0), 1, True)
    assert live.prefill_queue_wait_s == pytest.approx(0.2)
    assert live.decode_pressure_frac == pytest.approx(0.3)  # KV usage above 5 / 100 requests
    assert live.decode_kv_usage_frac == 0.3  # as observed, the arriving request not added
    assert (live.prefill_queue_requests, live.prefill_active_tokens, live.prefill_max_batched_tokens) == (2, 4000, 2048)
    assert (live.prefix_hit_tokens, live.num_prefill_instances, live.kv_transfer_healthy) == (512, 1, True)


def test_unknown_kv_usage_and_no_prefill_instance_stay_unknown() -> None:
    live = build_live_state(View("d", active_requests=250, max_num_seqs=200), 0, None, None, 0, False)
    assert live.decode_pressure_frac == 1.0  # capped
    assert live.decode_kv_usage_frac is None
    assert live.prefill_queue_wait_s is None
    assert live.prefill_queue_requests is None


def test_prefill_rate_follows_lone_legs_and_ignores_short_ones() -> None:
    rate = PlacementConfig(initial_prefill_tokens_per_s=10000.0, prefill_rate_weight_frac=0.5).new_prefill_rate()
    rate.observe(100, 0.001)  # below the minimum sample: ignored
    assert rate.tokens_per_s == 10000.0
    rate.observe(3000, 0.1)  # 30000 tokens/s
    assert rate.tokens_per_s == pytest.approx(20000.0)
    assert rate.wait_s(4000) == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("affinity_slack_requests", -1),
        ("default_output_tokens", 0),
        ("initial_prefill_tokens_per_s", 0.0),
        ("prefill_rate_weight_frac", 1.5),
    ],
)
def test_bad_placement_settings_are_refused_by_name(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        PlacementConfig(**{field: value})  # type: ignore[arg-type]
