"""The shipped alert rules are valid Prometheus rules and fire on the seed's alarms (promtool)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "alerts"
SEED_ALARMS = {
    "PdctlKvTransferTimeouts",
    "PdctlPrefillQueueBacklog",
    "PdctlTpotJitter",
    "PdctlPrefixCacheHitRateDrop",
    "PdctlControllerStale",
}


@pytest.fixture
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not on the PATH (Debian package `prometheus`)")
    return path


def test_rules_cover_the_seed_alarms() -> None:
    rules = yaml.safe_load((ALERTS / "pdctl.rules.yml").read_text())
    names = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    assert names >= SEED_ALARMS
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("page", "warn")
            assert rule["annotations"]["summary"]


def test_promtool_check_rules(promtool: str) -> None:
    result = subprocess.run(
        [promtool, "check", "rules", str(ALERTS / "pdctl.rules.yml")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 12 rules found" in result.stdout + result.stderr


def test_promtool_rule_unit_tests(promtool: str) -> None:
    result = subprocess.run(
        [promtool, "test", "rules", "pdctl.rules.test.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ALERTS,
    )
    assert result.returncode == 0, result.stdout + result.stderr
