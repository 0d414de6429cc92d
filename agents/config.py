"""Experiment files: what to train, on which scenarios, how long, and how to judge it.

Example (``experiments/rag-surge.yaml``)::

    name: rag-surge
    algorithm: maskable_ppo
    scenarios: [rag-surge-8]           # training mix: one scenario drawn per episode
    eval_scenarios: [rag-surge-8]      # judged on these, with eval_seeds never used in training
    eval_seeds: [1000, 1001, 1002]
    baselines: [baseline:dynamo-load, baseline:keda-queue]
    total_timesteps: 20000
    n_envs: 2
    seed: 0
    layout: {max_groups: 2, max_tenants: 4}
    hyperparameters: {learning_rate: 3.0e-4, n_steps: 128, batch_size: 64, net_arch: [64, 64]}
    sweep:                             # optional: `pdctl train --sweep` runs this grid (agents.sweep)
      seeds: [0, 1]
      scenarios: [[rag-surge-8], [rag-surge-8, chatbot-8]]
      hyperparameters: {learning_rate: [1.0e-4, 3.0e-4], net_arch: [[64, 64], [128, 128]]}

Unknown keys are refused; YAML keys are the field names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    model_validator,
)

from policies.baselines import BASELINES
from policies.features import ObservationLayout, PoolActions
from policies.rule_selector import SelectorBehaviour
from policies.set_features import SET_MAX_GROUPS, SET_MAX_TENANTS, SetLayout

__all__ = [
    "ExperimentConfig",
    "ExperimentError",
    "FamilyConfig",
    "HyperparameterGrid",
    "Hyperparameters",
    "LayoutConfig",
    "PretrainConfig",
    "SelectorConfig",
    "SweepConfig",
    "load_experiment",
    "validation_lines",
]

TRAIN_SEED_LIMIT = 1000
"""Training episodes draw seeds below this; evaluation seeds must be at or above it (never seen in training)."""


class ExperimentError(ValueError):
    """An experiment file was refused (one line per problem, naming the file and field)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LayoutConfig(_Strict):
    """Observation/action slots (``kind: slots``) or the padding of a layout-free set policy (``kind: set``)."""

    kind: Literal["slots", "set"] = "slots"
    """``slots``: fixed group/tenant slots, action codec v3/v4 (:mod:`policies.action_codec`); ``set``: the
    layout-free set policy, action codec v5 (:mod:`policies.set_policy`), any groups and tenants up to
    ``max_groups`` / ``max_tenants`` (default 3 / 6 for it, what the scenario family generates)."""
    max_groups: Annotated[int, Field(ge=1, le=8)] = 2
    max_tenants: Annotated[int, Field(ge=1, le=16)] = 4
    pool_actions: PoolActions = "target"
    """``target`` (the count each pool should reach; action codec v4) or ``delta`` (±1 instance per pool and
    interval; v3, what artifacts trained before v4 use). Targets imitate better: every interval is labelled with
    the split, not only the few that move (``experiments/results/learned/README.md``). Slots only: a set policy
    always moves one instance toward prefill or decode."""

    @model_validator(mode="after")
    def _set_has_no_pool_actions(self) -> LayoutConfig:
        if self.kind == "set" and "pool_actions" in self.model_fields_set:
            raise ValueError("pool_actions applies to kind: slots only (a set policy moves the prefill share)")
        return self

    def to_layout(self) -> ObservationLayout:
        """The :class:`~policies.features.ObservationLayout` these slots describe."""
        return ObservationLayout(self.max_groups, self.max_tenants, self.pool_actions)

    def to_set_layout(self) -> SetLayout:
        """The :class:`~policies.set_features.SetLayout` (kind ``set``; unset maxima default to 3 / 6)."""
        fields = self.model_fields_set
        return SetLayout(
            max_groups=self.max_groups if "max_groups" in fields else SET_MAX_GROUPS,
            max_tenants=self.max_tenants if "max_tenants" in fields else SET_MAX_TENANTS,
        )


