"""The rule selector: a learned policy that picks, per tenant group and interval, which rule acts there.

A set policy (:mod:`policies.set_policy`) regresses every routing threshold and pool move; trained to imitate
the best rule of each scenario it learned one rule's side of a discrimination and broke the other's. The selector
learns only the discrimination. Every interval it reads each tenant group's window as one relative row
(:func:`group_features`: the group's set-policy row, plus the mean and the maximum of its tenants' rows, all from
:func:`policies.set_features.build_set_observation`), scores the rules of its manifest with a small network shared
across groups, and lets the chosen rule decide that group's pools and its tenants' thresholds. Whatever it
chooses, a group is run by one of the rules a platform team already trusts, never by a threshold nobody wrote.

* **Any layout.** The network sees one group at a time, so any number of groups and tenants and any GPU budget
  fit; nothing counts groups, tenants or instances.
* **Hysteresis.** A group changes rule only after the same other rule (or, with
  :attr:`SelectorManifest.patience_streak` ``any_better``, any other rule) has scored best for
  :attr:`SelectorManifest.switch_patience_intervals` intervals in a row, each time by at least
  :attr:`SelectorManifest.switch_margin_frac` of predicted goodput ratio, judged on one window or, with
  :attr:`SelectorManifest.switch_evidence` ``since_switch``, on the mean since the group's last change; it
  starts under the manifest's first rule (the watchdog's fallback by default) or, with
  :attr:`SelectorManifest.first_decision` ``scored``, under the rule its first window scores best.
* **Flap damping** (with :attr:`SelectorBehaviour.failed_rule_bar_s`): a rule a group was switched to and soon
  switched back from is barred from that group's choice for a while, longer at each repeat.
* **Pools.** A rule that sizes pools (``aggregated``) sets them; under a rule that holds pools as deployed, the
  group returns to the split the selector found at its first decision, relative to the budget
  (:class:`policies.watchdog.BudgetSplit`), so leaving ``aggregated`` restores the deployed prefill pool.
* **A move is judged once it has settled.** With ``settle_before_judging`` the patience counts only windows in
  which the pools the selector asked for run, and with ``move_dwell_s`` only once they have run as long as the move
  took (at most that long): the first windows after a move still carry the backlog it built up.
* **The start is judged like a move** (with :attr:`SelectorBehaviour.dwell_after_start`): a group's first windows,
  routed by the thresholds deployed before the selector or still carrying their backlog, do not count.
* **No evidence, no vote.** A window in which no tenant of a group has a known request rate (a controller's
  first ticks, a scrape gap) neither advances nor resets that group's patience: the group keeps its rule. On the
  live demo's first three 2-s ticks every value was unknown, and a selector that voted on them switched the group
  to a rule the simulator scores at a seventh of legacy's goodput on that scenario.
* **A broken transfer path** (with :attr:`SelectorBehaviour.transfer_fallback`): a window that shows a group's
  KV-transfer path unusable (:mod:`policies.transfer_fallback`) switches it to ``aggregated`` at once.
* **Tenants of no listed group** (a live policy file's implicit ``default`` tenant) keep their thresholds
  (:meth:`policies.base.PolicyContext.grouped`).

An artifact directory holds ``manifest.json`` (:class:`SelectorManifest`, ``format: pdctl-rule-selector``) and
``weights.safetensors`` (the network's tensors, :data:`TENSOR_NAMES`). Decisions are deterministic.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from policies.base import Policy, PolicyContext
from policies.baselines import BASELINES, BaselinePolicy, make_baseline
from policies.features import Observation
from policies.learned import (
    MANIFEST_NAME,
    WEIGHTS_NAME,
    PolicyLoadError,
    check_build,
    learned_policy_id,
    read_manifest,
    read_weights,
)
from policies.memory_codec import decode_mapping, decode_pools, read_pair
from policies.objectives_met import group_met_objectives
from policies.pool_clamp import MoveClock, pools_running
from policies.schema import SCHEMA_VERSION, ControlAction, PoolTargets, RoutingThresholds
from policies.selector_memory import decode_group, decode_split, encode_group, encode_split
from policies.set_features import (
    SET_GROUP_FEATURES,
    SET_TENANT_FEATURES,
    SetObservation,
    build_set_observation,
    encode_row,
    set_feature_hash,
)
from policies.transfer_fallback import remote_path_unusable
from policies.watchdog import BudgetSplit, population_numbers

__all__ = [
    "GROUP_INPUT_WIDTH",
    "MAX_BAR_DOUBLINGS",
    "SELECTOR_FORMAT",
    "TENSOR_NAMES",
    "TRANSFER_COLUMNS",
    "UNVARIED_SCALE",
    "RuleSelector",
    "SelectorBehaviour",
    "SelectorManifest",
    "SelectorNetwork",
    "TransferMemory",
    "group_features",
    "read_selector_manifest",
]

SELECTOR_FORMAT = "pdctl-rule-selector"
GROUP_INPUT_WIDTH = 2 * len(SET_GROUP_FEATURES) + 4 * len(SET_TENANT_FEATURES)
"""One group's input: its row (values, known flags), then the mean and the maximum of its tenants' rows."""
MAX_BAR_DOUBLINGS = 5
"""A rule's bar doubles with each failed trial up to ``2 ** MAX_BAR_DOUBLINGS`` × ``failed_rule_bar_s`` (32×: 2 h 40
min at 300 s), so a controller that runs for weeks never bars a rule for good. Below the cap in any evaluated run: five
bars of 300 s take 2 h 35 min, longer than any scenario."""
TRIAL_CHECK_MARGIN_FRAC = 0.10
"""How much less often (absolute SLO attainment) the windows under a new rule may meet the objectives than those under
the rule it replaced before the switch counts as failed (``trial_check_windows``). Per-window attainment is noisy; a
tenth is twice the SLO watchdog's margin against its fallback."""
TRIAL_CHECK_HEALTHY_FRAC = 0.9
"""Only a switch away from a rule whose recorded windows met the objectives in at least this fraction of requests (the
line of the sustainable rate, ``pdctl evaluate --sweep-rate``) is checked (``trial_check_windows``). Under overload
every rule's windows worsen as the backlog grows, whichever routes it, and a rule that drains a backlog best starts
from the worst windows: measured on validation scenarios, reverting such switches lost as often as it gained."""
TRIAL_CHECK_LOAD_TOLERANCE_FRAC = 0.25
"""A window under the new rule is compared only when its offered load per instance is at most this much above the
mean of the left rule's windows (the SLO watchdog's ``load_tolerance_frac``): a rise in load is not blamed."""
UNVARIED_SCALE = 1e-3
"""The input scale a fit gives a feature that never varied in its training data (the floor of the standard
deviation, :func:`agents.selector_fit.fit_selector`); at run time such a feature is held at its training value."""
TENSOR_NAMES: tuple[str, ...] = (
    "input.mean",
    "input.scale",
    "hidden0.weight",
    "hidden0.bias",
    "hidden1.weight",
    "hidden1.bias",
    "out.weight",
    "out.bias",
)
"""The network's tensors: input standardisation, two ReLU layers ``[width, in]``, the rule scores ``[rules, width]``."""


