"""The set-policy runtime: a layout-free learned policy evaluated with numpy, from weights and a manifest.

An exported set-policy artifact is a directory with

* ``weights.safetensors`` — the actor's tensors under the names of :mod:`policies.set_network`;
* ``manifest.json`` — :class:`SetManifest`: ``format: pdctl-set-policy``, schema and feature versions, the
  set-feature and codec hashes, the padding (most groups and tenants), the encoder depth and provenance.

Unlike a slot policy (:mod:`policies.learned`) it takes any number of tenant groups and tenants up to the padding
(by default 3 and 6), with any GPU budget: its observation is relative (:mod:`policies.set_features`), its pool
actions are moves of the prefill share (:mod:`policies.set_codec`), and its network is shared across slots. A
scenario beyond the padding is refused in one line. No observation normalisation is stored: the features are
normalised by construction (running statistics per slot would break the permutation invariance).

Deterministic decisions: per action dimension, the arg-max of the masked logits (stable-baselines3's
``predict(..., deterministic=True)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from policies.base import PolicyContext
from policies.features import Observation
from policies.learned import (
    MANIFEST_NAME,
    WEIGHTS_NAME,
    PolicyLoadError,
    check_build,
    learned_policy_id,
    masked_argmax,
    read_manifest,
    read_weights,
)
from policies.schema import SCHEMA_VERSION, ControlAction
from policies.set_codec import SetActionCodec
from policies.set_features import SET_MAX_GROUPS, SET_MAX_TENANTS, SetLayout, build_set_observation, set_feature_hash
from policies.set_network import SetNetwork

__all__ = ["SET_FORMAT", "SetManifest", "SetPolicy", "read_set_manifest"]

SET_FORMAT = "pdctl-set-policy"


class SetManifest(BaseModel):
    """What travels with a set policy's weights."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["pdctl-set-policy"] = "pdctl-set-policy"
    schema_version: int
    feature_hash: str
    codec_hash: str
    max_groups: int = Field(default=SET_MAX_GROUPS, ge=1)
    max_tenants: int = Field(default=SET_MAX_TENANTS, ge=1)
    num_encoder_layers: int = Field(ge=1)
    hidden_width: int = Field(ge=1)
    algorithm: str = ""
    mlflow_run_id: str | None = None
    git_commit: str | None = None
    trained_on: list[str] = []
    """Training scenarios or ``family:PATH#split``."""

    @property
    def layout(self) -> SetLayout:
        """The padding the network was trained with."""
        return SetLayout(max_groups=self.max_groups, max_tenants=self.max_tenants)


@dataclass(frozen=True)
class SetPolicy:
    """A trained set policy: relative observation → masked arg-max per dimension → :class:`ControlAction`."""

    manifest: SetManifest
    network: SetNetwork
    source: str = ""
    _codec: SetActionCodec = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_codec", SetActionCodec(self.manifest.layout))

    @property
    def policy_id(self) -> str:
        """``learned:<source>`` plus the MLflow run id when known."""
        return learned_policy_id(self.source, self.manifest.mlflow_run_id)

    @property
    def codec(self) -> SetActionCodec:
        """The action codec of the padding."""
        return self._codec

    @classmethod
    def load(cls, path: str | Path) -> SetPolicy:
        """Load an exported set-policy directory; refuses mismatches and malformed files with one line.

        Raises:
            PolicyLoadError: the manifest or weights are missing, malformed or from another build.
        """
        root = Path(path)
        manifest = read_set_manifest(root / MANIFEST_NAME)
        codec = SetActionCodec(manifest.layout)
        check_build(
            root / MANIFEST_NAME,
            (
                ("schema_version", manifest.schema_version, SCHEMA_VERSION),
                ("feature_hash", manifest.feature_hash, set_feature_hash()),
                ("codec_hash", manifest.codec_hash, codec.codec_hash()),
            ),
        )
        tensors = read_weights(root / WEIGHTS_NAME)
        try:
            network = SetNetwork.from_tensors(tensors, manifest.layout, manifest.num_encoder_layers)
        except ValueError as exc:
            raise PolicyLoadError(f"{root / WEIGHTS_NAME}: {exc}") from None
        if network.hidden_width != manifest.hidden_width:
            raise PolicyLoadError(
                f"{root / MANIFEST_NAME}: hidden_width: {manifest.hidden_width}, the weights have "
                f"{network.hidden_width}"
            )
        return cls(manifest=manifest, network=network, source=str(root))

    def act(self, vector: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Encoded action for one flat observation vector, masked arg-max per dimension."""
        logits = self.network.logits(np.asarray(vector, dtype=np.float32))
        return masked_argmax(logits, self._codec.nvec, mask)

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """Decide from the window behind ``observation`` and the context, with the guard's masks applied.

        Tenants of no listed group (the live policy file's implicit ``default`` tenant) are left out: the
        action keeps their thresholds as they are (:meth:`PolicyContext.grouped`).

        Raises:
            ValueError: the context has more groups or tenants than the padding (one line).
        """
        context = context.grouped()
        try:
            self.manifest.layout.check_fits(len(context.groups), len(context.tenants))
        except ValueError as exc:
            raise ValueError(f"policy {self.policy_id}: {exc}") from None
        rows = build_set_observation(observation.window, context.observation_context())
        vector = rows.to_vector(self.manifest.layout)
        mask = self._codec.masks(context.groups, context.current_pools, len(context.tenants))
        action = self.act(vector, mask)
        base = dict(context.base_thresholds) or dict(context.current_thresholds)
        return self._codec.decode(
            action, context.tenants, context.groups, context.current_pools, base, policy_id=self.policy_id
        )


def read_set_manifest(path: Path) -> SetManifest:
    """Read and validate a set-policy manifest (one line naming the file and field on failure).

    Raises:
        PolicyLoadError: missing, unreadable or invalid.
    """
    return read_manifest(path, SetManifest)
