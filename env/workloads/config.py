"""Workload configuration: what a tenant's request stream looks like, as a pydantic discriminated union.

A scenario names one :data:`WorkloadConfig` per tenant. The union is discriminated on ``kind``:

==================  ======================================================================================
``kind``            request stream
==================  ======================================================================================
``poisson``         Poisson arrivals at ``rate_rps``
``gamma``           renewal process with Gamma inter-arrival times (``cv`` > 1 is bursty, ``cv`` = 1 Poisson)
``diurnal``         inhomogeneous Poisson with a cosine rate curve (``mean_rate_rps``, ``peak_to_mean``, period)
``step``            piecewise-constant rate (and optionally length mix) in segments ``(start_s, rate_rps)``
``trace_azure``     replay of an Azure LLM inference 2023 CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``)
``trace_mooncake``  replay of a Mooncake FAST'25 JSONL trace, keeping its 512-token prefix-block ``hash_ids``
``servegen``        requests sampled from a ServeGen folder of per-client rate and length distributions
==================  ======================================================================================

Synthetic kinds carry ``input_tokens`` and ``output_tokens`` length distributions (``fixed``, ``lognormal``,
``empirical``), each clipped to ``[min_tokens, max_tokens]``, and optionally shared prompt prefixes (``prefix``,
as Mooncake-style ``hash_ids``). Trace kinds carry a window (``start_s``, ``duration_s``, in the trace's own time,
from its first request), a ``rate_scale`` (time compression: 2.0 replays the window twice as fast, doubling the
rate) and an optional ``max_requests``; the two replays may ``repeat`` their window back to back to fill a longer
horizon.

Paths in a config are taken as written; :func:`resolve_paths` makes relative ones absolute against a base folder
(a scenario file's folder). All models are frozen and refuse unknown keys.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

__all__ = [
    "AzureTraceWorkload",
    "DiurnalWorkload",
    "EmpiricalLength",
    "FixedLength",
    "GammaWorkload",
    "LengthDistribution",
    "LognormalLength",
    "MooncakeTraceWorkload",
    "PoissonWorkload",
    "PrefixSharing",
    "ServeGenWorkload",
    "StepSegment",
    "StepWorkload",
    "SyntheticWorkload",
    "TraceWorkload",
    "WorkloadConfig",
    "parse_workload_config",
    "resolve_paths",
]

#: z-score of the 95th percentile of a standard normal distribution.
_Z95 = 1.6448536269514722
#: Default upper clip of sampled lengths (tokens); long-context models serve up to 128 Ki tokens.
DEFAULT_MAX_TOKENS = 131_072


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ----------------------------------------------------------------------------------------------- lengths


class FixedLength(_Frozen):
    """Every request has the same length."""

    kind: Literal["fixed"] = "fixed"
    tokens: int = Field(gt=0, description="The length, in tokens.")


class LognormalLength(_Frozen):
    """Log-normal lengths, given either by ``median_tokens`` and ``sigma`` or by ``mean_tokens`` and ``p95_tokens``.

    Samples are rounded to integers and clipped to ``[min_tokens, max_tokens]`` (clipping moves the mean a little
    when the bounds cut into the distribution).
    """

    kind: Literal["lognormal"] = "lognormal"
    median_tokens: float | None = Field(default=None, gt=0, description="Median length (tokens); needs `sigma`.")
    sigma: float | None = Field(default=None, gt=0, description="Standard deviation of the log length.")
    mean_tokens: float | None = Field(default=None, gt=0, description="Mean length (tokens); needs `p95_tokens`.")
    p95_tokens: float | None = Field(default=None, gt=0, description="95th-percentile length (tokens).")
    min_tokens: int = Field(default=1, ge=1, description="Lower clip (tokens).")
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1, description="Upper clip (tokens).")

    @model_validator(mode="after")
    def _one_parametrisation(self) -> LognormalLength:
        by_median = self.median_tokens is not None or self.sigma is not None
        by_mean = self.mean_tokens is not None or self.p95_tokens is not None
        if by_median == by_mean:
            raise ValueError("give either median_tokens and sigma, or mean_tokens and p95_tokens")
        if by_median and (self.median_tokens is None or self.sigma is None):
            raise ValueError("median_tokens and sigma go together")
        if by_mean:
            if self.mean_tokens is None or self.p95_tokens is None:
                raise ValueError("mean_tokens and p95_tokens go together")
            log_ratio = math.log(self.p95_tokens / self.mean_tokens)
            if log_ratio <= 0.0:
                raise ValueError("p95_tokens must exceed mean_tokens for a log-normal")
            if log_ratio >= _Z95 * _Z95 / 2.0:
                raise ValueError(
                    f"no log-normal has mean {self.mean_tokens:g} and p95 {self.p95_tokens:g} "
                    f"(p95/mean must be below {math.exp(_Z95 * _Z95 / 2.0):.3f})"
                )
        if self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must not exceed max_tokens")
        return self

    def log_params(self) -> tuple[float, float]:
        """Return ``(mu, sigma)`` of the underlying normal distribution of the log length."""
        if self.median_tokens is not None and self.sigma is not None:
            return math.log(self.median_tokens), self.sigma
        assert self.mean_tokens is not None
        assert self.p95_tokens is not None
        # mean = exp(mu + s²/2), p95 = exp(mu + z·s)  ⇒  s²/2 − z·s + ln(p95/mean) = 0; the smaller root.
        log_ratio = math.log(self.p95_tokens / self.mean_tokens)
        sigma = _Z95 - math.sqrt(_Z95 * _Z95 - 2.0 * log_ratio)
        return math.log(self.mean_tokens) - sigma * sigma / 2.0, sigma


class EmpiricalLength(_Frozen):
    """Lengths resampled (with replacement) from observed values: a trace file's column or an inline list.

    ``path`` + ``column`` reads a column of a CSV file with a header (e.g. ``ContextTokens`` of an Azure trace) or a
    field of a JSONL file (e.g. ``input_length`` of a Mooncake trace).
    """

    kind: Literal["empirical"] = "empirical"
    path: Path | None = Field(default=None, description="CSV (with header) or JSONL file holding the column.")
    column: str | None = Field(default=None, description="Column (CSV) or field (JSONL) name.")
    values: tuple[int, ...] | None = Field(default=None, min_length=1, description="Inline observed lengths.")
    min_tokens: int = Field(default=1, ge=1, description="Lower clip (tokens).")
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1, description="Upper clip (tokens).")

    @model_validator(mode="after")
    def _one_source(self) -> EmpiricalLength:
        from_file = self.path is not None or self.column is not None
        if from_file == (self.values is not None):
            raise ValueError("give either path and column, or values")
        if from_file and (self.path is None or self.column is None):
            raise ValueError("path and column go together")
        if self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must not exceed max_tokens")
        return self


LengthDistribution = Annotated[FixedLength | LognormalLength | EmpiricalLength, Field(discriminator="kind")]
"""A token-length distribution, discriminated on ``kind``."""


class PrefixSharing(_Frozen):
    """Shared prompt prefixes for synthetic requests, expressed as prefix-block ``hash_ids``.

    Each request, with probability ``share_frac``, starts with one of ``num_prefixes`` shared prefixes (chosen
    uniformly) of ``prefix_tokens`` tokens (a system prompt or a document); the rest of its prompt is unique. The
    hash ids follow the Mooncake convention: one id per ``block_tokens`` block, chained by prefix.
    """

    num_prefixes: int = Field(default=1, ge=1, description="Number of distinct shared prefixes.")
    prefix_tokens: int = Field(gt=0, description="Length of each shared prefix (tokens).")
    share_frac: float = Field(default=1.0, ge=0.0, le=1.0, description="Fraction of requests that use a prefix.")
    block_tokens: int = Field(default=512, gt=0, description="Tokens per hash block.")


# --------------------------------------------------------------------------------------- synthetic kinds


class _Synthetic(_Frozen):
    input_tokens: LengthDistribution = Field(description="Prompt length distribution.")
    output_tokens: LengthDistribution = Field(description="Output length distribution.")
    prefix: PrefixSharing | None = Field(default=None, description="Shared prefixes (hash_ids); none by default.")
    model: str = Field(default="", description="Served model name the requests ask for.")


class PoissonWorkload(_Synthetic):
    """Poisson arrivals (exponential inter-arrival times, CV 1)."""

    kind: Literal["poisson"] = "poisson"
    rate_rps: float = Field(gt=0, description="Mean arrival rate (requests/s).")


class GammaWorkload(_Synthetic):
    """Renewal arrivals with Gamma inter-arrival times: mean ``1/rate_rps``, coefficient of variation ``cv``."""

    kind: Literal["gamma"] = "gamma"
    rate_rps: float = Field(gt=0, description="Mean arrival rate (requests/s).")
    cv: float = Field(gt=0, description="Coefficient of variation of inter-arrival times (1 = Poisson, >1 bursty).")


class DiurnalWorkload(_Synthetic):
    """Inhomogeneous Poisson arrivals with rate ``mean·(1 + (peak_to_mean − 1)·cos(2π(t − phase_s)/period_s))``."""

    kind: Literal["diurnal"] = "diurnal"
    mean_rate_rps: float = Field(gt=0, description="Rate averaged over a period (requests/s).")
    peak_to_mean: float = Field(
        ge=1.0, le=2.0, description="Peak rate / mean rate; 2 makes the trough rate zero, 1 is flat."
    )
    period_s: float = Field(default=86_400.0, gt=0, description="Length of one cycle (s).")
    phase_s: float = Field(default=0.0, description="Time of a peak (s): the rate peaks at phase_s + k·period_s.")


class StepSegment(_Frozen):
    """One segment of a step workload: from ``start_s`` on, arrivals at ``rate_rps``, optionally another length mix.

    In YAML a segment may be written as a pair ``[start_s, rate_rps]``.
    """

    start_s: float = Field(ge=0, description="Start of the segment (s).")
    rate_rps: float = Field(ge=0, description="Poisson arrival rate in this segment (requests/s); 0 = silence.")
    input_tokens: LengthDistribution | None = Field(default=None, description="Prompt lengths here (else default).")
    output_tokens: LengthDistribution | None = Field(default=None, description="Output lengths here (else default).")

    @model_validator(mode="before")
    @classmethod
    def _from_pair(cls, data: Any) -> Any:
        if isinstance(data, list | tuple) and len(data) == 2:
            return {"start_s": data[0], "rate_rps": data[1]}
        return data


class StepWorkload(_Synthetic):
    """Piecewise-constant Poisson rate: step changes of rate and, per segment, of the length mix."""

    kind: Literal["step"] = "step"
    segments: tuple[StepSegment, ...] = Field(min_length=1, description="Segments, by increasing start_s from 0.")

    @model_validator(mode="after")
    def _ordered(self) -> StepWorkload:
        starts = [segment.start_s for segment in self.segments]
        if starts[0] != 0.0:
            raise ValueError("the first segment must start at 0")
        if any(b <= a for a, b in itertools.pairwise(starts)):
            raise ValueError("segment start_s values must increase strictly")
        return self


# ------------------------------------------------------------------------------------------- trace kinds


class _Trace(_Frozen):
    path: Path = Field(description="Trace file or folder.")
    start_s: float = Field(default=0.0, ge=0, description="Window start, seconds after the trace's first request.")
    duration_s: float | None = Field(default=None, gt=0, description="Window length in trace time (s); None = all.")
    rate_scale: float = Field(
        default=1.0, gt=0, description="Time compression: arrival offsets are divided by it (2 = twice the rate)."
    )
    max_requests: int | None = Field(default=None, gt=0, description="Keep at most this many requests.")
    model: str = Field(default="", description="Served model name the requests ask for.")


class _Replay(_Trace):
    repeat: bool = Field(
        default=False,
        description="Replay the window again, back to back, until the horizon (hash ids offset per repetition).",
    )


class AzureTraceWorkload(_Replay):
    """Replay of an Azure LLM inference 2023 CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    ``path`` is the CSV itself, or the folder holding both files with ``file`` choosing ``code`` or ``conv``.
    """

    kind: Literal["trace_azure"] = "trace_azure"
    file: Literal["code", "conv"] | None = Field(
        default=None, description="With a folder `path`: which trace, AzureLLMInferenceTrace_{file}.csv."
    )

    def csv_path(self) -> Path:
        """Return the CSV file this config names."""
        if self.file is None:
            return self.path
        return self.path / f"AzureLLMInferenceTrace_{self.file}.csv"


class MooncakeTraceWorkload(_Replay):
    """Replay of a Mooncake FAST'25 JSONL trace (fields timestamp in ms, input_length, output_length, hash_ids)."""

    kind: Literal["trace_mooncake"] = "trace_mooncake"
    hash_block_tokens: int = Field(default=512, gt=0, description="Tokens per hash_ids block (512 in Mooncake).")
    keep_hash_ids: bool = Field(default=True, description="Keep the prefix-block hashes (prefix-cache modelling).")


