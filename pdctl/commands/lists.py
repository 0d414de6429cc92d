"""The comma lists the commands take: names or paths (``--scenarios``, ``--policies``) and seeds (``--seeds``)."""

from __future__ import annotations

__all__ = ["parse_seeds", "split_list"]


def split_list(text: str) -> list[str]:
    """The non-empty, stripped parts of a comma list, in order."""
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_seeds(text: str) -> list[int]:
    """Seeds of ``A..B`` (inclusive), ``A``, or a comma list of those, in order, without repeats.

    Raises:
        ValueError: one line naming ``--seeds`` and the part that is not a seed or a range.
    """
    out: list[int] = []
    for part in split_list(text):
        first, sep, last = part.partition("..")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise ValueError(f"--seeds: {part!r} is not a seed or a range A..B of non-negative integers")
        lo, hi = int(first), int(last) if sep else int(first)
        if hi < lo:
            raise ValueError(f"--seeds: range {part!r} ends before it starts")
        out.extend(range(lo, hi + 1))
    if not out:
        raise ValueError("--seeds: no seed given")
    return list(dict.fromkeys(out))
