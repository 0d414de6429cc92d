"""Workload profiling: pure functions from requests (or distributions) to a :class:`WorkloadProfile` and a verdict.

Entry points: :func:`profile_records` (per-request records), :func:`profile_distributions` (PMFs, histograms),
:func:`profile_source` (a path or URL: Azure CSV, Mooncake JSONL, ServeGen folder, router log, Prometheus) and
:func:`decide_verdict` (the rules, documented in :mod:`livestack.profiling.verdict`).
"""

from livestack.profiling.profile import (
    GroupStats,
    LatencyStats,
    LengthStats,
    ProfileOptions,
    WorkloadProfile,
    profile_distributions,
    profile_records,
)
from livestack.profiling.records import RequestRecords
from livestack.profiling.sources import detect_source_kind, profile_source
from livestack.profiling.verdict import Decision, Verdict, decide_verdict

__all__ = [
    "Decision",
    "GroupStats",
    "LatencyStats",
    "LengthStats",
    "ProfileOptions",
    "RequestRecords",
    "Verdict",
    "WorkloadProfile",
    "decide_verdict",
    "detect_source_kind",
    "profile_distributions",
    "profile_records",
    "profile_source",
]
