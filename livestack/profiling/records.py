"""Per-request records the profiler reads: columns of whatever a source knows (NaN or None where it does not).

Sources fill what they have: a trace gives arrivals and lengths (Mooncake also prefix-block hashes); a router
request log adds tenant, route, streaming, status, prefix-hit tokens, TTFT/TPOT/E2E and per-stage timings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from env.workloads.columns import RequestColumns
from env.workloads.types import RequestSpec

__all__ = ["RequestRecords"]


@dataclass(frozen=True, slots=True, eq=False)
class RequestRecords:
    """Per-request columns (all of the same length).

    Attributes:
        input_tokens: prompt lengths.
        output_tokens: output lengths.
        arrival_s: arrival times (s, any origin), or None when the source has none.
        tenant: tenant per request, or None.
        route: route per request (``remote_prefill`` / ``local_prefill`` / …), or None.
        stream: 1.0 streamed, 0.0 not, NaN unknown; or None.
        ok: True for requests that succeeded; or None when the source has no status.
        latency_s: ``{"ttft": …, "tpot": …, "e2e": …}`` seconds per request, NaN where missing.
        stages_s: per-stage durations (docs/design.md stage names), NaN where missing.
        prefix_hit_tokens: prompt tokens served from a prefix cache (router statistics), or None.
        hash_ids, hash_offsets, hash_block_tokens: prefix-block hashes in CSR layout, or None.
    """

    input_tokens: NDArray[np.int64]
    output_tokens: NDArray[np.int64]
    arrival_s: NDArray[np.float64] | None = None
    tenant: NDArray[np.str_] | None = None
    route: NDArray[np.str_] | None = None
    stream: NDArray[np.float64] | None = None
    ok: NDArray[np.bool_] | None = None
    latency_s: dict[str, NDArray[np.float64]] = field(default_factory=dict)
    stages_s: dict[str, NDArray[np.float64]] = field(default_factory=dict)
    prefix_hit_tokens: NDArray[np.float64] | None = None
    hash_ids: NDArray[np.int64] | None = None
    hash_offsets: NDArray[np.int64] | None = None
    hash_block_tokens: int = 512

    def __len__(self) -> int:
        return len(self.input_tokens)

    @classmethod
    def from_columns(cls, columns: RequestColumns, tenant: str | None = None) -> RequestRecords:
        """Records of a generated or replayed stream (one tenant, or none)."""
        has_hashes = columns.has_hash_ids
        return cls(
            input_tokens=columns.input_tokens,
            output_tokens=columns.output_tokens,
            arrival_s=columns.arrival_s,
            tenant=None if tenant is None else np.full(len(columns), tenant),
            hash_ids=columns.hash_ids if has_hashes else None,
            hash_offsets=columns.hash_offsets if has_hashes else None,
            hash_block_tokens=columns.hash_block_tokens,
        )

    @classmethod
    def from_tenant_columns(cls, streams: Mapping[str, RequestColumns]) -> RequestRecords:
        """Records of several tenants' streams merged by arrival (stable: ties keep the mapping's order).

        Hash ids are namespaced per tenant (offset past the previous tenants' largest id), since ids are unique
        within one source only; the block size of the first stream with hashes is kept.
        """
        names = list(streams)
        parts = [streams[name] for name in names]
        if not parts:
            z = np.zeros(0, dtype=np.int64)
            return cls(input_tokens=z, output_tokens=z, arrival_s=np.zeros(0), tenant=np.zeros(0, dtype=np.str_))
        arrival = np.concatenate([p.arrival_s for p in parts])
        order = np.argsort(arrival, kind="stable")
        tenant = np.repeat(np.array(names, dtype=np.str_), [len(p) for p in parts])
        with_hashes = [p for p in parts if p.has_hash_ids]
        hash_ids = hash_offsets = None
        block_tokens = with_hashes[0].hash_block_tokens if with_hashes else 512
        if with_hashes:
            shifted = []
            base = 0
            for p in parts:
                shifted.append(p.hash_ids + base)
                base += int(p.hash_ids.max()) + 1 if p.has_hash_ids else 0
            counts = np.concatenate([np.diff(p.hash_offsets) for p in parts])
            offsets = np.zeros(len(counts) + 1, dtype=np.int64)
            np.cumsum(counts, out=offsets[1:])
            merged = RequestColumns(
                arrival,
                np.concatenate([p.input_tokens for p in parts]),
                np.concatenate([p.output_tokens for p in parts]),
                np.concatenate(shifted),
                offsets,
                block_tokens,
            ).take(order)
            hash_ids, hash_offsets = merged.hash_ids, merged.hash_offsets
        return cls(
            input_tokens=np.concatenate([p.input_tokens for p in parts])[order],
            output_tokens=np.concatenate([p.output_tokens for p in parts])[order],
            arrival_s=arrival[order],
            tenant=tenant[order],
            hash_ids=hash_ids,
            hash_offsets=hash_offsets,
            hash_block_tokens=block_tokens,
        )

    @classmethod
    def from_specs(cls, specs: Sequence[RequestSpec]) -> RequestRecords:
        """Records of a list of :class:`RequestSpec` (sorted by arrival here)."""
        ordered = sorted(specs, key=lambda spec: spec.arrival_s)
        counts = np.array([len(s.hash_ids) for s in ordered], dtype=np.int64)
        offsets = np.zeros(len(ordered) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        has_hashes = bool(offsets[-1] > 0)
        return cls(
            input_tokens=np.array([s.input_tokens for s in ordered], dtype=np.int64),
            output_tokens=np.array([s.output_tokens for s in ordered], dtype=np.int64),
            arrival_s=np.array([s.arrival_s for s in ordered], dtype=np.float64),
            tenant=np.array([s.tenant for s in ordered], dtype=np.str_),
            hash_ids=np.array([h for s in ordered for h in s.hash_ids], dtype=np.int64) if has_hashes else None,
            hash_offsets=offsets if has_hashes else None,
            hash_block_tokens=ordered[0].hash_block_tokens if ordered else 512,
        )

    def take(self, rows: NDArray[np.bool_]) -> RequestRecords:
        """The records selected by a boolean mask (hashes are dropped: reuse is a whole-stream property)."""

        def pick(array: NDArray[np.generic] | None) -> NDArray[np.generic] | None:
            return None if array is None else array[rows]

        return RequestRecords(
            input_tokens=self.input_tokens[rows],
            output_tokens=self.output_tokens[rows],
            arrival_s=None if self.arrival_s is None else self.arrival_s[rows],
            tenant=None if self.tenant is None else self.tenant[rows],
            route=None if self.route is None else self.route[rows],
            stream=None if self.stream is None else self.stream[rows],
            ok=None if self.ok is None else self.ok[rows],
            latency_s={k: v[rows] for k, v in self.latency_s.items()},
            stages_s={k: v[rows] for k, v in self.stages_s.items()},
            prefix_hit_tokens=None if self.prefix_hit_tokens is None else self.prefix_hit_tokens[rows],
            hash_block_tokens=self.hash_block_tokens,
        )
