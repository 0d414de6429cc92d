"""Grouped cross-validation of the rule selector's fit on its training rollouts (never on validation or test).

Usage: python experiments/selector_cv.py --experiment EXPERIMENT.yaml --rollouts OUT/rollouts.pkl
       [--folds 5] [--variant '{"hidden_width": 16, "ensemble_members": 5}' ...] [--train-scenarios N ...]

Reads the rollout cache a ``pdctl train`` run of a ``rule_selector`` experiment wrote (``OUT/rollouts.pkl``), splits
its training scenarios into ``--folds`` folds (every scenario's groups, seeds and rate scales in one fold), and for
each variant (the experiment's ``selector`` section with the given fields replaced) fits on all folds but one and
scores the held-out fold with the experiment's labels: the **regret** of a window is ``1 − ratio`` of the rule the
fitted network scores best, where ``ratio`` is that rule's windowed goodput over the best rule's
(:func:`agents.selector_data.selector_targets`), weighted as the fit weighs its samples. Printed per variant: the
mean regret over folds, each fold's, and the weighted share of windows where the pick is the best rule. A row
``constant:RULE`` scores always picking one rule.

``--train-scenarios N`` (repeatable) draws a learning curve: each variant is also fitted on only the first ``N``
(in a fixed shuffled order, seed 0) of each fold's training scenarios and scored on the same held-out fold, so the
rows at growing ``N`` say whether the fit is limited by the number of training scenarios (a regret still falling at
the full count) or not (flat).

It measures how well the network ranks the rules on scenarios it did not see, one window at a time: not the
selector's hysteresis, its pool moves or the watchdog, which only an evaluation on the validation split measures.
"""

from __future__ import annotations

import argparse
import json
import pickle
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.config import SelectorConfig, load_experiment
from agents.selector_data import GroupRollout, SelectorDataset
from agents.selector_fit import fit_recipe, label_recipe
from policies.rule_selector import SelectorNetwork


def _rollouts(path: Path) -> list[GroupRollout]:
    with path.open("rb") as fh:
        cache = pickle.load(fh)  # the run's own output, written by agents.selector_data.cached_rollouts
    return [r for per_task, _ in cache["entries"].values() for r in per_task]


def _base(scenario: str) -> str:
    """The scenario a rollout's name comes from (``default-00007@x1.5``: a rate-scaled ``default-00007``)."""
    return scenario.split("@", 1)[0]


def _labelled(rollouts: list[GroupRollout], scenarios: set[str], selector: SelectorConfig) -> SelectorDataset:
    """The labelled samples of the rollouts of ``scenarios`` (at every rate scale)."""
    return label_recipe([r for r in rollouts if _base(r.scenario) in scenarios], selector)


def _first(scenarios: list[str], count: int | None) -> set[str]:
    """The first ``count`` of ``scenarios`` in a fixed shuffled order (seed 0); all of them for ``None``."""
    order = [scenarios[i] for i in np.random.default_rng(0).permutation(len(scenarios))]
    return set(order if count is None else order[:count])


def main() -> None:
    """Print the cross-validated regret of each variant (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", type=Path, required=True)
    parser.add_argument("--rollouts", type=Path, required=True)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--variant", action="append", default=[], help="JSON: selector fields to replace")
    parser.add_argument(
        "--train-scenarios", action="append", type=int, default=[], help="also fit on only this many (learning curve)"
    )
    args = parser.parse_args()
    if any(n < 1 for n in args.train_scenarios):
        raise SystemExit(f"--train-scenarios: {min(args.train_scenarios)} is not a positive count")
    config = load_experiment(args.experiment)
    base = config.selector
    if base is None:
        raise SystemExit(f"{args.experiment}: not a rule_selector experiment (no selector section)")
    torch.set_num_threads(1)
    cached = _rollouts(args.rollouts)
    rollouts = [r for r in cached if r.rule in base.rules]  # a cache of a run with more candidates: theirs are left
    if len(rollouts) < len(cached):
        print(f"left out {len(cached) - len(rollouts)} rollouts of rules not in the experiment's {base.rules}")
    scenarios = sorted({_base(r.scenario) for r in rollouts})  # a scenario at every rate scale in one fold
    folds = [set(scenarios[i :: args.folds]) for i in range(args.folds)]
    print(f"{len(scenarios)} training scenarios, {args.folds} folds, labels from {args.experiment}")
    runs: list[tuple[str, int | None]] = [("constant:" + base.rules[0], None)]
    for text in ["{}", *args.variant]:
        runs += [(text, None)] + [(text, n) for n in sorted(set(args.train_scenarios))]
    for text, count in runs:
        start = time.perf_counter()
        fields: dict[str, Any] = {} if text.startswith("constant:") else json.loads(text)
        selector = base.model_copy(update=fields)
        regrets, best_shares = [], []
        for fold in folds:
            held_out = _labelled(rollouts, fold, selector)
            if text.startswith("constant:"):
                pick = np.full(len(held_out.inputs), selector.rules.index(text.split(":", 1)[1]))
            else:
                train = _labelled(rollouts, _first(sorted(set(scenarios) - fold), count), selector)
                fit = fit_recipe(train, selector, config.seed)
                network = SelectorNetwork.from_tensors(fit.tensors, len(selector.rules))
                pick = network.scores(held_out.inputs).argmax(1)
            got = held_out.ratios[np.arange(len(pick)), pick]
            w = held_out.weights
            regrets.append(float(((1.0 - got) * w).sum() / w.sum()))
            best_shares.append(float(((got >= 1.0 - 1e-6) * w).sum() / w.sum()))
        label = text if count is None else f"{text} on {count} training scenarios per fold"
        print(
            f"{label}: regret {np.mean(regrets):.4f} (folds {' '.join(f'{r:.3f}' for r in regrets)}), "
            f"best rule picked {np.mean(best_shares):.3f}, {time.perf_counter() - start:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
