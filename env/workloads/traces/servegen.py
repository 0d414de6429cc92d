"""ServeGen client distributions (Alibaba, arXiv:2505.09999): loading, and sampling requests from them.

A ServeGen folder is not a per-request trace. Each client ``<id>`` has

* ``chunk-<id>-trace.csv`` (no header): ``window_start_s, rate_req_per_s, iat_cv, fit_family, param1, param2`` for
  consecutive 600-s windows; ``fit_family`` is ``Gamma`` (shape, scale), ``Weibull`` (shape, scale) or empty;
* ``chunk-<id>-dataset.json``: ``{window_start_s: {field: "{value: probability, ...}"}}`` with PMFs of
  ``input_tokens``, ``output_tokens`` (and ``reason_ratio``, not used here) for a few windows of the day.

Sampling (:func:`sample_servegen`): in every 600-s window with a positive rate, a client's arrivals form a renewal
process whose inter-arrival family and shape are the fitted ones, with the scale reset so the mean gap is exactly
``1/rate`` (the fit's own mean differs slightly); windows without a fit use a Gamma of the window's CV (exponential
when the CV is 0 or 1). Lengths come from the client's PMFs of the latest dataset window at or before the arrival;
an empty PMF (``"{}"``: no data in that window) is skipped, so the nearest earlier window with data stands in
(else the earliest one).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from env.workloads.columns import RequestColumns
from env.workloads.errors import TraceFormatError, TraceNotFoundError
from env.workloads.traces._io import read_text

__all__ = ["SERVEGEN_WINDOW_S", "Pmf", "ServeGenClient", "load_servegen_folder", "sample_servegen"]

#: Length of one rate window of the ServeGen client traces (s).
SERVEGEN_WINDOW_S = 600.0
_TRACE_NAME = re.compile(r"^chunk-(.+)-trace\.csv$")
_FAMILIES = ("Gamma", "Weibull", "")


@dataclass(frozen=True, slots=True, eq=False)
class Pmf:
    """A discrete distribution: ``values`` (sorted) with probabilities ``probs`` (summing to 1)."""

    values: NDArray[np.float64]
    probs: NDArray[np.float64]

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        """Draw ``n`` values."""
        cdf = np.cumsum(self.probs)
        index = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
        drawn: NDArray[np.float64] = self.values[np.minimum(index, len(self.values) - 1)]
        return drawn

    def mean(self) -> float:
        """Return the mean."""
        return float(np.dot(self.values, self.probs))


@dataclass(frozen=True, slots=True, eq=False)
class ServeGenClient:
    """One ServeGen client: per-window arrival statistics and per-dataset-window length PMFs."""

    client_id: str
    window_start_s: NDArray[np.float64]
    rate_rps: NDArray[np.float64]
    iat_cv: NDArray[np.float64]
    family: tuple[str, ...]
    param1: NDArray[np.float64]
    param2: NDArray[np.float64]
    dataset_start_s: NDArray[np.float64]
    input_pmfs: tuple[Pmf, ...]
    output_pmfs: tuple[Pmf, ...]

    def mean_rate_rps(self) -> float:
        """Return the client's rate averaged over its windows."""
        return float(self.rate_rps.mean()) if len(self.rate_rps) else 0.0


def _read_client_windows(
    path: Path,
) -> tuple[
    NDArray[np.float64],
    NDArray[np.float64],
    NDArray[np.float64],
    tuple[str, ...],
    NDArray[np.float64],
    NDArray[np.float64],
]:
    names = ("window_start_s", "rate_req_per_s", "iat_cv", "fit_family", "param1", "param2")
    numeric: list[list[float]] = [[], [], [], [], []]
    families: list[str] = []
    line_numbers: list[int] = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        line_numbers.append(number)
        fields = line.split(",")
        if len(fields) != len(names):
            raise TraceFormatError(path, f"{len(fields)} fields, expected {len(names)}", line=number)
        if fields[3] not in _FAMILIES:
            raise TraceFormatError(path, f"unknown fit family {fields[3]!r}", line=number, column=names[3])
        families.append(fields[3])
        for slot, (value, name) in enumerate(zip(fields[:3] + fields[4:], names[:3] + names[4:], strict=True)):
            try:
                number_value = float(value) if value.strip() else 0.0
            except ValueError:
                raise TraceFormatError(path, f"not a number: {value!r}", line=number, column=name) from None
            if not math.isfinite(number_value) or (slot < 3 and number_value < 0):
                raise TraceFormatError(path, f"bad value {value!r}", line=number, column=name)
            numeric[slot].append(number_value)
    arrays = [np.array(column, dtype=np.float64) for column in numeric]
    if len(arrays[0]) and (np.diff(arrays[0]) <= 0).any():
        bad_row = int(np.flatnonzero(np.diff(arrays[0]) <= 0)[0]) + 1
        raise TraceFormatError(path, "window starts must increase", line=line_numbers[bad_row], column=names[0])
    return arrays[0], arrays[1], arrays[2], tuple(families), arrays[3], arrays[4]