class FamilyConfig(_Strict):
    """Training on a scenario family (``docs/scenario-families.md``): a fresh generated scenario per episode."""

    path: str = Field(min_length=1, description="The family file (e.g. experiments/families/default.yaml).")
    train_split: Literal["train", "validation", "test"] = "train"
    """Split the training episodes are drawn from."""
    validation_split: Literal["train", "validation", "test"] = "validation"
    """Split the checkpoints are compared on (its first ``validation_scenarios`` seeds)."""
    validation_scenarios: Annotated[int, Field(ge=1, le=200)] = 6
    """How many scenarios of the validation split (its first seeds) checkpoints are compared on."""

    @model_validator(mode="after")
    def _splits_apart(self) -> FamilyConfig:
        if self.train_split == self.validation_split:
            raise ValueError(
                f"validation_split {self.validation_split!r} is the train_split (validation must be unseen)"
            )
        if "test" in (self.train_split, self.validation_split):
            raise ValueError("the test split is for the final judgement only; train and validate on the others")
        return self


class Hyperparameters(_Strict):
    """PPO hyperparameters (stable-baselines3 names)."""

    learning_rate: Annotated[float, Field(gt=0)] = 3e-4
    n_steps: Annotated[int, Field(ge=8)] = 128
    batch_size: Annotated[int, Field(ge=8)] = 64
    n_epochs: Annotated[int, Field(ge=1)] = 10
    gamma: Annotated[float, Field(gt=0, le=1)] = 0.95
    gae_lambda: Annotated[float, Field(gt=0, le=1)] = 0.95
    clip_range: Annotated[float, Field(gt=0)] = 0.2
    ent_coef: Annotated[float, Field(ge=0)] = 0.01
    vf_coef: Annotated[float, Field(ge=0)] = 0.5
    max_grad_norm: Annotated[float, Field(gt=0)] = 0.5
    net_arch: list[Annotated[int, Field(ge=1)]] = [64, 64]
    activation: Literal["tanh", "relu"] = "tanh"
    set_hidden_width: Annotated[int, Field(ge=4, le=1024)] = 64
    """``layout.kind: set`` only: width of the shared tenant and group encoders."""
    set_encoder_layers: Annotated[int, Field(ge=1, le=4)] = 2
    """``layout.kind: set`` only: tanh layers per encoder."""


def _distinct(seeds: list[int]) -> list[int]:
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"repeated seeds in {seeds}")
    return seeds