def group_features(rows: SetObservation) -> np.ndarray:
    """One input row per tenant group ``[groups, GROUP_INPUT_WIDTH]`` (module docstring).

    A group without tenants has zero tenant parts (every value unknown).
    """
    width = 2 * len(SET_TENANT_FEATURES)
    out = np.zeros((len(rows.group_rows), GROUP_INPUT_WIDTH), dtype=np.float32)
    for gi, group_row in enumerate(rows.group_rows):
        members = [
            encode_row(row, SET_TENANT_FEATURES)
            for row, index in zip(rows.tenant_rows, rows.tenant_group, strict=True)
            if index == gi
        ]
        tenants = np.stack(members) if members else np.zeros((1, width), dtype=np.float32)
        out[gi] = np.concatenate([encode_row(group_row, SET_GROUP_FEATURES), tenants.mean(0), tenants.max(0)])
    return out


class SelectorBehaviour(BaseModel):
    """How a rule selector acts at run time beyond its weights.

    Set by a training recipe (``agents.config.SelectorConfig``) and carried by the manifest it exports
    (:class:`SelectorManifest`): one definition of each field, its bounds and its meaning.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    switch_patience_intervals: int = Field(default=2, ge=1, le=100)
    """Intervals in a row another rule must score best before a group changes rule."""
    patience_streak: Literal["same_rule", "any_better"] = "same_rule"
    """What the patience counts: intervals in a row that the **same** other rule scores best (``same_rule``), or
    intervals in a row that **some** other rule scores above the acting one (``any_better``; the switch then goes
    to the latest best), so that a group whose rule is failing does not wait while the alternatives trade places."""
    transfer_memory_s: float = Field(default=0.0, ge=0.0, le=86_400)
    """How long a group's last observed KV-transfer features stand in for unknown ones (0 = never). Under a rule
    that transfers nothing (``aggregated``) the transfer features go unknown, so without a memory the selector
    cannot tell a network still failing from one that recovered, and leaves aggregated as soon as it has switched
    to it; with one, it judges on the last transfers it saw until they are this old."""
    settle_before_judging: bool = False
    """Count the patience only in intervals where the group's pools are settled: no instance starting or
    switching, and the pools the selector last asked for running. A rule is trained on the states it leads to,
    not on the minutes its pool move takes; judged in between, it is judged on states it was never scored on."""
    move_dwell_s: float = Field(default=0.0, ge=0.0, le=86_400)
    """With ``settle_before_judging``: after a pool move of a group has settled, count its patience only once the
    moved pools have run as long as the move took, at most this long (0 = from the first settled window). The
    windows right after a move still carry the backlog the move built up, and a backlog built over a long move takes
    long to clear; judged on them, a rule that took ten minutes to bring up is left again at once (traced on a
    validation scenario: aggregated reached after 600 s, isl-bounding chosen back 30 s later, the move undone over
    the next 600 s). Only after a move: a group's first windows are judged at once unless ``dwell_after_start``."""
    routing_follows_pools: bool = False
    """When a group changes to a rule that asks for other pools, keep routing it by the rule before until those
    pools run (no instance pending, the sizes asked for running): a pool move takes minutes, and the new rule's
    routing on the old pools (``aggregated``'s all-local prefill with the prefill pool still up) serves the
    group on part of its instances in between."""
    switch_margin_frac: float = Field(default=0.0, ge=0.0, le=1.0)
    """How much higher than the acting rule's a challenger's predicted goodput ratio (its goodput over the best
    rule's, as the network is fitted to predict it) must be for a window to count toward the patience (0 = any
    higher score counts). A switch has a cost the network does not score (a pool move drains and restarts
    instances, and the backlog it builds outlives it), and its predictions carry an error: without a margin, a
    group whose rules all score near 1.0 switches on differences of a hundredth (traced on a validation scenario:
    legacy left for aggregated at 0.97 against 0.99 during a quiet phase, the pools emptied, and the flood that
    followed met the wrong pools). A window in which no challenger clears the margin resets the patience."""
    switch_evidence: Literal["window", "since_switch"] = "window"
    """What a challenger is judged on each window: that window's predicted goodput ratios (``window``), or their
    mean over every judged window since the group last changed rule (``since_switch``; from its first decision
    before any change). One window's prediction carries its noise, and a rule that leads for three windows of a
    quiet phase is not the rule of the run; held under legacy for whole validation runs and averaged, the network's
    ratios name each scenario's best rule more often than the switches it makes from single windows do. The mean
    restarts at each change, so the evidence for leaving a rule is gathered under that rule."""
    transfer_fallback: bool = False
    """Switch a group to the ``aggregated`` rule at once, without waiting out the patience, in a window that shows
    its KV-transfer path unusable (:func:`policies.transfer_fallback.remote_path_unusable`: half its remote legs
    failed, or their p95 transfer time reached the loosest TTFT objective of its tenants), and route it locally at
    once. The network learns the cost of a failing link only from what the windows of its rollouts showed, and the
    patience then adds intervals during which every remote leg fails or times out and the prefill pool idles; the
    safety guard lets the move to aggregated pools through in one tick (:mod:`policies.guard`). Leaving
    ``aggregated`` afterwards is the network's decision as usual. Needs ``aggregated`` among the rules."""
    hold_while_objectives_met: bool = False
    """Keep a group's acting rule through a judged window in which every tenant of the group with traffic met its
    objectives (:func:`policies.objectives_met.group_met_objectives`: at least 95 % of its requests within both
    its TTFT and TPOT objective): such a window resets the patience as one in which the acting rule scores best.
    Nothing in that window can be served better, so a switch could pay off only through traffic still to come, and
    the network's prediction of it from a window that shows none of it is its least reliable (traced on a
    validation scenario: a group at 96 % of its capacity, every tenant at 97-100 % attainment under legacy, was
    switched to isl-or-load, whose all-remote routing overloaded the prefill pool; the queue it built held the
    group near 25 % attainment for the rest of the run). The evidence for leaving a rule is
    then gathered in windows where that rule falls short. A transfer fallback still acts at once. Off in the shipped
    selector: measured on validation 72, it gained share and lost goodput
    (``experiments/results/families/objectives-hold/``); with the 220-scenario fit, on 320 never-run scenarios, it
    raised the floor and did not raise the share (``experiments/results/families/s220-hold/``)."""
    dwell_after_start: bool = False
    """Leave a group's first windows unjudged, as the first windows after a pool move are: the window of its first
    decision was routed by the thresholds the deployment ran before the selector, not by any rule of it, and the
    windows right after still carry the backlog that routing built up. The patience counts once the acting rule has
    routed one whole window after the first decision (the window's length, ``MetricWindow.window_s``) and then as
    long again, at most ``move_dwell_s`` (the dwell after a move that took that long). Traced on a validation
    scenario: a group's first window under the initial thresholds met 2-20 % of its objectives, the next, with that
    window's backlog, 32-80 %, the third 88-98 %; counted from the first, the patience had switched the group from
    legacy to isl-or-load by the third, and the group then met about 22 % for the rest of the run. A transfer
    fallback still acts at once. Off in the shipped selector: measured on validation 72, it raised the
    geometric mean and lowered share and floor, with the two seeds disagreeing
    (``experiments/results/families/start-dwell/``)."""
    first_decision: Literal["first_rule", "scored"] = "first_rule"
    """At a group's first decision: start under the first rule and let the patience run (``first_rule``), or act
    at once as the best-scored rule (``scored``: nothing was chosen before, so there is nothing to flap from).
    Either way, a group whose tenants all run the route rule of one of the rules already (a restarted controller
    keeps the thresholds in force) resumes that rule (:meth:`RuleSelector._rule_in_force`)."""
    failed_rule_bar_s: float = Field(default=0.0, ge=0.0, le=86_400)
    """Flap damping (0 = off). When the selector switches a group back to the rule it held just before the acting
    one, within this long of switching to the acting one, that rule's trial failed: it is barred from the group's
    choice for this long, doubling with each further failed trial of it in that group (up to
    :data:`MAX_BAR_DOUBLINGS` times). The network judges a rule
    from windows of the state the acting rule keeps, and a healthy state is where it rates the rule that runs the
    system hardest best: traced on a validation scenario (default-10141), a group went from isl-bounding to legacy
    and back three times in seven minutes, legacy's windows collapsing within 30 s each time, at a seventh of the
    best rule's goodput. Only a reverted rule is barred, not one left for a third rule, and the transfer fallback
    acts whatever is barred (its move to ``aggregated`` is no trial)."""

    trial_check_windows: int = Field(default=0, ge=0, le=100)
    """Outcome check of a switch (0 = off). When the selector switches a group from one rule to another, it keeps
    the group's realised SLO attainment and offered load per instance (:func:`policies.watchdog.population_numbers`)
    of up to this many last judged windows under the rule it left; a window that began before the switch is no
    outcome of the new rule. Only a switch away from a rule that met the objectives (its windows' mean at least
    :data:`TRIAL_CHECK_HEALTHY_FRAC`) is checked, and only for ``failed_rule_bar_s`` after it: once the new rule has
    this many windows of its own, if those at a comparable or lighter load (at most
    :data:`TRIAL_CHECK_LOAD_TOLERANCE_FRAC` above the left rule's mean) are at least half of them and met the
    objectives less often than the left rule's by more than :data:`TRIAL_CHECK_MARGIN_FRAC`, the switch failed: the
    group goes back to the rule it left at once, the new rule is barred as a failed trial, and the left rule's record
    stays its windows before the trial until it has run as long as the trial did (its first windows back carry the
    trial's backlog). The network predicts a switch's gain from the window before it; nothing else checks that the
    gain came. Traced on a validation scenario (default-10323): a group meeting about 93 % of its objectives under
    legacy was switched to isl-or-load on one burst window and met about a third of them for the rest of the run,
    while the network kept rating isl-or-load at or above legacy. The transfer fallback's move to ``aggregated`` is
    not checked (a safety move, not a trial)."""

    @model_validator(mode="after")
    def _check_needs_a_bar(self) -> SelectorBehaviour:
        if self.trial_check_windows > 0 and self.failed_rule_bar_s <= 0:
            raise ValueError(
                "trial_check_windows needs failed_rule_bar_s > 0 (a failed trial bars the rule it reverts from)"
            )
        return self

    @model_validator(mode="after")
    def _dwell_needs_settling(self) -> SelectorBehaviour:
        if self.move_dwell_s > 0 and not self.settle_before_judging:
            raise ValueError("move_dwell_s needs settle_before_judging: true (the dwell follows a settled move)")
        return self

    def check_fallback_rule(self, rules: list[str]) -> None:
        """Refuse ``transfer_fallback`` without ``aggregated`` among ``rules`` (the recipe's or the manifest's).

        Raises:
            ValueError: one line naming the field.
        """
        if self.transfer_fallback and "aggregated" not in rules:
            raise ValueError("transfer_fallback needs the aggregated rule among the rules")

    def behaviour(self) -> dict[str, object]:
        """These fields and their values (what a trained selector's manifest takes from its recipe)."""
        return {name: getattr(self, name) for name in SelectorBehaviour.model_fields}


