"""Registering or training against a tracking URI leaves the process's environment as it found it.

``mlflow.set_tracking_uri`` writes ``MLFLOW_TRACKING_URI`` into ``os.environ``; before ``fluent_tracking_uri`` the
test process kept the URI of a stopped test server, and demo subprocesses started later retried it for minutes.
"""

from __future__ import annotations

import os
from pathlib import Path

import mlflow
import pytest

from agents.registry import register_policy, training_run

pytestmark = pytest.mark.integration

SEED = Path(__file__).resolve().parents[2] / "policies" / "examples" / "seed_pd_policy.yaml"
ENV = "MLFLOW_TRACKING_URI"


def test_an_unset_tracking_uri_stays_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with training_run("scope-test", "run-1", uri) as (run_id, used):
        assert used == uri
        assert os.environ[ENV] == uri  # subprocesses of the run inherit it
        mlflow.log_metric("x", 1.0)
    assert ENV not in os.environ
    registered = register_policy(SEED, "scope-test", tracking_uri=uri)
    assert registered.version == 1
    assert ENV not in os.environ
    assert mlflow.MlflowClient(tracking_uri=uri).get_run(run_id).data.metrics["x"] == 1.0


def test_a_set_tracking_uri_is_put_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "http://127.0.0.1:9/elsewhere")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with training_run("scope-test", "run-1", uri):
        assert os.environ[ENV] == uri
    assert os.environ[ENV] == "http://127.0.0.1:9/elsewhere"
    register_policy(SEED, "scope-test", tracking_uri=uri)
    assert os.environ[ENV] == "http://127.0.0.1:9/elsewhere"
