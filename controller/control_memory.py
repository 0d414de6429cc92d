"""The control state on disk, so that a restarted controller carries on where it stopped.

Each tick hands the next one a :class:`~policies.control.ControlState`: the thresholds the policy last decided and
the guard let through, the table last published, and the guard's memory (when each group's pools and each tenant's
thresholds last changed, which way each pool and ordered threshold field last moved, and by which policy). Kept
only in the process, a restart threw all of it away: the new process started from the base file's thresholds and
published them in full at its first tick, undoing every threshold the policy had moved (in the gym env, a restart
every 10 minutes of a simulated day made 228 threshold reversals under ``baseline:queue_kv`` and 384 under
``learned:default`` where none ran without restarts: ``tests/env/test_restart.py``), and it forgot the guard's
cooldowns and reversal holds, so it could give back at once a pool it had grown a minute before.

An active controller that actuates therefore writes that state to a file after every tick that changed it, and reads
it back at start, after it has taken its lease (:mod:`controller.lease`: one writer per target, so one writer per
memory file), as :meth:`ControlState.after_restart` says: the policy's thresholds and the guard's memory; its
hysteresis streaks, which count consecutive ticks, only when the file is at most the guard's ``max_staleness_s`` old
(a quick restart continues the sequence, a long outage breaks it: measured in the simulator, dropping them at every
restart of a 2-minute crash loop cost ``baseline:queue_kv`` a quarter of its goodput on short-flood-8,
``experiments/results/restarts/``). Nothing counts as published then: the first tick publishes the whole table,
which the router actuator does not send when the router runs it already (:mod:`controller.actuators.router`), so a
router restarted meanwhile gets it back. The thresholds are kept only while the base policy file resolves to the
same base thresholds as when they were written (a digest of them is in the file): under a changed base file they
restart from it, as a reload with a changed base file does, and the guard's memory is kept.

A policy that remembers between ticks (:class:`policies.base.RemembersState`, found through its wrappers by
:func:`policies.registry.remembering_policy`: the rule selector, or the SLO watchdog with its primary's memory
inside) writes its memory into the same file, with the control clock's reading at the write; the new process's
policy takes it back when it has the same ``policy_id``, its times moved onto the new clock (:class:`ReadBack`). A
malformed one stops the start like the rest.

Times are written as wall-clock epoch seconds and read back onto the new process's monotonic clock (the guard's
clock), so a restart on another host or after a reboot keeps the ages; a time in the future (clock skew) is read as
now. A memory of a group or tenant the configuration no longer has is harmless (never looked up).

The default path is the lease file's with ``.memory.json`` for ``.lease`` (so, like the lease, it belongs to the
targets it is named after: for a new deployment behind the same router URL or namespace, delete it);
``control_memory_file`` in the config overrides it. Advisory mode, and an active controller with only the dry-run
actuator and no ``control_memory_file``, keep the state in the process only (they change nothing that outlives
them). Writes are atomic (a temporary file in the same directory, then ``os.replace``). A file that cannot be read
back is refused with one line naming it and the field (:class:`ControlMemoryError`; the daemon exits with the
configuration error code): it is written only by this module, so a malformed one is a fault to look at, not to
overwrite; delete it to start from the base file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Any

from controller.config import ControllerConfig
from controller.lease import lease_path
from policies.control import ControlState
from policies.guard import ORDERED_THRESHOLD_FIELDS, GroupGuardState, GuardState, ThresholdMove
from policies.schema import LengthBucket, Route, RoutingThresholds

__all__ = [
    "FORMAT",
    "VERSION",
    "ControlMemoryError",
    "ControlMemoryFile",
    "ReadBack",
    "base_digest",
    "control_memory_path",
    "decode_control_memory",
    "encode_control_memory",
    "encode_thresholds",
]

FORMAT = "pdctl-control-memory"
VERSION = 1

_THRESHOLD_FIELDS = {f.name: f for f in fields(RoutingThresholds)}


class ControlMemoryError(ValueError):
    """A control memory file that cannot be read back (the message is one line naming the file and the field)."""


def control_memory_path(config: ControllerConfig) -> Path | None:
    """Where ``config``'s controller keeps its control state (``None``: in the process only; module docstring)."""
    if config.mode != "active":
        return None
    if config.control_memory_file is not None:
        return config.control_memory_file
    lease = lease_path(config)
    return None if lease is None else lease.with_name(lease.stem + ".memory.json")


# ------------------------------------------------------------------------------------------------ thresholds


def _threshold_value(value: object) -> object:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, frozenset):
        return sorted(value)
    if isinstance(value, tuple):  # the length buckets
        return [
            {"route": b.route.value, "min_input_tokens": b.min_input_tokens, "max_input_tokens": b.max_input_tokens}
            for b in value
        ]
    return value


