"""Where the trials of a sweep run: local worker processes or Ray tasks, and one trial run in either.

:func:`run_trial` trains one trial (a :class:`TrialJob`, picklable) in the process it lands in and never raises
for a failed trial; :func:`trial_backend` yields the outcomes of a list of jobs as they finish, from a
``spawn`` process pool (default) or from ``ray.remote`` tasks (see :mod:`agents.sweep` for the backends' rules:
``--ray-address local`` starts an in-process local Ray instance, any other address is passed to ``ray.init``).
Ray is imported only when asked for (:func:`import_ray`).
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.config import ExperimentConfig
from agents.train import train

__all__ = ["LOCAL_RAY", "SweepError", "TrialJob", "TrialOutcome", "import_ray", "run_trial", "trial_backend"]

LOCAL_RAY = "local"
"""``--ray-address local``: start an in-process local Ray instance (Ray's ``local_mode`` no longer exists)."""


class SweepError(RuntimeError):
    """The sweep could not run at all (Ray missing or unreachable); one line."""


@dataclass(slots=True)
class TrialOutcome:
    """What one trial produced (picklable; crosses process and Ray boundaries)."""

    index: int
    run_id: str
    status: str
    """``finished`` or ``failed``."""
    goodput: float | None = None
    evaluation: dict[str, float] = field(default_factory=dict)
    wall_s: float | None = None
    timesteps: int | None = None
    env_steps_per_s: float | None = None
    artifact: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class TrialJob:
    """One trial as a worker receives it: the validated experiment (JSON form), its folder and its MLflow run."""

    index: int
    config: dict[str, Any]
    out_dir: str
    tracking_uri: str
    run_id: str


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def run_trial(job: TrialJob) -> TrialOutcome:
    """Train one trial in this process (a pool worker or a Ray task); never raises for a failed trial."""
    os.environ["MLFLOW_RUN_ID"] = job.run_id  # train()'s mlflow.start_run resumes the child run the driver made
    out = Path(job.out_dir)
    try:
        config = ExperimentConfig.model_validate(job.config)
        result = train(config, out, tracking_uri=job.tracking_uri, progress=False, evaluate_baselines=False)
        evaluation = result.evaluation[f"learned:{result.artifact}"]
        return TrialOutcome(
            index=job.index,
            run_id=job.run_id,
            status="finished",
            goodput=evaluation["mean"],
            evaluation=dict(evaluation),
            wall_s=result.wall_s,
            timesteps=result.timesteps,
            env_steps_per_s=result.env_steps_per_s,
            artifact=str(result.artifact),
        )
    except Exception as exc:
        out.mkdir(parents=True, exist_ok=True)
        (out / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
        return TrialOutcome(index=job.index, run_id=job.run_id, status="failed", error=_one_line(exc))
    finally:
        os.environ.pop("MLFLOW_RUN_ID", None)


def _failed(job: TrialJob, exc: BaseException) -> TrialOutcome:
    return TrialOutcome(index=job.index, run_id=job.run_id, status="failed", error=_one_line(exc))


def _run_local(jobs: list[TrialJob], max_parallel: int | None) -> Iterator[TrialOutcome]:
    workers = max(1, min(max_parallel or os.cpu_count() or 1, len(jobs)))
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.submit(run_trial, job): job for job in jobs}
        for future in as_completed(futures):
            try:
                yield future.result()
            except Exception as exc:  # a worker died (BrokenProcessPool) or the result did not unpickle
                yield _failed(futures[future], exc)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # an interrupted sweep does not start queued trials


def import_ray() -> Any:
    """The ``ray`` module. Raises :class:`SweepError` (how to install it) when Ray is missing."""
    try:
        import ray
    except ImportError:
        raise SweepError("--ray-address needs Ray, which is not installed: pip install 'pdctl[ray]'") from None
    return ray


@contextmanager
def _ray_session(address: str, num_cpus: int) -> Iterator[Any]:
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    try:
        if address == LOCAL_RAY:
            ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level="warning")
        else:
            ray.init(address=address, logging_level="warning")
    except Exception as exc:
        raise SweepError(f"cannot start Ray at {address!r}: {_one_line(exc)}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _run_ray(ray: Any, jobs: list[TrialJob], max_parallel: int | None, num_cpus: float) -> Iterator[TrialOutcome]:
    remote = ray.remote(num_cpus=num_cpus, max_retries=0)(run_trial)
    queue = list(jobs)
    pending: dict[Any, TrialJob] = {}
    limit = max_parallel or len(jobs)
    while queue or pending:
        while queue and len(pending) < limit:
            job = queue.pop(0)
            pending[remote.remote(job)] = job
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            job = pending.pop(ref)
            try:
                yield ray.get(ref)
            except Exception as exc:  # the task's worker died (RayTaskError / WorkerCrashedError)
                yield _failed(job, exc)


@contextmanager
def trial_backend(
    jobs: list[TrialJob], ray_address: str | None, max_parallel: int | None, num_cpus: float
) -> Iterator[Iterator[TrialOutcome]]:
    """The outcomes of ``jobs`` as they finish: local processes without ``ray_address``, else Ray tasks.

    Raises:
        SweepError: Ray was asked for but is missing or cannot start.
    """
    if ray_address is None:
        yield _run_local(jobs, max_parallel)
        return
    total = max_parallel or os.cpu_count() or 1
    with _ray_session(ray_address, total) as ray:
        yield _run_ray(ray, jobs, max_parallel, num_cpus)