class SelectorManifest(SelectorBehaviour):
    """What travels with a rule selector's weights.

    Its rules, its network's width, how it acts (:class:`SelectorBehaviour`) and where it came from.
    """

    format: Literal["pdctl-rule-selector"] = "pdctl-rule-selector"
    schema_version: int
    feature_hash: str
    rules: list[str] = Field(min_length=2)
    """Baseline names (``policies.baselines``), in the network's output order; the first acts at the start."""
    hidden_width: int = Field(ge=1)
    ensemble_members: int = Field(default=1, ge=1, le=16)
    """Networks in the weights file (:class:`SelectorNetwork`)."""
    algorithm: str = ""
    mlflow_run_id: str | None = None
    git_commit: str | None = None
    trained_on: list[str] = []
    """Training scenarios or ``family:PATH#split``."""
    trained_behind_admission_slack_frac: float | None = None
    """Provenance: the admission stage's TTFT slack the training rollouts ran behind (:mod:`policies.admission`);
    None: none. The selector does not act on it; the router's admission stage is set in the router's own config."""

    @field_validator("rules")
    @classmethod
    def _known_rules(cls, rules: list[str]) -> list[str]:
        unknown = [r for r in rules if r not in BASELINES]
        if unknown:
            raise ValueError(f"unknown rule {unknown[0]!r} (known: {', '.join(sorted(BASELINES))})")
        if len(set(rules)) != len(rules):
            raise ValueError("a rule is listed twice")
        return rules

    @model_validator(mode="after")
    def _fallback_needs_aggregated(self) -> SelectorManifest:
        self.check_fallback_rule(self.rules)
        return self

    @model_validator(mode="after")
    def _margin_needs_ratios(self) -> SelectorManifest:
        if not self.algorithm.endswith("/soft_best"):
            return self
        for name, used in (
            ("switch_margin_frac", self.switch_margin_frac > 0),
            ("switch_evidence", self.switch_evidence != "window"),
        ):
            if used:
                raise ValueError(
                    f"{name} needs a selector fitted on goodput ratios (algorithm rule_selector/ratio); "
                    f"{self.algorithm} scores are not ratios"
                )
        return self


