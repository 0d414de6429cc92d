"""The Prometheus scrape configuration: one shipped file, rendered with concrete targets where they are known.

``deploy/prometheus/prometheus.yml`` is the configuration a person runs as written (the documented one-host
stack). ``pdctl demo`` and the integration tests start their parts on free ports, so they render that same file
with their own targets and interval (:func:`render_scrape_config`): every other setting (job names, the
``instance_id``/``group`` target labels, the alert rules) comes from the shipped file, never from a second copy.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = ["CONTROLLER_JOB", "ROUTER_JOB", "SHIPPED_SCRAPE_CONFIG", "VLLM_JOB", "render_scrape_config"]

SHIPPED_SCRAPE_CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "prometheus.yml"
"""The shipped scrape configuration (in a source checkout)."""

ROUTER_JOB = "pdctl-router"
CONTROLLER_JOB = "pdctl-controller"
VLLM_JOB = "vllm"


def _target(url: str) -> str:
    """``host:port`` of a base URL (``http://host:port/`` → ``host:port``)."""
    return url.split("//", 1)[-1].rstrip("/")


def render_scrape_config(
    router_url: str | None,
    instances: Mapping[str, tuple[str, str]],
    scrape_interval_s: float | None = None,
    controller_url: str | None = None,
    shipped: Path = SHIPPED_SCRAPE_CONFIG,
) -> dict[str, Any]:
    """The shipped configuration with these targets.

    Args:
        router_url: the router's base URL (``None``: no router job).
        instances: instance id → (base URL, tenant group); each becomes a ``vllm`` target with the
            ``instance_id`` and ``group`` labels.
        scrape_interval_s: scrape and rule-evaluation interval (``None``: the shipped one).
        controller_url: the controller's base URL (``None``: no controller job).
        shipped: the file to render (default the shipped one).

    Returns:
        A mapping ready for ``yaml.safe_dump``; rule files are absolute paths, so it can be written anywhere.

    Raises:
        ValueError: the file lacks one of the jobs it must define (named in the message).
    """
    document = yaml.safe_load(shipped.read_text(encoding="utf-8"))
    config: dict[str, Any] = copy.deepcopy(document)
    if scrape_interval_s is not None:
        interval = f"{round(scrape_interval_s * 1000)}ms"
        config.setdefault("global", {}).update({"scrape_interval": interval, "evaluation_interval": interval})
    config["rule_files"] = [str((shipped.parent / f).resolve()) for f in config.get("rule_files", [])]
    jobs = {job.get("job_name"): job for job in config.get("scrape_configs", [])}
    for name in (ROUTER_JOB, CONTROLLER_JOB, VLLM_JOB):
        if name not in jobs:
            raise ValueError(f"{shipped}: scrape_configs has no job {name!r}")
    wanted = {ROUTER_JOB: router_url, CONTROLLER_JOB: controller_url}
    for name, url in wanted.items():
        jobs[name]["static_configs"] = [{"targets": [_target(url)]}] if url else []
    jobs[VLLM_JOB]["static_configs"] = [
        {"targets": [_target(url)], "labels": {"instance_id": iid, "group": group}}
        for iid, (url, group) in instances.items()
    ]
    config["scrape_configs"] = [job for job in jobs.values() if job["static_configs"]]
    return config
