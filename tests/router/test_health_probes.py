"""Health probes: one slow answer from a busy instance is not a dead instance, a run of them is.

Found at chaos scale (issue 21): with the router, the instances and the load generator on one busy host, a single
probe that missed its timeout took every decode instance out at once and requests failed with 503. Real router and
emulated instances on 127.0.0.1; the emulator's ``health_delay_s`` fault makes every probe slower than its timeout.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from livestack.emulator import FaultConfig
from livestack.emulator.tokenizer import prompt_text
from tests.router.cluster import LiveCluster, live_cluster, stream_request

pytestmark = pytest.mark.timeout(60)

SLOW_HEALTH = FaultConfig(health_delay_s=0.35)  # slower than the probes' 0.25-s timeout


def _health(timeouts: int | None = None) -> dict[str, Any]:
    limit = {} if timeouts is None else {"unhealthy_after_timeouts": timeouts}
    return {"health": {"interval_s": 0.1, "timeout_s": 0.25, **limit}}


async def _healthy(c: LiveCluster) -> dict[str, bool]:
    async with c.session.get(c.url + "/admin/state", headers=c.admin_headers()) as r:
        return {i["id"]: i["healthy"] for i in (await r.json())["instances"]}


async def _until_all_down(c: LiveCluster, deadline_s: float) -> float:
    """Seconds until every instance reads unhealthy (fails the test past ``deadline_s``)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while any((await _healthy(c)).values()):
        assert loop.time() - start < deadline_s, "the instances were never marked down"
        await asyncio.sleep(0.05)
    return loop.time() - start


# A probe cycle takes at least 0.35 s (0.25 s timeout + 0.1 s interval): by 0.5 s at most two probes have timed
# out, by 0.3 s at most one. A busy host only makes cycles longer, so these checks cannot pass by luck of timing.


async def test_probes_that_time_out_mark_an_instance_down_only_after_a_run_of_them(tmp_path: Path) -> None:
    async with live_cluster(tmp_path, 1, 2, faults=SLOW_HEALTH, router_overrides=_health(4)) as c:
        await asyncio.sleep(0.5)
        assert await _healthy(c) == {"p0": True, "d0": True, "d1": True}
        result = await stream_request(c.session, c.url, {"prompt": prompt_text(64), "max_tokens": 4, "stream": True})
        assert result.status == 200
        assert result.done
        await _until_all_down(c, deadline_s=10.0)  # four in a row: down


async def test_one_timed_out_probe_is_tolerated_by_default_and_a_refusal_is_not(tmp_path: Path) -> None:
    async with live_cluster(tmp_path, 1, 1, faults=SLOW_HEALTH, router_overrides=_health()) as c:  # default: 2
        await asyncio.sleep(0.3)
        assert await _healthy(c) == {"p0": True, "d0": True}
        await _until_all_down(c, deadline_s=10.0)
    async with live_cluster(tmp_path, 1, 1, router_overrides=_health(4)) as c:
        await asyncio.sleep(0.3)
        assert await _healthy(c) == {"p0": True, "d0": True}
        await c.host.stop()  # refused connections: down at the next probe, no run of four needed
        assert await _until_all_down(c, deadline_s=10.0) < 4 * 0.35
