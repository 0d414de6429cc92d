"""Multi-turn prefix reuse: how much of the prompt a prefix cache could have served.

From prefix-block hashes (Mooncake ``hash_ids``): requests are taken in arrival order against an unbounded cache.
A block is *seen before* when its id appeared in an earlier request; *block reuse* is the share of all blocks seen
before; the *leading hits* of a request are its blocks seen before up to its first unseen block, and *token reuse*
is ``Σ min(leading_hits · block_tokens, input_tokens) / Σ input_tokens`` (the definitions of the traces README).
From a router log, token reuse is ``Σ prefix_hit_tokens / Σ input_tokens`` as measured by the serving cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["PrefixReuse", "leading_hit_tokens", "prefix_reuse_from_hashes", "prefix_reuse_from_hits"]


@dataclass(frozen=True, slots=True)
class PrefixReuse:
    """Prefix reuse of a stream; block fields are None when measured from cache hits.

    Attributes:
        source: ``hash_ids`` (infinite-cache replay) or ``prefix_hit_tokens`` (router measurement).
        token_reuse_frac: share of prompt tokens a prefix cache serves.
        block_tokens: tokens per block.
        num_blocks: all blocks of all prompts.
        unique_blocks: distinct block ids.
        block_reuse_frac: share of blocks seen in an earlier request.
        hit_any_frac: share of requests with at least one leading block seen before.
        hit_2plus_frac: share of requests with at least two leading blocks seen before.
    """

    source: str
    token_reuse_frac: float
    block_tokens: int | None = None
    num_blocks: int | None = None
    unique_blocks: int | None = None
    block_reuse_frac: float | None = None
    hit_any_frac: float | None = None
    hit_2plus_frac: float | None = None


def _leading_hits(
    hash_ids: NDArray[np.int64], hash_offsets: NDArray[np.int64]
) -> tuple[NDArray[np.bool_], NDArray[np.int64], int]:
    """Per block: seen in an earlier request; per request: leading blocks seen before; and the unique-id count."""
    n = len(hash_offsets) - 1
    counts = np.diff(hash_offsets)
    row = np.repeat(np.arange(n), counts)
    _, first_position, inverse = np.unique(hash_ids, return_index=True, return_inverse=True)
    seen = row[first_position][inverse] < row
    position = np.arange(len(hash_ids)) - np.repeat(hash_offsets[:-1], counts)
    unseen_position = np.where(seen, np.iinfo(np.int64).max, position)
    leading = counts.copy()
    nonempty = counts > 0
    if nonempty.any():
        first_unseen = np.minimum.reduceat(unseen_position, hash_offsets[:-1][nonempty])
        leading[nonempty] = np.minimum(first_unseen, counts[nonempty])
    return seen, leading, len(first_position)


def leading_hit_tokens(
    hash_ids: NDArray[np.int64],
    hash_offsets: NDArray[np.int64],
    input_tokens: NDArray[np.int64],
    block_tokens: int,
) -> NDArray[np.int64]:
    """Prompt tokens of each request an unbounded prefix cache would serve: ``min(leading·block, input)``."""
    _, leading, _ = _leading_hits(hash_ids, hash_offsets)
    return np.minimum(leading * block_tokens, input_tokens)


def prefix_reuse_from_hashes(
    hash_ids: NDArray[np.int64],
    hash_offsets: NDArray[np.int64],
    input_tokens: NDArray[np.int64],
    block_tokens: int,
) -> PrefixReuse:
    """Infinite-cache prefix reuse of requests in order (CSR hash layout, rows sorted by arrival)."""
    n = len(hash_offsets) - 1
    seen, leading, unique = _leading_hits(hash_ids, hash_offsets)
    hit_tokens = np.minimum(leading * block_tokens, input_tokens)
    total_tokens = float(input_tokens.sum())
    return PrefixReuse(
        source="hash_ids",
        token_reuse_frac=float(hit_tokens.sum()) / total_tokens if total_tokens > 0 else 0.0,
        block_tokens=block_tokens,
        num_blocks=len(hash_ids),
        unique_blocks=unique,
        block_reuse_frac=float(seen.mean()) if len(seen) else 0.0,
        hit_any_frac=float((leading >= 1).mean()) if n else 0.0,
        hit_2plus_frac=float((leading >= 2).mean()) if n else 0.0,
    )


def prefix_reuse_from_hits(prefix_hit_tokens: NDArray[np.float64], input_tokens: NDArray[np.int64]) -> PrefixReuse:
    """Token reuse measured by the serving stack (router log ``prefix_hit_tokens``); unknown rows are ignored."""
    known = np.isfinite(prefix_hit_tokens)
    total = float(input_tokens[known].sum())
    hits = np.minimum(prefix_hit_tokens[known], input_tokens[known])
    return PrefixReuse(
        source="prefix_hit_tokens",
        token_reuse_frac=float(hits.sum()) / total if total > 0 else 0.0,
        hit_any_frac=float((hits > 0).mean()) if known.any() else None,
    )
