"""Observations of the simulator: metric windows, vLLM metrics, stage records, GPU-seconds.

The window arithmetic is :mod:`env.sim.windows`; this part keeps the window marks (where the previous snapshot
ended) and hands :mod:`env.sim.windows` the simulator as its read-only view.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from env.sim.base import SimulatorBase
from env.sim.instances import InstanceRole, InstanceState
from env.sim.windows import group_window, instance_metrics, stage_records, tenant_window
from policies.schema import GroupWindow, MetricWindow, TenantWindow

__all__ = ["Snapshots"]


class Snapshots(SimulatorBase):
    """The simulator's part that reports what it observed."""

    def gpu_seconds(self, group: int | None = None) -> float:
        """GPU-seconds of every instance (starting, serving or draining) so far."""
        total = 0.0
        for inst in self.instances:
            if group is not None and inst.group != group:
                continue
            end = inst.stopped_s if not math.isnan(inst.stopped_s) else self.now_s
            total += max(end - inst.created_s, 0.0) * inst.tp
        return total

    def pool_counts(self, group: int) -> dict[str, int]:
        """Active and pending instance counts of a group."""
        g = self.groups[group]
        out = {"prefill": len(g.prefill), "decode": len(g.decode), "pending_prefill": 0, "pending_decode": 0}
        for inst in g.instances:
            if inst.state in (InstanceState.STARTING, InstanceState.DRAINING) and inst.next_role is not None:
                key = "pending_prefill" if inst.next_role == InstanceRole.PREFILL else "pending_decode"
                out[key] += 1
        return out

    def instance_metrics(self) -> dict[str, dict[str, Any]]:
        """Per instance: vLLM-named counters, gauges and histograms (see :func:`env.sim.windows.instance_metrics`)."""
        return instance_metrics(self)

    def stage_records(self) -> dict[str, np.ndarray]:
        """Columns of every finished request (see :func:`env.sim.windows.stage_records`)."""
        return stage_records(self)

    def snapshot(self) -> MetricWindow:
        """Statistics since the previous snapshot (or the start), as the shared metric-window type."""
        now = self.now_s
        window = max(now - self._window_start_s, 1e-9)
        tenants: dict[str, TenantWindow] = {}
        for ti, name in enumerate(self.tenant_names):
            arrived = self.arrived[ti][self._window_marks_arrived[ti] :]
            finished = self.finished[ti][self._window_marks_finished[ti] :]
            self._window_marks_arrived[ti] = len(self.arrived[ti])
            self._window_marks_finished[ti] = len(self.finished[ti])
            tenants[name] = tenant_window(self, ti, arrived, finished, window)
        groups: dict[str, GroupWindow] = {}
        for gi, group in enumerate(self.groups):
            log = group.transfer_log[self._window_marks_transfers[gi] :]
            self._window_marks_transfers[gi] = len(group.transfer_log)
            groups[group.name] = group_window(self, gi, log, self.window_counters)
        self._window_start_s = now
        return MetricWindow(end_s=now, window_s=window, tenants=tenants, groups=groups)
