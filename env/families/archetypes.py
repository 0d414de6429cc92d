"""Tenant archetypes: request lengths, burstiness, shared prefixes, objectives and weight of six kinds of traffic.

Lengths are log-normal distributions fitted to the public traces' statistics (``../shared/traces/README.md``), so
a generated scenario needs no trace file:

============  ======================================================================================  =========
archetype     fitted to                                                                               arrivals
============  ======================================================================================  =========
``chat``      Azure 2023 conversation: input p50 1,020 / p90 2,735 (max 14,050), output p50 129 / p90   Poisson
              424 (max 1,000); inter-arrival CV 1.09
``agent``     Mooncake tool-agent trace (README averages: input 8,596, output 182); tool definitions    Gamma CV 2
              as a few shared 4k-token prefixes
``rag``       long-context retrieval: 7k-token prompts sharing 20 document prefixes (as the shipped      Gamma CV 2
              ``rag-longctx-8``), inputs p99 within Mooncake conversation's 27k p90
``batch``     summarization: 3k-token documents, 400-token summaries; loose objectives, low priority    Gamma CV 1.5
``code``      Azure 2023 code: input p50 1,469 / p90 5,188 (max 7,437), output p50 13 / p90 55 (max     Gamma CV 2
              1,899); inter-arrival CV 13.2 in the trace, kept at 2 so a short episode is not a few
              bursts
``multiturn`` Mooncake FAST'25 conversation: input p50 6,909 / mean 12,035 (clipped at 64 Ki), output    Poisson
              p50 350 / mean 343; 37 % of prompt blocks reused, as shared conversation prefixes
============  ======================================================================================  =========

Objectives follow the shipped scenarios (``experiments/scenarios/README.md``); a family scales them (tightness)
and the priorities per tenant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ARCHETYPES", "Archetype", "ArchetypeName", "LogNormalSpec", "PrefixSpec"]

ArchetypeName = Literal["chat", "agent", "rag", "batch", "code", "multiturn"]
"""The archetype names a family weights."""


@dataclass(frozen=True, slots=True)
class LogNormalSpec:
    """A clipped log-normal length (tokens): median, log standard deviation, clip bounds."""

    median_tokens: float
    sigma: float
    min_tokens: int
    max_tokens: int

    def as_config(self) -> dict[str, object]:
        """As a scenario's ``lognormal`` length mapping."""
        return {
            "kind": "lognormal",
            "median_tokens": self.median_tokens,
            "sigma": self.sigma,
            "min_tokens": self.min_tokens,
            "max_tokens": self.max_tokens,
        }


@dataclass(frozen=True, slots=True)
class PrefixSpec:
    """Shared prompt prefixes (as a scenario's ``prefix`` block)."""

    num_prefixes: int
    prefix_tokens: int
    share_frac: float

    def as_config(self) -> dict[str, object]:
        """As a scenario's ``prefix`` mapping (512-token hash blocks)."""
        return {
            "num_prefixes": self.num_prefixes,
            "prefix_tokens": self.prefix_tokens,
            "share_frac": self.share_frac,
            "block_tokens": 512,
        }


@dataclass(frozen=True, slots=True)
class Archetype:
    """One kind of tenant traffic.

    Attributes:
        name: archetype name (also the stem of generated tenant names).
        input_tokens: prompt lengths.
        output_tokens: output lengths.
        arrival_cv: coefficient of variation of inter-arrival times (1 = Poisson, above 1 bursty).
        prefix: shared prefixes, or None.
        ttft_p95_s: TTFT objective (p95) before the family's tightness scale.
        ttft_p99_s: optional p99 TTFT objective.
        tpot_s: TPOT objective before scaling.
        tpot_quantile: which TPOT quantile the objective is on (95 or 99).
        priority: priority before the family's scale.
        short: whether the traffic is short prompts (a flood draws short tenants).
    """

    name: ArchetypeName
    input_tokens: LogNormalSpec
    output_tokens: LogNormalSpec
    arrival_cv: float
    prefix: PrefixSpec | None
    ttft_p95_s: float
    ttft_p99_s: float | None
    tpot_s: float
    tpot_quantile: Literal[95, 99]
    priority: float
    short: bool


ARCHETYPES: dict[str, Archetype] = {
    "chat": Archetype(
        "chat",
        LogNormalSpec(1020, 0.75, 16, 14050),
        LogNormalSpec(129, 0.9, 1, 1000),
        1.0,
        None,
        1.0,
        2.0,
        0.06,
        95,
        2.0,
        True,
    ),
    "agent": Archetype(
        "agent",
        LogNormalSpec(6200, 0.8, 256, 32768),
        LogNormalSpec(130, 0.8, 1, 2048),
        2.0,
        PrefixSpec(4, 4096, 0.9),
        2.0,
        None,
        0.06,
        99,
        1.5,
        False,
    ),
    "rag": Archetype(
        "rag",
        LogNormalSpec(7000, 0.5, 1024, 32768),
        LogNormalSpec(300, 0.6, 1, 2048),
        2.0,
        PrefixSpec(20, 4096, 0.6),
        4.0,
        None,
        0.08,
        95,
        1.0,
        False,
    ),
    "batch": Archetype(
        "batch",
        LogNormalSpec(3000, 0.6, 256, 16384),
        LogNormalSpec(400, 0.5, 16, 2048),
        1.5,
        None,
        30.0,
        None,
        0.2,
        95,
        0.5,
        False,
    ),
    "code": Archetype(
        "code",
        LogNormalSpec(1469, 0.98, 16, 7437),
        LogNormalSpec(13, 1.1, 1, 1899),
        2.0,
        None,
        1.0,
        None,
        0.06,
        99,
        1.5,
        True,
    ),
    "multiturn": Archetype(
        "multiturn",
        LogNormalSpec(6909, 1.05, 128, 65536),
        LogNormalSpec(350, 0.5, 1, 2000),
        1.0,
        PrefixSpec(64, 4096, 0.4),
        6.0,
        None,
        0.08,
        95,
        1.0,
        False,
    ),
}
"""The archetypes by name (see the module docstring for what each is fitted to)."""
