"""Export a trained set policy (:class:`agents.set_policy_net.SetActorCriticPolicy`) as safetensors + manifest.

Only the actor is exported: the encoders' linear layers as ``{encoder}.{i}.weight`` / ``.bias`` (i-th linear
layer) and the two heads, the names :class:`policies.set_network.SetNetwork` reads. The artifact is loaded back
before this returns, so a directory that does not load is never left behind.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from torch import nn

from agents.set_policy_net import SetActorCritic
from policies.learned import MANIFEST_NAME, WEIGHTS_NAME
from policies.schema import SCHEMA_VERSION
from policies.set_codec import SetActionCodec
from policies.set_features import set_feature_hash
from policies.set_network import ENCODERS, HEADS
from policies.set_policy import SetManifest, SetPolicy

__all__ = ["export_set_policy", "set_tensors"]


def _array(tensor: Any) -> np.ndarray:
    return np.ascontiguousarray(tensor.detach().cpu().numpy(), dtype=np.float32)


def set_tensors(extractor: SetActorCritic) -> dict[str, np.ndarray]:
    """The actor's tensors under their runtime names."""
    tensors: dict[str, np.ndarray] = {}
    for name in ENCODERS:
        linears = [m for m in getattr(extractor, name) if isinstance(m, nn.Linear)]
        for i, layer in enumerate(linears):
            tensors[f"{name}.{i}.weight"] = _array(layer.weight)
            tensors[f"{name}.{i}.bias"] = _array(layer.bias)
    for name in HEADS:
        layer = getattr(extractor, name)
        tensors[f"{name}.weight"] = _array(layer.weight)
        tensors[f"{name}.bias"] = _array(layer.bias)
    return tensors


def export_set_policy(
    model: Any,
    out_dir: str | Path,
    *,
    algorithm: str = "MaskablePPO",
    mlflow_run_id: str | None = None,
    git_commit: str | None = None,
    trained_on: Sequence[str] = (),
) -> Path:
    """Write ``weights.safetensors`` and ``manifest.json`` of ``model`` (a ``MaskablePPO`` with a set policy).

    Raises:
        ValueError: the model's policy is not a set policy.
    """
    extractor = getattr(model.policy, "mlp_extractor", None)
    if not isinstance(extractor, SetActorCritic):
        raise ValueError("export_set_policy needs a MaskablePPO built with SetActorCriticPolicy")
    layout = extractor.layout
    manifest = SetManifest(
        schema_version=SCHEMA_VERSION,
        feature_hash=set_feature_hash(),
        codec_hash=SetActionCodec(layout).codec_hash(),
        max_groups=layout.max_groups,
        max_tenants=layout.max_tenants,
        num_encoder_layers=extractor.num_encoder_layers,
        hidden_width=extractor.hidden_width,
        algorithm=algorithm,
        mlflow_run_id=mlflow_run_id,
        git_commit=git_commit,
        trained_on=list(trained_on),
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(set_tensors(extractor), str(out / WEIGHTS_NAME))
    (out / MANIFEST_NAME).write_text(json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n")
    SetPolicy.load(out)  # refuse to leave an artifact behind that does not load
    return out
