"""The verdict: is P/D disaggregation likely to pay off for this traffic, and if not, what comes first?

Rules, in order (thresholds are the named constants below; ``T`` is the long-context threshold, default 2048),
after a first check that there are at least :data:`MIN_REQUESTS_FOR_VERDICT` requests (else: evaluate, too few):

1. **Short in, short out** (the seed's rule). If at least :data:`NOT_A_PRIORITY_SHORT_SHORT_FRAC` of requests have
   input < ``T`` *and* output < :data:`SHORT_OUTPUT_MAX_TOKENS`, disaggregation is **not a priority**: prefills are
   short enough that chunked prefill hides them and the KV transfer would cost about what it saves. First steps:
   continuous batching, prefix caching, chunked prefill, quantisation, prompt compression.
2. **Long prompts.** The long-context share counts requests whose *uncached* prompt is ≥ ``T`` when prefix reuse
   is known per request (a cached prefix is not prefilled again), else whose prompt is ≥ ``T``. At least
   :data:`PAYS_OFF_LONG_CONTEXT_FRAC` → **likely pays off**: long prefills regularly stall co-batched decodes
   (TPOT spikes) and prefill capacity wants to scale on its own.
3. **Some long prompts.** At least :data:`CONSIDER_LONG_CONTEXT_FRAC`, or fewer but with visible interference
   (TPOT p99/p50 ≥ :data:`TPOT_INTERFERENCE_RATIO`) → **evaluate**: it depends on SLOs and load, so simulate it
   (``pdctl plan``). Interference plus at least :data:`CONSIDER_LONG_CONTEXT_FRAC` upgrades to *likely pays off*.
4. Otherwise → **not a priority** (prompts are short; long outputs are a decode-capacity question).

Modifiers that add reasons and first steps without changing the decision: prefix reuse ≥
:data:`HIGH_PREFIX_REUSE_FRAC` (prefix caching and cache-aware routing), median output <
:data:`SHORT_DECODE_MEDIAN_TOKENS` (little decode to protect: the gain is TTFT and prefill sizing; weigh the KV
transfer), bursty arrivals (inter-arrival CV ≥ :data:`BURSTY_IAT_CV` or peak-to-mean ≥ :data:`BURSTY_PEAK_TO_MEAN`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "BURSTY_IAT_CV",
    "BURSTY_PEAK_TO_MEAN",
    "CONSIDER_LONG_CONTEXT_FRAC",
    "HIGH_PREFIX_REUSE_FRAC",
    "LONG_CONTEXT_THRESHOLD_TOKENS",
    "MIN_REQUESTS_FOR_VERDICT",
    "NOT_A_PRIORITY_SHORT_SHORT_FRAC",
    "PAYS_OFF_LONG_CONTEXT_FRAC",
    "SHORT_DECODE_MEDIAN_TOKENS",
    "SHORT_OUTPUT_MAX_TOKENS",
    "TPOT_INTERFERENCE_RATIO",
    "Decision",
    "Verdict",
    "VerdictInputs",
    "decide_verdict",
]

#: Default long-context threshold (input tokens); ``--long-threshold`` changes it.
LONG_CONTEXT_THRESHOLD_TOKENS = 2048
#: Outputs shorter than this are "short out".
SHORT_OUTPUT_MAX_TOKENS = 256
#: The seed's rule: at this share of short-in/short-out requests, disaggregation is not the priority.
NOT_A_PRIORITY_SHORT_SHORT_FRAC = 0.90
#: Long-context share at which disaggregation likely pays off.
PAYS_OFF_LONG_CONTEXT_FRAC = 0.30
#: Long-context share from which disaggregation is worth evaluating.
CONSIDER_LONG_CONTEXT_FRAC = 0.10
#: TPOT p99/p50 at which prefill-decode interference is considered visible.
TPOT_INTERFERENCE_RATIO = 3.0
#: Share of prompt tokens reusable from a prefix cache that makes prefix caching a first-class step.
HIGH_PREFIX_REUSE_FRAC = 0.30
#: Median output below which there is little decode to protect.
SHORT_DECODE_MEDIAN_TOKENS = 32
#: Inter-arrival CV from which arrivals count as bursty.
BURSTY_IAT_CV = 2.0
#: Peak-to-mean rate (at the profile's bin) from which arrivals count as bursty.
BURSTY_PEAK_TO_MEAN = 2.0
#: Fewer requests than this give no verdict ("evaluate", with the reason).
MIN_REQUESTS_FOR_VERDICT = 100

_SHORT_FIRST_STEPS = (
    "continuous batching (vLLM's default scheduler) with max_num_seqs/max_num_batched_tokens sized for the load",
    "prefix caching (enable_prefix_caching) for shared system prompts and multi-turn history",
    "chunked prefill so that the few longer prompts do not stall decoding",
    "quantisation (FP8 weights and KV cache) for more batch per GPU",
    "prompt compression or trimming of long histories",
)


class Decision(StrEnum):
    """The three verdicts."""

    PAYS_OFF = "likely_pays_off"
    EVALUATE = "evaluate"
    NOT_A_PRIORITY = "not_a_priority"


@dataclass(frozen=True, slots=True)
class VerdictInputs:
    """The profile figures the rules read (fractions in [0, 1]; None = unknown)."""

    num_requests: float
    long_context_threshold_tokens: int
    long_context_frac: float
    uncached_long_context_frac: float | None
    short_short_frac: float
    output_p50_tokens: float
    input_mean_tokens: float
    output_mean_tokens: float
    token_reuse_frac: float | None = None
    iat_cv: float | None = None
    peak_to_mean: float | None = None
    bin_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decision, one headline, the reasons behind it and what to do first."""

    decision: Decision
    headline: str
    reasons: list[str]
    first_steps: list[str]
    thresholds: dict[str, float] = field(default_factory=dict)