class ServeGenWorkload(_Trace):
    """Requests sampled from a ServeGen folder (``chunk-<client>-trace.csv`` + ``chunk-<client>-dataset.json``).

    The window selects the part of the day to generate (trace time, seconds from 0); ``rate_scale`` compresses time
    as for the replays. Each client's 600-s windows give a rate and an inter-arrival family (Gamma or Weibull,
    rescaled to the window's rate; exponential when not fitted); its lengths come from the PMFs of the latest
    dataset window at or before the request.
    """

    kind: Literal["servegen"] = "servegen"
    clients: tuple[str, ...] | None = Field(default=None, description="Client ids to include; None = all.")
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1, description="Upper clip of sampled lengths.")


SyntheticWorkload = PoissonWorkload | GammaWorkload | DiurnalWorkload | StepWorkload
"""Any generated (non-trace) workload."""

TraceWorkload = AzureTraceWorkload | MooncakeTraceWorkload | ServeGenWorkload
"""Any trace-driven workload."""

WorkloadConfig = Annotated[
    PoissonWorkload
    | GammaWorkload
    | DiurnalWorkload
    | StepWorkload
    | AzureTraceWorkload
    | MooncakeTraceWorkload
    | ServeGenWorkload,
    Field(discriminator="kind"),
]
"""One tenant's workload, discriminated on ``kind``."""

