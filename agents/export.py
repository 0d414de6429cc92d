"""Export a trained stable-baselines3 policy as a pdctl artifact: safetensors weights + a JSON manifest.

Only the actor path is exported (MLP hidden layers and the action head); the value head is not needed to act.
The observation-normalisation statistics of a ``VecNormalize`` wrapper travel in the manifest, so the runtime
(:class:`policies.learned.LearnedPolicy`, numpy only) reproduces ``model.predict(obs, deterministic=True)``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import save_file

from policies.action_codec import ActionCodec
from policies.features import ObservationLayout, feature_table_hash
from policies.learned import MANIFEST_NAME, WEIGHTS_NAME, LearnedPolicy, Manifest, ObsNormalisation
from policies.schema import SCHEMA_VERSION

__all__ = ["export_policy"]


def _actor_layers(policy: Any) -> tuple[list[tuple[np.ndarray, np.ndarray]], tuple[np.ndarray, np.ndarray], str]:
    hidden: list[tuple[np.ndarray, np.ndarray]] = []
    activation = ""
    for module in policy.mlp_extractor.policy_net:
        if isinstance(module, torch.nn.Linear):
            hidden.append((module.weight.detach().cpu().numpy(), module.bias.detach().cpu().numpy()))
        elif isinstance(module, torch.nn.Tanh):
            activation = activation or "tanh"
        elif isinstance(module, torch.nn.ReLU):
            activation = activation or "relu"
        else:
            raise ValueError(f"cannot export actor layer {module.__class__.__name__} (only Linear + Tanh/ReLU)")
    head = policy.action_net
    return hidden, (head.weight.detach().cpu().numpy(), head.bias.detach().cpu().numpy()), activation or "tanh"


def export_policy(
    model: Any,
    out_dir: str | Path,
    layout: ObservationLayout,
    *,
    obs_rms: Any | None = None,
    clip_obs: float = 10.0,
    epsilon: float = 1e-8,
    tenants: Sequence[str] = (),
    groups: Sequence[str] = (),
    algorithm: str = "MaskablePPO",
    mlflow_run_id: str | None = None,
    git_commit: str | None = None,
    trained_on: Sequence[str] = (),
) -> Path:
    """Write ``weights.safetensors`` and ``manifest.json`` under ``out_dir`` and check they load back.

    ``obs_rms`` is a ``VecNormalize.obs_rms`` (``mean``/``var``) when observations were normalised.
    """
    policy = model.policy
    if getattr(policy, "share_features_extractor", True) is False:
        raise ValueError("export needs share_features_extractor=True (one flatten extractor)")
    hidden, (head_w, head_b), activation = _actor_layers(policy)
    tensors: dict[str, np.ndarray] = {}
    for i, (weight, bias) in enumerate(hidden):
        tensors[f"hidden.{i}.weight"] = np.ascontiguousarray(weight, dtype=np.float32)
        tensors[f"hidden.{i}.bias"] = np.ascontiguousarray(bias, dtype=np.float32)
    tensors["action.weight"] = np.ascontiguousarray(head_w, dtype=np.float32)
    tensors["action.bias"] = np.ascontiguousarray(head_b, dtype=np.float32)
    norm = None
    if obs_rms is not None:
        norm = ObsNormalisation(
            mean=[float(x) for x in np.asarray(obs_rms.mean).reshape(-1)],
            var=[float(x) for x in np.asarray(obs_rms.var).reshape(-1)],
            clip=clip_obs,
            epsilon=epsilon,
        )
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        feature_hash=feature_table_hash(),
        codec_hash=ActionCodec(layout).codec_hash(),
        max_groups=layout.max_groups,
        max_tenants=layout.max_tenants,
        pool_actions=layout.pool_actions,
        activation=activation,
        num_hidden_layers=len(hidden),
        obs_normalisation=norm,
        tenants=list(tenants),
        groups=list(groups),
        algorithm=algorithm,
        mlflow_run_id=mlflow_run_id,
        git_commit=git_commit,
        trained_on=list(trained_on),
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS_NAME))
    (out / MANIFEST_NAME).write_text(json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n")
    LearnedPolicy.load(out)  # refuse to leave an artifact behind that does not load
    return out
