"""The learned-policy runtime: a trained actor network evaluated with numpy, from weights and a manifest.

An exported artifact is a directory with

* ``weights.safetensors`` — the actor's layers as float32 tensors named ``hidden.{i}.weight`` /
  ``hidden.{i}.bias`` (i = 0, 1, …) and ``action.weight`` / ``action.bias`` (``safetensors`` never unpickles);
* ``manifest.json`` — :class:`Manifest`: format and schema versions, the feature-table and action-codec hashes,
  the slot layout, the activation, the observation-normalisation statistics and provenance (MLflow run id).

:meth:`LearnedPolicy.load` refuses an artifact whose schema version, feature hash or codec hash differ from this
build's, with a one-line message naming the field. Evaluating the policy needs neither the simulator nor the
training stack (no torch, no stable-baselines3): the controller imports only this module.

Deterministic decisions: per action dimension, the arg-max of the masked logits (what stable-baselines3's
``predict(..., deterministic=True)`` returns for a ``MultiDiscrete`` space).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from policies.action_codec import ActionCodec
from policies.base import PolicyContext
from policies.features import Observation, ObservationLayout, PoolActions, feature_table_hash
from policies.schema import SCHEMA_VERSION, ControlAction

__all__ = [
    "MANIFEST_NAME",
    "WEIGHTS_NAME",
    "LearnedPolicy",
    "Manifest",
    "ObsNormalisation",
    "PolicyLoadError",
    "check_build",
    "learned_policy_id",
    "masked_argmax",
    "read_manifest",
    "read_weights",
]

ManifestT = TypeVar("ManifestT", bound=BaseModel)

MANIFEST_NAME = "manifest.json"
WEIGHTS_NAME = "weights.safetensors"


def learned_policy_id(source: str, mlflow_run_id: str | None) -> str:
    """``learned:<source>`` plus ``@<run id>`` when the artifact names its MLflow run."""
    run = f"@{mlflow_run_id}" if mlflow_run_id else ""
    return f"learned:{source}{run}"


def masked_argmax(logits: np.ndarray, nvec: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """The arg-max of each action dimension's slice of ``logits`` (sizes ``nvec``), masked entries excluded."""
    if mask is not None:
        logits = np.where(np.asarray(mask, dtype=bool), logits, -np.inf)
    out = np.empty(len(nvec), dtype=np.int64)
    start = 0
    for i, size in enumerate(nvec):
        out[i] = int(np.argmax(logits[start : start + size]))
        start += int(size)
    return out


class PolicyLoadError(ValueError):
    """A learned-policy artifact was refused (one line naming the file and the field)."""


class ObsNormalisation(BaseModel):
    """Running observation statistics applied before the network (VecNormalize-style)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mean: list[float]
    var: list[float]
    clip: float = 10.0
    epsilon: float = 1e-8


class Manifest(BaseModel):
    """What travels with the weights."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["pdctl-learned-policy"] = "pdctl-learned-policy"
    schema_version: int
    feature_hash: str
    codec_hash: str
    max_groups: int = Field(ge=1)
    max_tenants: int = Field(ge=1)
    pool_actions: PoolActions = "delta"
    """How the pool dimensions are encoded (``"delta"`` in artifacts from before action version 4)."""
    activation: Literal["tanh", "relu"] = "tanh"
    num_hidden_layers: int = Field(ge=0)
    obs_normalisation: ObsNormalisation | None = None
    tenants: list[str] = []
    """Tenant names in slot order at training time (the controller's tenant order must match)."""
    groups: list[str] = []
    algorithm: str = ""
    mlflow_run_id: str | None = None
    git_commit: str | None = None
    trained_on: list[str] = []

    @property
    def layout(self) -> ObservationLayout:
        """The slot layout the network was trained on."""
        return ObservationLayout(
            max_groups=self.max_groups, max_tenants=self.max_tenants, pool_actions=self.pool_actions
        )


@dataclass(frozen=True)
class _Network:
    hidden: tuple[tuple[np.ndarray, np.ndarray], ...]
    action: tuple[np.ndarray, np.ndarray]
    activation: str

    def logits(self, x: np.ndarray) -> np.ndarray:
        h = x.astype(np.float32)
        for weight, bias in self.hidden:
            h = h @ weight.T + bias
            h = np.tanh(h) if self.activation == "tanh" else np.maximum(h, 0.0)
        weight, bias = self.action
        out: np.ndarray = h @ weight.T + bias
        return out