class PretrainConfig(_Strict):
    """Behaviour-cloning warm start (:mod:`agents.pretrain`)."""

    teachers: list[str] = Field(min_length=1, description="Candidate teacher policy specs; best per scenario.")
    seeds: list[Annotated[int, Field(ge=0, lt=TRAIN_SEED_LIMIT)]] = [0, 1]
    epochs: Annotated[int, Field(ge=1)] = 30
    learning_rate: Annotated[float, Field(gt=0)] = 1e-3
    expert: Literal["best_teacher", "lookahead", "policy"] = "best_teacher"
    """``best_teacher``: imitate the best teacher per scenario; ``lookahead``: the receding-horizon expert over all
    teachers and the best static grid configurations (:func:`agents.pretrain.lookahead_episode`); ``policy``: the
    policy specs in ``teachers`` label every interval of the family's training scenarios (``layout.kind: set``
    only): one labels them all (e.g. ``mpc:4``), several each label the scenarios they are best on over the whole
    episode (:mod:`agents.set_imitation`, :mod:`agents.warm_start`)."""
    family_scenarios: Annotated[int, Field(ge=1, le=1000)] = 24
    """``expert: policy``: the first so many scenarios of the family's training split are labelled."""
    horizon_intervals: Annotated[int, Field(ge=1, le=120)] = 12
    """Lookahead expert: control intervals each candidate is followed for before the expert picks one."""
    grid_candidates: Annotated[int, Field(ge=0, le=20)] = 3
    """Lookahead expert: the best so many static grid configurations (on the training seeds) join the candidates."""
    workers: Annotated[int, Field(ge=1, le=64)] | None = None
    """Processes for expert episodes (default: the machine's cores)."""
    pool_move_weight: Annotated[float, Field(gt=0)] = 1.0
    """Imitation weight of demonstrations that move a pool (rare but decisive) against those that hold (1)."""
    prefer_best_alone: bool = False
    """Lookahead expert: ties go to the candidate best on its own over the episode before the previous choice."""
    best_alone_scope: Literal["episode", "scenario"] = "episode"
    """With ``prefer_best_alone``: the best candidate on the episode's own seed, or the best on average over the
    scenario's training seeds (one preference per scenario, so the same situations get the same labels)."""
    switch_margin_frac: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Lookahead expert: leave the preferred candidate (the best alone with ``prefer_best_alone``, else the current
    one) only for a horizon return higher by more than this fraction; 0 = any gain."""
    route_switch_margin_frac: Annotated[float, Field(ge=0, le=1)] | None = None
    """Lookahead expert: the margin for switching to a candidate that leaves the pool sizes where the kept one
    would (routing thresholds only: instant and free to undo); ``None``: ``switch_margin_frac``."""
    dagger_iterations: Annotated[int, Field(ge=0, le=10)] = 0
    """Lookahead or policy expert: rounds in which the student drives and the expert labels the states it visits
    (DAgger)."""

    @model_validator(mode="after")
    def _expert_options(self) -> PretrainConfig:
        if len(set(self.teachers)) != len(self.teachers):
            raise ValueError(f"teachers: repeated policy specs in {self.teachers}")
        if self.expert != "lookahead":
            used = {
                "dagger_iterations": self.dagger_iterations > 0 and self.expert != "policy",
                "prefer_best_alone": self.prefer_best_alone,
                "switch_margin_frac": self.switch_margin_frac > 0,
                "route_switch_margin_frac": self.route_switch_margin_frac is not None,
            }
            names = [name for name, is_used in used.items() if is_used]
            if names:
                raise ValueError(f"{names[0]} needs expert: lookahead (the best-teacher warm start has no expert)")
        if self.best_alone_scope != "episode" and not self.prefer_best_alone:
            raise ValueError("best_alone_scope needs prefer_best_alone: true")
        return self


def _grid_fields() -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name, info in Hyperparameters.model_fields.items():
        item = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        fields[name] = (Annotated[list[item], Field(min_length=1)] | None, None)  # type: ignore[valid-type]
    return fields


HyperparameterGrid: type[BaseModel] = create_model(
    "HyperparameterGrid",
    __config__=ConfigDict(extra="forbid", frozen=True),
    __doc__="Values to try per hyperparameter: every :class:`Hyperparameters` field as a non-empty list.",
    __module__=__name__,
    **_grid_fields(),
)
"""Built from :class:`Hyperparameters`, so a key that is not a hyperparameter, or a value its field refuses, fails
validation naming it (``sweep.hyperparameters.learning_rate.0: Input should be greater than 0``)."""


def _as_scenario_sets(value: Any) -> Any:
    """``[a, [b, c]]`` → ``[[a], [b, c]]``: a plain name is a one-scenario training set."""
    if isinstance(value, list):
        return [[item] if isinstance(item, str) else item for item in value]
    return value


class SweepConfig(_Strict):
    """A seed × training-scenario-set × hyperparameter grid over the experiment (run by :mod:`agents.sweep`)."""

    seeds: Annotated[list[Annotated[int, Field(ge=0, lt=TRAIN_SEED_LIMIT)]], AfterValidator(_distinct)] = Field(
        default_factory=list
    )
    """Training seeds, one trial each (empty: the experiment's ``seed``)."""
    scenarios: Annotated[
        list[Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]],
        BeforeValidator(_as_scenario_sets),
    ] = Field(default_factory=list)
    """Training sets, each a list of scenarios (a plain name is a set of one; empty: the experiment's scenarios).
    Every trial is judged on the experiment's held-out scenarios, so trials stay comparable."""
    hyperparameters: HyperparameterGrid = Field(default_factory=HyperparameterGrid)
    max_parallel: Annotated[int, Field(ge=1)] | None = None
    """Trials at once (default: the CPU count locally; every trial that fits on a Ray cluster)."""
    num_cpus_per_trial: Annotated[float, Field(gt=0)] = 1.0
    """CPUs Ray reserves per trial (``ray.remote(num_cpus=…)``)."""
    vec_env: Literal["dummy", "subprocess"] = "dummy"
    """Each trial's ``vec_env``. ``dummy`` (default) steps a trial's ``n_envs`` envs inside its worker: the worker
    is already one of ``max_parallel`` processes (or a Ray task holding ``num_cpus_per_trial``), and spawning
    ``n_envs`` env processes under each would oversubscribe the CPUs the sweep accounts for."""
    evaluate_baselines: bool = True
    """Evaluate the experiment's baselines once (on the held-out scenarios and seeds) for the summary table."""


