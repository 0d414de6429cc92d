"""The README's quickstart smoke test does what it says: run as written (ports aside), the short answer stays
local with reason ``short_output`` and the long one takes the remote path, and the response headers say so.

The router configuration and the two requests are read from the README itself, so the recipe cannot drift
from what is tested.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from env.scenario import ClusterConfig
from livestack.emulator import EmulatorHost, InstanceSpec
from router.app import Router
from router.config import RouterConfig
from router.flow import ROUTE_HEADER, ROUTE_REASON_HEADER

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

REPO = Path(__file__).resolve().parents[2]
_REQUEST = re.compile(
    r"-H 'X-Tenant-Id: (?P<tenant>[\w-]+)' -d .*?print\(\"(?P<text>[^\"]+)\" \* (?P<times>\d+)\).*?"
    r"\\\"max_tokens\\\": (?P<max_tokens>\d+)\}\"\n"
    r"#\s+X-Pdctl-Route: (?P<route>\w+)\s+X-Pdctl-Route-Reason: (?P<reason>\w+)"
)


def quickstart() -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The README quickstart's router configuration and its requests with the documented outcome."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    config_text = section.split("cat > runs/router.yaml <<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    requests = [m.groupdict() for m in _REQUEST.finditer(section)]
    return yaml.safe_load(config_text), requests


def test_the_readme_recipe_is_found() -> None:
    config, requests = quickstart()
    assert [i["id"] for i in config["instances"]] == ["p0", "d0", "d1"]
    assert [(r["route"], r["reason"]) for r in requests] == [
        ("local_prefill", "short_output"),
        ("remote_prefill", "long_prompt"),
    ]


async def test_the_readme_smoke_test_takes_the_remote_path_and_says_why_not_for_short_output(tmp_path: Path) -> None:
    config, requests = quickstart()
    specs = [InstanceSpec(i["id"]) for i in config["instances"]]
    host = EmulatorHost(ClusterConfig(), specs)
    await host.start()
    config["listen"]["port"] = 0
    for inst in config["instances"]:
        inst["url"] = host.urls[inst["id"]]
    config["policy_file"] = (REPO / "runs" / config["policy_file"]).resolve()  # relative to runs/router.yaml
    config["request_log"] = tmp_path / config["request_log"]
    router = Router(RouterConfig.model_validate({**config, "admin_token": "dev"}))
    await router.start()
    seen = []
    try:
        async with aiohttp.ClientSession() as session:
            for r in requests:
                body = {"prompt": r["text"] * int(r["times"]), "max_tokens": int(r["max_tokens"])}
                async with session.post(
                    router.url + "/v1/completions", json=body, headers={"X-Tenant-Id": r["tenant"]}
                ) as resp:
                    assert resp.status == 200
                    await resp.read()
                    seen.append((resp.headers[ROUTE_HEADER], resp.headers[ROUTE_REASON_HEADER]))
        assert router.log is not None
        logged = [(rec["route"], rec["reason"], rec["expected_output_tokens"]) for rec in router.log.records()]
        pulls = sum(b.get() for inst in host.instances[1:] for b in inst.metrics.nixl_xfer_time._buckets)
    finally:
        await router.stop()
        await host.stop()
    assert seen == [(r["route"], r["reason"]) for r in requests]
    assert logged == [(r["route"], r["reason"], int(r["max_tokens"])) for r in requests]
    assert pulls == 1  # the long answer's KV went from p0 to a decode instance
