"""The shipped controller example runs off-cluster as written: a real controller process, started with
``controller/examples/controller.yaml``, ticks against a real router and emulated instances on 127.0.0.1.

The live stack listens on free ports, so the documented addresses in the file (router 8000, instances
8100-8102, controller 9464) are replaced by the live ones and its ``runs/`` paths by a temporary folder; nothing
else is changed. The Kubernetes example cannot run here; ``tests/controller/test_config_daemon.py`` loads it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.controller.harness import free_port
from tests.router.cluster import ADMIN_TOKEN, live_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "controller" / "examples"
DOCUMENTED = {"router": "127.0.0.1:8000", "p0": "127.0.0.1:8100", "d0": "127.0.0.1:8101", "d1": "127.0.0.1:8102"}


def _hostport(url: str) -> str:
    return url.split("//", 1)[1].rstrip("/")


async def _ticks_ok(session: aiohttp.ClientSession, url: str) -> float:
    try:
        async with session.get(url + "/metrics") as resp:
            text = await resp.text()
    except aiohttp.ClientError:
        return 0.0
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "pdctl_controller_ticks_total" and s.labels.get("result") == "ok"
    )


async def test_the_shipped_example_ticks_against_a_live_router(tmp_path: Path) -> None:
    text = (EXAMPLES / "controller.yaml").read_text(encoding="utf-8")
    document = yaml.safe_load(text)
    assert [a["kind"] for a in document["actuators"]] == ["router"]
    assert document["actuators"][0]["url"] == f"http://{DOCUMENTED['router']}"
    for address in DOCUMENTED.values():
        assert address in text, f"the example does not use the documented address {address}"
    async with live_cluster(tmp_path, num_prefill=1, num_decode=2) as c:
        port = free_port()
        live = {"router": _hostport(c.url), **{iid: _hostport(u) for iid, u in c.host.urls.items()}}
        for name, address in DOCUMENTED.items():
            text = text.replace(address, live[name])
        text = text.replace("port: 9464", f"port: {port}")
        text = text.replace("../../runs/", f"{tmp_path}/runs/").replace("../../", f"{REPO_ROOT}/")
        config_path = tmp_path / "controller.yaml"
        config_path.write_text(text, encoding="utf-8")
        log_path = tmp_path / "controller.log"
        env = {**os.environ, "PDCTL_ADMIN_TOKEN": ADMIN_TOKEN}
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "controller", "--config", str(config_path),
                stdout=log, stderr=asyncio.subprocess.STDOUT, cwd=str(REPO_ROOT), env=env,
            )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            async with asyncio.timeout(30):
                while await _ticks_ok(c.session, url) < 1:
                    assert proc.returncode is None, log_path.read_text(errors="replace")[-3000:]
                    await asyncio.sleep(0.2)
            async with c.session.get(url + "/healthz") as resp:
                assert resp.status == 200
        finally:
            if proc.returncode is None:
                proc.terminate()
            await proc.wait()
    audit = [json.loads(line) for line in (tmp_path / "runs" / "controller" / "audit.jsonl").read_text().splitlines()]
    assert audit, "the tick left no audit record"
    assert proc.returncode == 0, log_path.read_text(errors="replace")[-3000:]
