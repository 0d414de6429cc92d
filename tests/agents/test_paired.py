"""The paired geometric-mean ratio and its bootstrap interval (agents/paired.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agents.paired import paired_ratio


def test_ratio_is_the_geometric_mean_of_per_scenario_ratios() -> None:
    a = {"s1": 2.0, "s2": 1.0, "s3": 4.0}
    b = {"s1": 1.0, "s2": 2.0, "s3": 1.0}
    result = paired_ratio(a, b, draws=200)
    assert result.ratio == pytest.approx(math.exp((math.log(2.0) + math.log(0.5) + math.log(4.0)) / 3))
    assert (result.wins, result.losses, result.scenarios, result.skipped) == (2, 1, 3, 0)
    assert result.low <= result.ratio <= result.high


def test_identical_policies_have_a_degenerate_interval_at_one() -> None:
    a = {f"s{i}": float(i + 1) for i in range(10)}
    result = paired_ratio(a, dict(a), draws=500)
    assert result.ratio == pytest.approx(1.0)
    assert result.low == pytest.approx(1.0)
    assert result.high == pytest.approx(1.0)
    assert (result.wins, result.losses) == (0, 0)


def test_interval_widens_with_scatter_and_reproduces_with_its_seed() -> None:
    b = {f"s{i}": 1.0 for i in range(20)}
    tight = paired_ratio({s: 1.1 if i % 2 else 1.05 for i, s in enumerate(b)}, b, draws=2000, seed=3)
    loose = paired_ratio({s: 3.0 if i % 2 else 0.4 for i, s in enumerate(b)}, b, draws=2000, seed=3)
    assert tight.low > 1.0  # a consistent gain: the whole interval above one
    assert loose.low < 1.0 < loose.high  # a scattered one: the interval straddles one
    assert loose.high - loose.low > tight.high - tight.low
    assert paired_ratio({s: 3.0 if i % 2 else 0.4 for i, s in enumerate(b)}, b, draws=2000, seed=3) == loose
    assert paired_ratio({s: 3.0 if i % 2 else 0.4 for i, s in enumerate(b)}, b, draws=2000, seed=4) != loose


def test_zero_goodput_is_left_out_and_counted() -> None:
    result = paired_ratio({"s1": 0.0, "s2": 2.0, "s3": 1.0}, {"s1": 1.0, "s2": 1.0, "s4": 5.0}, draws=100)
    assert (result.scenarios, result.skipped) == (1, 1)
    assert result.ratio == pytest.approx(2.0)
    assert "1 left out" in result.describe(0.95)


@pytest.mark.parametrize(
    ("a", "b", "kwargs", "message"),
    [
        ({"s": 1.0}, {"s": 1.0}, {"draws": 0}, "draws must be >= 1"),
        ({"s": 1.0}, {"s": 1.0}, {"level": 1.0}, "level must be within (0, 1)"),
        ({"s": -1.0}, {"s": 1.0}, {}, "scenario s has goodput -1.0"),
        ({"s": math.nan}, {"s": 1.0}, {}, "scenario s has goodput nan"),
        ({"s": 0.0}, {"s": 1.0}, {}, "no scenario where both policies have a positive goodput"),
        ({"s": 1.0}, {"t": 1.0}, {}, "no scenario where both policies have a positive goodput"),
    ],
)
def test_bad_input_is_one_line_naming_it(
    a: dict[str, float], b: dict[str, float], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        paired_ratio(a, b, **kwargs)
    assert "\n" not in str(info.value)
