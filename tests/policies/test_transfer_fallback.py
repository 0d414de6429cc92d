"""The control-interval judgment of a group's KV-transfer path (policies.transfer_fallback)."""

from __future__ import annotations

import pytest

from policies.base import PolicyContext
from policies.schema import (
    GroupWindow,
    MetricWindow,
    PoolTargets,
    RoutingThresholds,
    Slo,
    Tenant,
    TenantGroup,
    TenantWindow,
)
from policies.transfer_fallback import remote_legs, remote_path_unusable

GROUP = TenantGroup("g", ("tight", "loose"), gpu_budget=8)
TENANTS = (
    Tenant("tight", "g", Slo(ttft_p95_s=0.5)),
    Tenant("loose", "g", Slo(ttft_p95_s=2.0, ttft_p99_s=3.0)),  # its per-request bound is the tighter 2.0 s
)
CONTEXT = PolicyContext(
    tenants=TENANTS,
    groups=(GROUP,),
    current_pools={"g": PoolTargets(4, 4)},
    current_thresholds={t.name: RoutingThresholds() for t in TENANTS},
)


def _window(
    *, p95_s: float | None = None, failed: float | None = None, rate_rps: float | None = 1.0, remote: float = 0.5
) -> MetricWindow:
    tenants = {t.name: TenantWindow(request_rate_rps=rate_rps, remote_prefill_frac=remote) for t in TENANTS}
    group = GroupWindow(num_prefill=4, num_decode=4, kv_transfer_time_p95_s=p95_s, kv_transfer_failure_frac=failed)
    return MetricWindow(end_s=100.0, window_s=15.0, tenants=tenants, groups={"g": group})


def test_remote_legs_are_rate_times_remote_fraction_times_the_window() -> None:
    assert remote_legs(_window(), CONTEXT, "g") == pytest.approx(2 * 1.0 * 0.5 * 15.0)
    assert remote_legs(_window(rate_rps=None), CONTEXT, "g") is None


@pytest.mark.parametrize(
    ("p95_s", "failed", "unusable"),
    [
        (0.05, 0.0, False),  # healthy
        (1.0, 0.0, False),  # slower than the tight tenant's objective, not the loose one's: still usable for it
        (2.0, 0.0, True),  # reaches the loosest objective (the p95 bound, not the looser p99)
        (0.05, 0.49, False),
        (0.05, 0.5, True),  # the breaker's unhealthy fraction
        (None, None, False),  # no transfers measured: nothing to judge
    ],
)
def test_a_path_is_unusable_when_half_its_legs_fail_or_its_p95_reaches_the_loosest_objective(
    p95_s: float | None, failed: float | None, unusable: bool
) -> None:
    assert remote_path_unusable(_window(p95_s=p95_s, failed=failed), CONTEXT, "g") is unusable


def test_too_few_remote_legs_or_an_unknown_group_are_never_judged_unusable() -> None:
    few = _window(p95_s=9.0, failed=1.0, rate_rps=0.2)  # 2 x 0.2 x 0.5 x 15 = 3 legs < 8
    assert not remote_path_unusable(few, CONTEXT, "g")
    assert remote_path_unusable(few, CONTEXT, "g", min_samples=3)
    assert not remote_path_unusable(_window(p95_s=9.0, failed=1.0), CONTEXT, "other")
    assert not remote_path_unusable(_window(p95_s=9.0, failed=1.0, rate_rps=None), CONTEXT, "g")
