"""Columnar form of a request stream: numpy arrays instead of one object per request.

:class:`RequestColumns` is what the loaders and generators build; :meth:`RequestColumns.to_specs` turns it into the
list of :class:`~env.workloads.types.RequestSpec` that consumers read one by one. A simulator that wants speed can
read the arrays directly: row ``i`` has ``arrival_s[i]``, ``input_tokens[i]``, ``output_tokens[i]`` and prefix-block
hashes ``hash_ids[hash_offsets[i]:hash_offsets[i + 1]]`` (CSR layout; empty when the source has none).
Hash ids are unique within one source only: a consumer mixing sources keys its prefix cache by (tenant, id).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from env.workloads.types import RequestSpec

__all__ = ["RequestColumns"]


@dataclass(frozen=True, slots=True, eq=False)
class RequestColumns:
    """A request stream as parallel arrays, sorted by arrival.

    Attributes:
        arrival_s: arrival times (s), float64, non-decreasing.
        input_tokens: prompt lengths, int64.
        output_tokens: output lengths, int64.
        hash_ids: all prefix-block hashes, concatenated, int64.
        hash_offsets: int64 of length ``len + 1``; row ``i`` owns ``hash_ids[hash_offsets[i]:hash_offsets[i+1]]``.
        hash_block_tokens: tokens per hash block.
        model: served model name.
    """

    arrival_s: NDArray[np.float64]
    input_tokens: NDArray[np.int64]
    output_tokens: NDArray[np.int64]
    hash_ids: NDArray[np.int64]
    hash_offsets: NDArray[np.int64]
    hash_block_tokens: int = 512
    model: str = ""

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.input_tokens) != n or len(self.output_tokens) != n or len(self.hash_offsets) != n + 1:
            raise ValueError("RequestColumns: column lengths differ")

    @classmethod
    def from_arrays(
        cls,
        arrival_s: NDArray[np.float64],
        input_tokens: NDArray[np.int64],
        output_tokens: NDArray[np.int64],
        *,
        hash_ids: NDArray[np.int64] | None = None,
        hash_offsets: NDArray[np.int64] | None = None,
        hash_block_tokens: int = 512,
        model: str = "",
    ) -> RequestColumns:
        """Build columns from arrays; without hashes every row gets an empty ``hash_ids``."""
        n = len(arrival_s)
        if hash_ids is None or hash_offsets is None:
            hash_ids = np.zeros(0, dtype=np.int64)
            hash_offsets = np.zeros(n + 1, dtype=np.int64)
        return cls(
            np.asarray(arrival_s, dtype=np.float64),
            np.asarray(input_tokens, dtype=np.int64),
            np.asarray(output_tokens, dtype=np.int64),
            np.asarray(hash_ids, dtype=np.int64),
            np.asarray(hash_offsets, dtype=np.int64),
            hash_block_tokens,
            model,
        )

    @classmethod
    def empty(cls, *, hash_block_tokens: int = 512, model: str = "") -> RequestColumns:
        """Return a stream with no requests."""
        z = np.zeros(0, dtype=np.int64)
        return cls.from_arrays(np.zeros(0), z, z, hash_block_tokens=hash_block_tokens, model=model)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def has_hash_ids(self) -> bool:
        """Whether any row carries prefix-block hashes."""
        return len(self.hash_ids) > 0

    def hash_ids_of(self, row: int) -> NDArray[np.int64]:
        """Return the prefix-block hashes of one row."""
        return self.hash_ids[self.hash_offsets[row] : self.hash_offsets[row + 1]]

    def take(self, rows: NDArray[np.intp] | NDArray[np.bool_]) -> RequestColumns:
        """Return the rows selected by an index array or a boolean mask, in the given order."""
        index = np.flatnonzero(rows) if rows.dtype == np.bool_ else np.asarray(rows, dtype=np.intp)
        starts = self.hash_offsets[:-1][index]
        counts = self.hash_offsets[1:][index] - starts
        offsets = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        gather = np.repeat(starts - offsets[:-1], counts) + np.arange(offsets[-1], dtype=np.int64)
        return RequestColumns(
            self.arrival_s[index],
            self.input_tokens[index],
            self.output_tokens[index],
            self.hash_ids[gather],
            offsets,
            self.hash_block_tokens,
            self.model,
        )

    def with_arrivals(self, arrival_s: NDArray[np.float64]) -> RequestColumns:
        """Return the same requests with other arrival times (same length, caller keeps them sorted)."""
        return RequestColumns(
            np.asarray(arrival_s, dtype=np.float64),
            self.input_tokens,
            self.output_tokens,
            self.hash_ids,
            self.hash_offsets,
            self.hash_block_tokens,
            self.model,
        )

    def to_specs(self, tenant: str, id_prefix: str = "") -> list[RequestSpec]:
        """Return one :class:`RequestSpec` per row; ids are ``f"{id_prefix}{tenant}-{row}"``."""
        arrivals = self.arrival_s.tolist()
        inputs = self.input_tokens.tolist()
        outputs = self.output_tokens.tolist()
        prefix = f"{id_prefix}{tenant}-"
        block = self.hash_block_tokens
        model = self.model
        if not self.has_hash_ids:
            return [
                RequestSpec(f"{prefix}{i}", tenant, arrivals[i], inputs[i], outputs[i], (), block, model)
                for i in range(len(arrivals))
            ]
        flat = self.hash_ids.tolist()
        offsets = self.hash_offsets.tolist()
        return [
            RequestSpec(
                f"{prefix}{i}",
                tenant,
                arrivals[i],
                inputs[i],
                outputs[i],
                tuple(flat[offsets[i] : offsets[i + 1]]),
                block,
                model,
            )
            for i in range(len(arrivals))
        ]
