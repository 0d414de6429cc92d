"""The rule selector's recipe (``algorithm: rule_selector``): roll out → label → fit → export → evaluate → register.

1. **Roll out** — every rule of ``selector.rules`` runs the first ``selector.family_scenarios`` scenarios of the
   family's training split on ``selector.seeds``, under each of its rollout conditions (``selector.rate_scales`` ×
   ``selector.bandwidth_scales``, or ``selector.conditions_per_scenario`` of them in rotation)
   (:func:`agents.selector_data.collect_rollouts`); each tenant group's inputs at every interval and its goodput,
   per interval and over the episode, are kept per task in ``OUT/rollouts.pkl``, which a rerun into the same folder
   reads instead of simulating those tasks again (:func:`agents.selector_data.cached_rollouts`; the reported wall
   time is still that of a run from scratch). With ``selector.rollout_request_budget`` a rollout of a scenario that
   offers more requests stops early (:func:`agents.selector_data.rollout_stop_s`) and keeps the bins it knows.
2. **Label** — per group, each rule's goodput over the best rule's, over the episode or over the
   ``selector.label_window_intervals`` from each interval (:func:`agents.selector_data.selector_targets`): a
   hindsight label, used for training only.
3. **Fit** — the selector network (:func:`agents.selector_fit.fit_selector`), seeded by the experiment's ``seed``.
   With ``selector.branch_rounds`` it is then run on training scenarios, each rule is followed from the states it
   reaches (DAgger, :mod:`agents.selector_branch`), and it is fitted again on those samples too.
4. **Export** — ``policy/`` (:class:`policies.rule_selector.SelectorManifest` + safetensors), logged to MLflow.
5. **Evaluate** — on the family's validation scenarios and ``eval_seeds``, beside the experiment's baselines, through
   the evaluation loop every policy is judged by (:func:`agents.evaluate.evaluate_policies`).
6. **Register** — optionally, with that evaluation as the promotion gate's evidence, as ``pdctl train`` does.

The test split is never generated here.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import mlflow
import torch

from agents.config import ExperimentConfig
from agents.evaluate import evaluate_policies
from agents.registry import log_evidence, register_policy, training_evidence, training_run
from agents.selector_branch import (
    BRANCH_CACHE_NAME,
    BranchedGroup,
    BranchTask,
    branched_rollout,
    policy_digest,
    with_branches,
)
from agents.selector_data import (
    ROLLOUT_CACHE_NAME,
    GroupRollout,
    RolloutTask,
    StopPlan,
    cached_rollouts,
    rollout_stops,
)
from agents.selector_fit import export_selector, fit_recipe, label_recipe
from agents.set_training import family_split_paths, held_out_paths, scenario_source
from agents.tracking import git_commit, run_name
from env.set_env import FamilyDraw
from policies.rule_selector import SelectorManifest
from policies.schema import SCHEMA_VERSION
from policies.set_features import set_feature_hash

__all__ = ["SelectorTrainResult", "train_selector"]


class SelectorTrainResult:
    """What a selector run produced (the fields ``pdctl train`` prints)."""

    def __init__(
        self,
        artifact: Path,
        run_id: str,
        wall_s: float,
        timesteps: int,
        evaluation: dict[str, dict[str, float]],
        registered_version: int | None,
    ) -> None:
        self.artifact = artifact
        self.run_id = run_id
        self.wall_s = wall_s
        self.timesteps = timesteps
        """Control intervals simulated for the rollouts."""
        self.env_steps_per_s = timesteps / max(wall_s, 1e-9)
        self.evaluation = evaluation
        self.registered_version = registered_version


def train_selector(
    config: ExperimentConfig,
    out_dir: str | Path,
    *,
    tracking_uri: str | None = None,
    progress: bool = True,
    evaluate_baselines: bool = True,
) -> SelectorTrainResult:
    """Run one ``algorithm: rule_selector`` experiment end to end (module docstring)."""
    selector = config.selector
    if selector is None or config.family is None:
        raise ValueError("train_selector: needs algorithm rule_selector, a selector section and a family")
    torch.manual_seed(config.seed)
    torch.set_num_threads(1)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    held_out = held_out_paths(config, out)
    from mlflow import MlflowClient

    with training_run(config.name, run_name(config.name, config.algorithm, config.seed), tracking_uri) as (
        run_id,
        uri,
    ):
        mlflow.set_tags({"pdctl.experiment": config.name, "pdctl.feature_hash": set_feature_hash(),
                         "pdctl.schema_version": str(SCHEMA_VERSION), "pdctl.layout_kind": "any"})  # fmt: skip
        mlflow.log_params({"algorithm": config.algorithm, "seed": config.seed,
                           **{f"selector.{k}": v for k, v in selector.model_dump().items()}})  # fmt: skip
        mlflow.log_dict(config.model_dump(mode="json"), "experiment.json")
        start = time.perf_counter()
        # 1. roll out every rule on every training scenario
        paths = family_split_paths(
            config, out / "train-scenarios", config.family.train_split, selector.family_scenarios
        )
        runs = [
            (p, rate_scale, bandwidth_scale, seed)
            for index, p in enumerate(paths)
            for rate_scale, bandwidth_scale in selector.rollout_conditions(index)
            for seed in selector.seeds
        ]
        plan_start = time.perf_counter()
        budget, min_intervals = selector.rollout_request_budget, selector.rollout_min_intervals
        workers = selector.workers or os.cpu_count() or 1
        stops: list[float | None] = (
            [None] * len(runs)
            if budget is None
            else rollout_stops([StopPlan(str(p), rt, bw, sd, budget, min_intervals) for p, rt, bw, sd in runs], workers)
        )
        plan_s = time.perf_counter() - plan_start  # counted in the training time: a run from scratch does it too
        tasks = [
            RolloutTask(
                str(p),
                rule,
                seed,
                rate_scale=rate_scale,
                bandwidth_scale=bandwidth_scale,
                admission_ttft_slack_frac=selector.admission_ttft_slack_frac,
                stop_s=stop_s,
                late_misses=selector.rollout_late_misses and stop_s is not None,
            )
            for (p, rate_scale, bandwidth_scale, seed), stop_s in zip(runs, stops, strict=True)
            for rule in selector.rules
        ]
        if budget is not None and progress:
            print(f"rollouts: {sum(s is not None for s in stops)} of {len(runs)} runs stop at the request budget")

        def reporter(what: str) -> Callable[[int, int], None]:
            def report(done: int, total: int) -> None:
                if progress and (done % 20 == 0 or done == total):
                    print(f"{what}: {done}/{total} ({time.perf_counter() - start:.0f} s)", flush=True)

            return report

        rollouts: list[GroupRollout]
        rollouts, rollout_s = cached_rollouts(out / ROLLOUT_CACHE_NAME, tasks, workers, reporter("rollouts"))
        fit_start = time.perf_counter()
        per_run = {
            (r.scenario, r.seed, r.rate_scale, r.bandwidth_scale, r.rule): len(r.inputs) for r in rollouts
        }  # every group of a run: same intervals
        intervals = sum(per_run.values())
        # 2. label, 3. fit
        data = label_recipe(rollouts, selector)
        fit = fit_recipe(data, selector, config.seed)
        source = scenario_source(config)
        manifest = SelectorManifest(
            schema_version=SCHEMA_VERSION,
            feature_hash=set_feature_hash(),
            rules=list(selector.rules),
            hidden_width=selector.hidden_width,
            ensemble_members=selector.ensemble_members,
            **selector.behaviour(),
            algorithm=selector.algorithm_name(),
            mlflow_run_id=run_id,
            git_commit=git_commit(),
            trained_on=[source.describe()] if isinstance(source, FamilyDraw) else [],
            trained_behind_admission_slack_frac=selector.admission_ttft_slack_frac,
        )
        # 3b. DAgger: branch each rule from the states the fitted selector reaches, add those samples, fit again
        branch_s = 0.0  # the branch rounds' time as a run from scratch (cached tasks count their recorded time)
        branch_wall_s = 0.0  # the time this call spent collecting them, which the fit time must not count again
        branches: list[BranchedGroup] = []
        window = selector.label_window_intervals
        for round_index in range(1, selector.branch_rounds + 1):
            assert window is not None  # the config refuses branch_rounds without a label window
            learner = export_selector(out / f"policy-round{round_index}", fit.tensors, manifest).resolve()
            branch_tasks = [
                BranchTask(
                    str(p),
                    f"learned:{learner}",
                    policy_digest(learner),
                    tuple(selector.rules),
                    seed,
                    selector.branch_every_intervals,
                    window,
                    rate_scale=rate_scale,
                    bandwidth_scale=bandwidth_scale,
                    admission_ttft_slack_frac=selector.admission_ttft_slack_frac,
                )
                for index, p in enumerate(paths[: selector.branch_scenarios])
                for rate_scale, bandwidth_scale in selector.rollout_conditions(index)
                for seed in selector.seeds
            ]
            collect_start = time.perf_counter()
            found, took_s = cached_rollouts(
                out / BRANCH_CACHE_NAME,
                branch_tasks,
                workers,
                reporter(f"branches, round {round_index}"),
                run=branched_rollout,
            )
            branch_wall_s += time.perf_counter() - collect_start
            branch_s += took_s
            intervals += sum(
                {(b.scenario, b.seed, b.rate_scale, b.bandwidth_scale): b.intervals for b in found}.values()
            )
            branches.extend(found)
            fit = fit_recipe(
                with_branches(data, branches, selector.temperature_frac, selector.branch_group_weight),
                selector, config.seed,
            )  # fmt: skip
            mlflow.log_metric(
                "selector/branched_groups", sum(1 for b in branches if len(b.met_weighted)), step=round_index
            )
        # a run from scratch, also when the rollouts or branches were cached
        fit_s = time.perf_counter() - fit_start - branch_wall_s
        wall_s = plan_s + rollout_s + branch_s + fit_s
        for epoch, loss in enumerate(fit.losses):
            mlflow.log_metric("selector/loss", loss, step=epoch)
        mlflow.log_metrics({"selector/agreement_frac": fit.agreement_frac, "selector/labelled_groups": data.groups,
                            "time/plan_s": plan_s, "time/rollout_s": rollout_s, "time/branch_s": branch_s,
                            "time/fit_s": fit_s, "time/train_wall_s": wall_s,
                            "time/env_steps_per_s": intervals / max(rollout_s + branch_s, 1e-9)})  # fmt: skip
        summary = {"labelled_groups": data.groups, "best_counts": data.best_counts, "losses": fit.losses,
                   "agreement_frac": fit.agreement_frac, "plan_s": plan_s, "rollout_s": rollout_s, "branch_s": branch_s,
                   "fit_s": fit_s, "intervals": intervals}  # fmt: skip
        (out / "selector-fit.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        mlflow.log_dict(summary, "selector-fit.json")
        # 4. export
        artifact = export_selector(out / "policy", fit.tensors, manifest)
        mlflow.log_artifacts(str(artifact), artifact_path="policy")
        # 5. evaluate on held-out scenarios and seeds
        specs = [f"learned:{artifact}", *(config.baselines if evaluate_baselines else [])]
        evaluation = evaluate_policies(specs, held_out, config.eval_seeds, selector.admission_ttft_slack_frac)
        mlflow.log_metric("eval/learned_weighted_goodput_rps", evaluation[specs[0]]["mean"])
        if len(specs) > 1:
            mlflow.log_metric("eval/best_baseline_weighted_goodput_rps", max(evaluation[s]["mean"] for s in specs[1:]))
        mlflow.log_dict(evaluation, "evaluation.json")
        (out / "evaluation.json").write_text(json.dumps(evaluation, indent=2) + "\n", encoding="utf-8")
        # 6. register
        version = None
        if config.register_as:
            evidence = training_evidence(
                artifact, held_out, config.eval_seeds, evaluation, selector.admission_ttft_slack_frac
            )
            version = register_policy(artifact, config.register_as, tracking_uri=uri, run_id=run_id).version
            log_evidence(MlflowClient(tracking_uri=uri), config.register_as, version, evidence)
    return SelectorTrainResult(artifact, run_id, wall_s, intervals, evaluation, version)
