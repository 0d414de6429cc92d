"""A paired comparison of two policies over a scenario set: the geometric-mean goodput ratio and its spread.

Two policies run on the same scenarios (and seeds) are compared scenario by scenario: the ratio of their
priority-weighted goodputs, summarised by its geometric mean. How far that mean can be trusted depends on how
much the per-scenario ratios scatter, so :func:`paired_ratio` adds a **percentile bootstrap** interval: the
scenarios are resampled with replacement ``draws`` times (a seeded generator, so the interval reproduces) and the
geometric mean is recomputed on each resample.

The interval answers "would another draw of scenarios like these give the same sign?", not "would another
training run give the same policy": a recipe's fit-to-fit spread (``experiments/results/families/README-learned.md``,
tenth session) is a separate source of noise that only more fits measure. Scenarios where either policy's goodput
is zero have no finite ratio and are left out (counted in :attr:`PairedRatio.skipped`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["PairedRatio", "paired_ratio"]


@dataclass(frozen=True, slots=True)
class PairedRatio:
    """Policy A against policy B over the scenarios both ran.

    Attributes:
        ratio: geometric mean over scenarios of goodput A / goodput B.
        low: lower end of the bootstrap interval of that mean.
        high: upper end.
        scenarios: scenarios compared.
        skipped: scenarios left out (either goodput zero).
        wins: scenarios where A's goodput is above B's.
        losses: scenarios where it is below.
    """

    ratio: float
    low: float
    high: float
    scenarios: int
    skipped: int
    wins: int
    losses: int

    def describe(self, level: float) -> str:
        """``1.023 (95 % interval 0.991–1.057; 12 up, 9 down of 36)``."""
        skipped = f", {self.skipped} left out (zero goodput)" if self.skipped else ""
        return (
            f"{self.ratio:.3f} ({level:.0%} interval {self.low:.3f}–{self.high:.3f}; {self.wins} up, "
            f"{self.losses} down of {self.scenarios}{skipped})"
        )


def paired_ratio(
    goodput_a: Mapping[str, float],
    goodput_b: Mapping[str, float],
    *,
    draws: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
) -> PairedRatio:
    """Geometric-mean ratio A / B over the scenarios both have, with a percentile bootstrap interval.

    Args:
        goodput_a: per scenario, policy A's goodput (any positive unit; seeds already averaged).
        goodput_b: the same for policy B.
        draws: bootstrap resamples.
        level: coverage of the interval (0.95: the 2.5th to the 97.5th percentile).
        seed: seed of the resampling.

    Raises:
        ValueError: a parameter out of range, a negative or non-finite goodput, or no scenario with both goodputs
            positive (one line naming it).
    """
    if draws < 1:
        raise ValueError(f"paired_ratio draws must be >= 1, got {draws}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"paired_ratio level must be within (0, 1), got {level}")
    logs: list[float] = []
    skipped = 0
    for scenario in sorted(set(goodput_a) & set(goodput_b)):
        a, b = goodput_a[scenario], goodput_b[scenario]
        for value in (a, b):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"paired_ratio: scenario {scenario} has goodput {value!r} (need finite and >= 0)")
        if a == 0 or b == 0:
            skipped += 1
            continue
        logs.append(math.log(a / b))
    if not logs:
        raise ValueError("paired_ratio: no scenario where both policies have a positive goodput")
    values = np.asarray(logs, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(draws, len(values)))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return PairedRatio(
        ratio=math.exp(float(values.mean())),
        low=math.exp(float(low)),
        high=math.exp(float(high)),
        scenarios=len(logs),
        skipped=skipped,
        wins=int(np.count_nonzero(values > 0)),
        losses=int(np.count_nonzero(values < 0)),
    )
