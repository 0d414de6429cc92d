"""After a session that ran benchmarks, merge their fragments into ``benchmarks/results/summary.{json,md}``."""

from __future__ import annotations

import time

import pytest
from summary import RAW, write_summary

_STARTED = time.time()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    del session, exitstatus
    fresh = [p for p in RAW.glob("*.json") if p.stat().st_mtime >= _STARTED] if RAW.is_dir() else []
    if fresh:
        path = write_summary()
        print(f"\nbenchmark summary: {path}")