@dataclass(frozen=True)
class SelectorNetwork:
    """One or more members, each input standardisation, two ReLU layers and one score per rule, in numpy.

    A single network's tensors are named :data:`TENSOR_NAMES`; an ensemble of *K* members (fitted on the same data
    from *K* seeds) names member *k*'s ``m{k}.`` + those names, and scores a rule by the mean of the members'
    predicted goodput ratios (:meth:`scores`).
    """

    members: tuple[Mapping[str, np.ndarray], ...]

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, np.ndarray], num_rules: int) -> SelectorNetwork:
        """Check names and shapes against :data:`TENSOR_NAMES` (per member) and ``num_rules``.

        Raises:
            ValueError: a tensor is missing, extra or of the wrong shape, or the members differ in width (one line
                naming it).
        """
        if all(name in tensors for name in TENSOR_NAMES) or not any(k.startswith("m0.") for k in tensors):
            prefixes = [""]
        else:
            count = 0
            while any(k.startswith(f"m{count}.") for k in tensors):
                count += 1
            prefixes = [f"m{k}." for k in range(count)]
        wanted = [p + n for p in prefixes for n in TENSOR_NAMES]
        missing = [n for n in wanted if n not in tensors]
        extra = sorted(set(tensors) - set(wanted))
        if missing or extra:
            raise ValueError(f"tensors: missing {missing or 'none'}, unexpected {extra or 'none'}")
        members = []
        for prefix in prefixes:
            t = {n: np.asarray(tensors[prefix + n], dtype=np.float32) for n in TENSOR_NAMES}
            width = t["hidden0.weight"].shape[0]
            want = {
                "input.mean": (GROUP_INPUT_WIDTH,),
                "input.scale": (GROUP_INPUT_WIDTH,),
                "hidden0.weight": (width, GROUP_INPUT_WIDTH),
                "hidden0.bias": (width,),
                "hidden1.weight": (width, width),
                "hidden1.bias": (width,),
                "out.weight": (num_rules, width),
                "out.bias": (num_rules,),
            }
            for name, shape in want.items():
                if t[name].shape != shape:
                    raise ValueError(f"tensor {prefix}{name}: shape {t[name].shape}, expected {shape}")
            members.append(t)
        widths = {int(m["hidden0.weight"].shape[0]) for m in members}
        if len(widths) > 1:
            raise ValueError(f"tensors: members of different widths {sorted(widths)}")
        return cls(tuple(members))

    @property
    def hidden_width(self) -> int:
        """Units per hidden layer (every member's)."""
        return int(self.members[0]["hidden0.weight"].shape[0])

    @property
    def num_members(self) -> int:
        """Networks in the ensemble (1: a single network)."""
        return len(self.members)

    def scores(self, inputs: np.ndarray) -> np.ndarray:
        """Rule scores (logits) ``[groups, rules]`` for group inputs ``[groups, GROUP_INPUT_WIDTH]``.

        A single network's scores are its outputs. An ensemble's are the logit of the mean over members of the
        sigmoid of each member's outputs (the goodput ratio each predicts, as it was fitted), so the best-scored
        rule is the one of best mean predicted ratio.

        An input that never varied in training (its scale at :data:`UNVARIED_SCALE`) is held at its training
        value: the network learned nothing from it, and standardised by that scale any live difference would be
        a thousandfold (measured on the live demo: the tenants' prefix-hit fraction, never known in the
        simulator, is known live, and the scores went from about 7 to -1,018 … 374).
        """
        if len(self.members) == 1:
            return _member_scores(self.members[0], inputs)
        return _ratio_logits(self.member_ratios(inputs).mean(0))

    def member_ratios(self, inputs: np.ndarray) -> np.ndarray:
        """Each member's predicted goodput ratios ``[members, groups, rules]`` (the sigmoid of its outputs).

        Their mean over members is what :meth:`scores` ranks the rules by; their spread is how much the members
        disagree (an offline measure: the selector acts on :meth:`scores` alone).
        """
        return np.stack([_score_ratios(_member_scores(t, inputs)) for t in self.members])


