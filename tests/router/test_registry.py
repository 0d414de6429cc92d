from __future__ import annotations

from router.config import InstanceConfig
from router.registry import InstanceRegistry


def registry() -> InstanceRegistry:
    return InstanceRegistry(
        [
            InstanceConfig(id="p0", url="http://h:1/", role="prefill"),
            InstanceConfig(id="d0", url="http://h:2", role="decode"),
            InstanceConfig(id="d1", url="http://h:3", role="decode"),
        ]
    )


def test_idle_instance_switches_at_once_busy_one_drains() -> None:
    reg = registry()
    d0, d1 = reg.instances["d0"], reg.instances["d1"]
    assert reg.instances["p0"].url == "http://h:1"
    reg.acquire(d1)
    reg.change_roles({"d1": "prefill"})
    assert (d1.role, d1.pending_role, d1.draining) == ("decode", "prefill", True)
    assert not d1.serves("decode")
    assert not d1.serves("prefill")
    assert [i.id for i in reg.serving("decode")] == ["d0"]
    reg.release(d1)
    assert (d1.role, d1.pending_role, d1.draining) == ("prefill", None, False)
    assert {i.id for i in reg.serving("prefill")} == {"p0", "d1"}
    reg.change_roles({"p0": "decode"})
    assert reg.instances["p0"].role == "decode"
    assert d0.in_flight == 0


def test_changing_back_cancels_a_pending_change() -> None:
    reg = registry()
    d1 = reg.instances["d1"]
    reg.acquire(d1)
    reg.change_roles({"d1": "prefill"})
    reg.change_roles({"d1": "decode"})
    assert (d1.role, d1.pending_role) == ("decode", None)
    assert d1.serves("decode")


def test_validate_roles() -> None:
    reg = registry()
    assert reg.validate_roles({"zz": "decode"}) == ("roles.zz", "unknown instance 'zz'")
    assert reg.validate_roles({"d0": "both"})[0] == "roles.d0"  # type: ignore[index]
    assert reg.validate_roles({"d0": "prefill", "d1": "prefill"}) == (
        "roles",
        "the change would leave no decode instance",
    )
    assert reg.validate_roles({"d0": "prefill"}) is None


def test_least_loaded_prefill_counts_tokens() -> None:
    reg = registry()
    reg.change_roles({"d1": "prefill"})
    p0, d1 = reg.instances["p0"], reg.instances["d1"]
    reg.acquire(p0, 5000)
    assert reg.least_loaded_prefill() is d1
    reg.acquire(d1, 9000)
    assert reg.least_loaded_prefill() is p0
    p0.healthy = False
    assert reg.least_loaded_prefill() is d1
