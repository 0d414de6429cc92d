"""A set-policy artifact in the evaluation loop: ``learned:DIR`` on any layout up to 3 groups / 6 tenants."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agents import evaluate as ev
from env.set_env import ScenarioList, SetPolicyEnv
from policies.set_policy import SetPolicy
from tests.env.helpers import tiny_scenario
from tests.policies.test_set_policy import write_set_artifact


def _scenario_file(tmp_path: Path, groups: int, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    scenario = tiny_scenario(duration_s=40.0, groups=groups, name=name)
    path.write_text(yaml.safe_dump(scenario.model_dump(mode="json")))
    return path


def test_set_policy_is_judged_like_the_set_env_agent(tmp_path: Path) -> None:
    """Three groups / six tenants (beyond every slot artifact): decide → guard equals encoded action → step."""
    write_set_artifact(tmp_path / "artifact")
    policy = SetPolicy.load(tmp_path / "artifact")
    path = _scenario_file(tmp_path, 3, "three")
    via_step = SetPolicyEnv(ScenarioList((str(path),)))
    obs, _ = via_step.reset(seed=0, options={"scenario": str(path)})
    via_decide = SetPolicyEnv(ScenarioList((str(path),)))
    via_decide.reset(seed=0, options={"scenario": str(path)})
    decide_env = via_decide.inner
    for _ in range(via_step.inner.num_steps):
        control = decide_env.control(policy.decide(decide_env.observation(), decide_env.policy_context()))
        obs, reward, _, _, _ = via_step.step(policy.act(obs, via_step.action_masks()))
        assert reward == pytest.approx(control.reward)
        assert via_step.inner.current_pools() == decide_env.current_pools()
        assert via_step.inner.thresholds == decide_env.thresholds
    for spec in (f"learned:{tmp_path / 'artifact'}", f"watchdog:learned:{tmp_path / 'artifact'}"):
        result = ev.run_one(ev.RunSpec(spec, str(path), 0))
        assert result.error is None
        assert next(r for r in result.rows if r["tenant"] == "ALL")["arrived"] > 0


def test_beyond_the_maximum_the_run_is_refused_in_one_line(tmp_path: Path) -> None:
    write_set_artifact(tmp_path / "artifact")
    path = _scenario_file(tmp_path, 4, "four")
    refused = ev.run_one_safe(ev.RunSpec(f"learned:{tmp_path / 'artifact'}", str(path), 0))
    assert refused.rows == []
    assert refused.error is not None
    assert "\n" not in refused.error
    assert refused.error == (
        f"ValueError: policy learned:{tmp_path / 'artifact'}: 4 groups / 8 tenants exceed the set policy's maximum"
        " of 3 groups / 6 tenants"
    )
