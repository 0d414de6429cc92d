from __future__ import annotations

from pathlib import Path

import pytest

from agents.registry import PromotionRefused, RegistryError, list_policies, promote, register_policy
from controller.policy_registry import mlflow_resolver
from policies import load_policy_file

pytestmark = pytest.mark.integration

SEED = Path(__file__).resolve().parents[2] / "policies" / "examples" / "seed_pd_policy.yaml"


def test_register_promote_resolve_a_rule_policy(mlflow_server: str) -> None:
    v1 = register_policy(
        SEED, "gate-test", tracking_uri=mlflow_server, evaluation={"goodput": 10.0, "best_baseline_goodput": 9.0}
    )
    assert v1.aliases == ("challenger",)
    assert v1.kind == "file"
    promoted = promote("gate-test", v1.version, margin_frac=0.05, tracking_uri=mlflow_server)
    assert "champion" in promoted.aliases
    local = mlflow_resolver(mlflow_server)("models:/gate-test@champion")
    assert load_policy_file(local / "policy.yaml") == load_policy_file(SEED)

    v2 = register_policy(
        SEED, "gate-test", tracking_uri=mlflow_server, evaluation={"goodput": 10.2, "best_baseline_goodput": 9.0}
    )
    with pytest.raises(PromotionRefused, match=r"does not beat champion v1 10 by 5.0%"):
        promote("gate-test", v2.version, margin_frac=0.05, tracking_uri=mlflow_server)
    v3 = register_policy(
        SEED, "gate-test", tracking_uri=mlflow_server, evaluation={"goodput": 8.0, "best_baseline_goodput": 9.0}
    )
    with pytest.raises(PromotionRefused, match="best baseline"):
        promote("gate-test", v3.version, tracking_uri=mlflow_server)
    v4 = register_policy(SEED, "gate-test", tracking_uri=mlflow_server)
    with pytest.raises(PromotionRefused, match="no held-out evaluation"):
        promote("gate-test", v4.version, tracking_uri=mlflow_server)
    champion = [p for p in list_policies("gate-test", tracking_uri=mlflow_server) if "champion" in p.aliases]
    assert [p.version for p in champion] == [v1.version]


def test_bad_inputs_are_refused(mlflow_server: str, tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="no such artifact"):
        register_policy(tmp_path / "missing", "x", tracking_uri=mlflow_server)
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: {traffic_percent: 500}\n")
    with pytest.raises(RegistryError, match=r"bad.yaml:1: rollout.traffic_percent"):
        register_policy(bad, "x", tracking_uri=mlflow_server)
    with pytest.raises(ValueError, match="not found"):
        mlflow_resolver(mlflow_server)("models:/never-registered@champion")
    with pytest.raises(ValueError, match="expected models:/"):
        mlflow_resolver(mlflow_server)("runs:/abc/policy")
