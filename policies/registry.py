"""Policies by name: ``file:PATH``, ``baseline:NAME``, ``learned:PATH``, ``registry:models:/NAME@ALIAS``.

Every command that takes a policy resolves it here. Baselines live in the explicit :data:`BASELINES` table
(name → factory); a name not in it is refused with the list of known names. ``learned:`` and ``registry:``
specs are parsed and refused with a one-line "not available yet" error until the learned-policy runtime
lands.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.base import Policy
from policies.policy_file import ResolvedPolicy, load_policy_file, resolve_policy
from policies.rules import FilePolicy, QueueKvParams, QueueKvPolicy

__all__ = ["BASELINES", "PolicySpec", "PolicySpecError", "load_policy", "parse_policy_spec"]

BaselineFactory = Callable[[ResolvedPolicy, str, Mapping[str, Any]], Policy]


def _queue_kv(resolved: ResolvedPolicy, spec: str, params: Mapping[str, Any]) -> Policy:
    del resolved
    return QueueKvPolicy(QueueKvParams(**params), policy_id=spec)


BASELINES: Mapping[str, BaselineFactory] = {
    "queue_kv": _queue_kv,
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
    if kind == "registry" and not (argument.startswith("models:/") and "@" in argument):
        raise PolicySpecError(f"policy spec {spec!r}: a registry spec reads registry:models:/NAME@ALIAS")
    return PolicySpec(kind, argument)


def load_policy(
    spec: str, base: ResolvedPolicy, params: Mapping[str, Any] | None = None, base_dir: Path | None = None
) -> Policy:
    """Build the policy named by ``spec`` for the tenants, SLOs and bounds of ``base``.

    ``params`` are the baseline's parameters (ignored by other kinds); relative ``file:`` paths are taken
    relative to ``base_dir``.

    Raises:
        PolicySpecError: unknown kind or baseline, or a kind not available yet.
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
        except (TypeError, ValueError) as exc:
            raise PolicySpecError(f"policy spec {spec!r}: bad parameters: {exc}") from None
    raise PolicySpecError(f"policy spec {spec!r}: {parsed.kind} policies are not available yet in this version")
