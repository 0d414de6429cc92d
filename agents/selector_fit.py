"""Fit and export the rule selector's network (:mod:`policies.rule_selector`) with torch.

:func:`fit_selector` minimises the weighted cross-entropy between the network's rule distribution and the soft
targets of :func:`agents.selector_data.selector_targets` (AdamW, mini-batches, a fixed seed), and returns the
tensors the numpy runtime reads: the same two ReLU layers, so :class:`policies.rule_selector.SelectorNetwork`
scores exactly what the fitted module does. :func:`export_selector` writes the artifact directory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file

from agents.config import SelectorConfig
from agents.selector_data import GroupRollout, SelectorDataset, selector_targets
from policies.learned import MANIFEST_NAME, WEIGHTS_NAME
from policies.rule_selector import GROUP_INPUT_WIDTH, UNVARIED_SCALE, SelectorManifest, SelectorNetwork

__all__ = ["FitResult", "export_selector", "fit_recipe", "fit_selector", "label_recipe"]


@dataclass(frozen=True, slots=True)
class FitResult:
    """The fitted tensors and the loss curve (weighted cross-entropy per epoch)."""

    tensors: dict[str, np.ndarray]
    losses: list[float]
    agreement_frac: float
    """Weighted share of samples whose arg-max rule is the target's arg-max (on the training data)."""


def fit_selector(
    data: SelectorDataset,
    *,
    hidden_width: int,
    epochs: int,
    learning_rate: float,
    weight_decay: float,
    batch_size: int,
    seed: int,
    loss: str = "ratio",
    members: int = 1,
    ratio_expectile: float = 0.5,
) -> FitResult:
    """Fit the selector network to ``data`` (module docstring).

    With ``members`` > 1, that many networks are fitted from seeds ``seed``, ``seed + 1``, …, and their tensors
    are returned under the ``m{k}.`` prefixes :class:`policies.rule_selector.SelectorNetwork` reads as an
    ensemble; the losses are the members' mean per epoch, the agreement the ensemble's.

    ``ratio_expectile`` (``loss="ratio"`` only; 0.5 = the plain fit): each output's loss weighs ``2·τ`` where
    the prediction is below its label and ``2·(1 − τ)`` where it is above, so below 0.5 the network predicts a
    low expectile of each rule's ratio instead of its mean: a rule whose outcome from similar states is spread
    scores lower than one as good on average whose outcome is steady.
    """
    if members < 1:
        raise ValueError(f"members must be >= 1, got {members}")
    if not 0.0 < ratio_expectile < 1.0:
        raise ValueError(f"ratio_expectile must be in (0, 1), got {ratio_expectile}")
    if ratio_expectile != 0.5 and loss != "ratio":
        raise ValueError(f"ratio_expectile needs loss 'ratio', got {loss!r}")
    hyper = _Hyper(hidden_width, epochs, learning_rate, weight_decay, batch_size, loss, ratio_expectile)
    fits = [_fit_one(data, hyper, seed + k) for k in range(members)]
    if members == 1:
        return fits[0]
    tensors = {f"m{k}.{name}": value for k, fit in enumerate(fits) for name, value in fit.tensors.items()}
    network = SelectorNetwork.from_tensors(tensors, data.ratios.shape[1])
    labels = data.targets if loss == "soft_best" else data.ratios
    agree = network.scores(data.inputs).argmax(1) == labels.argmax(1)
    agreement = float((agree * data.weights).sum() / data.weights.sum())
    losses = [float(np.mean([fit.losses[e] for fit in fits])) for e in range(epochs)]
    return FitResult(tensors, losses, agreement)


@dataclass(frozen=True, slots=True)
class _Hyper:
    """:func:`fit_selector`'s settings for every member."""

    hidden_width: int
    epochs: int
    learning_rate: float
    weight_decay: float
    batch_size: int
    loss: str
    ratio_expectile: float


