from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from policies import (
    SCHEMA_VERSION,
    MetricWindow,
    ObservationLayout,
    PoolTargets,
    RoutingThresholds,
    Tenant,
    TenantGroup,
    build_observation,
    feature_table_hash,
)
from policies.action_codec import ActionCodec
from policies.base import PolicyContext
from policies.learned import MANIFEST_NAME, WEIGHTS_NAME, LearnedPolicy, PolicyLoadError

LAYOUT = ObservationLayout(max_groups=1, max_tenants=2)
CODEC = ActionCodec(LAYOUT)


def write_artifact(root: Path, *, seed: int = 0, **manifest_overrides: object) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tensors = {
        "hidden.0.weight": rng.normal(size=(16, LAYOUT.size)).astype(np.float32),
        "hidden.0.bias": rng.normal(size=16).astype(np.float32),
        "action.weight": rng.normal(size=(int(CODEC.nvec.sum()), 16)).astype(np.float32),
        "action.bias": rng.normal(size=int(CODEC.nvec.sum())).astype(np.float32),
    }
    root.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(root / WEIGHTS_NAME))
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "feature_hash": feature_table_hash(),
        "codec_hash": CODEC.codec_hash(),
        "max_groups": 1,
        "max_tenants": 2,
        "num_hidden_layers": 1,
        "obs_normalisation": {"mean": [0.1] * LAYOUT.size, "var": [2.0] * LAYOUT.size, "clip": 5.0},
        "tenants": ["chat", "rag"],
    }
    manifest.update(manifest_overrides)
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    return tensors


def test_act_matches_a_reference_forward_pass(tmp_path: Path) -> None:
    tensors = write_artifact(tmp_path)
    policy = LearnedPolicy.load(tmp_path)
    x = np.random.default_rng(1).uniform(0, 1, LAYOUT.size).astype(np.float32)
    z = np.clip((x - 0.1) / np.sqrt(2.0 + 1e-8), -5, 5)
    logits = np.tanh(z @ tensors["hidden.0.weight"].T + tensors["hidden.0.bias"]) @ tensors["action.weight"].T
    logits = logits + tensors["action.bias"]
    expected, start = [], 0
    for size in CODEC.nvec:
        expected.append(int(np.argmax(logits[start : start + size])))
        start += int(size)
    assert policy.act(x).tolist() == expected


def test_decide_respects_masks_and_returns_a_control_action(tmp_path: Path) -> None:
    write_artifact(tmp_path)
    policy = LearnedPolicy.load(tmp_path)
    tenants = (Tenant("chat", "g"), Tenant("rag", "g"))
    group = TenantGroup("g", ("chat", "rag"), gpu_budget=4, min_prefill=1, max_prefill=1)
    th = {t.name: RoutingThresholds() for t in tenants}
    ctx = PolicyContext(tenants, (group,), {"g": PoolTargets(1, 3)}, th, th)
    obs = build_observation(MetricWindow(0.0, 10.0, {}, {}), ctx.observation_context())
    action = policy.decide(obs, ctx)
    assert action.pools["g"].num_prefill == 1  # prefill pinned by bounds: masked
    assert set(action.thresholds) == {"chat", "rag"}
    assert action.policy_id.startswith("learned:")


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"schema_version": SCHEMA_VERSION + 1}, "schema_version"),
        ({"feature_hash": "0000"}, "feature_hash"),
        ({"codec_hash": "0000"}, "codec_hash"),
        ({"max_groups": 0}, "max_groups"),
        ({"unexpected": 1}, "unexpected"),
        ({"num_hidden_layers": 2}, "hidden.1"),
        ({"obs_normalisation": {"mean": [0.0], "var": [1.0]}}, "obs_normalisation"),
    ],
)
def test_mismatched_or_malformed_artifacts_are_refused(tmp_path: Path, override: dict[str, Any], field: str) -> None:
    write_artifact(tmp_path, **override)
    with pytest.raises(PolicyLoadError, match=field) as info:
        LearnedPolicy.load(tmp_path)
    assert "\n" not in str(info.value)


def test_pickles_are_never_loaded(tmp_path: Path) -> None:
    write_artifact(tmp_path)
    (tmp_path / WEIGHTS_NAME).write_bytes(b"\x80\x04\x95" + b"cos\nsystem\n" * 4)  # a pickle, not safetensors
    with pytest.raises(PolicyLoadError, match="not a safetensors file"):
        LearnedPolicy.load(tmp_path)
    with pytest.raises(PolicyLoadError, match="missing"):
        LearnedPolicy.load(tmp_path / "nowhere")
