"""Grouped cross-validation of the rule selector's fit on its training rollouts (never on validation or test).

Usage: python experiments/selector_cv.py --experiment EXPERIMENT.yaml --rollouts OUT/rollouts.pkl
       [--folds 5] [--variant '{"hidden_width": 16, "ensemble_members": 5}' ...] [--train-scenarios N ...]
       [--switches]

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

``--switches`` adds, per fitted variant, what acting on the fit would do to the windows of the held-out folds run under
the first rule (the rule a group starts with): a window *switches* when the best-scored rule is another one whose
mean predicted ratio beats the first rule's by the recipe's ``switch_margin_frac``; printed are the switched share
of the window weight, the realized gain (the switched-to rule's ratio less the first rule's) per window of all the
weight, the mean gain of a switched window, and the share of switched weight that loses (gain below 0) and that
loses more than 0.3. For an ensemble (``ensemble_members`` above 1) a second line counts only the switches every
member agrees on (each predicts the switched-to rule above the first), an offline look at whether the members'
disagreement marks the losing switches; the selector itself acts on the mean alone.

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


LOSS_LINE = 0.3
"""A switched window losing more than this ratio to the first rule is counted apart (``--switches``)."""


def switch_sums(
    member_ratios: np.ndarray, ratios: np.ndarray, weights: np.ndarray, margin: float, all_agree: bool
) -> np.ndarray:
    """Weighted sums over windows of switching off rule 0 (module docstring, ``--switches``).

    Args:
        member_ratios: each member's predicted goodput ratios ``[members, windows, rules]``.
        ratios: the realized ratios ``[windows, rules]`` (each rule's windowed goodput over the best rule's).
        weights: the windows' sample weights.
        margin: how much the mean predicted ratio of the switched-to rule must beat rule 0's.
        all_agree: count only the switches every member predicts above rule 0.

    Returns:
        ``[switched weight, realized gain, losing weight, weight losing more than LOSS_LINE, total weight]``.
    """
    mean = member_ratios.mean(0)
    windows = np.arange(len(mean))
    pick = mean.argmax(1)
    switched = (pick != 0) & (mean[windows, pick] - mean[:, 0] > margin)
    if all_agree:
        switched &= (member_ratios[:, windows, pick] > member_ratios[:, :, 0]).all(0)
    gain = ratios[windows, pick] - ratios[:, 0]
    w = np.where(switched, weights, 0.0)
    return np.array([w.sum(), (w * gain).sum(), w[gain < 0].sum(), w[gain < -LOSS_LINE].sum(), weights.sum()])


def _switch_line(label: str, sums: np.ndarray) -> str:
    switched, gain, losing, losing_big, total = sums
    per_switch = gain / switched if switched > 0 else 0.0
    losing_frac = losing / switched if switched > 0 else 0.0
    big_frac = losing_big / switched if switched > 0 else 0.0
    return (
        f"  {label}: switched {switched / total:.3f} of the weight, gain {gain / total:.4f} per window "
        f"({per_switch:.3f} per switched window), losing {losing_frac:.3f} of the switched, "
        f"by more than {LOSS_LINE} {big_frac:.3f}"
    )


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
    parser.add_argument("--switches", action="store_true", help="also what switching off the first rule gains")
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
        switches = {agree: np.zeros(5) for agree in (False, True)}
        for fold in folds:
            held_out = _labelled(rollouts, fold, selector)
            if text.startswith("constant:"):
                pick = np.full(len(held_out.inputs), selector.rules.index(text.split(":", 1)[1]))
            else:
                train = _labelled(rollouts, _first(sorted(set(scenarios) - fold), count), selector)
                fit = fit_recipe(train, selector, config.seed)
                network = SelectorNetwork.from_tensors(fit.tensors, len(selector.rules))
                pick = network.scores(held_out.inputs).argmax(1)
                if args.switches:
                    member_ratios = network.member_ratios(held_out.inputs)
                    for agree in switches:
                        switches[agree] += switch_sums(
                            member_ratios, held_out.ratios, held_out.weights, selector.switch_margin_frac, agree
                        )
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
        if args.switches and not text.startswith("constant:"):
            print(
                _switch_line(
                    f"switches off {selector.rules[0]} (margin {selector.switch_margin_frac})", switches[False]
                )
            )
            if selector.ensemble_members > 1:
                print(_switch_line("those every member agrees on", switches[True]), flush=True)


if __name__ == "__main__":
    main()