def _fit_one(data: SelectorDataset, hyper: _Hyper, seed: int) -> FitResult:
    """One network (the arithmetic :func:`fit_selector` describes)."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    x = torch.from_numpy(data.inputs)
    y = torch.from_numpy(data.targets if hyper.loss == "soft_best" else data.ratios)
    mask = torch.from_numpy(data.label_mask)
    masked = not bool(data.label_mask.all())
    w = torch.from_numpy(data.weights)
    mean = x.mean(0)
    scale = x.std(0).clamp_min(UNVARIED_SCALE)  # the runtime holds inputs at this scale still
    rules = y.shape[1]
    net = torch.nn.Sequential(
        torch.nn.Linear(GROUP_INPUT_WIDTH, hyper.hidden_width),
        torch.nn.ReLU(),
        torch.nn.Linear(hyper.hidden_width, hyper.hidden_width),
        torch.nn.ReLU(),
        torch.nn.Linear(hyper.hidden_width, rules),
    )
    optimiser = torch.optim.AdamW(net.parameters(), lr=hyper.learning_rate, weight_decay=hyper.weight_decay)
    xs = (x - mean) / scale
    losses: list[float] = []
    for _ in range(hyper.epochs):
        order = torch.randperm(len(xs), generator=generator)
        total = 0.0
        for start in range(0, len(order), hyper.batch_size):
            idx = order[start : start + hyper.batch_size]
            logits = net(xs[idx])
            if hyper.loss == "soft_best":
                per_sample = -(y[idx] * torch.log_softmax(logits, dim=1)).sum(1)
            else:
                per_output = torch.nn.functional.binary_cross_entropy_with_logits(logits, y[idx], reduction="none")
                if hyper.ratio_expectile != 0.5:
                    over = torch.sigmoid(logits.detach()) > y[idx]
                    per_output = per_output * torch.where(
                        over, 2.0 * (1.0 - hyper.ratio_expectile), 2.0 * hyper.ratio_expectile
                    )
                if masked:
                    per_sample = (per_output * mask[idx]).sum(1) / mask[idx].sum(1).clamp_min(1.0)
                else:
                    per_sample = per_output.mean(1)
            batch_loss = (per_sample * w[idx]).sum() / w[idx].sum()
            optimiser.zero_grad()
            batch_loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
            optimiser.step()
            total += float(batch_loss.detach()) * float(w[idx].sum())
        losses.append(total / float(w.sum()))
    with torch.no_grad():
        agree = (net(xs).argmax(1) == y.argmax(1)).float()
        agreement = float((agree * w).sum() / w.sum())
    layers = [m for m in net if isinstance(m, torch.nn.Linear)]
    tensors = {
        "input.mean": mean.numpy().astype(np.float32),
        "input.scale": scale.numpy().astype(np.float32),
    }
    for name, layer in zip(("hidden0", "hidden1", "out"), layers, strict=True):
        tensors[f"{name}.weight"] = layer.weight.detach().numpy().astype(np.float32).copy()
        tensors[f"{name}.bias"] = layer.bias.detach().numpy().astype(np.float32).copy()
    return FitResult(tensors, losses, agreement)


def label_recipe(rollouts: Sequence[GroupRollout], selector: SelectorConfig) -> SelectorDataset:
    """:func:`agents.selector_data.selector_targets` with a recipe's labelling settings (its ``selector`` section)."""
    return selector_targets(
        rollouts,
        selector.rules,
        selector.temperature_frac,
        window_intervals=selector.label_window_intervals,
        share_transfer=selector.share_transfer,
        balance_best_rules=selector.balance_best_rules,
        own_rule_labels=selector.own_rule_labels,
        equal_window_weights=selector.equal_window_weights,
    )


def fit_recipe(data: SelectorDataset, selector: SelectorConfig, seed: int) -> FitResult:
    """:func:`fit_selector` with a recipe's settings (its ``selector`` section) and the experiment's seed."""
    return fit_selector(
        data,
        hidden_width=selector.hidden_width,
        epochs=selector.epochs,
        learning_rate=selector.learning_rate,
        weight_decay=selector.weight_decay,
        batch_size=selector.batch_size,
        seed=seed,
        loss=selector.loss,
        members=selector.ensemble_members,
        ratio_expectile=selector.ratio_expectile,
    )


def export_selector(out: Path, tensors: Mapping[str, np.ndarray], manifest: SelectorManifest) -> Path:
    """Write ``manifest.json`` and ``weights.safetensors`` to ``out`` (created); returns ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(out / WEIGHTS_NAME))
    (out / MANIFEST_NAME).write_text(json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
    return out
