"""Calibrated performance model: step times of an inference engine from measured operator timings."""

from env.perf.model import ExecutionTimeModel, InterpolatedExecutionTimeModel, StepBreakdown, StepOverheads
from env.perf.profile import MODELS, ModelSpec, OperatorProfile, ProfileError, load_operator_profile

__all__ = [
    "MODELS",
    "ExecutionTimeModel",
    "InterpolatedExecutionTimeModel",
    "ModelSpec",
    "OperatorProfile",
    "ProfileError",
    "StepBreakdown",
    "StepOverheads",
    "load_operator_profile",
]