def _parse_pmf(path: Path, text: object, where: str) -> Pmf:
    if not isinstance(text, str) or not text.strip().startswith("{") or not text.strip().endswith("}"):
        raise TraceFormatError(path, "expected a PMF string '{value: probability, ...}'", column=where)
    body = text.strip()[1:-1].replace(":", ",")
    try:
        pairs = np.array(body.split(","), dtype=np.float64).reshape(-1, 2) if body.strip() else np.zeros((0, 2))
    except ValueError:
        raise TraceFormatError(path, "malformed PMF", column=where) from None
    if len(pairs) == 0 or (pairs[:, 1] < 0).any() or pairs[:, 1].sum() <= 0 or not np.isfinite(pairs).all():
        raise TraceFormatError(path, "PMF is empty or has negative or non-finite entries", column=where)
    order = np.argsort(pairs[:, 0], kind="stable")
    probs = pairs[order, 1]
    return Pmf(pairs[order, 0], probs / probs.sum())


def _is_empty_pmf(text: object) -> bool:
    return isinstance(text, str) and text.replace(" ", "") == "{}"


def _read_client_pmfs(path: Path) -> tuple[NDArray[np.float64], tuple[Pmf, ...], tuple[Pmf, ...]]:
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, f"invalid JSON ({exc.msg})", line=exc.lineno) from None
    if not isinstance(data, dict) or not data:
        raise TraceFormatError(path, "expected a non-empty object {window_start_s: {field: PMF}}")
    entries: list[tuple[float, Pmf, Pmf]] = []
    for key, fields in data.items():
        try:
            start_s = float(key)
        except ValueError:
            raise TraceFormatError(path, f"window key {key!r} is not a number") from None
        if not isinstance(fields, dict):
            raise TraceFormatError(path, "expected an object of PMFs", column=key)
        for field in ("input_tokens", "output_tokens"):
            if field not in fields:
                raise TraceFormatError(path, f"window {key}: missing field", column=field)
        if any(_is_empty_pmf(fields[field]) for field in ("input_tokens", "output_tokens")):
            continue  # no requests observed in that dataset window: the nearest other window stands in
        entries.append(
            (
                start_s,
                _parse_pmf(path, fields["input_tokens"], f"{key}.input_tokens"),
                _parse_pmf(path, fields["output_tokens"], f"{key}.output_tokens"),
            )
        )
    if not entries:
        raise TraceFormatError(path, "no window has input_tokens and output_tokens PMFs")
    entries.sort(key=lambda entry: entry[0])
    return (
        np.array([e[0] for e in entries]),
        tuple(e[1] for e in entries),
        tuple(e[2] for e in entries),
    )


def load_servegen_folder(path: Path, clients: tuple[str, ...] | None = None) -> tuple[ServeGenClient, ...]:
    """Load every client (or the named ones) of a ServeGen folder, ordered by client id (numeric where possible).

    Raises:
        TraceNotFoundError: the folder, a named client or a client's dataset file is missing.
        TraceFormatError: a malformed trace CSV or dataset JSON.
    """
    if not path.is_dir():
        raise TraceNotFoundError(path, "no such folder" if not path.exists() else "expected a ServeGen folder")
    found = {m.group(1): p for p in path.iterdir() if (m := _TRACE_NAME.match(p.name))}
    if not found:
        raise TraceNotFoundError(path, "no chunk-<client>-trace.csv files in the folder")
    if clients is not None:
        missing = [c for c in clients if c not in found]
        if missing:
            raise TraceNotFoundError(path / f"chunk-{missing[0]}-trace.csv", "no such ServeGen client")
        found = {c: found[c] for c in clients}
    loaded = []
    for client_id in sorted(found, key=lambda c: (not c.isdigit(), int(c) if c.isdigit() else 0, c)):
        starts, rates, cvs, families, p1, p2 = _read_client_windows(found[client_id])
        ds_start, input_pmfs, output_pmfs = _read_client_pmfs(path / f"chunk-{client_id}-dataset.json")
        loaded.append(
            ServeGenClient(client_id, starts, rates, cvs, families, p1, p2, ds_start, input_pmfs, output_pmfs)
        )
    return tuple(loaded)


