"""The set policy's actor network evaluated with numpy: shared across tenants and groups, permutation-invariant.

Shapes (one observation; ``G``/``T`` = the layout's group/tenant slots, ``H`` = hidden width):

1. **Tenant encoder** (shared by every tenant): ``h_t = enc_t([tenant_row_t, group_row_{g(t)}])`` → ``[T, H]``.
2. **Pooling per group** over its (unmasked) tenants: mean and max of ``h_t`` → ``[G, 2H]`` (zeros for a group
   without tenants).
3. **Group encoder** (shared by every group): ``z_g = enc_g([group_row_g, mean_g, max_g])`` → ``[G, H]``.
4. **Context**: ``c`` = mean of ``z_g`` over the unmasked groups → ``[H]``.
5. **Heads**: group logits ``head_g([z_g, c])`` → ``[G, 3]`` (pool moves); tenant logits
   ``head_t([h_t, z_{g(t)}, c])`` → ``[T, 22]`` (route levels). Flat logits: group slots, then tenant slots,
   in the order of :class:`~policies.set_codec.SetActionCodec`.

Every slot passes through the same weights and the only cross-slot operations are mean and max, so permuting
tenants (or groups, with the membership permuted alike) permutes the logits the same way. Encoders use
``tanh`` after every layer; heads are linear. :class:`agents.set_policy_net.SetActorCriticPolicy` is the torch
twin that training uses; :mod:`agents.set_export` writes its weights under the names read here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from policies.set_codec import POOL_MOVES, TENANT_DIMS
from policies.set_features import SetLayout

__all__ = ["ENCODERS", "HEADS", "SetNetwork"]

ENCODERS = ("tenant_encoder", "group_encoder")
"""Tensor-name prefixes of the encoders: ``{prefix}.{i}.weight`` / ``.bias`` for their i-th linear layer."""
HEADS = ("group_head", "tenant_head")
"""Tensor-name prefixes of the linear heads: ``{prefix}.weight`` / ``.bias``."""

Layer = tuple[np.ndarray, np.ndarray]


def _mlp(x: np.ndarray, layers: Sequence[Layer]) -> np.ndarray:
    for weight, bias in layers:
        x = np.tanh(x @ weight.T + bias)
    return x


def _linear(x: np.ndarray, layer: Layer) -> np.ndarray:
    weight, bias = layer
    out: np.ndarray = x @ weight.T + bias
    return out


@dataclass(frozen=True)
class SetNetwork:
    """Weights of the actor and its forward pass."""

    layout: SetLayout
    tenant_encoder: tuple[Layer, ...]
    group_encoder: tuple[Layer, ...]
    group_head: Layer
    tenant_head: Layer

    @property
    def hidden_width(self) -> int:
        """Width ``H`` of the encoders' outputs."""
        return int(self.tenant_encoder[-1][0].shape[0])

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, np.ndarray], layout: SetLayout, num_layers: int) -> SetNetwork:
        """Build from named tensors, checking every shape.

        Raises:
            ValueError: a tensor is missing or has a shape that does not chain (one line naming it).
        """

        def get(name: str) -> np.ndarray:
            if name not in tensors:
                raise ValueError(f"{name}: missing tensor")
            return np.asarray(tensors[name], dtype=np.float32)

        def layer(prefix: str, width_in: int) -> Layer:
            weight, bias = get(f"{prefix}.weight"), get(f"{prefix}.bias")
            if weight.ndim != 2 or weight.shape[1] != width_in or bias.shape != (weight.shape[0],):
                raise ValueError(f"{prefix}.weight: shape {weight.shape} does not fit input width {width_in}")
            return weight, bias

        def encoder(prefix: str, width_in: int) -> tuple[Layer, ...]:
            layers = []
            for i in range(num_layers):
                layers.append(layer(f"{prefix}.{i}", width_in))
                width_in = layers[-1][0].shape[0]
            return tuple(layers)

        tenant_encoder = encoder("tenant_encoder", layout.tenant_width + layout.group_width)
        hidden = tenant_encoder[-1][0].shape[0]
        group_encoder = encoder("group_encoder", layout.group_width + 2 * hidden)
        if group_encoder[-1][0].shape[0] != hidden:
            raise ValueError(f"group_encoder: output width {group_encoder[-1][0].shape[0]}, expected {hidden}")
        group_head = layer("group_head", 2 * hidden)
        tenant_head = layer("tenant_head", 3 * hidden)
        for name, (weight, _), outputs in (
            ("group_head", group_head, len(POOL_MOVES)),
            ("tenant_head", tenant_head, sum(TENANT_DIMS)),
        ):
            if weight.shape[0] != outputs:
                raise ValueError(f"{name}.weight: {weight.shape[0]} outputs, expected {outputs}")
        return cls(layout, tenant_encoder, group_encoder, group_head, tenant_head)

    def logits(self, vector: np.ndarray) -> np.ndarray:
        """Flat logits (group slots, then tenant slots) of one flat observation vector."""
        groups, tenants, group_mask, tenant_mask, membership = self.layout.split(vector)
        members = membership * tenant_mask[:, None]  # [T, G]
        h = _mlp(np.concatenate([tenants, membership @ groups], axis=-1), self.tenant_encoder)
        h = h * tenant_mask[:, None]
        counts = members.sum(axis=0)  # [G]
        mean = (members.T @ h) / np.maximum(counts, 1.0)[:, None]
        stacked = np.where(members.T[:, :, None] > 0, h[None, :, :], -np.inf)  # [G, T, H]
        peak = np.where(counts[:, None] > 0, stacked.max(axis=1), 0.0)
        z = _mlp(np.concatenate([groups, mean, peak], axis=-1), self.group_encoder) * group_mask[:, None]
        context = z.sum(axis=0) / max(float(group_mask.sum()), 1.0)
        g = len(group_mask)
        group_logits = _linear(
            np.concatenate([z, np.broadcast_to(context, (g, len(context)))], axis=-1), self.group_head
        )
        t = len(tenant_mask)
        tenant_in = np.concatenate([h, membership @ z, np.broadcast_to(context, (t, len(context)))], axis=-1)
        tenant_logits = _linear(tenant_in, self.tenant_head)
        return np.concatenate([group_logits.ravel(), tenant_logits.ravel()]).astype(np.float32)
