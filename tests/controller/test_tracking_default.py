"""One MLflow default everywhere: without a tracking URI every part uses ``$PDCTL_DATA_DIR/mlflow/mlflow.db``
(``./data/mlflow/mlflow.db``), and a ``registry:`` policy never leaves MLflow's own ``./mlflow.db`` behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.registry import default_tracking_uri
from controller.policy_registry import resolve_alias, tracking_uri_or_default
from policies.data_dir import embedded_tracking_db, tracking_uri

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def bare_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("PDCTL_DATA_DIR", raising=False)
    return tmp_path


def test_precedence_explicit_then_environment_then_embedded(bare_cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    embedded = f"sqlite:///{bare_cwd / 'data' / 'mlflow' / 'mlflow.db'}"
    assert tracking_uri() == embedded
    assert tracking_uri_or_default(None) == embedded
    assert tracking_uri("http://mlflow:5000") == "http://mlflow:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert tracking_uri() == tracking_uri_or_default(None) == default_tracking_uri() == "http://env:5000"
    assert tracking_uri("http://explicit:1") == "http://explicit:1"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.setenv("PDCTL_DATA_DIR", str(bare_cwd / "elsewhere"))
    assert embedded_tracking_db() == bare_cwd / "elsewhere" / "mlflow" / "mlflow.db"
    assert tracking_uri_or_default(None) == default_tracking_uri() == f"sqlite:///{embedded_tracking_db()}"


def test_a_registry_spec_without_a_uri_looks_in_data_mlflow_and_writes_nothing(bare_cwd: Path) -> None:
    with pytest.raises(ValueError, match=r"no MLflow registry at .*data/mlflow/mlflow\.db") as info:
        resolve_alias("models:/pdctl-generalist@champion")
    assert "MLFLOW_TRACKING_URI" in str(info.value)
    assert sorted(p.name for p in bare_cwd.iterdir()) == []  # neither ./mlflow.db nor an empty data/ registry


def test_training_side_and_controller_share_the_embedded_registry(bare_cwd: Path) -> None:
    from mlflow import MlflowClient

    uri = default_tracking_uri()  # what pdctl train / pdctl policy register use
    assert uri == tracking_uri_or_default(None)
    MlflowClient(tracking_uri=uri).create_registered_model("pdctl-test")
    assert (bare_cwd / "data" / "mlflow" / "mlflow.db").is_file()
    with pytest.raises(ValueError, match="not found in the registry"):  # the controller reads that registry
        resolve_alias("models:/pdctl-test@champion")
    assert not (bare_cwd / "mlflow.db").exists()


def test_the_docs_name_the_same_default() -> None:
    for doc in ("README.md", "docs/design.md"):
        text = (REPO / doc).read_text(encoding="utf-8")
        assert "data/mlflow/mlflow.db" in text, doc
        assert "$PDCTL_DATA_DIR/mlflow/mlflow.db" in text, doc