class SelectorConfig(_Strict, SelectorBehaviour):
    """``algorithm: rule_selector``: the rule selector's data and fit (:mod:`agents.selector_train`).

    How the selector acts is :class:`policies.rule_selector.SelectorBehaviour`'s fields, copied into its manifest.
    """

    rules: list[str] = Field(
        default=["dynamo-legacy", "aggregated", "dynamo-isl-bounding", "dynamo-isl-or-load"],
        min_length=2,
        description="Baseline names the selector chooses among; the first acts at the start.",
    )
    family_scenarios: Annotated[int, Field(ge=1, le=1000)] = 160
    """The first so many scenarios of the family's training split; every rule runs every one."""
    seeds: Annotated[list[Annotated[int, Field(ge=0, lt=TRAIN_SEED_LIMIT)]], Field(min_length=1)] = [0]
    hidden_width: Annotated[int, Field(ge=1, le=1024)] = 64
    ensemble_members: Annotated[int, Field(ge=1, le=16)] = 1
    """Networks fitted on the same data from seeds ``seed``, ``seed + 1``, …; the selector scores a rule by their
    mean predicted goodput ratio (:class:`policies.rule_selector.SelectorNetwork`)."""
    epochs: Annotated[int, Field(ge=1)] = 20
    learning_rate: Annotated[float, Field(gt=0)] = 1e-3
    weight_decay: Annotated[float, Field(ge=0)] = 1e-3
    batch_size: Annotated[int, Field(ge=1)] = 256
    loss: Literal["ratio", "soft_best"] = "ratio"
    """``ratio``: each rule's goodput over the best rule's, per output (the selector picks the highest expected
    ratio); ``soft_best``: a softened distribution over which rule is best."""
    ratio_expectile: Annotated[float, Field(gt=0, lt=1)] = 0.5
    """``ratio`` only: fit this expectile of each rule's goodput ratio instead of its mean (0.5;
    :func:`agents.selector_fit.fit_selector`). Below 0.5 an overestimate costs more than an underestimate, so a rule
    whose outcome from similar states is spread scores below one as good on average whose outcome is steady: the
    selector then switches on predicted gains it is surer of."""
    temperature_frac: Annotated[float, Field(gt=0)] = 0.05
    """``soft_best`` only: the softening of the best-rule distribution."""
    workers: Annotated[int, Field(ge=1, le=64)] | None = None
    """Processes for the rollouts (default: the machine's cores)."""
    rate_scales: Annotated[list[Annotated[float, Field(gt=0, le=10)]], Field(min_length=1)] = [1.0]
    """Every training scenario is also rolled out with every tenant's rate multiplied by each of these, so the
    selector sees loads beyond the family's (the capacity yardstick sweeps the rate)."""
    bandwidth_scales: Annotated[list[Annotated[float, Field(gt=0, le=10)]], Field(min_length=1)] = [1.0]
    """And with its KV-transfer link rate multiplied by each of these (:func:`agents.runs.scale_bandwidth`), so the
    selector sees networks beyond the family's. The rollout conditions are every (rate scale, bandwidth scale)
    pair, rate-major."""
    conditions_per_scenario: Annotated[int, Field(ge=1)] | None = None
    """Unset: every scenario runs under every condition. Set to *k*: scenario *i* runs under conditions
    *i·k* … *i·k + k − 1* (modulo their number), so each condition is used about equally often while the rollouts
    cost *k* conditions per scenario (:meth:`rollout_conditions`)."""
    label_window_intervals: Annotated[int, Field(ge=1, le=1000)] | None = None
    """Label each interval by what each rule achieved on the requests arriving in this many intervals from it
    (:func:`agents.selector_data.selector_targets`); unset: by the whole episode."""
    share_transfer: bool = False
    """Fill each rollout's unknown KV-transfer features from a sibling rule's rollout of the same interval
    (:func:`agents.selector_data.shared_transfer_inputs`): what a selector with ``transfer_memory_s`` reads while
    it runs ``aggregated``."""
    balance_best_rules: bool = False
    """Weigh each labelled group in inverse proportion to how many groups share its best rule, so every rule's wins
    weigh the same in the fit (:func:`agents.selector_data.selector_targets`); unset: every group weighs 1."""
    own_rule_labels: bool = False
    """Fit each rule's output only on the states of that rule's own rollouts (``loss: ratio`` only;
    :func:`agents.selector_data.selector_targets`): a rollout's ratio for another rule was measured from that
    rule's state, not from this one. Unset: every rollout's state is labelled with every rule's ratio."""
    equal_window_weights: bool = False
    """Weigh every labelled window of a group the same (needs ``label_window_intervals``;
    :func:`agents.selector_data.selector_targets`); unset: each window in proportion to its best rule's goodput."""
    branch_rounds: Annotated[int, Field(ge=0, le=3)] = 0
    """DAgger rounds after the first fit (needs ``label_window_intervals``): the fitted selector runs the first
    ``branch_scenarios`` training scenarios under their rollout conditions, each rule is followed from the states it
    reaches every ``branch_every_intervals`` intervals (:func:`agents.selector_branch.branched_rollout`), those
    samples are added to the data and the selector is fitted again (:func:`agents.selector_branch.with_branches`).
    ``0``: none."""
    branch_scenarios: Annotated[int, Field(ge=1, le=1000)] | None = None
    """How many of the training scenarios (the first ones) the DAgger rounds branch; unset: all of them."""
    branch_every_intervals: Annotated[int, Field(ge=1, le=1000)] = 12
    """Control intervals between two branch points of a DAgger round (the first at half of it)."""
    branch_group_weight: Annotated[float, Field(gt=0, le=100)] = 1.0
    """What one branched group weighs in the fit, relative to one group of the rules' rollouts."""
    rollout_request_budget: Annotated[int, Field(ge=1)] | None = None
    """Stop a rollout whose scenario offers more requests than this (at its rate scale) at the end of the control
    interval in which the budget's last request arrives, but not before ``rollout_min_intervals`` intervals
    (:func:`agents.selector_data.rollout_stop_s`); its groups keep the bins before their first request still in
    flight, exactly what the whole episode records there. A few scenarios (large groups of a small model at high
    load) offer a hundred times the median's requests and would otherwise take most of the rollout time. Needs
    ``label_window_intervals``; not with ``branch_rounds``. Unset: every rollout runs its whole episode."""
    rollout_min_intervals: Annotated[int, Field(ge=1, le=1000)] = 20
    """The fewest control intervals a rollout stopped at ``rollout_request_budget`` runs."""
    rollout_late_misses: bool = False
    """A rollout stopped at ``rollout_request_budget`` also keeps the bins whose requests still in flight at the stop
    are certain misses: their first token cannot come within the TTFT objective (not yet scheduled on the decode
    instance that emits it, with the objective already past, or first scheduled there after it). Under overload
    the first request in flight arrives early, and without this a stopped busy group keeps few bins. Needs
    ``rollout_request_budget``."""
    admission_ttft_slack_frac: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    """Run every rollout (and branch) behind the router's admission stage with this TTFT slack
    (:class:`policies.admission.AdmissionConfig`), so the labels are what each rule achieves behind it; the held-out
    evaluation runs behind it too, and the gate's evidence records it (:class:`agents.gate.ScenarioSet`). Unset:
    every request admitted, as the router's default."""

    @model_validator(mode="after")
    def _known_rules(self) -> SelectorConfig:
        unknown = [r for r in self.rules if r not in BASELINES]
        if unknown:
            raise ValueError(f"rules: unknown baseline {unknown[0]!r} (known: {', '.join(sorted(BASELINES))})")
        if len(set(self.rules)) != len(self.rules):
            raise ValueError("rules: a rule is listed twice")
        self.check_fallback_rule(self.rules)
        if self.own_rule_labels and self.loss != "ratio":
            raise ValueError("own_rule_labels: needs loss: ratio (a best-rule distribution needs every rule's label)")
        if self.ratio_expectile != 0.5 and self.loss != "ratio":
            raise ValueError("ratio_expectile: needs loss: ratio (an expectile of each rule's goodput ratio)")
        if self.equal_window_weights and self.label_window_intervals is None:
            raise ValueError("equal_window_weights: needs label_window_intervals (an episode label has one window)")
        if self.branch_rounds and self.label_window_intervals is None:
            raise ValueError("branch_rounds: needs label_window_intervals (a branch is labelled over a window)")
        if self.rollout_request_budget is not None and self.label_window_intervals is None:
            raise ValueError(
                "rollout_request_budget: needs label_window_intervals (a stopped rollout has no episode goodput)"
            )
        if self.rollout_late_misses and self.rollout_request_budget is None:
            raise ValueError("rollout_late_misses: needs rollout_request_budget (only a stopped rollout reads them)")
        if self.rollout_request_budget is not None and self.branch_rounds:
            raise ValueError("rollout_request_budget: not with branch_rounds (branches run whole episodes)")
        for name, scales in (("rate_scales", self.rate_scales), ("bandwidth_scales", self.bandwidth_scales)):
            if len(set(scales)) != len(scales):
                raise ValueError(f"{name}: a scale is listed twice")
        conditions = len(self.rate_scales) * len(self.bandwidth_scales)
        if self.conditions_per_scenario is not None and self.conditions_per_scenario > conditions:
            raise ValueError(
                f"conditions_per_scenario: {self.conditions_per_scenario} exceeds the {conditions} conditions"
                " (rate_scales x bandwidth_scales)"
            )
        return self

    def algorithm_name(self) -> str:
        """What a fitted selector's manifest records as its ``algorithm``.

        ``rule_selector/`` and the loss, with ``-expectile-τ`` where ``ratio_expectile`` is not 0.5.
        """
        suffix = "" if self.ratio_expectile == 0.5 else f"-expectile-{self.ratio_expectile:g}"
        return f"rule_selector/{self.loss}{suffix}"

    def rollout_conditions(self, scenario_index: int) -> list[tuple[float, float]]:
        """The (rate scale, bandwidth scale) pairs the ``scenario_index``-th training scenario is rolled out under."""
        grid = [(rate, bandwidth) for rate in self.rate_scales for bandwidth in self.bandwidth_scales]
        k = self.conditions_per_scenario
        if k is None:
            return grid
        return [grid[(scenario_index * k + j) % len(grid)] for j in range(k)]


