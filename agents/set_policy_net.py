"""The set policy's torch network for sb3-contrib's ``MaskablePPO``: the twin of :mod:`policies.set_network`.

:class:`SetActorCritic` takes the flat, padded observation (:class:`~policies.set_features.SetLayout`) and
returns the flat action logits (group slots, then tenant slots) as the actor latent, and a pooled summary as the
critic latent. :class:`SetActorCriticPolicy` plugs it into ``MaskableActorCriticPolicy`` in place of the MLP
extractor, with the action net an identity (the heads already emit logits, per slot, with shared weights). The
forward pass is the one documented in :mod:`policies.set_network`; the critic adds ``value([c, max_g z_g])``.
"""

from __future__ import annotations

from typing import Any

import torch
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from torch import nn

from policies.set_codec import POOL_MOVES, TENANT_DIMS
from policies.set_features import SetLayout

__all__ = ["SetActorCritic", "SetActorCriticPolicy"]

_HEAD_GAIN = 0.01
"""Initial gain of the logit heads (as SB3 initialises its action net): near-uniform first policies."""


def _encoder(width_in: int, hidden: int, layers: int) -> nn.Sequential:
    modules: list[nn.Module] = []
    for _ in range(layers):
        modules += [nn.Linear(width_in, hidden), nn.Tanh()]
        width_in = hidden
    return nn.Sequential(*modules)


class SetActorCritic(nn.Module):
    """Shared tenant and group encoders, mean/max pooling per group, per-slot heads, a pooled critic latent."""

    def __init__(self, layout: SetLayout, hidden_width: int = 64, num_encoder_layers: int = 2) -> None:
        super().__init__()
        self.layout = layout
        self.hidden_width = hidden_width
        self.num_encoder_layers = num_encoder_layers
        self.tenant_encoder = _encoder(layout.tenant_width + layout.group_width, hidden_width, num_encoder_layers)
        self.group_encoder = _encoder(layout.group_width + 2 * hidden_width, hidden_width, num_encoder_layers)
        self.group_head = nn.Linear(2 * hidden_width, len(POOL_MOVES))
        self.tenant_head = nn.Linear(3 * hidden_width, sum(TENANT_DIMS))
        self.latent_dim_pi = layout.max_groups * len(POOL_MOVES) + layout.max_tenants * sum(TENANT_DIMS)
        self.latent_dim_vf = 2 * hidden_width
        for head in (self.group_head, self.tenant_head):
            nn.init.orthogonal_(head.weight, gain=_HEAD_GAIN)
            nn.init.zeros_(head.bias)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        layout, g, t = self.layout, self.layout.max_groups, self.layout.max_tenants
        sizes = [g * layout.group_width, t * layout.tenant_width, g, t, t * g]
        groups, tenants, group_mask, tenant_mask, membership = torch.split(x, sizes, dim=-1)
        return (
            groups.reshape(-1, g, layout.group_width),
            tenants.reshape(-1, t, layout.tenant_width),
            group_mask,
            tenant_mask,
            membership.reshape(-1, t, g),
        )

    def _encode(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        groups, tenants, group_mask, tenant_mask, membership = self._split(x)
        members = membership * tenant_mask.unsqueeze(-1)  # [B, T, G]
        h = self.tenant_encoder(torch.cat([tenants, membership @ groups], dim=-1)) * tenant_mask.unsqueeze(-1)
        counts = members.sum(dim=1)  # [B, G]
        mean = members.transpose(1, 2) @ h / counts.clamp(min=1.0).unsqueeze(-1)
        inside = members.transpose(1, 2).unsqueeze(-1) > 0  # [B, G, T, 1]
        stacked = torch.where(inside, h.unsqueeze(1), torch.full_like(h.unsqueeze(1), -torch.inf))
        peak = torch.where(counts.unsqueeze(-1) > 0, stacked.max(dim=2).values, torch.zeros_like(mean))
        z = self.group_encoder(torch.cat([groups, mean, peak], dim=-1)) * group_mask.unsqueeze(-1)
        context = z.sum(dim=1) / group_mask.sum(dim=1, keepdim=True).clamp(min=1.0)  # [B, H]
        return h, z, context, membership, group_mask

    def forward_actor(self, features: torch.Tensor) -> torch.Tensor:
        """Flat logits ``[B, Σ nvec]``."""
        h, z, context, membership, _ = self._encode(features)
        g, t = self.layout.max_groups, self.layout.max_tenants
        group_logits = self.group_head(torch.cat([z, context.unsqueeze(1).expand(-1, g, -1)], dim=-1))
        tenant_in = torch.cat([h, membership @ z, context.unsqueeze(1).expand(-1, t, -1)], dim=-1)
        tenant_logits = self.tenant_head(tenant_in)
        return torch.cat([group_logits.flatten(1), tenant_logits.flatten(1)], dim=-1)

    def forward_critic(self, features: torch.Tensor) -> torch.Tensor:
        """Critic latent ``[B, 2H]``: the group mean and the masked group max."""
        _, z, context, _, group_mask = self._encode(features)
        masked = torch.where(group_mask.unsqueeze(-1) > 0, z, torch.full_like(z, -torch.inf))
        peak = torch.where(group_mask.sum(dim=1, keepdim=True) > 0, masked.max(dim=1).values, torch.zeros_like(context))
        return torch.cat([context, peak], dim=-1)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(actor latent, critic latent)`` as SB3's ``MlpExtractor`` returns them."""
        return self.forward_actor(features), self.forward_critic(features)


class SetActorCriticPolicy(MaskableActorCriticPolicy):
    """``MaskableActorCriticPolicy`` whose extractor is :class:`SetActorCritic` and whose action net is identity.

    Extra keyword arguments: ``max_groups``, ``max_tenants`` (the padding), ``hidden_width`` and
    ``num_encoder_layers``.
    """

    def __init__(
        self,
        *args: Any,
        max_groups: int,
        max_tenants: int,
        hidden_width: int = 64,
        num_encoder_layers: int = 2,
        **kwargs: Any,
    ) -> None:
        self.set_layout = SetLayout(max_groups=max_groups, max_tenants=max_tenants)
        self.hidden_width = hidden_width
        self.num_encoder_layers = num_encoder_layers
        super().__init__(*args, **kwargs)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(
            max_groups=self.set_layout.max_groups,
            max_tenants=self.set_layout.max_tenants,
            hidden_width=self.hidden_width,
            num_encoder_layers=self.num_encoder_layers,
        )
        return data

    def _build_mlp_extractor(self) -> None:
        # SB3 annotates the attribute as its MlpExtractor; any module with the same latent widths and forward_* fits
        self.mlp_extractor = SetActorCritic(  # type: ignore[assignment]
            self.set_layout, self.hidden_width, self.num_encoder_layers
        )

    def _build(self, lr_schedule: Any) -> None:
        super()._build(lr_schedule)
        # the heads already emit per-slot logits: no shared linear layer over all slots
        self.action_net = nn.Identity()
        extractor = self.mlp_extractor
        assert isinstance(extractor, SetActorCritic)  # set by _build_mlp_extractor
        for head in (extractor.group_head, extractor.tenant_head):
            nn.init.orthogonal_(head.weight, gain=_HEAD_GAIN)
            nn.init.zeros_(head.bias)
        # SB3 types optimizer_class as type[Optimizer], whose base __init__ takes no lr; every concrete one does
        self.optimizer = self.optimizer_class(  # type: ignore[call-arg]
            self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs
        )
