"""Policies by name: ``file:PATH``, ``baseline:NAME``, ``learned:PATH``, ``registry:models:/NAME@ALIAS``.

Every command that takes a policy resolves it here. Baselines live in the explicit :data:`BASELINES` table
(name → factory: ``queue_kv`` of :mod:`policies.rules` and every baseline of :mod:`policies.baselines`); a name
not in it is refused with the list of known names. ``learned:PATH`` loads an exported artifact
(:class:`policies.learned.LearnedPolicy`). ``registry:models:/NAME@ALIAS`` needs a *resolver* from the caller
(the registry client lives outside the pure core): it turns the URI into a local directory holding either a
learned artifact or a ``policy.yaml``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from policies import baselines as _baselines
from policies.artifacts import load_learned
from policies.base import Policy, PolicyContext
from policies.features import Observation
from policies.learned import PolicyLoadError
from policies.policy_file import PolicyFileError, ResolvedPolicy, load_policy_file, resolve_policy
from policies.rules import FilePolicy, QueueKvParams, QueueKvPolicy
from policies.schema import ControlAction

__all__ = [
    "BASELINES",
    "PolicySpec",
    "PolicySpecError",
    "RegistryResolver",
    "load_artifact_dir",
    "load_policy",
    "parse_policy_spec",
]

BaselineFactory = Callable[[ResolvedPolicy, str, Mapping[str, Any]], Policy]


def _queue_kv(resolved: ResolvedPolicy, spec: str, params: Mapping[str, Any]) -> Policy:
    del resolved
    return QueueKvPolicy(QueueKvParams(**params), policy_id=spec)


def _peer_baseline(name: str) -> BaselineFactory:
    def factory(resolved: ResolvedPolicy, spec: str, params: Mapping[str, Any]) -> Policy:
        del resolved
        known = {"prefill_tokens_per_s", "decode_tokens_per_s"} if name == "dynamo-throughput" else set()
        unknown = sorted(set(params) - known)
        if unknown:
            raise PolicySpecError(f"policy spec {spec!r}: bad parameters: unknown {', '.join(unknown)}")
        try:
            return _baselines.make_baseline(name, **params)
        except ValueError as exc:
            raise PolicySpecError(f"policy spec {spec!r}: {exc}") from None

    return factory


BASELINES: Mapping[str, BaselineFactory] = {
    "queue_kv": _queue_kv,
    **{name: _peer_baseline(name) for name in sorted([*_baselines.BASELINES, "dynamo-throughput"])},
}
"""Baseline policies by name. Each factory takes the base policy (tenants, SLOs, bounds), the spec and the
baseline's parameters (keyword arguments of its parameter dataclass)."""

_KINDS = ("file", "baseline", "learned", "registry")


class PolicySpecError(ValueError):
    """A policy spec could not be parsed or loaded; the message is one line naming the spec."""


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A parsed policy spec: its kind and argument (path, baseline name or model URI)."""

    kind: str
    argument: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.argument}"


def parse_policy_spec(spec: str) -> PolicySpec:
    """Split ``KIND:ARGUMENT`` and check the kind and the argument's shape."""
    kind, sep, argument = spec.partition(":")
    if not sep or kind not in _KINDS or not argument:
        raise PolicySpecError(
            f"policy spec {spec!r}: expected one of file:PATH, baseline:NAME, learned:PATH, registry:models:/NAME@ALIAS"
        )
    if kind == "registry":
        body = argument.removeprefix("models:/")
        pinned = "/" in body and body.rsplit("/", 1)[1].isdigit()
        if not argument.startswith("models:/") or not ("@" in body or pinned):
            raise PolicySpecError(
                f"policy spec {spec!r}: a registry spec reads registry:models:/NAME@ALIAS "
                "or registry:models:/NAME/VERSION"
            )
    return PolicySpec(kind, argument)


RegistryResolver = Callable[[str], Path]
"""Turns ``models:/NAME@ALIAS`` into a local directory (downloading it); raises ``ValueError`` when it cannot."""


def load_artifact_dir(path: Path, spec: str) -> Policy:
    """A policy from a local artifact directory: ``policy.yaml`` (a rule policy) or a learned artifact."""
    policy_file = path / "policy.yaml"
    try:
        if policy_file.is_file():
            return FilePolicy(resolve_policy(load_policy_file(policy_file), str(policy_file)), spec)
        return _Labelled(load_learned(path), spec)
    except (PolicyFileError, PolicyLoadError) as exc:
        raise PolicySpecError(f"policy spec {spec!r}: {str(exc).splitlines()[0]}") from None


class _Labelled:
    """A policy under another id (the spec it was loaded from)."""

    def __init__(self, inner: Policy, policy_id: str) -> None:
        self.inner = inner
        self._policy_id = policy_id

    @property
    def policy_id(self) -> str:
        """The spec, e.g. ``registry:models:/pdctl-generalist@champion (v3)``."""
        return self._policy_id

    def decide(self, observation: Observation, context: PolicyContext) -> ControlAction:
        """The wrapped policy's decision, relabelled."""
        return replace(self.inner.decide(observation, context), policy_id=self._policy_id)


def load_policy(
    spec: str,
    base: ResolvedPolicy,
    params: Mapping[str, Any] | None = None,
    base_dir: Path | None = None,
    resolver: RegistryResolver | None = None,
) -> Policy:
    """Build the policy named by ``spec`` for the tenants, SLOs and bounds of ``base``.

    ``params`` are the baseline's parameters (ignored by other kinds); relative ``file:`` paths are taken
    relative to ``base_dir``.

    Raises:
        PolicySpecError: unknown kind or baseline, a learned or registry artifact that does not load, or a
            registry spec without a resolver.
        policies.policy_file.PolicyFileError: a ``file:`` policy is invalid.
    """
    parsed = parse_policy_spec(spec)
    if parsed.kind == "file":
        path = Path(parsed.argument)
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        return FilePolicy(resolve_policy(load_policy_file(path), str(path)), str(parsed))
    if parsed.kind == "baseline":
        factory = BASELINES.get(parsed.argument)
        if factory is None:
            known = ", ".join(sorted(BASELINES))
            raise PolicySpecError(f"policy spec {spec!r}: unknown baseline {parsed.argument!r} (known: {known})")
        try:
            return factory(base, str(parsed), params or {})
        except PolicySpecError:
            raise
        except (TypeError, ValueError) as exc:
            raise PolicySpecError(f"policy spec {spec!r}: bad parameters: {exc}") from None
    if parsed.kind == "learned":
        path = Path(parsed.argument)
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        return load_artifact_dir(path, str(parsed))
    if resolver is None:
        raise PolicySpecError(f"policy spec {spec!r}: registry policies need an MLflow registry client here")
    try:
        local = resolver(parsed.argument)
    except ValueError as exc:
        raise PolicySpecError(f"policy spec {spec!r}: {str(exc).splitlines()[0]}") from None
    return load_artifact_dir(local, str(parsed))
