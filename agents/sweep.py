"""Training sweeps: seeds × training-scenario sets × hyperparameter values, in local processes or on Ray.

A sweep is the ``sweep:`` block of an experiment file (:class:`agents.config.SweepConfig`)::

    sweep:
      seeds: [0, 1, 2]
      scenarios: [[rag-surge-8], [rag-surge-8, chatbot-8]]      # training sets (a plain name is a set of one)
      hyperparameters: {learning_rate: [1.0e-4, 3.0e-4], net_arch: [[64, 64], [128, 128]]}
      max_parallel: 4

and ``pdctl train --experiment FILE --sweep [--ray-address ADDR] [--max-parallel N]`` runs it.

**Trials.** Every point of the cartesian product is the experiment with those values replaced, re-validated as an
:class:`~agents.config.ExperimentConfig` before anything runs (a bad combination, e.g. a ``batch_size`` above
``n_steps × n_envs``, fails with one line naming the trial and the field). A trial trains with
:func:`agents.train.train` in its own folder (``OUT/trial-NNN``), never registers (``register_as`` is dropped),
evaluates no baselines, and is judged on the experiment's held-out scenarios and seeds whatever its training set,
so trials are comparable. Its ``vec_env`` is ``dummy`` unless the sweep says otherwise: a trial already is one
worker process (or one Ray task holding ``num_cpus_per_trial``), and ``n_envs`` env subprocesses under every
worker would oversubscribe the CPUs the sweep accounts for. All randomness of a trial comes from its seed, so a
trial's numbers do not depend on the backend, the worker it lands on or what ran there before.

**MLflow.** One parent run in the experiment's MLflow experiment (``pdctl-train-NAME``) records the grid (params
``sweep.*``, ``grid.json``); each trial is a child run (tag ``mlflow.parentRunId``, ``pdctl.sweep.trial``)
created by the driver up front (status ``SCHEDULED``) and resumed by the trial's ``train()`` through
``MLFLOW_RUN_ID``, so it carries the usual training params, curves and ``eval/learned_weighted_goodput_rps``. A
failed trial is marked ``FAILED`` with a ``pdctl.sweep.error`` line (traceback in ``trial-NNN/error.txt``) and
does not stop the others. At the end the parent gets the summary table ranked by held-out goodput
(``sweep_summary.md`` / ``.json``, also written to ``OUT``), ``best_trial.*`` params and ``sweep/*`` metrics.

**Backends** (:mod:`agents.sweep_backends`). Default: a :class:`~concurrent.futures.ProcessPoolExecutor` with the
``spawn`` context (no forked copies of a driver's threads or MLflow clients), ``max_parallel`` workers (default: the
CPU count). With a Ray address, trials are ``ray.remote`` tasks with ``num_cpus_per_trial`` CPUs each, at most
``max_parallel`` in flight; Ray is imported only then. ``local`` starts an in-process local Ray instance
(``ray.init(num_cpus=…, include_dashboard=False)``): Ray's own ``local_mode`` was removed (ray 2.60 raises on
``ray.init(local_mode=True)``), and a local instance runs the same code path as a cluster. Any other value is passed
to ``ray.init(address=…)`` (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``); if Ray is already initialised in this
process, that session is used. On a cluster every node needs pdctl installed, and the tracking URI must be a server
every node reaches (not the default SQLite file).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agents.config import ExperimentConfig, ExperimentError, validation_lines
from agents.evaluate import evaluate_policies, scenario_paths
from agents.registry import default_tracking_uri, ensure_experiment
from agents.sweep_backends import (
    SweepError,
    TrialJob,
    TrialOutcome,
    import_ray,
    run_trial,
    trial_backend,
)
from agents.tracking import provenance_tags

__all__ = [
    "RANKING_METRIC",
    "SweepError",
    "SweepResult",
    "Trial",
    "TrialOutcome",
    "plan_trials",
    "run_sweep",
    "run_trial",
    "summary_markdown",
]

RANKING_METRIC = "eval/learned_weighted_goodput_rps"
"""What trials are ranked by: mean priority-weighted goodput on the held-out scenarios and seeds (MLflow metric)."""


@dataclass(frozen=True, slots=True)
class Trial:
    """One point of the grid: the values it sets and the validated experiment it trains."""

    index: int
    seed: int
    scenarios: tuple[str, ...]
    hyperparameters: dict[str, Any]
    config: ExperimentConfig

    @property
    def label(self) -> str:
        """``seed=0 scenarios=a+b learning_rate=0.0001``."""
        cells = [f"seed={self.seed}", f"scenarios={'+'.join(self.scenarios)}"]
        cells += [f"{k}={_compact(v)}" for k, v in self.hyperparameters.items()]
        return " ".join(cells)


@dataclass(slots=True)
class SweepResult:
    """A finished sweep: outcomes ranked best first (failed trials last), and where everything went."""

    parent_run_id: str
    trials: list[Trial]
    ranked: list[TrialOutcome]
    baselines: dict[str, float]
    summary_md: Path
    summary_json: Path
    wall_s: float

    @property
    def best(self) -> TrialOutcome | None:
        """The best finished trial (``None`` when every trial failed)."""
        return self.ranked[0] if self.ranked and self.ranked[0].status == "finished" else None

    @property
    def failed(self) -> list[TrialOutcome]:
        """Trials that failed."""
        return [o for o in self.ranked if o.status != "finished"]


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")) if isinstance(value, list | dict) else str(value)


def plan_trials(config: ExperimentConfig, source: str = "<experiment>") -> list[Trial]:
    """Expand ``config.sweep`` into validated trials (scenario sets × hyperparameter values × seeds, in that order).

    Raises:
        ExperimentError: no ``sweep`` block, an unknown scenario, or a trial the experiment schema refuses; one
            line per problem, starting with ``source``.
    """
    sweep = config.sweep
    if sweep is None:
        raise ExperimentError(f"{source}: sweep: no sweep block (give seeds, scenarios and/or hyperparameters)")
    scenario_sets = [list(s) for s in sweep.scenarios] or [list(config.scenarios)]
    problems: list[str] = []
    for i, names in enumerate(scenario_sets):
        try:
            scenario_paths(names)
        except ValueError as exc:
            problems.append(f"{source}: sweep.scenarios.{i}: {exc}")
    grid: dict[str, list[Any]] = sweep.hyperparameters.model_dump(exclude_none=True)
    seeds = list(sweep.seeds) or [config.seed]
    base = config.model_dump(mode="json")
    trials: list[Trial] = []
    for names, values, seed in itertools.product(scenario_sets, itertools.product(*grid.values()), seeds):
        index = len(trials)
        chosen = dict(zip(grid, values, strict=True))
        data = {
            **base,
            "seed": seed,
            "scenarios": names,
            "eval_scenarios": list(config.held_out_scenarios),
            "vec_env": sweep.vec_env,
            "hyperparameters": {**base["hyperparameters"], **chosen},
            "register_as": None,
            "sweep": None,
        }
        if data.get("pretrain") and data["pretrain"].get("workers") is None:
            # a trial is already one worker: its expert episodes run in it rather than in a nested process pool
            data["pretrain"] = {**data["pretrain"], "workers": 1}
        try:
            trial_config = ExperimentConfig.model_validate(data)
        except ValidationError as exc:
            label = Trial(index, seed, tuple(names), chosen, config).label
            problems.extend(validation_lines(exc, f"{source}: sweep: trial {index} ({label})"))
            continue
        trials.append(Trial(index, seed, tuple(names), chosen, trial_config))
    if problems:
        raise ExperimentError("\n".join(problems))
    return trials


def _rank(outcomes: list[TrialOutcome]) -> list[TrialOutcome]:
    def key(o: TrialOutcome) -> tuple[int, float, int]:
        finished = o.status == "finished" and o.goodput is not None
        return (0 if finished else 1, -(o.goodput or 0.0) if finished else 0.0, o.index)

    return sorted(outcomes, key=key)


def _summary_rows(trials: list[Trial], ranked: list[TrialOutcome]) -> list[dict[str, Any]]:
    by_index = {t.index: t for t in trials}
    rows = []
    for rank, outcome in enumerate(ranked, start=1):
        trial = by_index[outcome.index]
        rows.append(
            {
                "rank": rank if outcome.status == "finished" else None,
                "trial": outcome.index,
                "seed": trial.seed,
                "scenarios": list(trial.scenarios),
                "hyperparameters": trial.hyperparameters,
                "status": outcome.status,
                "weighted_goodput_rps": outcome.goodput,
                "evaluation": outcome.evaluation,
                "wall_s": outcome.wall_s,
                "timesteps": outcome.timesteps,
                "run_id": outcome.run_id,
                "artifact": outcome.artifact,
                "error": outcome.error,
            }
        )
    return rows


def summary_markdown(rows: list[dict[str, Any]], baselines: dict[str, float], title: str) -> str:
    """The ranked table (one row per trial; baselines below it for reference)."""
    keys = list(dict.fromkeys(k for row in rows for k in row["hyperparameters"]))
    head = ["rank", "trial", "seed", "scenarios", *keys, "goodput (req/s)", "wall (s)", "status", "run"]
    lines = [f"# {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        goodput = row["weighted_goodput_rps"]
        cells = [
            str(row["rank"] or "–"),
            str(row["trial"]),
            str(row["seed"]),
            "+".join(row["scenarios"]),
            *(_compact(row["hyperparameters"].get(k, "")) for k in keys),
            f"{goodput:.4f}" if goodput is not None else "–",
            f"{row['wall_s']:.1f}" if row["wall_s"] is not None else "–",
            row["status"] if row["error"] is None else f"{row['status']}: {row['error']}".replace("|", "/"),
            f"`{row['run_id']}`",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if baselines:
        lines += ["", "Baselines on the same held-out scenarios and seeds:", ""]
        lines += [f"- `{spec}`: {value:.4f} req/s" for spec, value in baselines.items()]
    lines.append("")
    return "\n".join(lines)


def _grid_params(config: ExperimentConfig, trials: list[Trial], backend: str) -> dict[str, str]:
    assert config.sweep is not None
    params = {
        "sweep.backend": backend,
        "sweep.trials": str(len(trials)),
        "sweep.seeds": _compact(sorted({t.seed for t in trials})),
        "sweep.scenarios": _compact([list(s) for s in dict.fromkeys(t.scenarios for t in trials)]),
        "sweep.max_parallel": str(config.sweep.max_parallel),
        "sweep.vec_env": config.sweep.vec_env,
        "total_timesteps": str(config.total_timesteps),
        "eval_seeds": _compact(config.eval_seeds),
        "eval_scenarios": _compact(list(config.held_out_scenarios)),
    }
    for key, values in config.sweep.hyperparameters.model_dump(exclude_none=True).items():
        params[f"sweep.hp.{key}"] = _compact(values)
    return params


def _best_params(best: TrialOutcome, trial: Trial) -> dict[str, str]:
    params = {
        "best_trial.index": str(best.index),
        "best_trial.run_id": best.run_id,
        "best_trial.seed": str(trial.seed),
        "best_trial.scenarios": ",".join(trial.scenarios),
    }
    params.update({f"best_trial.hp.{k}": _compact(v) for k, v in trial.hyperparameters.items()})
    return params


def run_sweep(
    config: ExperimentConfig,
    out_dir: str | Path,
    *,
    tracking_uri: str | None = None,
    ray_address: str | None = None,
    max_parallel: int | None = None,
    num_cpus_per_trial: float | None = None,
    evaluate_baselines: bool | None = None,
    source: str = "<experiment>",
    on_trial: Callable[[Trial, TrialOutcome], None] | None = None,
) -> SweepResult:
    """Run every trial of ``config.sweep`` (see the module docstring) and rank them.

    Arguments left ``None`` take the sweep block's values. ``on_trial`` is called in the driver as each trial ends.

    Raises:
        ExperimentError: the grid is invalid (nothing has run).
        SweepError: Ray was asked for but is missing or unreachable (nothing has run).
    """
    trials = plan_trials(config, source)
    if ray_address is not None:
        import_ray()  # fail before any MLflow run exists

    from mlflow import MlflowClient

    assert config.sweep is not None
    sweep = config.sweep
    parallel = max_parallel or sweep.max_parallel
    cpus = num_cpus_per_trial or sweep.num_cpus_per_trial
    baselines_wanted = sweep.evaluate_baselines if evaluate_baselines is None else evaluate_baselines
    backend = "local" if ray_address is None else f"ray:{ray_address}"
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    uri = default_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri=uri)
    experiment_id = ensure_experiment(client, f"pdctl-train-{config.name}")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    layout = config.layout.to_layout()
    parent = client.create_run(
        experiment_id,
        run_name=f"{config.name}__sweep__{stamp}",
        tags=provenance_tags(layout, {"pdctl.experiment": config.name, "pdctl.sweep": "parent"}),
    )
    parent_id = parent.info.run_id
    children: dict[int, str] = {}
    outcomes: list[TrialOutcome] = []
    status = "KILLED"
    start = time.perf_counter()
    try:
        client.log_batch(parent_id, params=_mlflow_params(_grid_params(config, trials, backend)))
        client.log_dict(parent_id, config.model_dump(mode="json"), "experiment.json")
        client.log_dict(
            parent_id,
            {"trials": [{"index": t.index, "label": t.label, **_overrides(t)} for t in trials]},
            "grid.json",
        )
        jobs = []
        for trial in trials:
            child = client.create_run(
                experiment_id,
                run_name=f"{config.name}__sweep__{stamp}__trial{trial.index:03d}",
                tags={
                    "mlflow.parentRunId": parent_id,
                    "pdctl.experiment": config.name,
                    "pdctl.sweep": "trial",
                    "pdctl.sweep.trial": str(trial.index),
                    "pdctl.sweep.label": trial.label,
                },
            )
            children[trial.index] = child.info.run_id
            client.update_run(child.info.run_id, status="SCHEDULED")
            jobs.append(
                TrialJob(
                    trial.index,
                    trial.config.model_dump(mode="json"),
                    str(out / f"trial-{trial.index:03d}"),
                    uri,
                    child.info.run_id,
                )
            )
        by_index = {t.index: t for t in trials}
        with trial_backend(jobs, ray_address, parallel, cpus) as results:
            for outcome in results:
                outcomes.append(outcome)
                _close_child(client, outcome, by_index[outcome.index], config.name, stamp)
                if on_trial is not None:
                    on_trial(by_index[outcome.index], outcome)
        baselines = _baselines(config) if baselines_wanted else {}
        result = _finish(client, parent_id, config, trials, outcomes, baselines, out, time.perf_counter() - start)
        status = "FINISHED" if result.best is not None else "FAILED"
        return result
    finally:
        finished = {o.index for o in outcomes}
        for index, run_id in children.items():
            if index not in finished:
                client.set_terminated(run_id, "KILLED")
        client.set_terminated(parent_id, status)


def _mlflow_params(params: dict[str, str]) -> list[Any]:
    from mlflow.entities import Param

    return [Param(k, v) for k, v in params.items()]


def _overrides(trial: Trial) -> dict[str, Any]:
    return {"seed": trial.seed, "scenarios": list(trial.scenarios), "hyperparameters": trial.hyperparameters}


def _close_child(client: Any, outcome: TrialOutcome, trial: Trial, name: str, stamp: str) -> None:
    """Name the child run after its trial (train() names runs by seed only) and record a failure."""
    client.update_run(outcome.run_id, name=f"{name}__sweep__{stamp}__trial{trial.index:03d}")
    client.set_tag(outcome.run_id, "pdctl.sweep.status", outcome.status)
    if outcome.status != "finished":
        client.set_tag(outcome.run_id, "pdctl.sweep.error", (outcome.error or "")[:4000])
        client.set_terminated(outcome.run_id, "FAILED")


def _baselines(config: ExperimentConfig) -> dict[str, float]:
    if not config.baselines:
        return {}
    table = evaluate_policies(config.baselines, scenario_paths(config.held_out_scenarios), config.eval_seeds)
    return {spec: values["mean"] for spec, values in table.items()}


def _finish(
    client: Any,
    parent_id: str,
    config: ExperimentConfig,
    trials: list[Trial],
    outcomes: list[TrialOutcome],
    baselines: dict[str, float],
    out: Path,
    wall_s: float,
) -> SweepResult:
    ranked = _rank(outcomes)
    rows = _summary_rows(trials, ranked)
    summary = {
        "experiment": config.name,
        "parent_run_id": parent_id,
        "ranking_metric": RANKING_METRIC,
        "wall_s": wall_s,
        "baselines": baselines,
        "trials": rows,
    }
    md = summary_markdown(rows, baselines, f"Sweep {config.name}: trials ranked by held-out weighted goodput")
    summary_md, summary_json = out / "summary.md", out / "summary.json"
    summary_md.write_text(md, encoding="utf-8")
    summary_json.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    client.log_text(parent_id, md, "sweep_summary.md")
    client.log_dict(parent_id, summary, "sweep_summary.json")
    result = SweepResult(parent_id, trials, ranked, baselines, summary_md, summary_json, wall_s)
    metrics = {
        "sweep/trials": float(len(trials)),
        "sweep/finished": float(len(ranked) - len(result.failed)),
        "sweep/failed": float(len(result.failed)),
        "sweep/wall_s": wall_s,
    }
    if baselines:
        metrics["eval/best_baseline_weighted_goodput_rps"] = max(baselines.values())
    best = result.best
    if best is not None and best.goodput is not None:
        metrics["sweep/best_weighted_goodput_rps"] = best.goodput
        trial = next(t for t in trials if t.index == best.index)
        client.log_batch(parent_id, params=_mlflow_params(_best_params(best, trial)))
    for key, value in metrics.items():
        client.log_metric(parent_id, key, value)
    return result
