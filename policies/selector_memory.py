"""A rule selector's memory as a JSON document, so that a restarted controller's selector carries on.

What :class:`~policies.rule_selector.RuleSelector` remembers between ticks, per group: the rule acting and the one
routing, the patience under way, the pool move clock, the evidence since the last switch, the trial of the acting rule
and the bars on failed ones, the outcome record; and the deployed split of each group (restored when a group leaves
``aggregated``), the pools it last asked for, and the last transfer features it saw. Rules are written by name (the
readers of each value: :mod:`policies.memory_codec`). Times are on the control clock (``PolicyContext.now_s``) and
moved by a shift when read back (the controller computes it from the wall clock, :mod:`controller.control_memory`).

Measured in the simulator (``experiments/results/restarts/``): restarted every 2 minutes without this memory (the
selector resuming only the rule in force), ``learned:default`` lost 2.4 % of its goodput on network-incident-8; with
it, a restart changes no figure.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from policies.memory_codec import read_count, read_number, read_pair, read_time
from policies.pool_clamp import MoveClock
from policies.watchdog import BudgetSplit

__all__ = ["GroupMemory", "decode_group", "decode_split", "encode_group", "encode_split"]

GroupMemory = Any
"""A ``policies.rule_selector._GroupState`` (typed loosely here: this module only reads and writes its fields)."""


def encode_group(state: GroupMemory, rules: Sequence[str]) -> dict[str, Any]:
    """One group's state as JSON values (rules by name)."""

    def name(index: int | None) -> str | None:
        return None if index is None else rules[index]

    return {
        "rule": rules[state.rule],
        "proposed": name(state.proposed),
        "streak": state.streak,
        "routing": rules[state.routing],
        "move": [state.move.moving_since_s, state.move.settled_since_s],
        "started_s": state.started_s,
        "ratio_sum": None if state.ratio_sum is None else [float(v) for v in state.ratio_sum],
        "ratio_windows": state.ratio_windows,
        "trial_since_s": state.trial_since_s,
        "previous": name(state.previous),
        "bars": {rules[r]: [until_s, failed] for r, (until_s, failed) in sorted(state.bars.items())},
        "outcomes": [list(o) for o in state.outcomes],
        "acting_since_s": state.acting_since_s,
        "left_outcomes": None if state.left_outcomes is None else [list(o) for o in state.left_outcomes],
    }


def decode_group(
    doc: object, field: str, rules: Sequence[str], state: GroupMemory, shift_s: float, window: int
) -> GroupMemory:
    """Fill ``state`` (a fresh group state) from ``doc``; ``window``: the outcome record's length.

    Raises:
        ValueError: one line naming the field.
    """
    if not isinstance(doc, dict):
        raise ValueError(f"{field}: expected a mapping")

    def optional_rule(key: str) -> int | None:
        value = doc.get(key)
        return None if value is None else required_rule(key)

    def required_rule(key: str) -> int:
        value = doc.get(key)
        if value not in rules:
            raise ValueError(f"{field}.{key}: {value!r} is not one of the selector's rules ({', '.join(rules)})")
        return rules.index(value)

    state.rule, state.routing = required_rule("rule"), required_rule("routing")
    state.proposed, state.previous = optional_rule("proposed"), optional_rule("previous")
    state.streak = read_count(doc.get("streak"), f"{field}.streak")
    move = doc.get("move")
    if not isinstance(move, list) or len(move) != 2:
        raise ValueError(f"{field}.move: expected [moving since, settled since]")
    state.move = MoveClock(
        read_time(move[0], f"{field}.move[0]", shift_s), read_time(move[1], f"{field}.move[1]", shift_s)
    )
    state.started_s = read_number(doc.get("started_s"), f"{field}.started_s") + shift_s
    ratio_sum = doc.get("ratio_sum")
    if ratio_sum is not None:
        if not isinstance(ratio_sum, list) or len(ratio_sum) != len(rules):
            raise ValueError(f"{field}.ratio_sum: expected {len(rules)} numbers")
        state.ratio_sum = np.array([read_number(v, f"{field}.ratio_sum") for v in ratio_sum], dtype=np.float64)
    state.ratio_windows = read_count(doc.get("ratio_windows"), f"{field}.ratio_windows")
    state.trial_since_s = read_time(doc.get("trial_since_s"), f"{field}.trial_since_s", shift_s)
    bars = doc.get("bars")
    if not isinstance(bars, dict):
        raise ValueError(f"{field}.bars: expected a mapping")
    state.bars = {}
    for key, value in bars.items():
        if key not in rules:
            raise ValueError(f"{field}.bars.{key}: not one of the selector's rules")
        until_s, failed = read_pair(value, f"{field}.bars.{key}")
        state.bars[rules.index(key)] = (until_s + shift_s, read_count(int(failed), f"{field}.bars.{key}[1]"))
    outcomes = doc.get("outcomes")
    if not isinstance(outcomes, list):
        raise ValueError(f"{field}.outcomes: expected a list")
    state.outcomes = deque((read_pair(o, f"{field}.outcomes") for o in outcomes), maxlen=window)
    state.acting_since_s = read_time(doc.get("acting_since_s"), f"{field}.acting_since_s", shift_s)
    left = doc.get("left_outcomes")
    if left is not None and not isinstance(left, list):
        raise ValueError(f"{field}.left_outcomes: expected a list")
    state.left_outcomes = None if left is None else tuple(read_pair(o, f"{field}.left_outcomes") for o in left)
    return state


def encode_split(split: BudgetSplit | None) -> list[float] | None:
    """A deployed split as two shares (``None``: no instance ran when it was taken)."""
    return None if split is None else [split.prefill_share_frac, split.instances_share_frac]


def decode_split(value: object, field: str) -> BudgetSplit | None:
    """The split :func:`encode_split` wrote."""
    if value is None:
        return None
    prefill, instances = read_pair(value, field)
    return BudgetSplit(prefill, instances)
