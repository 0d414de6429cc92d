"""The policy registry on MLflow: register, list and promote policies behind aliases.

A registered policy is an MLflow model version whose source is a directory of artifacts:

* a **learned** policy: ``manifest.json`` + ``weights.safetensors`` (:mod:`policies.learned`);
* a **rule** policy: ``policy.yaml`` (a policy file) + ``manifest.json`` with ``{"kind": "file"}``.

Resolving ``models:/NAME@ALIAS`` back to files is the serving side's job (:mod:`controller.policy_registry`).
A new version gets the alias ``challenger``. :func:`promote` moves ``champion`` (or any alias) to a version only
when its held-out evaluation beats the current champion and the best baseline by ``margin_frac``; the numbers
are version tags written at registration (``eval.goodput``, ``eval.best_baseline_goodput``), so the gate needs
no simulator at promotion time. A refusal raises :class:`PromotionRefused` with the numbers.

The tracking URI defaults to a SQLite file under ``./data/mlflow`` (embedded default); ``MLFLOW_TRACKING_URI``
or an explicit URI selects a server.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mlflow.exceptions import MlflowException

__all__ = [
    "DEFAULT_TRACKING_DIR",
    "PromotionRefused",
    "RegisteredPolicy",
    "RegistryError",
    "default_tracking_uri",
    "ensure_experiment",
    "list_policies",
    "promote",
    "register_policy",
]

DEFAULT_TRACKING_DIR = Path("data") / "mlflow"
GOODPUT_TAG = "eval.goodput"
BASELINE_TAG = "eval.best_baseline_goodput"
KIND_TAG = "pdctl.kind"


class RegistryError(ValueError):
    """A registry operation failed (one line naming what)."""


class PromotionRefused(RegistryError):
    """The promotion gate refused a version; the message carries the numbers."""


@dataclass(frozen=True, slots=True)
class RegisteredPolicy:
    """One version of a registered policy."""

    name: str
    version: int
    aliases: tuple[str, ...]
    kind: str
    run_id: str | None
    goodput: float | None
    best_baseline_goodput: float | None
    source: str


def default_tracking_uri(tracking_uri: str | None = None) -> str:
    """``tracking_uri``, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///data/mlflow/mlflow.db``."""
    if tracking_uri:
        return tracking_uri
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    DEFAULT_TRACKING_DIR.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(DEFAULT_TRACKING_DIR / 'mlflow.db').resolve()}"


def _client(tracking_uri: str | None):  # type: ignore[no-untyped-def]
    import mlflow
    from mlflow import MlflowClient

    uri = default_tracking_uri(tracking_uri)
    mlflow.set_tracking_uri(uri)
    return MlflowClient(tracking_uri=uri)


def ensure_experiment(client, name: str) -> str:  # type: ignore[no-untyped-def]
    """The id of experiment ``name``, created if needed; with a local SQLite store its artifacts live beside it."""
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        return str(existing.experiment_id)
    location = None
    if client.tracking_uri.startswith("sqlite:///"):
        db = Path(client.tracking_uri.removeprefix("sqlite:///"))
        location = (db.parent / "artifacts").resolve().as_uri()
    return str(client.create_experiment(name, artifact_location=location))


def _kind_of(path: Path) -> str:
    manifest = path / "manifest.json"
    if not manifest.is_file():
        raise RegistryError(f"{path}: no manifest.json (export a learned policy or use a policy file)")
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RegistryError(f"{manifest}: not readable JSON: {exc}") from None
    return "file" if data.get("kind") == "file" else "learned"


def _stage_policy_file(policy_file: Path) -> Path:
    from policies.policy_file import PolicyFileError, load_policy_file, resolve_policy

    try:
        resolve_policy(load_policy_file(policy_file), str(policy_file))
    except PolicyFileError as exc:
        raise RegistryError(str(exc).splitlines()[0]) from None
    staged = Path(tempfile.mkdtemp(prefix="pdctl-policy-"))
    shutil.copyfile(policy_file, staged / "policy.yaml")
    (staged / "manifest.json").write_text(json.dumps({"kind": "file", "source": str(policy_file)}))
    return staged