def encode_thresholds(thresholds: RoutingThresholds) -> dict[str, Any]:
    """Every field of ``thresholds`` as JSON values (exact: reading the file gives ``thresholds`` back)."""
    return {name: _threshold_value(getattr(thresholds, name)) for name in _THRESHOLD_FIELDS}


def base_digest(base: Mapping[str, RoutingThresholds]) -> str:
    """A digest of the base thresholds per tenant (what binds kept thresholds to the base file they came from)."""
    doc = {name: encode_thresholds(t) for name, t in sorted(base.items())}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------ writing


def _wall(at_s: float, now_s: float, wall_s: float) -> float:
    return round(wall_s - (now_s - at_s), 6)


def _encode_guard(state: GuardState, now_s: float, wall_s: float) -> dict[str, Any]:
    groups = {
        name: {
            "last_change_at": None if g.last_change_s is None else _wall(g.last_change_s, now_s, wall_s),
            "last_move": list(g.last_move),
            "last_move_policy_id": g.last_move_policy_id,
            "streak_direction": list(g.streak_direction),
            "streak_ticks": g.streak_ticks,
        }
        for name, g in sorted(state.groups.items())
    }
    tenants = {name: _wall(at_s, now_s, wall_s) for name, at_s in sorted(state.tenants.items())}
    moves = {
        tenant: {
            name: {"direction": m.direction, "at": _wall(m.at_s, now_s, wall_s), "policy_id": m.policy_id}
            for name, m in sorted(per.items())
        }
        for tenant, per in sorted(state.threshold_moves.items())
    }
    return {"groups": groups, "tenants": tenants, "threshold_moves": moves}


