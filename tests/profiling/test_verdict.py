from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from env.workloads import generate_columns, parse_workload_config
from livestack.profiling import Decision, RequestRecords, profile_records, profile_source
from livestack.profiling.verdict import (
    CONSIDER_LONG_CONTEXT_FRAC,
    HIGH_PREFIX_REUSE_FRAC,
    MIN_REQUESTS_FOR_VERDICT,
    NOT_A_PRIORITY_SHORT_SHORT_FRAC,
    PAYS_OFF_LONG_CONTEXT_FRAC,
    TPOT_INTERFERENCE_RATIO,
    VerdictInputs,
    decide_verdict,
)
from tests.workloads import readme_stats as readme

SHORT_CHAT = {
    "kind": "poisson",
    "rate_rps": 5.0,
    "input_tokens": {"kind": "lognormal", "median_tokens": 250, "sigma": 0.7},
    "output_tokens": {"kind": "lognormal", "median_tokens": 90, "sigma": 0.6},
}

BASE = VerdictInputs(
    num_requests=1000,
    long_context_threshold_tokens=2048,
    long_context_frac=0.05,
    uncached_long_context_frac=None,
    short_short_frac=0.5,
    output_p50_tokens=200,
    input_mean_tokens=800,
    output_mean_tokens=200,
)


def test_short_chat_is_not_a_priority() -> None:
    columns = generate_columns(parse_workload_config(SHORT_CHAT), np.random.default_rng(0), 600)
    profile = profile_records(RequestRecords.from_columns(columns, tenant="chat"), source="synthetic chat")
    assert profile.short_short_frac >= NOT_A_PRIORITY_SHORT_SHORT_FRAC
    assert profile.verdict.decision is Decision.NOT_A_PRIORITY
    assert "not a priority" in profile.verdict.headline
    steps = " ".join(profile.verdict.first_steps)
    for step in ("continuous batching", "prefix caching", "chunked prefill", "quantisation", "prompt compression"):
        assert step in steps
    assert any("short in" in reason for reason in profile.verdict.reasons)


def test_azure_code_pays_off_with_short_output_caveat(traces_dir: Path) -> None:
    profile = profile_source(str(traces_dir / readme.AZURE_CODE.file))
    assert profile.verdict.decision is Decision.PAYS_OFF
    reasons = " ".join(profile.verdict.reasons)
    assert "37.5 %" in reasons
    assert "outputs are very short" in reasons
    assert "bursty" in reasons


def test_mooncake_conversation_pays_off_with_prefix_caching_first(traces_dir: Path) -> None:
    profile = profile_source(str(traces_dir / readme.MOONCAKE_CONVERSATION.file))
    assert profile.verdict.decision is Decision.PAYS_OFF
    assert profile.uncached_long_context_frac is not None
    assert profile.uncached_long_context_frac >= PAYS_OFF_LONG_CONTEXT_FRAC
    assert "prefix caching" in profile.verdict.first_steps[0]
    assert any("quantised" in note for note in profile.notes)
    assert not any("inter-arrival CV" in reason for reason in profile.verdict.reasons)


def test_azure_conversation_is_worth_evaluating(traces_dir: Path) -> None:
    assert profile_source(str(traces_dir / readme.AZURE_CONV.file)).verdict.decision is Decision.EVALUATE


@pytest.mark.parametrize(
    ("changes", "decision"),
    [
        ({"short_short_frac": NOT_A_PRIORITY_SHORT_SHORT_FRAC}, Decision.NOT_A_PRIORITY),
        ({"short_short_frac": 0.89, "long_context_frac": PAYS_OFF_LONG_CONTEXT_FRAC}, Decision.PAYS_OFF),
        ({"long_context_frac": PAYS_OFF_LONG_CONTEXT_FRAC - 0.01}, Decision.EVALUATE),
        ({"long_context_frac": CONSIDER_LONG_CONTEXT_FRAC}, Decision.EVALUATE),
        ({"long_context_frac": CONSIDER_LONG_CONTEXT_FRAC - 0.01}, Decision.NOT_A_PRIORITY),
        # the uncached share decides when known
        ({"long_context_frac": 0.8, "uncached_long_context_frac": 0.05}, Decision.NOT_A_PRIORITY),
        # visible interference: evaluate below 10 %, pays off from 10 %
        (
            {"long_context_frac": 0.02, "tpot_p50_s": 0.02, "tpot_p99_s": 0.02 * TPOT_INTERFERENCE_RATIO},
            Decision.EVALUATE,
        ),
        ({"long_context_frac": 0.15, "tpot_p50_s": 0.02, "tpot_p99_s": 0.1}, Decision.PAYS_OFF),
        ({"long_context_frac": 0.15, "tpot_p50_s": 0.02, "tpot_p99_s": 0.03}, Decision.EVALUATE),
        ({"num_requests": 0}, Decision.EVALUATE),
        ({"num_requests": MIN_REQUESTS_FOR_VERDICT - 1, "short_short_frac": 1.0}, Decision.EVALUATE),
        ({"num_requests": MIN_REQUESTS_FOR_VERDICT, "short_short_frac": 1.0}, Decision.NOT_A_PRIORITY),
    ],
)
def test_rules(changes: dict[str, Any], decision: Decision) -> None:
    verdict = decide_verdict(dataclasses.replace(BASE, **changes))
    assert verdict.decision is decision
    assert verdict.reasons
    assert verdict.thresholds["not_a_priority_short_short_frac"] == NOT_A_PRIORITY_SHORT_SHORT_FRAC


def test_modifiers_add_reasons_not_decisions() -> None:
    plain = decide_verdict(dataclasses.replace(BASE, long_context_frac=0.5))
    rich = decide_verdict(
        dataclasses.replace(
            BASE, long_context_frac=0.5, token_reuse_frac=HIGH_PREFIX_REUSE_FRAC, iat_cv=3.0, peak_to_mean=1.1, bin_s=60
        )
    )
    assert plain.decision is rich.decision is Decision.PAYS_OFF
    assert len(rich.reasons) == len(plain.reasons) + 2
    assert rich.first_steps[0].startswith("enable prefix caching")
