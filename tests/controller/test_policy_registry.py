"""The daemon's registry policy follows its alias, validates each version, and keeps the old one on failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.registry import promote, register_policy
from controller.policy_registry import RegistryPolicy, mlflow_resolver
from policies import MetricWindow, build_observation, load_policy_file, resolve_policy
from policies.base import PolicyContext
from policies.registry import PolicySpecError, load_policy

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "policies" / "examples"


def _context(base) -> PolicyContext:  # type: ignore[no-untyped-def]
    th = {n: tp.thresholds for n, tp in base.tenants.items()}
    return PolicyContext(tuple(tp.tenant for tp in base.tenants.values()), tuple(base.groups.values()), {}, th, th)


def test_alias_is_followed_and_a_bad_version_is_refused(mlflow_server: str, tmp_path: Path) -> None:
    base = resolve_policy(load_policy_file(EXAMPLES / "seed_pd_policy.yaml"))
    first = tmp_path / "first.yaml"
    first.write_text("pd_disaggregation_policy: {remote_prefill: {min_input_tokens: 3000}}\n")
    second = tmp_path / "second.yaml"
    second.write_text("pd_disaggregation_policy: {remote_prefill: {min_input_tokens: 5000}}\n")
    v1 = register_policy(first, "follow", tracking_uri=mlflow_server)
    promote("follow", v1.version, tracking_uri=mlflow_server, force=True)

    policy = RegistryPolicy(
        "registry:models:/follow@champion", base, tracking_uri=mlflow_server, cache_dir=tmp_path / "cache"
    )
    ctx = _context(base)
    obs = build_observation(MetricWindow(0.0, 10.0, {}, {}), ctx.observation_context())
    assert policy.version == v1.version
    assert policy.decide(obs, ctx).thresholds["default"].min_remote_input_tokens == 3000
    assert policy.refresh()  # alias unchanged: nothing to do
    assert policy.loads_ok == 1

    v2 = register_policy(second, "follow", tracking_uri=mlflow_server)
    promote("follow", v2.version, tracking_uri=mlflow_server, force=True)
    assert policy.refresh()
    assert policy.version == v2.version
    assert policy.policy_id.endswith(f"#v{v2.version}")
    assert policy.decide(obs, ctx).thresholds["default"].min_remote_input_tokens == 5000

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text(
        json.dumps(
            {
                "schema_version": 999,
                "feature_hash": "x",
                "codec_hash": "y",
                "max_groups": 1,
                "max_tenants": 1,
                "num_hidden_layers": 0,
            }
        )
    )
    v3 = register_policy(broken, "follow", tracking_uri=mlflow_server)
    promote("follow", v3.version, tracking_uri=mlflow_server, force=True)
    assert not policy.refresh()
    assert policy.version == v2.version  # the running policy stays
    assert "schema_version" in (policy.last_error or "")
    assert policy.decide(obs, ctx).thresholds["default"].min_remote_input_tokens == 5000


def test_registry_specs_through_load_policy(mlflow_server: str, tmp_path: Path) -> None:
    base = resolve_policy(load_policy_file(EXAMPLES / "seed_pd_policy.yaml"))
    v = register_policy(EXAMPLES / "multi_tenant.yaml", "by-spec", tracking_uri=mlflow_server)
    resolver = mlflow_resolver(mlflow_server, tmp_path)
    policy = load_policy(f"registry:models:/by-spec/{v.version}", base, resolver=resolver)
    assert policy.policy_id == f"registry:models:/by-spec/{v.version}"
    with pytest.raises(PolicySpecError, match="not found in the registry"):
        load_policy("registry:models:/no-such-model@champion", base, resolver=resolver)
    with pytest.raises(PolicySpecError, match="not found in the registry"):
        RegistryPolicy("registry:models:/no-such-model@champion", base, tracking_uri=mlflow_server)
