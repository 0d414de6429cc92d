"""Workloads: arrival processes, length distributions and trace loaders, all producing :class:`RequestSpec`."""

from env.workloads.types import RequestSpec

__all__ = ["RequestSpec"]
