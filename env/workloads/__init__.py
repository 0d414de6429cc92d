"""Workloads: arrival processes, length distributions and trace loaders, all producing :class:`RequestSpec`.

Entry points: :data:`WorkloadConfig` (what a scenario writes), :func:`generate_requests` (a sorted list of
:class:`RequestSpec`) and :func:`generate_columns` (the same requests as numpy columns, :class:`RequestColumns`).
"""

from env.workloads.columns import RequestColumns
from env.workloads.config import WorkloadConfig, parse_workload_config, resolve_paths
from env.workloads.errors import TraceFormatError, TraceNotFoundError, WorkloadError
from env.workloads.generate import generate_columns, generate_requests
from env.workloads.types import RequestSpec

__all__ = [
    "RequestColumns",
    "RequestSpec",
    "TraceFormatError",
    "TraceNotFoundError",
    "WorkloadConfig",
    "WorkloadError",
    "generate_columns",
    "generate_requests",
    "parse_workload_config",
    "resolve_paths",
]
