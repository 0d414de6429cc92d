"""Policies by name: the one policy-spec grammar of every command.

Core kinds:

* ``file:PATH`` — a policy file (:class:`policies.rules.FilePolicy`: its thresholds for every tenant);
* ``baseline:NAME`` — the explicit :data:`BASELINES` table (name → factory: ``queue_kv`` of
  :mod:`policies.rules` and every baseline of :mod:`policies.baselines`); a name not in it is refused with the
  list of known names;
* ``learned:PATH`` — an exported artifact (:class:`policies.learned.LearnedPolicy`, or
  :class:`policies.set_policy.SetPolicy` when its manifest says ``pdctl-set-policy``);
* ``registry:models:/NAME@ALIAS`` (or ``/NAME/VERSION``) — needs a *resolver* from the caller (the registry
  client lives outside the pure core) that turns the URI into a local directory holding either a learned
  artifact or a ``policy.yaml``;
* ``learned:default`` — the shipped default learned policy under the safety layer it ships with
  (:data:`DEFAULT_LEARNED_SPEC`: the rule selector trained on the default scenario family; its safety layer is the
  guard every policy runs under — bounds, hysteresis, the pace of pool moves — and, since the twelfth session, no SLO
  watchdog: on the 72 pinned validation scenarios over three selectors the watchdog cost 5–8 % and lowered the floor,
  ``experiments/results/families/safety-layer-choice/``). ``watchdog:learned:default`` puts it under the watchdog;
  a selector only ever runs one of four rule policies per group, so it cannot fail the way an unconstrained network
  can (idle instances, absolute pool counts from another budget), which is what the watchdog was built for;
* ``learned:admission`` — the learned policy for a router whose admission stage is on (:data:`ADMISSION_LEARNED_SPEC`:
  the same recipe as the default's, every training rollout behind the admission stage at TTFT slack 1.0;
  ``experiments/results/families/selector-admission/``). Behind admission only: without it, it is below the default;
* ``watchdog:PRIMARY`` and ``watchdog[FALLBACK]:PRIMARY`` — ``PRIMARY`` (any core kind but another watchdog)
  under the SLO watchdog of :mod:`policies.watchdog` (default parameters), with a ``baseline:`` or ``file:``
  fallback (:data:`WATCHDOG_FALLBACK` when none is named).

Packages outside the core add kinds with :func:`register_kind` (``agents`` adds ``grid:`` and ``expert:H``,
which need a simulator and so never reach the controller); a kind nobody registered is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from policies import baselines as _baselines
from policies.artifacts import load_learned
from policies.base import Policy, PolicyContext, RemembersState, policy_layers, remembering_layer
from policies.features import Observation, ObservationLayout
from policies.learned import LearnedPolicy, PolicyLoadError
from policies.policy_file import PolicyFileError, ResolvedPolicy, load_policy_file, resolve_policy
from policies.rule_selector import RuleSelector
from policies.rules import FilePolicy, QueueKvParams, QueueKvPolicy
from policies.schema import ControlAction
from policies.set_policy import SetPolicy
from policies.watchdog import FALLBACK_KINDS, SloWatchdog

__all__ = [
    "ADMISSION_LEARNED_ARTIFACT",
    "ADMISSION_LEARNED_SPEC",
    "BASELINES",
    "DEFAULT_LEARNED_ARTIFACT",
    "DEFAULT_LEARNED_SPEC",
    "WATCHDOG_FALLBACK",
    "KindFactory",
    "LoadOptions",
    "PolicySpec",
    "PolicySpecError",
    "RegistryResolver",
    "build_policy",
    "expand_alias",
    "fitted_admission_slack",
    "fixed_layout",
    "inner_rule_selector",
    "layout_problem",
    "load_artifact_dir",
    "load_policy",
    "parse_policy_spec",
    "register_kind",
    "remembering_policy",
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

WATCHDOG_FALLBACK = "baseline:dynamo-legacy"
"""The fallback of ``watchdog:PRIMARY`` (the best baseline on most shipped scenarios)."""

DEFAULT_LEARNED_ARTIFACT = (
    Path(__file__).resolve().parents[1] / "experiments/results/learned/selector-560-late-misses-policy"
)
"""The shipped default learned policy: the rule selector of ``experiments/selector-560-late-misses.yaml`` (fitted on
560 generated training scenarios at 1.0x and 1.5x load, rollouts stopped at a 20,000-request budget keeping the bins
whose in-flight requests are certain misses; 8-interval label windows, a 0.05 switch margin, ``transfer_fallback``
on, a 300 s bar on a rule switched back from, the outcome check of a switch over 6 windows; in a source checkout;
chosen by experiments/results/families/l560/PROTOCOL.md, see experiments/results/families/README-learned.md)."""

DEFAULT_LEARNED_SPEC = f"learned:{DEFAULT_LEARNED_ARTIFACT}"
"""What ``learned:default`` stands for: the default learned policy as it ships (its safety layer is the guard every
policy runs under; the SLO watchdog is opt-in, ``watchdog:learned:default``)."""

ADMISSION_LEARNED_ARTIFACT = (
    Path(__file__).resolve().parents[1] / "experiments/results/learned/selector-admission-policy"
)
"""The learned policy for a router whose admission stage is on (:mod:`policies.admission`): the rule selector of
``experiments/selector-admission.yaml``, fitted on rollouts behind the admission stage at TTFT slack 1.0 (its
manifest's ``trained_behind_admission_slack_frac``); chosen by
``experiments/results/families/selector-admission/second-look/PROTOCOL.md``."""

ADMISSION_LEARNED_SPEC = f"learned:{ADMISSION_LEARNED_ARTIFACT}"
"""What ``learned:admission`` stands for."""

_ALIASES = {"learned:default": DEFAULT_LEARNED_SPEC, "learned:admission": ADMISSION_LEARNED_SPEC}


def expand_alias(spec: str) -> str:
    """The spec an alias (``learned:default``, ``learned:admission``) stands for; any other spec unchanged."""
    return _ALIASES.get(spec, spec)


_CORE_KINDS = ("file", "baseline", "learned", "registry")
_CORE_USAGE = "file:PATH, baseline:NAME, learned:PATH, registry:models:/NAME@ALIAS, watchdog[FALLBACK]:PRIMARY"


class PolicySpecError(ValueError):
    """A policy spec could not be parsed or loaded; the message is one line naming the spec."""


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A parsed policy spec: its kind and argument (path, baseline name, model URI or the watchdog's primary).

    Attributes:
        kind: ``file``, ``baseline``, ``learned``, ``registry``, ``watchdog`` or a registered kind.
        argument: what follows the colon (for ``watchdog``: the primary's spec).
        fallback: the watchdog's fallback spec (``None`` for other kinds).
    """

    kind: str
    argument: str
    fallback: str | None = None

    def __str__(self) -> str:
        if self.kind == "watchdog":
            return f"watchdog[{self.fallback}]:{self.argument}"
        return f"{self.kind}:{self.argument}"


RegistryResolver = Callable[[str], Path]
"""Turns ``models:/NAME@ALIAS`` into a local directory (downloading it); raises ``ValueError`` when it cannot."""


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """Everything :func:`load_policy` was given besides the spec (registered kinds receive it as it is).

    Attributes:
        base: the base policy (tenants, SLOs, bounds).
        params: parameters of the baseline the spec itself names (ignored by other kinds and by the parts of a
            watchdog spec).
        base_dir: relative ``file:`` and ``learned:`` paths are taken relative to it (default: the working
            directory).
        fallback_dir: a relative path that does not exist there is looked up here too (``None``: nowhere else).
        resolver: the registry client for ``registry:`` specs.
        baseline_params: parameters for a baseline named anywhere in the spec, by baseline name, when
            ``params`` does not give them (e.g. ``dynamo-throughput``'s profiled throughputs).
        extra: what the caller hands to its registered kinds (the core never reads it).
    """

    base: ResolvedPolicy
    params: Mapping[str, Any] = field(default_factory=dict)
    base_dir: Path | None = None
    fallback_dir: Path | None = None
    resolver: RegistryResolver | None = None
    baseline_params: Callable[[str], Mapping[str, Any]] | None = None
    extra: Any = None

    def path(self, argument: str) -> Path:
        """A ``file:`` or ``learned:`` argument as a path (see ``base_dir`` and ``fallback_dir``)."""
        path = Path(argument)
        if path.is_absolute():
            return path
        here = self.base_dir / path if self.base_dir is not None else path
        if not here.exists() and self.fallback_dir is not None and (self.fallback_dir / path).exists():
            return self.fallback_dir / path
        return here


KindFactory = Callable[[PolicySpec, LoadOptions], Policy]
"""Builds the policy of a registered kind; raises :class:`PolicySpecError` (or ``ValueError``) on bad input."""


@dataclass(frozen=True, slots=True)
class _Kind:
    factory: KindFactory
    usage: str
    empty_argument: bool


_REGISTERED: dict[str, _Kind] = {}


def register_kind(kind: str, factory: KindFactory, usage: str, *, empty_argument: bool = False) -> None:
    """Add a policy kind to the grammar (registering the same kind again replaces it).

    Args:
        kind: the prefix before the colon; not a core kind nor ``watchdog``.
        factory: builds the policy from the parsed spec and the load options.
        usage: how the kind is written, for error messages (e.g. ``expert:H``).
        empty_argument: whether ``KIND:`` alone is a valid spec (``grid:``).
    """
    if kind in (*_CORE_KINDS, "watchdog") or not kind.isidentifier():
        raise ValueError(f"cannot register policy kind {kind!r}")
    _REGISTERED[kind] = _Kind(factory, usage, empty_argument)


def _usage() -> str:
    return ", ".join([_CORE_USAGE, *(k.usage for k in _REGISTERED.values())])


def _parse_watchdog(spec: str) -> PolicySpec:
    rest = spec.removeprefix("watchdog")
    if rest.startswith("[") and "]:" in rest:
        fallback, primary = rest[1:].split("]:", 1)
    elif rest.startswith(":"):
        fallback, primary = WATCHDOG_FALLBACK, rest[1:]
    else:
        raise PolicySpecError(f"policy spec {spec!r}: expected watchdog:PRIMARY or watchdog[FALLBACK]:PRIMARY")
    primary_kind, _, primary_argument = primary.partition(":")
    if primary_kind not in _CORE_KINDS or not primary_argument:
        raise PolicySpecError(
            f"policy spec {spec!r}: the watchdog's primary must be baseline:NAME, file:PATH, learned:PATH "
            "or registry:models:/NAME@ALIAS"
        )
    fallback_kind, _, fallback_argument = fallback.partition(":")
    if fallback_kind not in FALLBACK_KINDS or not fallback_argument:
        raise PolicySpecError(f"policy spec {spec!r}: the watchdog's fallback must be baseline:NAME or file:PATH")
    try:
        parse_policy_spec(primary)
    except PolicySpecError as exc:
        raise PolicySpecError(f"policy spec {spec!r}: {str(exc).split(': ', 1)[1]}") from None
    return PolicySpec("watchdog", primary, fallback)


def parse_policy_spec(spec: str) -> PolicySpec:
    """Split ``KIND:ARGUMENT`` and check the kind and the argument's shape.

    Raises:
        PolicySpecError: one line naming the spec.
    """
    spec = expand_alias(spec)
    if spec.startswith("watchdog"):
        return _parse_watchdog(spec)
    kind, sep, argument = spec.partition(":")
    registered = _REGISTERED.get(kind)
    known = kind in _CORE_KINDS or registered is not None
    if not sep or not known or not (argument or (registered is not None and registered.empty_argument)):
        raise PolicySpecError(f"policy spec {spec!r}: expected one of {_usage()}")
    if kind == "registry":
        body = argument.removeprefix("models:/")
        pinned = "/" in body and body.rsplit("/", 1)[1].isdigit()
        if not argument.startswith("models:/") or not ("@" in body or pinned):
            raise PolicySpecError(
                f"policy spec {spec!r}: a registry spec reads registry:models:/NAME@ALIAS "
                "or registry:models:/NAME/VERSION"
            )
    return PolicySpec(kind, argument)


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


def inner_rule_selector(policy: Policy) -> RuleSelector | None:
    """The rule selector ``policy`` is or wraps, ``None`` when there is none (:func:`policies.base.policy_layers`)."""
    return next((layer for layer in policy_layers(policy) if isinstance(layer, RuleSelector)), None)


def remembering_policy(policy: Policy) -> RemembersState | None:
    """The policy ``policy`` is or wraps that can hand its memory over (:class:`~policies.base.RemembersState`).

    A restarted controller gives it back the memory its predecessor wrote (``controller.control_memory``). The SLO
    watchdog is the outermost that remembers (its record, with its primary's memory inside); a label or the registry
    policy remembers nothing itself, and the rule selector inside it is found through them.
    """
    return remembering_layer(policy)


def hand_over_memory(old: Policy, new: Policy) -> bool:
    """Give ``new`` the memory of ``old`` when both are the same policy that remembers; whether it did.

    The memory passes through JSON, as it does through a restarted controller's memory file
    (``controller.control_memory``), with no time between them (a reload, or a restart in simulated time).

    Raises:
        ValueError: the memory does not read back (one line naming the field).
    """
    before, after = remembering_policy(old), remembering_policy(new)
    if before is None or after is None or old.policy_id != new.policy_id:
        return False
    after.restore_memory(json.loads(json.dumps(before.memory_document())), 0.0)
    return True


def fitted_admission_slack(policy: Policy) -> float | None:
    """The admission stage's TTFT slack the rule selector inside ``policy`` was fitted behind (from its manifest).

    ``None`` for a selector fitted without the stage and for a policy with no selector inside
    (:func:`inner_rule_selector`). A selector fitted behind the stage is meant to run behind it at that slack
    (:mod:`policies.admission`): the evaluation warns otherwise, and the controller compares it with the slack the
    router reports.
    """
    selector = inner_rule_selector(policy)
    return None if selector is None else selector.manifest.trained_behind_admission_slack_frac


def fixed_layout(policy: Policy) -> ObservationLayout | None:
    """The slot layout a policy was trained on (a learned policy, also relabelled or under the watchdog).

    ``None`` for rule policies, which decide on named observations and fit any layout.
    """
    if isinstance(policy, LearnedPolicy):
        return policy.manifest.layout
    if isinstance(policy, _Labelled):
        return fixed_layout(policy.inner)
    if isinstance(policy, SloWatchdog):
        return fixed_layout(policy.primary) or fixed_layout(policy.fallback)
    return None


def layout_problem(
    policy: Policy, tenants: Sequence[str], groups: Sequence[str], grouped_tenants: Sequence[str] | None = None
) -> str | None:
    """Why a learned policy cannot drive these live ``tenants`` and ``groups`` (one line), ``None`` if it can.

    A slot policy must hold them (``max_groups`` / ``max_tenants``) and, when its manifest names the tenants
    and groups it was trained on in slot order, see exactly those: with other or fewer tenants it would drive
    tenants it never saw. A set policy must hold ``grouped_tenants`` (default ``tenants``): the tenants of a listed
    group, the only ones it decides for (:meth:`policies.base.PolicyContext.grouped`). Rule policies fit anything.
    Checked at load time, so a policy that would fail on every tick is refused before the first.
    """
    if isinstance(policy, _Labelled):
        return layout_problem(policy.inner, tenants, groups, grouped_tenants)
    if isinstance(policy, SloWatchdog):
        return layout_problem(policy.primary, tenants, groups, grouped_tenants) or layout_problem(
            policy.fallback, tenants, groups, grouped_tenants
        )
    if isinstance(policy, SetPolicy):
        layout = policy.manifest.layout
        decided = tenants if grouped_tenants is None else grouped_tenants
        if len(groups) > layout.max_groups or len(decided) > layout.max_tenants:
            return (
                f"policy {policy.policy_id}: its layout holds {layout.max_groups} groups / {layout.max_tenants} "
                f"tenants, the policy file has {len(groups)} / {len(decided)}"
            )
        return None
    if not isinstance(policy, LearnedPolicy):
        return None
    manifest = policy.manifest
    if len(groups) > manifest.max_groups or len(tenants) > manifest.max_tenants:
        return (
            f"policy {policy.policy_id}: its layout holds {manifest.max_groups} groups / {manifest.max_tenants} "
            f"tenants, the policy file has {len(groups)} / {len(tenants)}"
        )
    for kind, trained, live in (("tenants", manifest.tenants, tenants), ("groups", manifest.groups, groups)):
        if trained and list(trained) != list(live):
            return (
                f"policy {policy.policy_id}: trained on {kind} {', '.join(trained)} (in slot order), the policy file "
                f"has {', '.join(live) or 'none'}"
            )
    return None


def _baseline(parsed: PolicySpec, spec: str, options: LoadOptions, params: Mapping[str, Any] | None) -> Policy:
    factory = BASELINES.get(parsed.argument)
    if factory is None:
        known = ", ".join(sorted(BASELINES))
        raise PolicySpecError(f"policy spec {spec!r}: unknown baseline {parsed.argument!r} (known: {known})")
    if params is None:
        params = options.baseline_params(parsed.argument) if options.baseline_params is not None else {}
    try:
        return factory(options.base, str(parsed), params)
    except PolicySpecError:
        raise
    except (TypeError, ValueError) as exc:
        raise PolicySpecError(f"policy spec {spec!r}: bad parameters: {exc}") from None


def _load(spec: str, options: LoadOptions, params: Mapping[str, Any] | None) -> Policy:
    spec = expand_alias(spec)
    parsed = parse_policy_spec(spec)
    if parsed.kind == "watchdog":
        assert parsed.fallback is not None
        return SloWatchdog(_load(parsed.argument, options, None), _load(parsed.fallback, options, None))
    if parsed.kind == "file":
        path = options.path(parsed.argument)
        return FilePolicy(resolve_policy(load_policy_file(path), str(path)), str(parsed))
    if parsed.kind == "baseline":
        return _baseline(parsed, spec, options, params)
    if parsed.kind == "learned":
        return load_artifact_dir(options.path(parsed.argument), str(parsed))
    if parsed.kind == "registry":
        if options.resolver is None:
            raise PolicySpecError(f"policy spec {spec!r}: registry policies need an MLflow registry client here")
        try:
            local = options.resolver(parsed.argument)
        except ValueError as exc:
            raise PolicySpecError(f"policy spec {spec!r}: {str(exc).splitlines()[0]}") from None
        return load_artifact_dir(local, str(parsed))
    try:
        return _REGISTERED[parsed.kind].factory(parsed, options)
    except PolicySpecError:
        raise
    except ValueError as exc:
        raise PolicySpecError(f"policy spec {spec!r}: {str(exc).splitlines()[0]}") from None


def build_policy(spec: str, options: LoadOptions) -> Policy:
    """Build the policy named by ``spec`` with everything :class:`LoadOptions` holds.

    Raises:
        PolicySpecError: unknown kind or baseline, a learned or registry artifact that does not load, a
            registry spec without a resolver, or a registered kind's refusal.
        policies.policy_file.PolicyFileError: a ``file:`` policy is invalid.
    """
    return _load(spec, options, options.params or None)


def load_policy(
    spec: str,
    base: ResolvedPolicy,
    params: Mapping[str, Any] | None = None,
    base_dir: Path | None = None,
    resolver: RegistryResolver | None = None,
) -> Policy:
    """Build the policy named by ``spec`` for the tenants, SLOs and bounds of ``base``.

    ``params`` are the baseline's parameters (ignored by other kinds); relative ``file:`` and ``learned:``
    paths are taken relative to ``base_dir``.

    Raises:
        PolicySpecError: unknown kind or baseline, a learned or registry artifact that does not load, a
            registry spec without a resolver, or a registered kind's refusal.
        policies.policy_file.PolicyFileError: a ``file:`` policy is invalid.
    """
    return build_policy(spec, LoadOptions(base, params or {}, base_dir, resolver=resolver))
