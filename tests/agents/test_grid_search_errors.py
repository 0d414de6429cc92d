from __future__ import annotations

from pathlib import Path

import pytest

from agents.grid_search import search

REPO = Path(__file__).resolve().parents[2]


def test_a_grid_whose_every_run_fails_names_the_first_error(tmp_path: Path) -> None:
    empty_traces = tmp_path / "traces"
    empty_traces.mkdir()
    with pytest.raises(RuntimeError, match=r"grid search of chatbot-8: every configuration failed; first: TraceNotF"):
        search(
            REPO / "experiments/scenarios/chatbot-8.yaml",
            seeds=(0,),
            workers=1,
            cache_dir=tmp_path / "cache",
            traces_dir=str(empty_traces),
        )
    assert list(tmp_path.glob("cache/*.json")) == []  # nothing cached from a failed search
