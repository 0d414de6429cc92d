from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.config import ExperimentError, load_experiment

SMOKE = Path(__file__).resolve().parents[2] / "experiments" / "smoke.yaml"


def _write(tmp_path: Path, **changes: Any) -> Path:
    data = yaml.safe_load(SMOKE.read_text())
    data.update(changes)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_validation_seeds_default_and_custom(tmp_path: Path) -> None:
    assert load_experiment(SMOKE).validation_seeds == [900]
    assert load_experiment(_write(tmp_path, validation_seeds=[900, 901, 902])).validation_seeds == [900, 901, 902]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"validation_seeds": [900, 900]}, r"exp.yaml: validation_seeds: .*repeated seeds"),
        ({"validation_seeds": [1000]}, r"exp.yaml: validation_seeds.0: .*less than 1000"),
        ({"validation_seeds": []}, r"exp.yaml: validation_seeds: "),
        (
            {"validation_seeds": [1, 900], "pretrain": {"teachers": ["baseline:aggregated"], "seeds": [0, 1]}},
            r"validation_seeds \[1\] are also pretrain.seeds",
        ),
        (
            {"pretrain": {"teachers": ["baseline:aggregated"], "expert": "lookahead", "best_alone_scope": "scenario"}},
            r"exp.yaml: pretrain: .*best_alone_scope needs prefer_best_alone: true",
        ),
        ({"layout": {"pool_actions": "absolute"}}, r"layout.pool_actions: Input should be 'delta' or 'target'"),
        (
            {"pretrain": {"teachers": ["mpc:4", "mpc:4"], "expert": "policy"}},
            r"teachers: repeated policy specs",
        ),
        (
            {"pretrain": {"teachers": ["mpc:4"], "expert": "policy"}},
            r"pretrain.expert: layout.kind: set takes expert: policy, and expert: policy needs it",
        ),
    ],
)
def test_bad_validation_seeds_and_layouts_are_refused_naming_the_field(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ExperimentError, match=message):
        load_experiment(_write(tmp_path, **changes))


def test_pool_target_layout_reaches_the_codec(tmp_path: Path) -> None:
    config = load_experiment(_write(tmp_path, layout={"pool_actions": "target"}))
    assert config.layout.to_layout().pool_actions == "target"