def encode_control_memory(
    state: ControlState,
    digest: str,
    now_s: float,
    wall_s: float,
    policy: tuple[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The document that keeps ``state`` (what :meth:`ControlState.after_restart` keeps of it).

    ``digest``: :func:`base_digest` of the base thresholds it runs on. The guard's times, on its clock where
    ``now_s`` is wall time ``wall_s``, are written as wall-clock epoch seconds. ``policy``: the policy's id and
    its memory (:class:`~policies.base.RemembersState`), written with the control clock's reading ``now_s``.
    """
    return {
        "format": FORMAT,
        "version": VERSION,
        "written_at": round(wall_s, 6),
        "base_digest": digest,
        "policy_thresholds": {n: encode_thresholds(t) for n, t in sorted(state.policy_thresholds.items())},
        "guard": _encode_guard(state.guard, now_s, wall_s),
        "policy": None if policy is None else {"policy_id": policy[0], "clock_s": now_s, "memory": dict(policy[1])},
    }


# ------------------------------------------------------------------------------------------------ reading


class _Reader:
    """Field access with one-line errors naming the file and the field's path."""

    def __init__(self, source: str, now_s: float, wall_s: float) -> None:
        self.source, self.now_s, self.wall_s = source, now_s, wall_s

    def fail(self, field: str, problem: str) -> ControlMemoryError:
        return ControlMemoryError(f"{self.source}: {field}: {problem}")

    def mapping(self, value: object, field: str) -> Mapping[str, Any]:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise self.fail(field, "expected a mapping")
        return value

    def text(self, value: object, field: str) -> str:
        if not isinstance(value, str):
            raise self.fail(field, "expected a string")
        return value

    def time(self, value: object, field: str) -> float:
        """A wall-clock epoch time, onto the guard's clock (never later than now)."""
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.fail(field, f"expected epoch seconds, got {value!r}")
        return min(self.now_s, self.now_s - (self.wall_s - float(value)))

    def direction(self, value: object, field: str, allowed: tuple[int, ...]) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float) or value not in allowed:
            raise self.fail(field, f"expected one of {', '.join(map(str, allowed))}, got {value!r}")
        return int(value)

    def group(self, name: str, value: object) -> GroupGuardState:
        field = f"guard.groups.{name}"
        doc = self.mapping(value, field)
        extra = doc.keys() - {"last_change_at", "last_move", "last_move_policy_id", "streak_direction", "streak_ticks"}
        if extra:
            raise self.fail(field, f"unknown field {sorted(extra)[0]}")
        at = doc.get("last_change_at")
        move = doc.get("last_move", [0, 0])
        if not isinstance(move, list) or len(move) != 2:
            raise self.fail(f"{field}.last_move", "expected [prefill, decode] directions")
        streak = doc.get("streak_direction", [0, 0])
        if not isinstance(streak, list) or len(streak) != 2:
            raise self.fail(f"{field}.streak_direction", "expected [prefill, decode] directions")
        ticks = doc.get("streak_ticks", 0)
        if isinstance(ticks, bool) or not isinstance(ticks, int) or ticks < 0:
            raise self.fail(f"{field}.streak_ticks", f"expected a count of ticks, got {ticks!r}")
        return GroupGuardState(
            last_change_s=None if at is None else self.time(at, f"{field}.last_change_at"),
            streak_direction=(
                self.direction(streak[0], f"{field}.streak_direction[0]", (-1, 0, 1)),
                self.direction(streak[1], f"{field}.streak_direction[1]", (-1, 0, 1)),
            ),
            streak_ticks=ticks,
            last_move=(
                self.direction(move[0], f"{field}.last_move[0]", (-1, 0, 1)),
                self.direction(move[1], f"{field}.last_move[1]", (-1, 0, 1)),
            ),
            last_move_policy_id=self.text(doc.get("last_move_policy_id", ""), f"{field}.last_move_policy_id"),
        )

    def move(self, tenant: str, name: str, value: object) -> ThresholdMove:
        field = f"guard.threshold_moves.{tenant}.{name}"
        if name not in ORDERED_THRESHOLD_FIELDS:
            raise self.fail(field, "not an ordered threshold field")
        doc = self.mapping(value, field)
        for key in ("direction", "at"):
            if key not in doc:
                raise self.fail(f"{field}.{key}", "missing")
        return ThresholdMove(
            direction=self.direction(doc["direction"], f"{field}.direction", (-1, 1)),
            at_s=self.time(doc["at"], f"{field}.at"),
            policy_id=self.text(doc.get("policy_id", ""), f"{field}.policy_id"),
        )

    def guard(self, value: object) -> GuardState:
        doc = self.mapping(value, "guard")
        groups = {name: self.group(name, v) for name, v in self.mapping(doc.get("groups", {}), "guard.groups").items()}
        tenants = {
            name: self.time(v, f"guard.tenants.{name}")
            for name, v in self.mapping(doc.get("tenants", {}), "guard.tenants").items()
        }
        moves = {
            tenant: {
                name: self.move(tenant, name, v)
                for name, v in self.mapping(per, f"guard.threshold_moves.{tenant}").items()
            }
            for tenant, per in self.mapping(doc.get("threshold_moves", {}), "guard.threshold_moves").items()
        }
        return GuardState(groups=groups, tenants=tenants, threshold_moves=moves)

    def thresholds(self, value: object, field: str) -> RoutingThresholds:
        doc = self.mapping(value, field)
        if doc.keys() != _THRESHOLD_FIELDS.keys():
            missing, extra = (
                sorted(_THRESHOLD_FIELDS.keys() - doc.keys()),
                sorted(doc.keys() - _THRESHOLD_FIELDS.keys()),
            )
            raise self.fail(f"{field}.{(missing or extra)[0]}", "missing" if missing else "unknown field")
        values = {name: self._threshold_field(name, doc[name], f"{field}.{name}") for name in _THRESHOLD_FIELDS}
        try:
            return RoutingThresholds(**values)  # type: ignore[arg-type]  # each value checked by its field above
        except (TypeError, ValueError) as exc:
            raise self.fail(field, str(exc).splitlines()[0]) from None

    def _threshold_field(self, name: str, value: object, field: str) -> object:
        default = _THRESHOLD_FIELDS[name].default
        try:
            if name == "enabled_models":
                if value is None:
                    return None
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise self.fail(field, "expected null or a list of model names")
                return frozenset(value)
            if name == "buckets":
                if not isinstance(value, list):
                    raise self.fail(field, "expected a list of buckets")
                return tuple(
                    LengthBucket(Route(b["route"]), int(b["min_input_tokens"]), b["max_input_tokens"]) for b in value
                )
            if isinstance(default, Enum):
                return type(default)(value)
        except (KeyError, TypeError, ValueError) as exc:
            raise self.fail(field, f"not readable: {exc}") from None
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise self.fail(field, f"expected true or false, got {value!r}")
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.fail(field, f"expected an integer, got {value!r}")
        elif isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise self.fail(field, f"expected a number, got {value!r}")
            return float(value)
        return value

    def table(self, value: object, field: str) -> dict[str, RoutingThresholds]:
        return {name: self.thresholds(v, f"{field}.{name}") for name, v in self.mapping(value, field).items()}


@dataclass(frozen=True, slots=True)
class ReadBack:
    """What a control memory document gives back.

    Attributes:
        state: the control state to start from.
        thresholds_kept: whether its thresholds are the document's (``False``: the base file changed since, so they
            restart from it; the guard's memory is kept either way).
        policy_id: the policy whose memory the document holds (``None``: none).
        policy_memory: that memory (:meth:`policies.base.RemembersState.restore_memory`).
        policy_shift_s: what moves its times onto this process's control clock.
    """

    state: ControlState
    thresholds_kept: bool
    policy_id: str | None = None
    policy_memory: Mapping[str, Any] | None = None
    policy_shift_s: float = 0.0


def decode_control_memory(
    doc: object,
    source: str,
    base: Mapping[str, RoutingThresholds],
    now_s: float,
    wall_s: float,
    max_gap_s: float,
) -> ReadBack:
    """The control state a :func:`encode_control_memory` document holds, and whether its thresholds were kept.

    Not kept: the base thresholds differ from those it was written under, so they restart from ``base``; the
    guard's memory is kept either way, its hysteresis streaks only when the file was written at most ``max_gap_s``
    before ``wall_s`` (a quick restart; the daemon passes the guard's ``max_staleness_s``). Times are read onto a
    clock where ``now_s`` is wall time ``wall_s``.

    Raises:
        ControlMemoryError: one line naming ``source`` and the field.
    """
    read = _Reader(source, now_s, wall_s)
    top = read.mapping(doc, "(top level)")
    if top.get("format") != FORMAT:
        raise read.fail("format", f"expected {FORMAT!r}, got {top.get('format')!r}")
    if top.get("version") != VERSION:
        raise read.fail("version", f"expected {VERSION}, got {top.get('version')!r} (written by another build?)")
    written_at = read.time(top.get("written_at"), "written_at")
    guard = read.guard(top.get("guard", {})).after_restart(keep_streaks=now_s - written_at <= max_gap_s)
    policy_thresholds = read.table(top.get("policy_thresholds"), "policy_thresholds")
    policy_id, memory, shift_s = None, None, 0.0
    if top.get("policy") is not None:
        policy = read.mapping(top.get("policy"), "policy")
        policy_id = read.text(policy.get("policy_id"), "policy.policy_id")
        memory = read.mapping(policy.get("memory"), "policy.memory")
        clock_s = policy.get("clock_s")
        if isinstance(clock_s, bool) or not isinstance(clock_s, int | float) or not math.isfinite(clock_s):
            raise read.fail("policy.clock_s", f"expected seconds, got {clock_s!r}")
        # the writer's clock reading clock_s was wall time written_at, which is written_at_s on this clock
        shift_s = written_at - float(clock_s)
    if read.text(top.get("base_digest"), "base_digest") != base_digest(base):
        return ReadBack(ControlState(policy_thresholds=dict(base), guard=guard), False, policy_id, memory, shift_s)
    return ReadBack(ControlState(policy_thresholds=policy_thresholds, guard=guard), True, policy_id, memory, shift_s)


def _kept(state: ControlState, policy: tuple[str, Mapping[str, Any]] | None) -> tuple[object, ...]:
    """What of ``state`` and the policy's memory is written: a change of anything else needs no write."""
    guard = state.guard
    moves = {(t, n): m for t, per in guard.threshold_moves.items() for n, m in per.items()}
    return dict(state.policy_thresholds), dict(guard.groups), dict(guard.tenants), moves, policy


@dataclass(slots=True)
class ControlMemoryFile:
    """One controller's control memory file: read once at start, written after each tick that changed it."""

    path: Path
    _written: tuple[object, ...] | None = None

    def load(
        self, base: Mapping[str, RoutingThresholds], now_s: float, wall_s: float, max_gap_s: float
    ) -> ReadBack | None:
        """What the file gives back (``None``: no file yet).

        Raises:
            ControlMemoryError: the file cannot be read or is malformed (one line naming it and the field).
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise ControlMemoryError(f"{self.path}: cannot read: {exc}".splitlines()[0]) from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ControlMemoryError(f"{self.path}: not JSON: {exc}") from None
        return decode_control_memory(doc, str(self.path), base, now_s, wall_s, max_gap_s)

    def save(
        self,
        state: ControlState,
        digest: str,
        now_s: float,
        wall_s: float,
        policy: tuple[str, Mapping[str, Any]] | None = None,
    ) -> bool:
        """Write ``state`` and ``policy`` (its id and memory) atomically, unless they are what was last written.

        Returns whether it wrote.

        Raises:
            OSError: the directory cannot be written (the caller logs it; the state stays in the process).
        """
        kept = _kept(state, policy)
        if kept == self._written:
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = encode_control_memory(state, digest, now_s, wall_s, policy)
        text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._written = kept
        return True
