"""Fault injection for an emulated instance: KV transfer failures and delays, slowness and crashes.

All randomness comes from one ``numpy.random.Generator`` seeded from the instance's seed, so a run with the
same seed fails the same transfers in the same order.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["FaultConfig", "FaultInjector"]


class FaultConfig(BaseModel):
    """Faults injected into one instance (all off by default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    transfer_failure_frac: Annotated[float, Field(ge=0.0, le=1.0)] = Field(
        0.0, description="Probability that a KV pull (a do_remote_prefill request on this instance) fails."
    )
    transfer_delay_s: Annotated[float, Field(ge=0.0)] = Field(
        0.0, description="Extra seconds added to every KV pull on this instance (emulated time)."
    )
    slow_factor: Annotated[float, Field(ge=1.0)] = Field(
        1.0, description="Multiplies every engine step duration (a slow or throttled GPU)."
    )
    crash_after_s: Annotated[float, Field(gt=0.0)] | None = Field(
        None, description="Wall seconds after start at which the instance crashes (stops answering)."
    )
    crash_after_requests: Annotated[int, Field(ge=1)] | None = Field(
        None, description="The instance crashes when this many generation requests have arrived."
    )
    health_delay_s: Annotated[float, Field(ge=0.0)] = Field(
        0.0, description="Wall seconds GET /health waits before answering (an overloaded API server)."
    )
    linger_after_done_s: Annotated[float, Field(ge=0.0)] = Field(
        0.0,
        description="Wall seconds a finished stream stays open after its [DONE] event before the instance closes "
        "it (a slow close, as behind a proxy).",
    )


class FaultInjector:
    """Draws the injected faults of one instance."""

    def __init__(self, config: FaultConfig, rng: np.random.Generator) -> None:
        self.config = config
        self._rng = rng
        self.num_requests = 0

    def transfer_fails(self) -> bool:
        """Whether the next KV pull fails."""
        frac = self.config.transfer_failure_frac
        return frac > 0.0 and bool(self._rng.random() < frac)

    def count_request(self) -> bool:
        """Count an arriving generation request; True when it triggers ``crash_after_requests``."""
        self.num_requests += 1
        limit = self.config.crash_after_requests
        return limit is not None and self.num_requests >= limit