def _member_scores(t: Mapping[str, np.ndarray], inputs: np.ndarray) -> np.ndarray:
    x = (np.asarray(inputs, dtype=np.float32) - t["input.mean"]) / t["input.scale"]
    x = np.where(t["input.scale"] <= UNVARIED_SCALE * 1.0001, np.float32(0.0), x)
    h = np.maximum(x @ t["hidden0.weight"].T + t["hidden0.bias"], 0.0)
    h = np.maximum(h @ t["hidden1.weight"].T + t["hidden1.bias"], 0.0)
    out: np.ndarray = h @ t["out.weight"].T + t["out.bias"]
    return out


_GROUP_RATE = [f.name for f in SET_GROUP_FEATURES].index("request_rate_per_instance")
_GROUP_TRANSFER = tuple(i for i, f in enumerate(SET_GROUP_FEATURES) if f.name.startswith("transfer_"))
_TENANT_TRANSFER = tuple(i for i, f in enumerate(SET_TENANT_FEATURES) if f.name.startswith("transfer_"))


def _transfer_columns() -> tuple[tuple[int, int], ...]:
    g, t = len(SET_GROUP_FEATURES), len(SET_TENANT_FEATURES)
    group = tuple((i, g + i) for i in _GROUP_TRANSFER)
    tenant_mean = tuple((2 * g + j, 2 * g + t + j) for j in _TENANT_TRANSFER)
    tenant_max = tuple((2 * g + 2 * t + j, 2 * g + 3 * t + j) for j in _TENANT_TRANSFER)
    return group + tenant_mean + tenant_max


TRANSFER_COLUMNS: tuple[tuple[int, int], ...] = _transfer_columns()
"""``(value, known flag)`` columns of the KV-transfer features in a :func:`group_features` row: the group's, then
the mean and the maximum of its tenants'."""


@dataclass
class TransferMemory:
    """The last observed KV-transfer features of each group and tenant, standing in for unknown ones for a while.

    Only the transfer features (``transfer_*`` in :data:`~policies.set_features.SET_GROUP_FEATURES` and
    :data:`~policies.set_features.SET_TENANT_FEATURES`) are remembered: they are the ones a rule that transfers
    nothing makes unknown. A value older than ``memory_s`` is forgotten (``0``: nothing is remembered).
    """

    memory_s: float
    _seen: dict[tuple[str, str, int], tuple[float, float]] = field(default_factory=dict)

    def recall(self, rows: SetObservation, context: PolicyContext) -> SetObservation:
        """``rows`` (built from ``context``, grouped) with unknown transfer features filled from recent values.

        Values known in ``rows`` are remembered with ``context.now_s``; an unknown one takes the value remembered
        for its group or tenant if that is at most ``memory_s`` old.
        """
        if self.memory_s <= 0:
            return rows
        now_s = context.now_s
        groups = tuple(
            self._fill(("group", g.name), row, _GROUP_TRANSFER, now_s)
            for g, row in zip(context.groups, rows.group_rows, strict=True)
        )
        tenants = tuple(
            self._fill(("tenant", t.name), row, _TENANT_TRANSFER, now_s)
            for t, row in zip(context.tenants, rows.tenant_rows, strict=True)
        )
        return SetObservation(groups, tenants, rows.tenant_group)

    def entries(self) -> list[list[Any]]:
        """What it remembers, as ``[kind, name, feature index, value, seen at (s)]`` rows (JSON values)."""
        return [[kind, name, index, value, at_s] for (kind, name, index), (value, at_s) in sorted(self._seen.items())]

    def restored(self, rows: object, shift_s: float) -> dict[tuple[str, str, int], tuple[float, float]]:
        """The memory :meth:`entries` wrote, its times moved by ``shift_s`` (to assign with :meth:`take`).

        Raises:
            ValueError: one line naming the field.
        """
        if not isinstance(rows, list):
            raise ValueError("transfer: expected a list")
        seen: dict[tuple[str, str, int], tuple[float, float]] = {}
        for row in rows:
            if (
                not isinstance(row, list)
                or len(row) != 5
                or row[0] not in ("group", "tenant")
                or not isinstance(row[1], str)
                or isinstance(row[2], bool)
                or not isinstance(row[2], int)
            ):
                raise ValueError(f"transfer: expected [group|tenant, name, index, value, seen at], got {row!r}")
            value, at_s = read_pair(row[3:], f"transfer.{row[1]}")
            seen[(row[0], row[1], row[2])] = (value, at_s + shift_s)
        return seen

    def take(self, seen: dict[tuple[str, str, int], tuple[float, float]]) -> None:
        """Remember ``seen`` (from :meth:`restored`) instead of what it remembered."""
        self._seen = seen

    def _fill(
        self, key: tuple[str, str], row: tuple[float | None, ...], indices: tuple[int, ...], now_s: float
    ) -> tuple[float | None, ...]:
        out = list(row)
        for i in indices:
            value = row[i]
            if value is not None and math.isfinite(value):
                self._seen[(*key, i)] = (value, now_s)
                continue
            seen = self._seen.get((*key, i))
            if seen is not None and now_s - seen[1] <= self.memory_s:
                out[i] = seen[0]
        return tuple(out)


