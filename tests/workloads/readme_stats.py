"""Statistics stated in ../shared/traces/README.md (summary table and sections 1-3), copied as constants.

Rates are (N-1)/span; token percentiles use numpy's linear interpolation; "long" = input >= 2048 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TraceStats:
    file: str
    rows: int
    span_s: float
    rate_rps: float
    input_mean: float
    input_p50: float
    input_p90: float
    input_p99: float
    input_max: int
    output_mean: float
    output_p50: float
    output_p90: float
    output_p99: float
    output_max: int
    long_pct: float
    block_reuse_pct: float | None = None
    token_reuse_pct: float | None = None


AZURE_CODE = TraceStats(
    "azure_llm_2023/AzureLLMInferenceTrace_code.csv",
    8_819,
    3_436,
    2.57,
    2_048,
    1_469,
    5_188,
    7_436,
    7_437,
    27.9,
    13,
    55,
    251,
    1_899,
    37.5,
)
AZURE_CONV = TraceStats(
    "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
    19_366,
    3_502,
    5.53,
    1_155,
    1_020,
    2_735,
    4_142,
    14_050,
    211,
    129,
    424,
    601,
    1_000,
    14.0,
)
MOONCAKE_CONVERSATION = TraceStats(
    "mooncake_fast25/conversation_trace.jsonl",
    12_031,
    3_537,
    3.40,
    12_035,
    6_909,
    27_367,
    85_400,
    126_195,
    343,
    350,
    597,
    1_119,
    2_000,
    76.7,
    36.6,
    37.4,
)
MOONCAKE_SYNTHETIC = TraceStats(
    "mooncake_fast25/synthetic_trace.jsonl",
    3_993,
    1_022,
    3.91,
    15_325,
    11_587,
    38_611,
    66_456,
    191_378,
    149,
    69,
    389,
    768,
    893,
    67.4,
    64.0,
    65.1,
)
AZURE_CODE_IAT_CV = 13.2
AZURE_CONV_IAT_CV = 1.09
MOONCAKE_SYNTHETIC_IAT_CV = 1.01
MOONCAKE_CONVERSATION_BLOCKS = 288_500
MOONCAKE_CONVERSATION_UNIQUE_BLOCKS = 182_790
MOONCAKE_SYNTHETIC_BLOCKS = 121_877
MOONCAKE_SYNTHETIC_UNIQUE_BLOCKS = 43_924

# ServeGen DeepSeek-R1 (section 3): 73 clients x 144 windows of 600 s; aggregate rate mean 16.0 (min 4.3, max 42.5);
# tokens from the rate-weighted PMF mixture over the 4 dataset windows.
SERVEGEN_CLIENTS = 73
SERVEGEN_WINDOWS = 144
SERVEGEN_RATE_MEAN_RPS = 16.0
SERVEGEN_RATE_MIN_RPS = 4.3
SERVEGEN_RATE_MAX_RPS = 42.5
SERVEGEN_INPUT = (1_576, 180, 3_473, 26_836)  # mean, p50, p90, p99
SERVEGEN_OUTPUT = (2_133, 1_014, 5_423, 15_063)
SERVEGEN_OUTPUT_MAX = 32_768
SERVEGEN_LONG_PCT = 12.7

TRACES = (AZURE_CODE, AZURE_CONV, MOONCAKE_CONVERSATION, MOONCAKE_SYNTHETIC)


def within_rounding(value: float, stated: float) -> bool:
    """True when ``value`` rounds to ``stated`` at the precision ``stated`` is written with (>= 0.5 units slack)."""
    text = repr(float(stated))
    decimals = 0 if float(stated).is_integer() else len(text.split(".")[1])
    return abs(value - stated) <= 0.5 * 10.0**-decimals + 1e-9
