"""Policies from the MLflow registry: resolve ``models:/NAME@ALIAS`` and follow the alias as it moves.

:func:`mlflow_resolver` downloads a registered version's artifacts to a local folder (the resolver that
:func:`policies.registry.load_policy` takes for ``registry:`` specs). :class:`RegistryPolicy` is the policy the
daemon runs for a ``registry:`` spec: :meth:`RegistryPolicy.refresh` (called by the loop once per interval, off the
event loop) asks the registry which version the alias points at; when it moved, the new version is downloaded and
validated (manifest, schema and feature hashes, weights) and only then swapped in. A failed load keeps the running
policy and is reported (:attr:`RegistryPolicy.last_error`, metric ``pdctl_controller_policy_loads_total``).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from policies.base import Policy, PolicyContext
from policies.data_dir import TRACKING_URI_ENV, embedded_tracking_db
from policies.data_dir import tracking_uri as resolve_tracking_uri
from policies.features import Observation
from policies.policy_file import ResolvedPolicy
from policies.registry import PolicySpecError, layout_problem, load_artifact_dir
from policies.schema import ControlAction

__all__ = ["AliasTarget", "RegistryPolicy", "mlflow_resolver", "resolve_alias", "tracking_uri_or_default"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AliasTarget:
    """Where a model URI points now."""

    name: str
    version: int
    source: str


def tracking_uri_or_default(tracking_uri: str | None) -> str:
    """``tracking_uri``, else ``MLFLOW_TRACKING_URI``, else the embedded registry (:mod:`policies.data_dir`)."""
    return resolve_tracking_uri(tracking_uri)


def _client(tracking_uri: str | None):  # type: ignore[no-untyped-def]
    from mlflow import MlflowClient

    uri = tracking_uri_or_default(tracking_uri)
    embedded = embedded_tracking_db()
    if uri == f"sqlite:///{embedded}" and not embedded.is_file():
        # MlflowClient would create an empty registry there; say where the registry was looked for instead
        raise ValueError(
            f"no MLflow registry at {embedded} (the default; set {TRACKING_URI_ENV} or mlflow_tracking_uri, or "
            "register a policy with pdctl train / pdctl policy register first)"
        )
    return MlflowClient(tracking_uri=uri)


def resolve_alias(uri: str, tracking_uri: str | None = None) -> AliasTarget:
    """The version ``models:/NAME@ALIAS`` (or ``models:/NAME/VERSION``) names; ``ValueError`` if none."""
    from mlflow.exceptions import MlflowException

    if not uri.startswith("models:/"):
        raise ValueError(f"{uri}: expected models:/NAME@ALIAS or models:/NAME/VERSION")
    body = uri.removeprefix("models:/")
    client = _client(tracking_uri)  # ValueError: no registry where the default says
    try:
        if "@" in body:
            name, alias = body.split("@", 1)
            mv = client.get_model_version_by_alias(name, alias)
        else:
            name, version = body.rsplit("/", 1)
            mv = client.get_model_version(name, version)
    except MlflowException as exc:
        raise ValueError(f"{uri}: not found in the registry ({exc.error_code})") from None
    except OSError as exc:
        raise ValueError(f"{uri}: registry unreachable ({exc.__class__.__name__})") from None
    return AliasTarget(mv.name, int(mv.version), str(mv.source))


def _download(target: AliasTarget, tracking_uri: str | None, dst: Path) -> Path:
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        return Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=target.source, dst_path=str(dst), tracking_uri=tracking_uri_or_default(tracking_uri)
            )
        )
    except (MlflowException, OSError) as exc:
        raise ValueError(
            f"models:/{target.name}/{target.version}: download failed ({exc.__class__.__name__})"
        ) from None


def mlflow_resolver(tracking_uri: str | None = None, cache_dir: str | Path | None = None):  # type: ignore[no-untyped-def]
    """A resolver for :func:`policies.registry.load_policy`: URI → local artifact folder (downloaded)."""

    def resolve(uri: str) -> Path:
        target = resolve_alias(uri, tracking_uri)
        root = Path(cache_dir) if cache_dir is not None else Path(tempfile.mkdtemp(prefix="pdctl-registry-"))
        dst = root / f"{target.name}-v{target.version}"
        if dst.exists():
            shutil.rmtree(dst)
        dst.mkdir(parents=True)
        return _download(target, tracking_uri, dst)

    return resolve


class RegistryPolicy:
    """The policy an alias points at, re-resolved by :meth:`refresh`; decisions delegate to the loaded version."""

    def __init__(
        self, spec: str, base: ResolvedPolicy, tracking_uri: str | None = None, cache_dir: str | Path | None = None
    ) -> None:
        self.spec = spec
        self.uri = spec.removeprefix("registry:")
        self.base = base
        self.tracking_uri = tracking_uri
        self.cache_dir = Path(cache_dir) if cache_dir is not None else Path(tempfile.mkdtemp(prefix="pdctl-registry-"))
        self.version: int | None = None
        self.last_error: str | None = None
        self.loads_ok = 0
        self.loads_failed = 0
        self._inner: Policy | None = None
        self._lock = threading.Lock()
        if not self.refresh():
            raise PolicySpecError(f"policy spec {spec!r}: {self.last_error}")

    @property
    def policy_id(self) -> str:
        """The spec and the version in force."""
        return f"{self.spec}#v{self.version}"

    @property
    def inner(self) -> Policy | None:
        """The loaded version (what :meth:`decide` delegates to)."""
        with self._lock:
            return self._inner

    def refresh(self) -> bool:
        """Follow the alias: load a new version if it moved. Returns False when a load failed (old one kept)."""
        try:
            target = resolve_alias(self.uri, self.tracking_uri)
        except ValueError as exc:
            return self._failed(str(exc))
        if target.version == self.version:
            return True
        dst = self.cache_dir / f"{target.name}-v{target.version}"
        try:
            if dst.exists():
                shutil.rmtree(dst)
            dst.mkdir(parents=True)
            local = _download(target, self.tracking_uri, dst)
            policy = load_artifact_dir(local, f"{self.spec}#v{target.version}")
        except (ValueError, OSError) as exc:
            return self._failed(f"version {target.version}: {str(exc).splitlines()[0]}")
        problem = layout_problem(
            policy, list(self.base.tenants), list(self.base.groups), self.base.grouped_tenant_names()
        )
        if problem is not None:  # it would fail (or drive tenants it never saw) on every tick: refused now
            return self._failed(f"version {target.version}: {problem}")
        with self._lock:
            previous, self._inner, self.version = self.version, policy, target.version
        self.loads_ok += 1
        self.last_error = None
        _log.info("registry policy %s: now version %s (was %s)", self.uri, target.version, previous)
        return True

    def _failed(self, message: str) -> bool:
        self.loads_failed += 1
        self.last_error = message
        _log.error("registry policy %s: load failed, keeping version %s: %s", self.uri, self.version, message)
        return False

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """The loaded version's decision."""
        with self._lock:
            inner = self._inner
        if inner is None:  # pragma: no cover - the constructor refuses to build without a version
            raise RuntimeError("no policy loaded")
        return inner.decide(observation, context)
