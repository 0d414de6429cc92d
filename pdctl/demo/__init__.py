"""``pdctl demo``: an emulated P/D cluster, the router, Prometheus, the controller and a surging load, end to end.

:mod:`pdctl.demo.main` runs the phases (:mod:`~pdctl.demo.runner`) with a live dashboard
(:mod:`~pdctl.demo.monitor`, :mod:`~pdctl.demo.dashboard`) and writes the comparison report
(:mod:`~pdctl.demo.report`, :mod:`~pdctl.demo.plots`); :mod:`~pdctl.demo.processes` starts and always stops
the children.
"""

from pdctl.demo.config import DemoInputError, DemoOptions
from pdctl.demo.main import run_demo

__all__ = ["DemoInputError", "DemoOptions", "run_demo"]