class ExperimentConfig(_Strict):
    """A training experiment."""

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str = ""
    algorithm: Literal["maskable_ppo", "rule_selector"] = "maskable_ppo"
    """``rule_selector``: no PPO; the rule selector is fitted to every rule's outcome (``selector:``)."""
    scenarios: list[str] = Field(
        default_factory=list, description="Training scenarios (names or paths), mixed per episode; or a family."
    )
    family: FamilyConfig | None = None
    """Train on a scenario family instead of listed scenarios (needs ``layout.kind: set``)."""
    eval_scenarios: list[str] = Field(default_factory=list, description="Held-back scenarios (default: scenarios).")
    eval_seeds: list[Annotated[int, Field(ge=TRAIN_SEED_LIMIT)]] = [1000, 1001, 1002]
    baselines: list[str] = Field(default_factory=list, description="Policy specs to beat (evaluated alongside).")
    total_timesteps: Annotated[int, Field(ge=1)] = 20_000
    n_envs: Annotated[int, Field(ge=1, le=64)] = 2
    vec_env: Literal["subprocess", "dummy"] = "subprocess"
    seed: Annotated[int, Field(ge=0)] = 0
    layout: LayoutConfig = LayoutConfig()
    normalize_observations: bool = True
    normalize_rewards: bool = True
    reward_scale: Literal["none", "offered"] = "none"
    """``layout.kind: set`` only: ``offered`` divides each interval's reward by the episode's weighted arrivals per
    interval, so scenarios of every size weigh alike (:data:`env.set_env.RewardScale`)."""
    hyperparameters: Hyperparameters = Hyperparameters()
    pretrain: PretrainConfig | None = None
    selector: SelectorConfig | None = None
    """``algorithm: rule_selector`` only (:mod:`agents.selector_train`)."""
    eval_every_steps: Annotated[int, Field(ge=0)] = 0
    """Evaluate (and checkpoint) every so many steps; 0 = only at the end."""
    validation_seeds: Annotated[
        list[Annotated[int, Field(ge=0, lt=TRAIN_SEED_LIMIT)]], Field(min_length=1), AfterValidator(_distinct)
    ] = [900]
    """Seeds the checkpoints are compared on (mean over the held-out scenarios and these seeds): kept apart from
    the evaluation seeds, so choosing a checkpoint never looks at the numbers it is judged by."""
    early_stop_patience: Annotated[int, Field(ge=0)] = 0
    """Stop after this many periodic evaluations without improvement; 0 = never."""
    promotion_margin_frac: Annotated[float, Field(ge=0)] = 0.02
    register_as: str | None = None
    """Register the exported policy under this name (alias ``challenger``) when the run ends."""
    sweep: SweepConfig | None = None
    """The grid ``pdctl train --sweep`` runs (:mod:`agents.sweep`); a plain ``pdctl train`` ignores it."""

    @model_validator(mode="after")
    def _validation_apart_from_demonstrations(self) -> ExperimentConfig:
        shared = sorted(set(self.validation_seeds) & set(self.pretrain.seeds if self.pretrain else ()))
        if shared:
            raise ValueError(f"validation_seeds {shared} are also pretrain.seeds (validation must be unseen)")
        return self

    @model_validator(mode="after")
    def _one_training_source(self) -> ExperimentConfig:
        if self.family is None and not self.scenarios:
            raise ValueError("scenarios: name at least one training scenario, or a family")
        if self.family is not None and self.scenarios:
            raise ValueError("scenarios: leave empty when training on a family (one source of episodes)")
        if self.family is not None and self.layout.kind != "set":
            raise ValueError("family: training on a family needs layout.kind: set (any layout, one policy)")
        if self.layout.kind == "set" and self.normalize_observations:
            raise ValueError(
                "normalize_observations: must be false with layout.kind: set (its features are normalised by"
                " construction; running statistics per slot would break the permutation invariance)"
            )
        if self.layout.kind != "set" and self.reward_scale != "none":
            raise ValueError("reward_scale: offered needs layout.kind: set")
        if self.pretrain is not None and (self.layout.kind == "set") != (self.pretrain.expert == "policy"):
            raise ValueError("pretrain.expert: layout.kind: set takes expert: policy, and expert: policy needs it")
        if self.pretrain is not None and self.pretrain.expert == "policy" and self.family is None:
            raise ValueError("pretrain.expert: policy labels the family's training split; name a family")
        return self

    @model_validator(mode="after")
    def _selector_section(self) -> ExperimentConfig:
        if (self.algorithm == "rule_selector") != (self.selector is not None):
            raise ValueError("selector: algorithm rule_selector takes a selector section, and only it does")
        if self.algorithm == "rule_selector" and (self.family is None or self.pretrain is not None):
            raise ValueError("algorithm: rule_selector trains on a family and takes no pretrain section")
        return self

    @model_validator(mode="after")
    def _batch_fits(self) -> ExperimentConfig:
        rollout = self.hyperparameters.n_steps * self.n_envs
        if self.hyperparameters.batch_size > rollout:
            raise ValueError(
                f"hyperparameters.batch_size ({self.hyperparameters.batch_size}) exceeds n_steps × n_envs ({rollout})"
            )
        return self

    @property
    def held_out_scenarios(self) -> list[str]:
        """Evaluation scenarios (the training ones when none are named)."""
        return self.eval_scenarios or self.scenarios


def load_experiment(path: str | Path, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Read and validate an experiment file; ``overrides`` (field → value) replace top-level fields."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ExperimentError(f"{p}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise ExperimentError(f"{p}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ExperimentError(f"{p}: expected a mapping at the top level")
    data.update(overrides or {})
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise ExperimentError("\n".join(validation_lines(exc, str(p)))) from None


def validation_lines(exc: ValidationError, prefix: str) -> list[str]:
    """One ``{prefix}: {field.path}: {message}`` line per problem."""
    lines = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(part) for part in err["loc"]) or "<top>"
        lines.append(f"{prefix}: {loc}: {err['msg']}")
    return lines
