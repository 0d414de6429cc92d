"""The demo end to end, shortened: it runs both phases, prints the comparison table and the workload profile,
writes the report, and leaves no process behind — also when interrupted with SIGINT (Ctrl-C).

Processes are found by command line: every child the demo starts names a file under its output folder, so
any process whose command line mentions that folder after the demo has exited is an orphan.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def processes_mentioning(text: str) -> dict[int, str]:
    """pid → command line of every live process whose command line contains ``text`` (except this one)."""
    out: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            out[int(entry.name)] = cmdline
    return out


def _demo(out: Path, *args: str) -> subprocess.Popen[str]:
    """``pdctl demo`` from ``out``'s parent folder with ``--out`` relative to it (as a user would type it)."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "COLUMNS": "160"}
    return subprocess.Popen(
        [sys.executable, "-m", "pdctl", "demo", "--out", out.name, "--plain", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=str(out.parent),
        env=env,
        start_new_session=True,
    )


def _kill_leftovers(out: Path) -> None:
    for pid in processes_mentioning(str(out)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_short_demo_runs_both_phases_reports_and_leaves_no_process(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    assert processes_mentioning(str(out)) == {}
    stale = '{"left by": "an earlier run"}\n'
    for phase in ("static", "controlled"):  # an earlier run's logs in the same folder are not this run's
        (out / phase / "overrides").mkdir(parents=True)
        (out / phase / "controller-audit.jsonl").write_text(stale)
        (out / phase / "router-requests.jsonl").write_text(stale)
    (out / "controlled" / "overrides" / "old.yaml").write_text("not: an override of this run\n")
    # an earlier run's control memory would start this fresh deployment from its state (this one would stop it)
    (out / "controlled" / "controller.memory.json").write_text(stale)
    proc = _demo(out, "--duration", "30", "--time-scale", "0.5", "--scraper")
    try:
        stdout, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
        leftovers = processes_mentioning(str(out))
        _kill_leftovers(out)
    assert proc.returncode == 0, stdout[-4000:]
    assert leftovers == {}, leftovers
    assert "static baseline vs controller" in stdout
    assert "TTFT SLO attainment" in stdout
    assert "TPOT SLO attainment" in stdout
    assert "Workload profile of what the demo replayed" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["phases"]) == {"static", "controlled"}
    assert summary["phases"]["static"]["controller_mode"] == "advisory"
    assert summary["phases"]["controlled"]["metric_source"] == "built-in scraper"
    for phase in summary["phases"].values():
        rag = phase["tenants"]["rag"]
        assert rag["num_requests"] > 20
        assert rag["num_ok"] == rag["num_requests"]
    report = (out / "report.md").read_text()
    for plot in ("ttft_over_time.png", "tpot_over_time.png", "pd_counts_thresholds.png", "cdfs.png"):
        assert (out / plot).stat().st_size > 10_000
        assert plot in report
    # the advisory phase changed nothing; its audit log shows what the controller would have done
    timeline = json.loads((out / "static" / "timeline.json").read_text())
    assert {(p["num_prefill"], p["num_decode"]) for p in timeline} == {(2, 6)}
    assert (out / "static" / "controller-audit.jsonl").stat().st_size > 0
    for phase in ("static", "controlled"):
        assert stale not in (out / phase / "controller-audit.jsonl").read_text()
        assert stale not in (out / phase / "router-requests.jsonl").read_text()
    assert not (out / "controlled" / "overrides" / "old.yaml").exists()
    assert json.loads((out / "controlled" / "controller.memory.json").read_text())["format"] == "pdctl-control-memory"


def test_sigint_stops_every_process_the_demo_started(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = _demo(out, "--duration", "60", "--no-baseline", "--scraper")
    try:
        deadline = time.monotonic() + 120
        audit = out / "controlled" / "controller-audit.jsonl"
        while not (audit.exists() and audit.stat().st_size > 0):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the controller never ticked"
            time.sleep(0.5)
        running = processes_mentioning(str(out))
        while len(running) < 4:  # emulator, router, controller, load generator
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, f"the load never started: {running}"
            time.sleep(0.2)
            running = processes_mentioning(str(out))
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        stdout, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
        leftovers = processes_mentioning(str(out))
        _kill_leftovers(out)
    assert proc.returncode == 130, stdout[-3000:]
    assert "interrupted" in stdout
    assert leftovers == {}, leftovers