@dataclass(frozen=True)
class LearnedPolicy:
    """A trained policy: observation vector → masked arg-max per action dimension → :class:`ControlAction`."""

    manifest: Manifest
    network: _Network
    source: str = ""
    _codec: ActionCodec = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_codec", ActionCodec(self.manifest.layout))

    @property
    def policy_id(self) -> str:
        """``learned:<source>`` plus the MLflow run id when known."""
        return learned_policy_id(self.source, self.manifest.mlflow_run_id)

    @property
    def codec(self) -> ActionCodec:
        """The action codec of the trained layout."""
        return self._codec

    @classmethod
    def load(cls, path: str | Path) -> LearnedPolicy:
        """Load an exported artifact directory; refuses mismatches and malformed files with one line."""
        root = Path(path)
        manifest = read_manifest(root / MANIFEST_NAME, Manifest)
        _check_compatible(manifest, root / MANIFEST_NAME)
        tensors = read_weights(root / WEIGHTS_NAME)
        network = _network_from(tensors, manifest, root / WEIGHTS_NAME)
        return cls(manifest=manifest, network=network, source=str(root))

    def normalise(self, vector: np.ndarray) -> np.ndarray:
        """Apply the manifest's observation normalisation (identity when there is none)."""
        norm = self.manifest.obs_normalisation
        if norm is None:
            return np.asarray(vector, dtype=np.float32)
        mean = np.asarray(norm.mean, dtype=np.float32)
        var = np.asarray(norm.var, dtype=np.float32)
        scaled = np.clip((vector - mean) / np.sqrt(var + norm.epsilon), -norm.clip, norm.clip)
        return np.asarray(scaled, dtype=np.float32)

    def act(self, vector: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Encoded action for one (unnormalised) observation vector, masked arg-max per dimension."""
        logits = self.network.logits(self.normalise(np.asarray(vector, dtype=np.float32)))
        return masked_argmax(logits, self._codec.nvec, mask)

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """Decide from an observation, with the guard's masks applied."""
        vector = observation.to_vector(self.manifest.layout)
        mask = self._codec.masks(context.groups, context.current_pools, len(context.tenants))
        action = self.act(vector, mask)
        base = dict(context.base_thresholds) or dict(context.current_thresholds)
        return self._codec.decode(
            action, context.tenants, context.groups, context.current_pools, base, policy_id=self.policy_id
        )


def read_manifest(path: Path, model: type[ManifestT]) -> ManifestT:
    """Read and validate an artifact manifest as ``model`` (one line naming the file and field on failure).

    Raises:
        PolicyLoadError: missing, unreadable or invalid.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PolicyLoadError(f"{path}: missing (not a learned-policy artifact directory)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PolicyLoadError(f"{path}: not readable JSON: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in err["loc"]) or "<top>"
        raise PolicyLoadError(f"{path}: {loc}: {err['msg']}") from None


def check_build(path: Path, fields: Sequence[tuple[str, object, object]]) -> None:
    """Refuse an artifact whose ``(field, artifact's value, this build's value)`` differ, naming the first.

    Raises:
        PolicyLoadError: one line: the file, the field and both values.
    """
    for name, got, want in fields:
        if got != want:
            raise PolicyLoadError(
                f"{path}: {name}: artifact has {got!r}, this build expects {want!r} (retrain or upgrade)"
            )


def _check_compatible(manifest: Manifest, path: Path) -> None:
    codec = ActionCodec(manifest.layout)
    check_build(
        path,
        (
            ("schema_version", manifest.schema_version, SCHEMA_VERSION),
            ("feature_hash", manifest.feature_hash, feature_table_hash()),
            ("codec_hash", manifest.codec_hash, codec.codec_hash()),
        ),
    )


def read_weights(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file (never unpickles); refuses a missing or malformed file in one line."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return dict(load_file(str(path)))
    except FileNotFoundError:
        raise PolicyLoadError(f"{path}: missing") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise PolicyLoadError(f"{path}: not a safetensors file: {exc}") from None


def _network_from(tensors: dict[str, Any], manifest: Manifest, path: Path) -> _Network:
    layout = manifest.layout
    hidden = []
    width = layout.size
    for i in range(manifest.num_hidden_layers):
        weight, bias = tensors.get(f"hidden.{i}.weight"), tensors.get(f"hidden.{i}.bias")
        if weight is None or bias is None:
            raise PolicyLoadError(f"{path}: hidden.{i}: missing tensor")
        if weight.ndim != 2 or weight.shape[1] != width or bias.shape != (weight.shape[0],):
            raise PolicyLoadError(f"{path}: hidden.{i}.weight: shape {weight.shape} does not fit input width {width}")
        hidden.append((weight.astype(np.float32), bias.astype(np.float32)))
        width = weight.shape[0]
    weight, bias = tensors.get("action.weight"), tensors.get("action.bias")
    outputs = int(ActionCodec(layout).nvec.sum())
    if weight is None or bias is None:
        raise PolicyLoadError(f"{path}: action: missing tensor")
    if weight.shape != (outputs, width) or bias.shape != (outputs,):
        raise PolicyLoadError(f"{path}: action.weight: shape {weight.shape}, expected {(outputs, width)}")
    norm = manifest.obs_normalisation
    if norm is not None and (len(norm.mean) != layout.size or len(norm.var) != layout.size):
        raise PolicyLoadError(f"{path}: obs_normalisation: length differs from the observation size {layout.size}")
    return _Network(tuple(hidden), (weight.astype(np.float32), bias.astype(np.float32)), manifest.activation)
