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


def test_the_source_digest_follows_every_byte_and_refuses_a_missing_path(tmp_path: Path) -> None:
    from agents.source_digest import source_digest

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    before = source_digest("grid-v4", ["pkg", "b.py"], root=tmp_path)
    assert source_digest("grid-v4", ["pkg", "b.py"], root=tmp_path) == before
    assert source_digest("grid-v5", ["pkg", "b.py"], root=tmp_path) != before
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert source_digest("grid-v4", ["pkg", "b.py"], root=tmp_path) != before
    with pytest.raises(FileNotFoundError, match="does not exist"):
        source_digest("grid-v4", ["gone"], root=tmp_path)
