"""The validation replay: a recommendation is checked on the whole source, on a seed the search did not use.

The search ranks configurations by probes that share one seed (common random numbers) and, with ``--horizon``,
cover only a part of the source. Before a configuration is recommended, :func:`validate` replays it over the
*whole* source (:attr:`agents.planning.inputs.PlanSource.whole`) at its sustainable rate multiplier, run to the
end, on seed ``search seed + VALIDATION_SEED_OFFSET``. If its SLO attainment there misses the target, the next
configuration of the ranking is replayed at its own sustainable multiplier, and so on (at most ``max_tries``);
the first that passes is the recommendation. When none passes, the search's best stays, marked unvalidated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.planning.probes import Probe, run_probe
from agents.planning.result import Capacity
from env.scenario import Scenario

__all__ = ["VALIDATION_SEED_OFFSET", "Validation", "validate"]

VALIDATION_SEED_OFFSET = 1
"""The validation replay's seed is the search's seed plus this (every search probe uses the search's seed)."""


@dataclass(slots=True)
class Validation:
    """The validation replays, in order, and what they recommend."""

    seed: int
    target_frac: float
    replays: list[Probe] = field(default_factory=list)
    recommended: Capacity | None = None
    """The first configuration whose replay met the target (None: none of those tried did)."""

    @property
    def passed(self) -> bool:
        """Whether some configuration passed."""
        return self.recommended is not None

    def as_dict(self) -> dict[str, Any]:
        """JSON form (``plan.json``'s ``validation``)."""
        return {
            "seed": self.seed,
            "target_frac": self.target_frac,
            "passed": self.passed,
            "recommended": None if self.recommended is None else self.recommended.config.label,
            "replays": [
                {
                    "label": p.config.label,
                    "rate_scale": p.rate_scale,
                    "offered_rps": p.offered_rps,
                    "slo_attainment_frac": p.slo_attainment_frac,
                    "goodput_rps": p.goodput_rps,
                    "num_arrived": p.num_arrived,
                    "passed": p.slo_attainment_frac >= self.target_frac,
                }
                for p in self.replays
            ],
        }


def validate(whole: Scenario, ranked: Sequence[Capacity], target_frac: float, max_tries: int = 4) -> Validation:
    """Replay the ranked configurations (best first) over ``whole`` until one meets ``target_frac`` (module doc).

    Configurations that sustained no multiplier are skipped, and so are per-tenant variants of a configuration that
    failed at the same multiplier.
    """
    seed = whole.seed + VALIDATION_SEED_OFFSET
    scenario = whole.model_copy(update={"seed": seed})
    out = Validation(seed=seed, target_frac=target_frac)
    failed: set[tuple[int, int, str, float]] = set()
    for cap in [c for c in ranked if c.lo > 0]:
        split = (cap.config.num_prefill, cap.config.num_decode, cap.config.route, cap.lo)
        if split in failed:  # a per-tenant variant of a configuration that failed at the same rate
            continue
        if len(out.replays) >= max_tries:
            break
        probe = run_probe(scenario, cap.config, cap.lo)
        out.replays.append(probe)
        if probe.slo_attainment_frac >= target_frac:
            out.recommended = cap
            break
        failed.add(split)
    return out