_ADAPTER: TypeAdapter[WorkloadConfig] = TypeAdapter(WorkloadConfig)


def parse_workload_config(data: Any) -> WorkloadConfig:
    """Validate a mapping (e.g. parsed YAML) into a :data:`WorkloadConfig`.

    Raises:
        pydantic.ValidationError: the mapping is not a valid workload.
    """
    return _ADAPTER.validate_python(data)


def _resolve(path: Path | None, base_dir: Path) -> Path | None:
    if path is None or path.is_absolute():
        return path
    return base_dir / path


def _resolve_length(dist: Any, base_dir: Path) -> Any:
    if isinstance(dist, EmpiricalLength) and dist.path is not None:
        return dist.model_copy(update={"path": _resolve(dist.path, base_dir)})
    return dist


def resolve_paths(config: WorkloadConfig, base_dir: Path) -> WorkloadConfig:
    """Return a copy of ``config`` with relative file paths made absolute against ``base_dir``."""
    if isinstance(config, AzureTraceWorkload | MooncakeTraceWorkload | ServeGenWorkload):
        return config.model_copy(update={"path": _resolve(config.path, base_dir)})
    update: dict[str, Any] = {
        "input_tokens": _resolve_length(config.input_tokens, base_dir),
        "output_tokens": _resolve_length(config.output_tokens, base_dir),
    }
    if isinstance(config, StepWorkload):
        update["segments"] = tuple(
            segment.model_copy(
                update={
                    "input_tokens": _resolve_length(segment.input_tokens, base_dir),
                    "output_tokens": _resolve_length(segment.output_tokens, base_dir),
                }
            )
            for segment in config.segments
        )
    return config.model_copy(update=update)