def _gaps(
    rng: np.random.Generator, family: str, shape: float, cv: float, rate_rps: float, n: int
) -> NDArray[np.float64]:
    """Draw ``n`` inter-arrival gaps with mean ``1/rate_rps``."""
    mean_s = 1.0 / rate_rps
    if family == "Weibull" and shape > 0:
        return rng.weibull(shape, n) * (mean_s / math.gamma(1.0 + 1.0 / shape))
    if family == "Gamma" and shape > 0:
        return rng.gamma(shape, mean_s / shape, n)
    if cv > 0 and not math.isclose(cv, 1.0):
        k = 1.0 / (cv * cv)
        return rng.gamma(k, mean_s / k, n)
    return rng.exponential(mean_s, n)


def _window_arrivals(
    rng: np.random.Generator, family: str, shape: float, cv: float, rate_rps: float, length_s: float
) -> NDArray[np.float64]:
    expected = rate_rps * length_s
    chunks: list[NDArray[np.float64]] = []
    elapsed = 0.0
    while elapsed < length_s:
        gaps = _gaps(rng, family, shape, cv, rate_rps, int(expected * 1.25 + 4.0 * math.sqrt(expected) + 8))
        times = elapsed + np.cumsum(gaps)
        chunks.append(times)
        elapsed = float(times[-1])
    times = np.concatenate(chunks)
    return times[times < length_s]


def sample_servegen(
    clients: tuple[ServeGenClient, ...],
    rng: np.random.Generator,
    *,
    start_s: float = 0.0,
    duration_s: float | None = None,
    rate_scale: float = 1.0,
    horizon_s: float | None = None,
    max_requests: int | None = None,
    max_tokens: int = 131_072,
) -> RequestColumns:
    """Sample requests from ServeGen clients over a window of the day.

    Trace time ``[start_s, start_s + duration_s)`` is generated, shifted to 0 and divided by ``rate_scale``; rows at
    or after ``horizon_s`` (workload time) are dropped, then all but the first ``max_requests``. Lengths are
    rounded and clipped to ``[1, max_tokens]``.
    """
    end_s = math.inf if duration_s is None else start_s + duration_s
    if horizon_s is not None:
        end_s = min(end_s, start_s + horizon_s * rate_scale)
    arrival_parts: list[NDArray[np.float64]] = []
    input_parts: list[NDArray[np.float64]] = []
    output_parts: list[NDArray[np.float64]] = []
    for client in clients:
        client_times: list[NDArray[np.float64]] = []
        for i, window_s in enumerate(client.window_start_s.tolist()):
            rate = float(client.rate_rps[i])
            if rate <= 0 or window_s + SERVEGEN_WINDOW_S <= start_s or window_s >= end_s:
                continue
            offsets = _window_arrivals(
                rng, client.family[i], float(client.param1[i]), float(client.iat_cv[i]), rate, SERVEGEN_WINDOW_S
            )
            times = window_s + offsets
            client_times.append(times[(times >= start_s) & (times < end_s)])
        if not client_times:
            continue
        times = np.concatenate(client_times)
        which = np.maximum(np.searchsorted(client.dataset_start_s, times, side="right") - 1, 0)
        inputs = np.empty(len(times))
        outputs = np.empty(len(times))
        for d in np.unique(which).tolist():
            rows = which == d
            count = int(rows.sum())
            inputs[rows] = client.input_pmfs[d].sample(rng, count)
            outputs[rows] = client.output_pmfs[d].sample(rng, count)
        arrival_parts.append(times)
        input_parts.append(inputs)
        output_parts.append(outputs)
    if not arrival_parts:
        return RequestColumns.empty()
    times = np.concatenate(arrival_parts)
    order = np.argsort(times, kind="stable")
    if max_requests is not None:
        order = order[:max_requests]
    arrival_s = (times[order] - start_s) / rate_scale
    clip = (1, max_tokens)
    inputs_out = np.clip(np.rint(np.concatenate(input_parts)[order]), *clip).astype(np.int64)
    outputs_out = np.clip(np.rint(np.concatenate(output_parts)[order]), *clip).astype(np.int64)
    return RequestColumns.from_arrays(arrival_s, inputs_out, outputs_out)