def _pct(frac: float) -> str:
    return f"{100.0 * frac:.1f} %"


def _thresholds(threshold_tokens: int) -> dict[str, float]:
    return {
        "long_context_threshold_tokens": float(threshold_tokens),
        "short_output_max_tokens": float(SHORT_OUTPUT_MAX_TOKENS),
        "not_a_priority_short_short_frac": NOT_A_PRIORITY_SHORT_SHORT_FRAC,
        "pays_off_long_context_frac": PAYS_OFF_LONG_CONTEXT_FRAC,
        "consider_long_context_frac": CONSIDER_LONG_CONTEXT_FRAC,
        "tpot_interference_ratio": TPOT_INTERFERENCE_RATIO,
        "high_prefix_reuse_frac": HIGH_PREFIX_REUSE_FRAC,
        "short_decode_median_tokens": float(SHORT_DECODE_MEDIAN_TOKENS),
        "bursty_iat_cv": BURSTY_IAT_CV,
        "bursty_peak_to_mean": BURSTY_PEAK_TO_MEAN,
        "min_requests_for_verdict": float(MIN_REQUESTS_FOR_VERDICT),
    }


def _modifiers(v: VerdictInputs, reasons: list[str], steps: list[str]) -> None:
    if v.token_reuse_frac is not None and v.token_reuse_frac >= HIGH_PREFIX_REUSE_FRAC:
        reasons.append(
            f"{_pct(v.token_reuse_frac)} of prompt tokens are reusable prefixes "
            f"(≥ {_pct(HIGH_PREFIX_REUSE_FRAC)}): cached prefixes skip prefill and KV transfer"
        )
        steps.insert(0, "enable prefix caching and route by prefix (cache-aware instance choice) first")
    if v.output_p50_tokens < SHORT_DECODE_MEDIAN_TOKENS:
        reasons.append(
            f"outputs are very short (median {v.output_p50_tokens:.0f} < {SHORT_DECODE_MEDIAN_TOKENS} tokens): "
            "the gain is prefill isolation (TTFT) and prefill sizing, not TPOT; keep the decode pool small and "
            "check that the KV transfer costs less than it saves"
        )
    bursty = []
    if v.iat_cv is not None and v.iat_cv >= BURSTY_IAT_CV:
        bursty.append(f"inter-arrival CV {v.iat_cv:.2f}")
    if v.peak_to_mean is not None and v.peak_to_mean >= BURSTY_PEAK_TO_MEAN:
        bursty.append(f"peak-to-mean {v.peak_to_mean:.2f} at {v.bin_s:g} s")
    if bursty:
        reasons.append(f"arrivals are bursty ({', '.join(bursty)}): size for the peak or scale pools separately")
        steps.append("set SLO-driven autoscaling (pdctl controller) rather than a static split")


