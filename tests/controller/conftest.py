"""Fixtures of the controller tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import mlflow_server_running


@pytest.fixture(scope="package")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow server for this package's tests, stopped when the package's last test is done."""
    with mlflow_server_running(tmp_path_factory.mktemp("mlflow")) as url:
        yield url