@dataclass
class _GroupState:
    rule: int = 0
    proposed: int | None = None
    streak: int = 0
    routing: int = 0
    """The rule whose thresholds act (``rule`` unless ``routing_follows_pools`` holds the previous one)."""
    move: MoveClock = field(default_factory=MoveClock)
    """Its last pool move (``settle_before_judging``, ``move_dwell_s``)."""
    started_s: float = 0.0
    """When the selector first decided for the group (``dwell_after_start``)."""
    ratio_sum: np.ndarray | None = None
    """Predicted goodput ratios summed over the judged windows since the last change (``since_switch``)."""
    ratio_windows: int = 0
    trial_since_s: float | None = None
    """When the selector switched the group to its acting rule (None: the rule was not switched to, so it is on no
    trial; ``failed_rule_bar_s``)."""
    previous: int | None = None
    """The rule the group held before the acting one, when the acting one is on trial."""
    bars: dict[int, tuple[float, int]] = field(default_factory=dict)
    """Rule → (barred until, s; failed trials so far) (``failed_rule_bar_s``)."""
    outcomes: deque[tuple[float, float]] = field(default_factory=deque)
    """(SLO attainment, offered load per instance) of the acting rule's last judged windows
    (``trial_check_windows``)."""
    acting_since_s: float | None = None
    """When the acting rule's windows start to count as its outcomes (``trial_check_windows``): at a switch, the
    switch (a window still holding traffic the rule before routed is no outcome of the acting one); at a revert, as
    long after it as the failed trial lasted."""
    left_outcomes: tuple[tuple[float, float], ...] | None = None
    """The left rule's last judged windows, while the acting rule's switch is checked (``trial_check_windows``)."""