def decide_verdict(v: VerdictInputs) -> Verdict:
    """Apply the rules of this module to the profile figures."""
    reasons: list[str] = []
    steps: list[str] = []
    threshold = v.long_context_threshold_tokens
    long_frac = v.uncached_long_context_frac if v.uncached_long_context_frac is not None else v.long_context_frac
    long_label = "an uncached prompt" if v.uncached_long_context_frac is not None else "a prompt"
    tpot_ratio = (
        v.tpot_p99_s / v.tpot_p50_s
        if v.tpot_p50_s is not None and v.tpot_p99_s is not None and v.tpot_p50_s > 0
        else None
    )
    interference = tpot_ratio is not None and tpot_ratio >= TPOT_INTERFERENCE_RATIO
    if math.isnan(v.short_short_frac) or v.num_requests < MIN_REQUESTS_FOR_VERDICT:
        return Verdict(
            Decision.EVALUATE,
            "Not enough data to judge",
            [f"{v.num_requests:.0f} requests, fewer than the {MIN_REQUESTS_FOR_VERDICT} a verdict needs"],
            ["profile a longer window of traffic"],
            _thresholds(threshold),
        )
    if v.short_short_frac >= NOT_A_PRIORITY_SHORT_SHORT_FRAC:
        decision = Decision.NOT_A_PRIORITY
        reasons.append(
            f"{_pct(v.short_short_frac)} of requests are short in (< {threshold} tokens) and short out "
            f"(< {SHORT_OUTPUT_MAX_TOKENS} tokens), at or above the {_pct(NOT_A_PRIORITY_SHORT_SHORT_FRAC)} rule"
        )
        steps.extend(_SHORT_FIRST_STEPS)
    elif long_frac >= PAYS_OFF_LONG_CONTEXT_FRAC or (interference and long_frac >= CONSIDER_LONG_CONTEXT_FRAC):
        decision = Decision.PAYS_OFF
        reasons.append(
            f"{_pct(long_frac)} of requests have {long_label} ≥ {threshold} tokens "
            f"(≥ {_pct(PAYS_OFF_LONG_CONTEXT_FRAC)} pays off): long prefills stall co-batched decodes"
        )
        steps.append("run pdctl plan to choose the prefill:decode split and routing threshold for your SLO")
    elif long_frac >= CONSIDER_LONG_CONTEXT_FRAC or interference:
        decision = Decision.EVALUATE
        reasons.append(
            f"{_pct(long_frac)} of requests have {long_label} ≥ {threshold} tokens "
            f"(between {_pct(CONSIDER_LONG_CONTEXT_FRAC)} and {_pct(PAYS_OFF_LONG_CONTEXT_FRAC)})"
        )
        steps.append("run pdctl plan: whether the split pays off depends on the SLO and the load")
        steps.append("meanwhile use chunked prefill and route only long prompts remotely (length threshold)")
    else:
        decision = Decision.NOT_A_PRIORITY
        reasons.append(f"only {_pct(long_frac)} of requests have {long_label} ≥ {threshold} tokens: prefills are short")
        steps.extend(_SHORT_FIRST_STEPS)
    if interference and tpot_ratio is not None:
        reasons.append(
            f"TPOT p99/p50 is {tpot_ratio:.1f} (≥ {TPOT_INTERFERENCE_RATIO:g}): "
            "decodes are being stalled, the signature of prefill-decode interference"
        )
    _modifiers(v, reasons, steps)
    share = v.input_mean_tokens / (v.input_mean_tokens + v.output_mean_tokens) if v.input_mean_tokens > 0 else 0.0
    reasons.append(
        f"prompt tokens are {_pct(share)} of all tokens (mean in {v.input_mean_tokens:.0f}, "
        f"out {v.output_mean_tokens:.0f})"
    )
    headline = {
        Decision.PAYS_OFF: "P/D disaggregation is likely to pay off for this traffic",
        Decision.EVALUATE: "P/D disaggregation may pay off: evaluate it against your SLOs",
        Decision.NOT_A_PRIORITY: "P/D disaggregation is not a priority for this traffic",
    }[decision]
    return Verdict(decision, headline, reasons, steps, _thresholds(threshold))