def register_policy(
    path: str | Path,
    name: str,
    *,
    tracking_uri: str | None = None,
    run_id: str | None = None,
    evaluation: Mapping[str, float] | None = None,
    experiment: str = "pdctl-policies",
) -> RegisteredPolicy:
    """Register an artifact directory or a policy file as a new version of ``name`` with alias ``challenger``.

    ``evaluation`` may carry ``goodput`` and ``best_baseline_goodput`` (held-out scenarios) for the gate.
    Without ``run_id`` a run is created in ``experiment`` to hold the artifacts.
    """
    import mlflow

    source = Path(path)
    staged: Path | None = None
    if source.is_file():
        staged = _stage_policy_file(source)
        source = staged
    elif not source.is_dir():
        raise RegistryError(f"{path}: no such artifact directory or policy file")
    kind = _kind_of(source)
    client = _client(tracking_uri)
    try:
        if run_id is None:
            with mlflow.start_run(
                experiment_id=ensure_experiment(client, experiment), run_name=f"register-{name}"
            ) as run:
                mlflow.log_artifacts(str(source), artifact_path="policy")
                run_id = run.info.run_id
        else:
            client.log_artifacts(run_id, str(source), artifact_path="policy")
    finally:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
    artifact_uri = f"{client.get_run(run_id).info.artifact_uri}/policy"
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name)
    version = client.create_model_version(name=name, source=artifact_uri, run_id=run_id)
    client.set_model_version_tag(name, version.version, KIND_TAG, kind)
    for key, tag in (("goodput", GOODPUT_TAG), ("best_baseline_goodput", BASELINE_TAG)):
        if evaluation and key in evaluation:
            client.set_model_version_tag(name, version.version, tag, repr(float(evaluation[key])))
    client.set_registered_model_alias(name, "challenger", version.version)
    return _describe(client, name, int(version.version))


def _float_tag(tags: Mapping[str, str], key: str) -> float | None:
    value = tags.get(key)
    return None if value is None else float(value)


def _describe(client, name: str, version: int) -> RegisteredPolicy:  # type: ignore[no-untyped-def]
    mv = client.get_model_version(name, str(version))
    return RegisteredPolicy(
        name=name,
        version=version,
        aliases=tuple(sorted(getattr(mv, "aliases", []) or [])),
        kind=mv.tags.get(KIND_TAG, "learned"),
        run_id=mv.run_id,
        goodput=_float_tag(mv.tags, GOODPUT_TAG),
        best_baseline_goodput=_float_tag(mv.tags, BASELINE_TAG),
        source=mv.source,
    )


def list_policies(name: str | None = None, *, tracking_uri: str | None = None) -> list[RegisteredPolicy]:
    """Every version of ``name`` (or of every registered policy), newest first."""
    client = _client(tracking_uri)
    query = f"name='{name}'" if name else ""
    versions = client.search_model_versions(query)
    out = [_describe(client, v.name, int(v.version)) for v in versions]
    return sorted(out, key=lambda p: (p.name, -p.version))


def promote(
    name: str,
    version: int,
    *,
    alias: str = "champion",
    margin_frac: float = 0.0,
    tracking_uri: str | None = None,
    force: bool = False,
) -> RegisteredPolicy:
    """Move ``alias`` to ``version`` if it beats the current holder and the best baseline by ``margin_frac``."""
    client = _client(tracking_uri)
    try:
        candidate = _describe(client, name, version)
    except MlflowException as exc:
        raise RegistryError(f"{name} version {version}: not found ({exc.__class__.__name__})") from None
    if not force:
        if candidate.goodput is None:
            raise PromotionRefused(
                f"{name} v{version}: no held-out evaluation ({GOODPUT_TAG} tag); register it with an evaluation"
            )
        bars: list[tuple[str, float]] = []
        if candidate.best_baseline_goodput is not None:
            bars.append(("best baseline", candidate.best_baseline_goodput))
        try:
            holder = client.get_model_version_by_alias(name, alias)
        except MlflowException:
            holder = None
        if holder is not None and int(holder.version) != version:
            held = _describe(client, name, int(holder.version))
            if held.goodput is not None:
                bars.append((f"{alias} v{held.version}", held.goodput))
        for label, value in bars:
            need = value * (1.0 + margin_frac)
            if candidate.goodput < need:
                raise PromotionRefused(
                    f"{name} v{version}: goodput {candidate.goodput:.4g} does not beat {label} {value:.4g} "
                    f"by {margin_frac:.1%} (needs ≥ {need:.4g}); {alias} unchanged"
                )
    client.set_registered_model_alias(name, alias, str(version))
    return _describe(client, name, version)