@dataclass
class RuleSelector:
    """A trained rule selector (module docstring). Stateful: one instance drives one deployment."""

    manifest: SelectorManifest
    network: SelectorNetwork
    source: str = ""
    rules: tuple[Policy, ...] = field(init=False)
    _groups: dict[str, _GroupState] = field(init=False, default_factory=dict)
    _splits: dict[str, BudgetSplit | None] = field(init=False, default_factory=dict)
    _memory: TransferMemory = field(init=False, default_factory=lambda: TransferMemory(0.0))
    _asked: dict[str, PoolTargets] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.rules = tuple(make_baseline(name) for name in self.manifest.rules)
        self._memory = TransferMemory(self.manifest.transfer_memory_s)

    @property
    def policy_id(self) -> str:
        """``learned:<source>`` plus the MLflow run id when known."""
        return learned_policy_id(self.source, self.manifest.mlflow_run_id)

    @classmethod
    def load(cls, path: str | Path) -> RuleSelector:
        """Load an exported selector directory; refuses mismatches and malformed files with one line.

        Raises:
            PolicyLoadError: the manifest or weights are missing, malformed or from another build.
        """
        root = Path(path)
        manifest = read_selector_manifest(root / MANIFEST_NAME)
        check_build(
            root / MANIFEST_NAME,
            (
                ("schema_version", manifest.schema_version, SCHEMA_VERSION),
                ("feature_hash", manifest.feature_hash, set_feature_hash()),
            ),
        )
        try:
            network = SelectorNetwork.from_tensors(read_weights(root / WEIGHTS_NAME), len(manifest.rules))
        except ValueError as exc:
            raise PolicyLoadError(f"{root / WEIGHTS_NAME}: {exc}") from None
        if network.hidden_width != manifest.hidden_width:
            raise PolicyLoadError(
                f"{root / MANIFEST_NAME}: hidden_width: {manifest.hidden_width}, the weights have "
                f"{network.hidden_width}"
            )
        if network.num_members != manifest.ensemble_members:
            raise PolicyLoadError(
                f"{root / MANIFEST_NAME}: ensemble_members: {manifest.ensemble_members}, the weights have "
                f"{network.num_members}"
            )
        return cls(manifest=manifest, network=network, source=str(root))

    def memory_document(self) -> dict[str, Any]:
        """What the selector remembers between ticks (:class:`~policies.base.RemembersState`).

        The document's fields: :mod:`policies.selector_memory`.
        """
        rules = self.manifest.rules
        return {
            "rules": list(rules),
            "groups": {name: encode_group(state, rules) for name, state in sorted(self._groups.items())},
            "splits": {name: encode_split(split) for name, split in sorted(self._splits.items())},
            "asked": {name: [p.num_prefill, p.num_decode] for name, p in sorted(self._asked.items())},
            "transfer": self._memory.entries(),
        }

    def restore_memory(self, document: Mapping[str, Any], shift_s: float) -> None:
        """Take over a :meth:`memory_document`, its times moved by ``shift_s``; all of it or, on error, nothing.

        Raises:
            ValueError: the document is malformed or from a selector over other rules (one line naming the field).
        """
        rules = self.manifest.rules
        doc = decode_mapping(document, "(selector memory)")
        if doc.get("rules") != list(rules):
            raise ValueError(f"rules: {doc.get('rules')!r}, this selector's are {list(rules)!r}")
        window = self.manifest.trial_check_windows
        groups = {
            name: decode_group(
                value, f"groups.{name}", rules, _GroupState(outcomes=deque(maxlen=window)), shift_s, window
            )
            for name, value in decode_mapping(doc.get("groups"), "groups").items()
        }
        splits = {
            name: decode_split(v, f"splits.{name}") for name, v in decode_mapping(doc.get("splits"), "splits").items()
        }
        asked = {
            name: decode_pools(v, f"asked.{name}") for name, v in decode_mapping(doc.get("asked"), "asked").items()
        }
        seen = self._memory.restored(doc.get("transfer"), shift_s)
        self._groups, self._splits, self._asked = groups, splits, asked
        self._memory.take(seen)

    def chosen_rules(self) -> dict[str, str]:
        """The rule each group is run by now (groups seen so far)."""
        return {g: self.manifest.rules[s.rule] for g, s in self._groups.items()}

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """Score the rules per group, apply the hysteresis, and compose the chosen rules' decisions."""
        context = context.grouped()
        rows = build_set_observation(observation.window, context.observation_context())
        rows = self._memory.recall(rows, context)
        scores = self.network.scores(group_features(rows)) if context.groups else np.zeros((0, len(self.rules)))
        chosen: list[int] = []
        for gi, group in enumerate(context.groups):
            if group.name not in self._splits:
                running = context.current_pools.get(group.name)
                self._splits[group.name] = None if running is None else BudgetSplit.of(group, running)
            state = self._groups.get(group.name)
            if state is None:
                scored = self.manifest.first_decision == "scored" and rows.group_rows[gi][_GROUP_RATE] is not None
                in_force = self._rule_in_force(group.name, context)
                first = in_force if in_force is not None else int(np.argmax(scores[gi])) if scored else 0
                state = self._groups[group.name] = _GroupState(
                    rule=first,
                    routing=first,
                    started_s=context.now_s,
                    outcomes=deque(maxlen=self.manifest.trial_check_windows),
                )
            if self._transfer_fallback(state, group.name, observation, context):
                chosen.append(state.rule)
                continue
            if rows.group_rows[gi][_GROUP_RATE] is None or not self._judged(state, group.name, observation, context):
                chosen.append(state.rule)  # no traffic seen in the window (no evidence, no vote), or not judged
                continue
            if self.manifest.hold_while_objectives_met and group_met_objectives(
                observation.window, context, group.name
            ):
                chosen.append(self._advance(state, state.rule, context.now_s))
                continue
            if self._trial_failed(state, observation, context, group.name):
                chosen.append(state.rule)
                continue
            evidence = self._evidence(state, scores[gi])
            chosen.append(self._advance(state, self._challenger(state, evidence, context.now_s), context.now_s))
        decisions = {i: self.rules[i].decide(observation, context) for i in sorted(set(chosen))}
        pools: dict[str, PoolTargets] = {}
        for gi, group in enumerate(context.groups):
            decision = decisions[chosen[gi]]
            split = self._splits.get(group.name)
            if group.name in decision.pools:
                pools[group.name] = decision.pools[group.name]
            elif split is not None:
                pools[group.name] = split.applied_to(group)
        routing = [
            self._routing(g.name, chosen[gi], pools, observation, context) for gi, g in enumerate(context.groups)
        ]
        for i in sorted(set(routing) - set(decisions)):
            decisions[i] = self.rules[i].decide(observation, context)
        thresholds: dict[str, RoutingThresholds] = {}
        for gi, group in enumerate(context.groups):
            decision = decisions[routing[gi]]
            for tenant in context.tenants:
                if tenant.group == group.name and tenant.name in decision.thresholds:
                    thresholds[tenant.name] = decision.thresholds[tenant.name]
        self._asked.update(pools)
        names = self.manifest.rules
        reason = ", ".join(
            f"{g.name}: {names[chosen[i]]}"
            + ("" if routing[i] == chosen[i] else f" (routed by {names[routing[i]]} until its pools run)")
            for i, g in enumerate(context.groups)
        )
        return ControlAction(thresholds, pools, reason=f"selector: {reason}", policy_id=self.policy_id)

    def _rule_in_force(self, group: str, context: PolicyContext) -> int | None:
        """The rule whose route rule every tenant of ``group`` runs now, when exactly one of the rules sets it.

        A selector's first decision for a group resumes that rule instead of starting under the first one: a
        restarted controller keeps the thresholds in force (``controller.control_memory``), and without this a
        restart handed every group to the first rule and back again after the patience (in the gym env, a restart
        every 10 minutes of a simulated day made 384 threshold reversals where none ran without restarts:
        ``tests/env/test_restart.py``). A deployment that starts from its base policy file runs none of the rules'
        route rules (the file's rule is ``pdctl`` unless it names another), so a fresh start is unchanged.
        """
        rules = {t.rule for t in (context.current_thresholds.get(x.name) for x in context.tenants_of(group)) if t}
        if len(rules) != 1:
            return None
        (rule,) = rules
        matches = [i for i, r in enumerate(self.rules) if isinstance(r, BaselinePolicy) and r.route_rule == rule]
        return matches[0] if len(matches) == 1 else None

    def _routing(
        self,
        group: str,
        rule: int,
        pools: Mapping[str, PoolTargets],
        observation: Observation,
        context: PolicyContext,
    ) -> int:
        """The rule whose thresholds act for ``group`` now (see ``routing_follows_pools``)."""
        state = self._groups[group]
        moving = not pools_running(observation.window, context, group, pools.get(group))
        if state.routing != rule and self.manifest.routing_follows_pools and moving:
            return state.routing
        state.routing = rule
        return rule

    def _transfer_fallback(
        self, state: _GroupState, group: str, observation: Observation, context: PolicyContext
    ) -> bool:
        """Whether ``group`` is switched to ``aggregated`` now, routing included (``transfer_fallback``)."""
        if not self.manifest.transfer_fallback or not remote_path_unusable(observation.window, context, group):
            return False
        fallback = self.manifest.rules.index("aggregated")
        if state.rule != fallback:
            state.rule, state.proposed, state.streak = fallback, None, 0
            state.ratio_sum, state.ratio_windows = None, 0
            state.trial_since_s, state.previous = None, None  # a safety move, not a trial of the rule
            state.outcomes.clear()
            state.left_outcomes = None
        state.routing = fallback
        return True

    def _judged(self, state: _GroupState, group: str, observation: Observation, context: PolicyContext) -> bool:
        """Whether this window counts for ``group``'s patience.

        Not while the group's start is dwelled on (``dwell_after_start``). Then it counts when the group's pools are
        settled (no instance pending, the pools last asked for running; ``settle_before_judging``) and, after a
        move, have run as long as the move took, at most ``move_dwell_s``.
        """
        window_s = observation.window.window_s
        start_s = state.started_s + window_s + min(window_s, self.manifest.move_dwell_s)
        starting = self.manifest.dwell_after_start and context.now_s < start_s
        if not self.manifest.settle_before_judging:
            return not starting
        moving = not pools_running(observation.window, context, group, self._asked.get(group))
        state.move.observe(moving, context.now_s)
        if moving or state.move.dwelling(context.now_s, self.manifest.move_dwell_s):
            return False
        state.move.reset()
        return not starting

    def _evidence(self, state: _GroupState, scores: np.ndarray) -> np.ndarray:
        """The scores a judged window's challenger is chosen on (``switch_evidence``), as logits."""
        if self.manifest.switch_evidence == "window":
            return scores
        ratios = _score_ratios(scores)
        state.ratio_sum = ratios if state.ratio_sum is None else state.ratio_sum + ratios
        state.ratio_windows += 1
        return _ratio_logits(state.ratio_sum / state.ratio_windows)

    def _challenger(self, state: _GroupState, scores: np.ndarray, now_s: float) -> int:
        """The best-scored rule not barred, or the acting one when the best does not beat it by the margin.

        Barred rules: ``failed_rule_bar_s``; the margin: ``switch_margin_frac``.
        """
        barred = [r for r, (until_s, _) in state.bars.items() if r != state.rule and until_s > now_s]
        if barred:
            scores = np.array(scores, dtype=np.float64)
            scores[barred] = -np.inf
        best = int(np.argmax(scores))
        margin = self.manifest.switch_margin_frac
        if best == state.rule or margin <= 0:
            return best
        gain = _predicted_ratio(scores[best]) - _predicted_ratio(scores[state.rule])
        return best if gain >= margin else state.rule

    def _advance(self, state: _GroupState, best: int, now_s: float) -> int:
        if best == state.rule:
            state.proposed, state.streak = None, 0
            return state.rule
        same = best == state.proposed or self.manifest.patience_streak == "any_better"
        state.streak = state.streak + 1 if same else 1
        state.proposed = best
        if state.streak >= self.manifest.switch_patience_intervals:
            self._end_trial(state, best, now_s)
            state.previous, state.trial_since_s = state.rule, now_s
            state.rule, state.proposed, state.streak = best, None, 0
            state.ratio_sum, state.ratio_windows = None, 0
            state.left_outcomes = tuple(state.outcomes) if state.outcomes else None
            state.outcomes.clear()
            state.acting_since_s = now_s
        return state.rule

    def _trial_failed(self, state: _GroupState, observation: Observation, context: PolicyContext, group: str) -> bool:
        """Record a judged window's outcome; revert a switch whose outcome fails (``trial_check_windows``).

        Returns whether the group went back to the rule it left in this window.
        """
        count = self.manifest.trial_check_windows
        if count <= 0:
            return False
        attainment, load = population_numbers(observation, context, frozenset({group}))
        if attainment is None or load is None:
            return False  # no evidence: neither recorded nor judged
        window_s = observation.window.window_s
        if state.acting_since_s is not None and context.now_s < state.acting_since_s + window_s:
            return False  # the window still holds traffic the rule before routed: no outcome of the acting one
        state.outcomes.append((attainment, load))
        left = state.left_outcomes
        if left is None or state.previous is None or state.trial_since_s is None:
            return False
        if context.now_s - state.trial_since_s > self.manifest.failed_rule_bar_s:
            state.left_outcomes = None  # the trial is over: the rule stays until the network says otherwise
            return False
        if len(state.outcomes) < count:
            return False
        left_attainment = sum(a for a, _ in left) / len(left)
        left_load = sum(x for _, x in left) / len(left)
        if left_attainment < TRIAL_CHECK_HEALTHY_FRAC:
            state.left_outcomes = None  # left while falling short: a backlog, not the new rule, sets its windows
            return False
        comparable = [a for a, x in state.outcomes if x <= left_load * (1.0 + TRIAL_CHECK_LOAD_TOLERANCE_FRAC)]
        if 2 * len(comparable) < count:
            return False
        if sum(comparable) / len(comparable) >= left_attainment - TRIAL_CHECK_MARGIN_FRAC:
            return False
        self._bar(state, state.rule, context.now_s)
        trial_s = context.now_s - state.trial_since_s
        state.rule, state.proposed, state.streak = state.previous, None, 0
        state.ratio_sum, state.ratio_windows = None, 0
        state.trial_since_s, state.previous, state.left_outcomes = None, None, None  # back to a tried rule
        # Its record stays its own windows before the trial until it has run as long as the trial did: the backlog
        # the failed rule built up takes about as long to clear.
        state.outcomes = deque(left, maxlen=count)
        state.acting_since_s = context.now_s + trial_s
        return True

    def _end_trial(self, state: _GroupState, best: int, now_s: float) -> None:
        """Bar the acting rule when the group goes back to ``best``, the rule before it, soon after switching to it.

        Soon: within ``failed_rule_bar_s``.
        """
        bar_s = self.manifest.failed_rule_bar_s
        trial = state.trial_since_s
        if bar_s <= 0 or trial is None or best != state.previous or now_s - trial >= bar_s:
            return
        self._bar(state, state.rule, now_s)

    def _bar(self, state: _GroupState, rule: int, now_s: float) -> None:
        """Bar ``rule`` from the group's choice after a failed trial: ``failed_rule_bar_s``, doubling per failure."""
        failed = state.bars.get(rule, (0.0, 0))[1] + 1
        state.bars[rule] = (now_s + self.manifest.failed_rule_bar_s * 2 ** min(failed - 1, MAX_BAR_DOUBLINGS), failed)


def _score_ratios(scores: np.ndarray) -> np.ndarray:
    """The goodput ratios scores (logits) predict: their sigmoid, in float64."""
    out: np.ndarray = 1.0 / (1.0 + np.exp(-np.asarray(scores, dtype=np.float64)))
    return out


def _ratio_logits(ratios: np.ndarray) -> np.ndarray:
    """Scores (logits) of predicted goodput ratios, clipped off 0 and 1: the inverse of :func:`_score_ratios`."""
    clipped = np.clip(ratios, 1e-12, 1.0 - 1e-12)
    out: np.ndarray = np.log(clipped / (1.0 - clipped))
    return out


def _predicted_ratio(score: float) -> float:
    """The goodput ratio a score (a logit, :meth:`SelectorNetwork.scores`) predicts."""
    return 1.0 / (1.0 + math.exp(-float(score)))


def read_selector_manifest(path: Path) -> SelectorManifest:
    """Read and validate a selector manifest (one line naming the file and field on failure).

    Raises:
        PolicyLoadError: missing, unreadable or invalid.
    """
    return read_manifest(path, SelectorManifest)
