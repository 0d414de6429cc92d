"""One function over many items in worker processes, results in the items' order."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import TypeVar

__all__ = ["map_in_processes"]

_In = TypeVar("_In")
_Out = TypeVar("_Out")


def map_in_processes(
    fn: Callable[[_In], _Out], items: Sequence[_In], workers: int, *, spawn: bool = False, chunksize: int = 1
) -> list[_Out]:
    """``fn`` over ``items`` in order, in ``workers`` processes when there is more than one of each, else here.

    ``fn`` must be picklable (a module-level function or a method looked up on its class). ``spawn`` starts fresh
    interpreters instead of forking this one (for work that must not inherit this process's state, such as torch's
    threads); ``chunksize`` items go to a worker at a time.
    """
    if workers > 1 and len(items) > 1:
        context = get_context("spawn") if spawn else None
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            return list(pool.map(fn, items, chunksize=chunksize))
    return [fn(item) for item in items]
