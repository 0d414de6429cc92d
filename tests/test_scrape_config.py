"""The shipped Prometheus scrape configuration (deploy/prometheus/prometheus.yml) and its rendering.

Debian's ``promtool check config`` accepts the file as shipped and as the demo renders it; the demo and the test
harness take every setting but the targets from it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pdctl.demo.config import prometheus_config
from pdctl.scrape_config import (
    CONTROLLER_JOB,
    ROUTER_JOB,
    SHIPPED_SCRAPE_CONFIG,
    VLLM_JOB,
    render_scrape_config,
)

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool is not on the PATH (Debian package prometheus)"
)


def promtool_check(path: Path) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool is not None
    return subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


@needs_promtool
def test_promtool_accepts_the_shipped_config() -> None:
    done = promtool_check(SHIPPED_SCRAPE_CONFIG)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 rule files found" in done.stdout  # the shipped alert rules load with it


@needs_promtool
def test_promtool_accepts_the_demo_rendering_written_elsewhere(tmp_path: Path) -> None:
    config = prometheus_config(
        "http://127.0.0.1:4000", {"p0": "http://127.0.0.1:4001/", "d0": "http://127.0.0.1:4002"}, "g"
    )
    path = tmp_path / "elsewhere" / "prometheus.yml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(config))
    done = promtool_check(path)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_promtool_refuses_a_broken_config(tmp_path: Path) -> None:
    path = tmp_path / "broken.yml"
    path.write_text("scrape_configs:\n  - job_name: x\n    scrape_interval: fast\n")
    assert promtool_check(path).returncode != 0


def test_the_shipped_config_scrapes_the_documented_stack() -> None:
    shipped = yaml.safe_load(SHIPPED_SCRAPE_CONFIG.read_text(encoding="utf-8"))
    jobs = {job["job_name"]: job["static_configs"] for job in shipped["scrape_configs"]}
    assert jobs[ROUTER_JOB] == [{"targets": ["127.0.0.1:8000"]}]  # docs/real-vllm.md: the router listens on 8000
    assert jobs[CONTROLLER_JOB] == [{"targets": ["127.0.0.1:9464"]}]  # controller/examples/controller.yaml
    instances = {c["labels"]["instance_id"]: c["targets"] for c in jobs[VLLM_JOB]}
    assert instances == {"p0": ["127.0.0.1:8100"], "d0": ["127.0.0.1:8101"], "d1": ["127.0.0.1:8102"]}
    assert all(c["labels"]["group"] for c in jobs[VLLM_JOB])


def test_rendering_replaces_only_the_targets_and_the_interval() -> None:
    shipped = yaml.safe_load(SHIPPED_SCRAPE_CONFIG.read_text(encoding="utf-8"))
    rendered = render_scrape_config(
        "http://127.0.0.1:5000", {"a": ("http://127.0.0.1:5001", "g1"), "b": ("http://10.0.0.2:8000/", "g2")}, 0.5
    )
    assert rendered["global"] == {"scrape_interval": "500ms", "evaluation_interval": "500ms"}
    assert [Path(f) for f in rendered["rule_files"]] == [
        (SHIPPED_SCRAPE_CONFIG.parent / f).resolve() for f in shipped["rule_files"]
    ]
    jobs = {job["job_name"]: job for job in rendered["scrape_configs"]}
    assert set(jobs) == {ROUTER_JOB, VLLM_JOB}  # no controller URL: no controller job
    assert jobs[ROUTER_JOB]["static_configs"] == [{"targets": ["127.0.0.1:5000"]}]
    assert jobs[VLLM_JOB]["static_configs"] == [
        {"targets": ["127.0.0.1:5001"], "labels": {"instance_id": "a", "group": "g1"}},
        {"targets": ["10.0.0.2:8000"], "labels": {"instance_id": "b", "group": "g2"}},
    ]
    with_controller = render_scrape_config(None, {}, controller_url="http://127.0.0.1:9464")
    assert [job["job_name"] for job in with_controller["scrape_configs"]] == [CONTROLLER_JOB]
    assert with_controller["global"] == shipped["global"]


def test_a_file_without_a_required_job_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump({"scrape_configs": [{"job_name": ROUTER_JOB}, {"job_name": VLLM_JOB}]}))
    with pytest.raises(ValueError, match=f"{path}: scrape_configs has no job 'pdctl-controller'"):
        render_scrape_config("http://127.0.0.1:1", {}, shipped=path)
