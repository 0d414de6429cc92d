"""The registry and its promotion gate on a real MLflow server (SQLite backend): the gate judges evidence pdctl
produced, bound to the version's files and to the scenario set, and refuses everything else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from typer.testing import CliRunner

from agents.gate import EVIDENCE_PATH
from agents.registry import (
    PromotionRefused,
    RegistryError,
    evaluate_version,
    list_policies,
    promote,
    register_policy,
)
from controller.policy_registry import mlflow_resolver
from pdctl.cli import app
from policies import load_policy_file
from tests.env.helpers import tiny_scenario

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "policies" / "examples"
SEED = EXAMPLES / "seed_pd_policy.yaml"
AGGREGATED = EXAMPLES / "aggregated_only.yaml"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scenarios") / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(duration_s=90.0).model_dump(mode="json")))
    return path


def test_the_gate_judges_the_evaluation_it_ran(mlflow_server: str, tiny: Path) -> None:
    v1 = register_policy(SEED, "gate-test", tracking_uri=mlflow_server)
    assert v1.aliases == ("challenger",)
    assert v1.kind == "file"
    with pytest.raises(PromotionRefused, match="no evaluation evidence"):
        promote("gate-test", v1.version, tracking_uri=mlflow_server)
    # On the tiny scenario the seed file and queue_kv serve every request within its objectives: equal goodput.
    evidence = evaluate_version(
        "gate-test", v1.version, [tiny], [0], baselines=["baseline:queue_kv"], tracking_uri=mlflow_server
    )
    assert evidence.candidate.mean == pytest.approx(evidence.references["baseline:queue_kv"].mean)
    assert evidence.champion is None
    with pytest.raises(PromotionRefused, match=r"does not beat best baseline baseline:queue_kv .* by 5.0%"):
        promote("gate-test", v1.version, margin_frac=0.05, tracking_uri=mlflow_server)
    promoted = promote("gate-test", v1.version, margin_frac=0.0, tracking_uri=mlflow_server)
    assert "champion" in promoted.aliases
    local = mlflow_resolver(mlflow_server)("models:/gate-test@champion")
    assert load_policy_file(local / "policy.yaml") == load_policy_file(SEED)

    # A baseline that does better on the same set: refused, with the numbers.
    v2 = register_policy(SEED, "gate-test", tracking_uri=mlflow_server)
    evidence2 = evaluate_version(
        "gate-test", v2.version, [tiny], [0], baselines=["baseline:aggregated"], tracking_uri=mlflow_server
    )
    assert evidence2.references["baseline:aggregated"].mean > evidence2.candidate.mean
    with pytest.raises(PromotionRefused, match="does not beat best baseline baseline:aggregated"):
        promote("gate-test", v2.version, tracking_uri=mlflow_server)

    # The champion is evaluated alongside the candidate, on the candidate's set.
    v3 = register_policy(AGGREGATED, "gate-test", tracking_uri=mlflow_server)
    evidence3 = evaluate_version("gate-test", v3.version, [tiny], [0], tracking_uri=mlflow_server)
    champion = evidence3.champion_score()
    assert champion is not None
    assert champion[0] == v1.version
    with pytest.raises(PromotionRefused, match=rf"does not beat champion v{v1.version} .* by 5.0%"):
        promote("gate-test", v3.version, margin_frac=0.05, tracking_uri=mlflow_server)
    champions = [p for p in list_policies("gate-test", tracking_uri=mlflow_server) if "champion" in p.aliases]
    assert [p.version for p in champions] == [v1.version]
    listed = {p.version: p for p in list_policies("gate-test", tracking_uri=mlflow_server)}
    assert listed[v2.version].goodput == pytest.approx(evidence2.candidate.mean)  # display copy of the evidence


def test_evidence_about_other_files_or_another_set_is_refused(mlflow_server: str, tiny: Path) -> None:
    client = MlflowClient(tracking_uri=mlflow_server)
    v1 = register_policy(SEED, "bound", tracking_uri=mlflow_server)
    evaluate_version("bound", v1.version, [tiny], [0], tracking_uri=mlflow_server)
    v1_evidence = Path(client.download_artifacts(v1.run_id or "", EVIDENCE_PATH)).read_text(encoding="utf-8")

    # v1's evidence copied into v2's run: bound to v1's files, not v2's.
    v2 = register_policy(AGGREGATED, "bound", tracking_uri=mlflow_server)
    client.log_text(v2.run_id or "", v1_evidence, EVIDENCE_PATH)
    with pytest.raises(PromotionRefused, match="the evidence is about other policy files"):
        promote("bound", v2.version, tracking_uri=mlflow_server)

    # Edited numbers of seeds without the hash that binds them: refused.
    edited = json.loads(v1_evidence)
    edited["scenario_set"]["seeds"] = [0, 1]
    client.log_text(v1.run_id or "", json.dumps(edited), EVIDENCE_PATH)
    with pytest.raises(PromotionRefused, match="is not the hash of its files and seeds"):
        promote("bound", v1.version, tracking_uri=mlflow_server)
    client.log_text(v1.run_id or "", "goodput: 5\n", EVIDENCE_PATH)
    with pytest.raises(PromotionRefused, match="not JSON"):
        promote("bound", v1.version, tracking_uri=mlflow_server)
    evaluate_version("bound", v1.version, [tiny], [0], tracking_uri=mlflow_server)  # a fresh evaluation

    # v3 is evaluated on seed 1 while there is no champion; v1 then becomes champion on seed 0.
    v3 = register_policy(SEED, "bound", tracking_uri=mlflow_server)
    evaluate_version("bound", v3.version, [tiny], [1], tracking_uri=mlflow_server)
    promote("bound", v1.version, tracking_uri=mlflow_server)
    with pytest.raises(PromotionRefused, match=rf"no verifiable score of champion v{v1.version} on the candidate"):
        promote("bound", v3.version, tracking_uri=mlflow_server)
    evaluate_version("bound", v3.version, [tiny], [1], tracking_uri=mlflow_server)  # now alongside the champion
    assert "champion" in promote("bound", v3.version, tracking_uri=mlflow_server).aliases


def test_bad_inputs_are_refused(mlflow_server: str, tmp_path: Path, tiny: Path) -> None:
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
    v = register_policy(SEED, "bad-inputs", tracking_uri=mlflow_server)
    with pytest.raises(ValueError, match="no such scenario file"):
        evaluate_version("bad-inputs", v.version, [tmp_path / "nope.yaml"], [0], tracking_uri=mlflow_server)
    with pytest.raises(ValueError, match="no seeds"):
        evaluate_version("bad-inputs", v.version, [tiny], [], tracking_uri=mlflow_server)
    with pytest.raises(RegistryError, match="margin must be within"):
        promote("bad-inputs", v.version, margin_frac=-0.1, tracking_uri=mlflow_server)
    with pytest.raises(RegistryError, match=r"confidence must be within \(0, 1\), got 1.5"):
        promote("bad-inputs", v.version, confidence=1.5, tracking_uri=mlflow_server)


def test_the_cli_refuses_typed_numbers_and_evaluates_at_registration(mlflow_server: str, tiny: Path) -> None:
    runner = CliRunner()
    typed = runner.invoke(
        app,
        ["policy", "register", str(SEED), "--name", "cli", "--goodput", "5", "--best-baseline-goodput", "4",
         "--tracking-uri", mlflow_server],
    )  # fmt: skip
    assert typed.exit_code == 2
    assert "--goodput/--best-baseline-goodput are refused" in typed.output
    assert list_policies("cli", tracking_uri=mlflow_server) == []  # nothing was registered
    evaluated = runner.invoke(
        app,
        ["policy", "register", str(SEED), "--name", "cli", "--scenarios", str(tiny), "--seeds", "0",
         "--baselines", "baseline:queue_kv", "--tracking-uri", mlflow_server],
    )  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    assert "weighted goodput" in evaluated.output
    assert "best baseline baseline:queue_kv" in evaluated.output
    promote_args = ["policy", "promote", "cli", "--version", "1", "--tracking-uri", mlflow_server]
    refused = runner.invoke(app, promote_args)  # the default margin is 2 %; the two are equal here
    assert refused.exit_code == 2
    assert "does not beat best baseline baseline:queue_kv" in refused.output
    # Scenario by scenario at 95 %: on one scenario the interval is its ratio, 1.0, which a 2 % margin refuses.
    paired = runner.invoke(app, [*promote_args, "--confidence", "0.95"])
    assert paired.exit_code == 2
    assert "goodput ratio over best baseline baseline:queue_kv 1.000" in paired.output
    assert "at 95% confidence" in paired.output
    promoted = runner.invoke(app, [*promote_args, "--margin", "0", "--confidence", "0.95"])
    assert promoted.exit_code == 0, promoted.output
    bad_seeds = runner.invoke(
        app, ["policy", "evaluate", "cli", "--version", "1", "--scenarios", str(tiny), "--seeds", "x",
              "--tracking-uri", mlflow_server],
    )  # fmt: skip
    assert bad_seeds.exit_code == 2
    assert "pdctl policy evaluate: --seeds: 'x' is not a seed or a range A..B" in bad_seeds.output


def test_evidence_behind_admission_records_it_and_is_judged_only_against_the_same_stage(
    mlflow_server: str, tiny: Path
) -> None:
    runner = CliRunner()
    v1 = register_policy(SEED, "behind", tracking_uri=mlflow_server)
    evaluate_version("behind", v1.version, [tiny], [0], tracking_uri=mlflow_server)  # without admission
    promote("behind", v1.version, margin_frac=0.0, tracking_uri=mlflow_server)
    v2 = register_policy(SEED, "behind", tracking_uri=mlflow_server)
    args = ["policy", "evaluate", "behind", "--version", str(v2.version), "--scenarios", str(tiny), "--seeds", "0",
            "--tracking-uri", mlflow_server]  # fmt: skip
    bad = runner.invoke(app, [*args, "--admission-slack", "0"])
    assert bad.exit_code == 2
    assert "--admission-slack" in bad.output
    register = ["policy", "register", str(SEED), "--name", "behind", "--tracking-uri", mlflow_server]
    for extra, message in (
        (["--admission-slack", "1"], "--admission-slack needs --scenarios"),
        (["--admission-slack", "-1", "--scenarios", str(tiny)], "pdctl policy register: --admission-slack"),
    ):
        refused = runner.invoke(app, [*register, *extra])
        assert refused.exit_code == 2
        assert message in refused.output
    assert len(list_policies("behind", tracking_uri=mlflow_server)) == 2  # nothing registered by the refusals
    ran = runner.invoke(app, [*args, "--admission-slack", "1"])
    assert ran.exit_code == 0, ran.output
    assert "(behind admission, slack 1)" in ran.output
    client = MlflowClient(tracking_uri=mlflow_server)
    doc = json.loads(Path(client.download_artifacts(v2.run_id or "", EVIDENCE_PATH)).read_text(encoding="utf-8"))
    assert doc["scenario_set"]["admission_ttft_slack_frac"] == 1.0
    assert doc["champion"]["version"] == v1.version  # the champion ran alongside, behind the same stage
    # the champion's own evidence (without admission) is on another set: the candidate's evidence alone verifies it
    own = json.loads(Path(client.download_artifacts(v1.run_id or "", EVIDENCE_PATH)).read_text(encoding="utf-8"))
    assert own["scenario_set"]["sha256"] != doc["scenario_set"]["sha256"]
    assert "behind" in promote("behind", v2.version, margin_frac=0.0, tracking_uri=mlflow_server).name
