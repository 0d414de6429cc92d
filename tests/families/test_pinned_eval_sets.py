"""The default family's validation and test sets are pinned: regenerating them gives the same bytes.

Every issue-18 result table names the scenario files it was measured on (``scenario_sha256``); the family itself
sets each tenant's rate against the performance model's capacity estimate, so a recalibrated model silently moves
every generated scenario. This happened once: the issue-20 step model lowered the rates by ~5 %, and tables made on
the earlier files could no longer be regenerated. This test turns such a change into a failure that says what to do.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

import pytest

from env.families import load_family, scenario_yaml
from env.families.generate import scenario_name

ROOT = Path(__file__).resolve().parents[2]
FAMILY = ROOT / "experiments" / "families" / "default.yaml"
PINS = {  # pin name: (split, pin file)
    "validation-36": ("validation", ROOT / "experiments" / "families" / "default-validation-36.sha256"),
    "validation-72": ("validation", ROOT / "experiments" / "families" / "default-validation-72.sha256"),
    "validation-144": ("validation", ROOT / "experiments" / "families" / "default-validation-144.sha256"),
    "validation-216": ("validation", ROOT / "experiments" / "families" / "default-validation-216.sha256"),
    "validation-288": ("validation", ROOT / "experiments" / "families" / "default-validation-288.sha256"),
    "validation-360": ("validation", ROOT / "experiments" / "families" / "default-validation-360.sha256"),
    "validation-432": ("validation", ROOT / "experiments" / "families" / "default-validation-432.sha256"),
    "validation-504": ("validation", ROOT / "experiments" / "families" / "default-validation-504.sha256"),
    "validation-576": ("validation", ROOT / "experiments" / "families" / "default-validation-576.sha256"),
    "validation-648": ("validation", ROOT / "experiments" / "families" / "default-validation-648.sha256"),
    "validation-864": ("validation", ROOT / "experiments" / "families" / "default-validation-864.sha256"),
    "validation-1000": ("validation", ROOT / "experiments" / "families" / "default-validation-1000.sha256"),
    "validation-1080": ("validation", ROOT / "experiments" / "families" / "default-validation-1080.sha256"),
    "validation-1400": ("validation", ROOT / "experiments" / "families" / "default-validation-1400.sha256"),
    "validation-1600": ("validation", ROOT / "experiments" / "families" / "default-validation-1600.sha256"),
    "validation-1720": ("validation", ROOT / "experiments" / "families" / "default-validation-1720.sha256"),
    "validation-1920": ("validation", ROOT / "experiments" / "families" / "default-validation-1920.sha256"),
    "validation-2000": ("validation", ROOT / "experiments" / "families" / "default-validation-2000.sha256"),
    "validation-2200": ("validation", ROOT / "experiments" / "families" / "default-validation-2200.sha256"),
    "validation-2320": ("validation", ROOT / "experiments" / "families" / "default-validation-2320.sha256"),
    "validation-2520": ("validation", ROOT / "experiments" / "families" / "default-validation-2520.sha256"),
    "validation-2640": ("validation", ROOT / "experiments" / "families" / "default-validation-2640.sha256"),
    "validation-2840": ("validation", ROOT / "experiments" / "families" / "default-validation-2840.sha256"),
    "validation-2960": ("validation", ROOT / "experiments" / "families" / "default-validation-2960.sha256"),
    "test-40": ("test", ROOT / "experiments" / "families" / "default-test-40.sha256"),
    "test-80": ("test", ROOT / "experiments" / "families" / "default-test-80.sha256"),
    "test-120": ("test", ROOT / "experiments" / "families" / "default-test-120.sha256"),
    "test-160": ("test", ROOT / "experiments" / "families" / "default-test-160.sha256"),
    "test-200": ("test", ROOT / "experiments" / "families" / "default-test-200.sha256"),
    "test-240": ("test", ROOT / "experiments" / "families" / "default-test-240.sha256"),
    "test-280": ("test", ROOT / "experiments" / "families" / "default-test-280.sha256"),
    "test-320": ("test", ROOT / "experiments" / "families" / "default-test-320.sha256"),
}


def _pinned(path: Path) -> dict[str, str]:
    """``sha256sum`` lines: file name → SHA-256."""
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        digest, name = line.split(maxsplit=1)
        out[name.strip()] = digest
    return out


@cache
def _generated_split(split: str) -> tuple[tuple[str, str], ...]:
    """(file name, SHA-256) of the split's first scenarios, as many as its largest pin holds, generated once.

    Every pin of a split is a prefix of it, so each pin compares with the first of these; generating each pin anew
    took most of this test's time (over 25,000 scenarios for the validation pins alone).
    """
    family = load_family(FAMILY)
    count = max(len(_pinned(path)) for pin_split, path in PINS.values() if pin_split == split)
    seeds = list(family.split_seeds(split))[:count]
    return tuple(
        (f"{scenario_name(family, seed)}.yaml", hashlib.sha256(scenario_yaml(family, seed).encode("utf-8")).hexdigest())
        for seed in seeds
    )


def _generated(split: str, count: int) -> dict[str, str]:
    return dict(_generated_split(split)[:count])


@pytest.mark.parametrize("pin", sorted(PINS))
def test_the_default_familys_evaluation_sets_regenerate_byte_for_byte(pin: str) -> None:
    split, path = PINS[pin]
    pinned = _pinned(path)
    generated = _generated(split, len(pinned))
    changed = sorted(name for name, digest in pinned.items() if generated.get(name) != digest)
    assert not changed, (
        f"{len(changed)} of {len(pinned)} {split} scenarios of the default family no longer regenerate as pinned in "
        f"{path.name} (first: {changed[0]}). The generator, the family or the performance model behind its "
        "capacity estimate changed. Every table in experiments/results/families/ measured on the pinned files is now "
        "unreproducible: regenerate the sets (docs/scenario-families.md, 'Pinned evaluation sets'), re-measure the "
        "rules and the default policy on them, then update the pin files."
    )


@pytest.mark.parametrize(
    ("small_pin", "large_pin"),
    [
        ("validation-36", "validation-72"),
        ("validation-72", "validation-144"),
        ("validation-144", "validation-216"),
        ("validation-216", "validation-288"),
        ("validation-288", "validation-360"),
        ("validation-360", "validation-432"),
        ("validation-432", "validation-504"),
        ("validation-504", "validation-576"),
        ("validation-576", "validation-648"),
        ("validation-648", "validation-864"),
        ("validation-864", "validation-1000"),
        ("validation-1000", "validation-1080"),
        ("validation-1080", "validation-1400"),
        ("validation-1400", "validation-1600"),
        ("validation-1600", "validation-1720"),
        ("validation-1720", "validation-1920"),
        ("validation-1920", "validation-2000"),
        ("validation-2000", "validation-2200"),
        ("validation-2200", "validation-2320"),
        ("validation-2320", "validation-2520"),
        ("validation-2520", "validation-2640"),
        ("validation-2640", "validation-2840"),
        ("validation-2840", "validation-2960"),
        ("test-40", "test-80"),
        ("test-80", "test-120"),
        ("test-120", "test-160"),
        ("test-160", "test-200"),
        ("test-200", "test-240"),
        ("test-240", "test-280"),
        ("test-280", "test-320"),
    ],
)
def test_a_larger_set_extends_the_smaller_one(small_pin: str, large_pin: str) -> None:
    """The first scenarios of a larger pinned set are the smaller set every earlier table was measured on."""
    small, large = _pinned(PINS[small_pin][1]), _pinned(PINS[large_pin][1])
    assert len(small) == int(small_pin.rsplit("-", 1)[1])
    assert len(large) == int(large_pin.rsplit("-", 1)[1])
    assert {name: large[name] for name in small} == small
