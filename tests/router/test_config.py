from __future__ import annotations

from pathlib import Path

import pytest

from router.config import RouterConfigError, load_router_config

GOOD = """
policy_file: policy.yaml
request_log: logs/r.jsonl
instances:
  - {id: p0, url: "http://127.0.0.1:1", role: prefill}
  - {id: d0, url: "http://127.0.0.1:2", role: decode}
"""


def test_paths_are_relative_to_the_file_and_token_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(GOOD)
    config = load_router_config(path)
    assert config.policy_file == tmp_path / "policy.yaml"
    assert config.request_log == tmp_path / "logs/r.jsonl"
    assert config.listen.host == "127.0.0.1"
    monkeypatch.delenv("PDCTL_ADMIN_TOKEN", raising=False)
    assert config.resolved_admin_token() is None
    monkeypatch.setenv("PDCTL_ADMIN_TOKEN", "secret")
    assert config.resolved_admin_token() == "secret"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("instances: []", "at least one instance must have role decode"),
        (GOOD.replace("role: decode", "role: both"), "instances.1.role"),
        (GOOD.replace('"http://127.0.0.1:2"', "127.0.0.1:2"), "instances.1.url"),
        (GOOD + "colour: red\n", "colour"),
        (GOOD.replace("p0", "d0"), "duplicate instance ids"),
        ("- a list", "expected a mapping"),
        (GOOD + "admission: {ttft_slack_frac: 0}\n", "admission.ttft_slack_frac"),
        (GOOD + "admission: {retry_after_s: .nan}\n", "admission.retry_after_s"),
    ],
)
def test_invalid_files_name_the_field(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(text)
    with pytest.raises(RouterConfigError, match=r"router\.yaml") as info:
        load_router_config(path)
    assert fragment in str(info.value)


def test_pdctl_router_refuses_an_invalid_config(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from pdctl.commands.router import register

    app = typer.Typer()
    register(app, "router", "Run the router.")
    path = tmp_path / "router.yaml"
    path.write_text(GOOD.replace("role: decode", "role: both"))
    result = CliRunner().invoke(app, ["--config", str(path)])
    assert result.exit_code == 2
    assert "instances.1.role" in result.output


async def test_serve_runs_until_stopped(tmp_path: Path) -> None:
    import asyncio

    from router.config import RouterConfig
    from router.server import serve

    config = RouterConfig.model_validate(
        {"listen": {"port": 0}, "instances": [{"id": "d0", "url": "http://127.0.0.1:9", "role": "decode"}]}
    )
    stop = asyncio.Event()
    task = asyncio.create_task(serve(config, stop))
    await asyncio.sleep(0.3)
    assert not task.done()
    stop.set()
    await asyncio.wait_for(task, 5)
    assert task.exception() is None
