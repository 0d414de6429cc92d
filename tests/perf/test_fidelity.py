"""Whole-step fidelity of the composed model against the measured Llama-3-8B H200 steps (``e2e_*.csv``).

The e2e files ship in ``env/profiles/h200-llama3/`` (copies of the calibration run; see its README).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from typer.testing import CliRunner

from env.perf.fidelity import E2E_FILES, StepPoint, fit_overheads, load_e2e_points, relative_errors, summarize
from env.perf.model import StepOverheads
from env.perf.profile import OperatorProfile, load_operator_profile
from pdctl.cli import app
from tests.sim.helpers import profile


@cache
def points() -> tuple[StepPoint, ...]:
    return tuple(load_e2e_points(profile().source, "llama3-8b"))


def _median_worst(p: OperatorProfile, pts: list[StepPoint], overheads: StepOverheads) -> tuple[float, float]:
    errors = [abs(e) for _, _, e in relative_errors(p, pts, overheads)]
    return float(np.median(errors)), float(np.max(errors))


def test_every_e2e_file_ships_with_rows() -> None:
    sources = {p.source for p in points()}
    assert sources == set(E2E_FILES)
    assert len(points()) == 30


def test_shipped_constants_meet_the_whole_step_targets() -> None:
    median, worst = _median_worst(profile(), list(points()), StepOverheads())
    assert median <= 0.03
    assert worst <= 0.08
    for source, (file_median, file_worst, _) in summarize(
        relative_errors(profile(), list(points()), StepOverheads())
    ).items():
        assert file_median <= 0.04, source
        assert file_worst <= 0.08, source


def test_shipped_constants_are_the_fit() -> None:
    fitted = fit_overheads(profile(), list(points()))
    shipped = StepOverheads()
    assert shipped.layer_overhead_s == pytest.approx(fitted.layer_overhead_s, rel=0.01)
    assert shipped.elementwise_bandwidth_frac == pytest.approx(fitted.elementwise_bandwidth_frac, rel=0.01)
    assert shipped.prefill_attention_factor == pytest.approx(fitted.prefill_attention_factor, rel=0.01)


def test_held_out_files_are_predicted_by_constants_fitted_on_the_others() -> None:
    """Leave one e2e file out, fit on the other two, predict it: the constants do not memorise points."""
    errors: list[float] = []
    for held in E2E_FILES:
        train = [p for p in points() if p.source != held]
        test = [p for p in points() if p.source == held]
        fitted = fit_overheads(profile(), train)
        assert 30e-6 < fitted.layer_overhead_s < 60e-6, held  # ~27 kernels x 1-2 us
        assert 0.4 < fitted.elementwise_bandwidth_frac <= 1.0, held
        errors.extend(abs(e) for _, _, e in relative_errors(profile(), test, fitted))
    assert float(np.median(errors)) <= 0.05


def test_operator_only_priors_without_any_e2e_fit() -> None:
    """No whole-step timing used: derived dispatch latency and roofline, 27 kernels x 2 us, the copy ceiling.

    Falls short of the 5 % target (median 5.7 %; see the profile README): the shipped folder has no
    ``elementwise.csv`` yet, so the element-wise rate is the 1.0 prior; with that table measured on the H200
    (the README's device command) ``operator_only_for`` derives it and the bound here can drop to 5 %.
    """
    median, worst = _median_worst(profile(), list(points()), StepOverheads.operator_only_for(profile()))
    assert median <= 0.07
    assert worst <= 0.15


def test_independent_operator_run_predicts_as_well() -> None:
    """The GEMM table of the second run (another H200) with the shipped constants."""
    repeat = load_operator_profile("h200-llama3-8b", gemm_file="gemm_repeat.csv")
    median, worst = _median_worst(repeat, list(points()), StepOverheads())
    assert median <= 0.03
    assert worst <= 0.08


def test_decode_is_graph_cheap_and_long_prefill_is_not_short() -> None:
    """The issue's examples: batch-1 decode was 76 % over, a 16k prefill 12 % under."""
    by_label = {p.label: (p, pred) for p, pred, _ in relative_errors(profile(), list(points()), StepOverheads())}
    point, predicted = by_label["decode 1@1024"]
    assert predicted < 1.08 * point.measured_s
    point, predicted = by_label["prefill 1x16384"]
    assert predicted == pytest.approx(point.measured_s, rel=0.03)


def test_cli_check_prints_the_table() -> None:
    result = CliRunner().invoke(app, ["perf", "check", "--profile", "h200-llama3-8b"])
    assert result.exit_code == 0, result.output
    assert "e2e_decode.csv" in result.output
    assert "median |err|" in result.output
    fitted = CliRunner().invoke(app, ["perf", "check", "--fit"])
    assert fitted.exit_code == 0
    assert "fitted on these points" in fitted.output
    none = CliRunner().invoke(app, ["perf", "check", "--profile", "h200-llama3-70b"])
    assert none.exit_code == 2
    assert "no e2e_*.csv rows for model llama3-70b" in none.output
