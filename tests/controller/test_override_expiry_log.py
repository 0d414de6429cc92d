"""An override that expires is logged once by the controller (the tick's time decides), and again only after
its file changed; loading and removal stay logged as before."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from tests.controller.test_loop import FakeReader, make_loop, surge


def _expiry_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "pdctl.controller.overrides" and "expired" in r.getMessage()
    ]


async def test_an_expiring_override_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pdctl.controller.overrides")
    loop, clock, _ = make_loop(tmp_path, FakeReader(surge(ttft_rag_s=0.001)))
    await loop.tick()
    expires = clock.now() + timedelta(seconds=3)
    path = tmp_path / "overrides" / "o.yaml"
    override = {
        "expires_at": expires.isoformat(),
        "tenants": [{"name": "rag", "pd_disaggregation_policy": {"remote_prefill": {"min_input_tokens": 2500}}}],
    }
    path.write_text(yaml.safe_dump(override))
    await clock.advance(1.0)
    assert (await loop.tick()).record["overrides"]["active"] == ["o.yaml"]
    assert not _expiry_lines(caplog)
    await clock.advance(3.0)
    assert (await loop.tick()).record["overrides"]["active"] == []
    await loop.tick()
    lines = _expiry_lines(caplog)
    assert len(lines) == 1
    assert lines[0].startswith(f"override o.yaml expired at {expires}: tenants rag are back to the running policy")
    # a new version of the file (a later expiry) applies again, and its own expiry is logged in turn
    path.write_text(yaml.safe_dump({**override, "expires_at": (clock.now() + timedelta(seconds=2)).isoformat()}))
    assert (await loop.tick()).record["overrides"]["active"] == ["o.yaml"]
    await clock.advance(3.0)
    await loop.tick()
    assert len(_expiry_lines(caplog)) == 2
