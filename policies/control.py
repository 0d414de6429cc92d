"""One control step, shared by the controller and the gym env: decide → guard → overrides → what to change.

:func:`control_step` is the whole decision half of a tick. It builds the :class:`~policies.base.PolicyContext`
and the observation from the window, asks the policy (or takes an action already decided, such as a learned
agent's decoded action), clamps it with the :class:`~policies.guard.SafetyGuard`, lets active overrides win
for the tenants they name, and works out what has to change: the pool targets of the groups whose target
differs from what runs, and the per-tenant threshold table to publish when it differs from the one last
published. It returns all of that as plain data (:class:`ControlEffects`); it performs nothing.

Each adapter carries the effects out its own way — the controller (:mod:`controller.loop`) through its
actuators, audit log and metrics; the gym env (:mod:`env.gym_env`) on the simulator — and then keeps
:meth:`ControlEffects.next_state` for the next step:

* **applied** (the effects were carried out, or there was nothing to carry out): the guard's memory moves on,
  the policy's view of its thresholds becomes what the guard let through, the published table becomes the
  one computed here;
* **not applied** (advisory mode, a failed actuation): only the guard's memory moves on, so cadence (cooldown,
  hysteresis) is the same as in active mode, while the policy keeps seeing the thresholds actually in force;
* a decision that is dropped (the configuration changed meanwhile) keeps the previous state.

**Two views of thresholds.** The policy sees (in its context and observation) the thresholds *it* last
decided; overrides are invisible to it. What is in force — and published — is that table with the active
overrides laid over it. An override that expires therefore hands each tenant back to the policy's latest
thresholds, not to ones from before the override.

Pure: no I/O and no clock (time arrives as ``inputs.now_s`` and ``inputs.now``); the only state that changes
is the policy's own (a stateful policy such as :class:`~policies.watchdog.SloWatchdog` remembers its streak).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from policies.base import Policy, PolicyContext
from policies.documents import policy_document
from policies.features import build_observation
from policies.guard import Clamp, GuardState, SafetyGuard
from policies.overrides import Override, apply_overrides
from policies.policy_file import ResolvedPolicy
from policies.schema import ControlAction, MetricWindow, PoolTargets, RoutingThresholds, Tenant, TenantGroup
from policies.watchdog import SloWatchdog, WatchdogState

__all__ = ["POLICY_ERROR_REASON", "ControlEffects", "ControlInputs", "ControlState", "control_step", "policy_context"]

POLICY_ERROR_REASON = "policy_error"
"""Decision reason of the hold that replaces a policy that raised (with ``hold_on_policy_error``)."""


@dataclass(frozen=True, slots=True)
class ControlState:
    """What one control step hands to the next.

    Attributes:
        policy_thresholds: per tenant, the thresholds the policy last decided and the guard let through (what
            the policy sees as current; overrides are not part of it).
        published: the threshold table last carried out (policy thresholds with overrides laid over them);
            ``None`` = nothing published yet, so the first step publishes the full table.
        guard: the guard's memory (cooldown clocks, hysteresis streaks).
    """

    policy_thresholds: Mapping[str, RoutingThresholds]
    published: Mapping[str, RoutingThresholds] | None = None
    guard: GuardState = field(default_factory=GuardState)

    @classmethod
    def start(cls, base_thresholds: Mapping[str, RoutingThresholds]) -> ControlState:
        """The state before the first step: the base thresholds, nothing published, a fresh guard."""
        return cls(policy_thresholds=dict(base_thresholds))

    def after_restart(self, *, keep_streaks: bool) -> ControlState:
        """What a restarted controller reads back of this state: its thresholds and the guard's memory.

        Nothing counts as published, and the guard's hysteresis streaks are kept only after a quick restart
        (``keep_streaks``; :meth:`~policies.guard.GuardState.after_restart`). A controller that keeps its memory file
        (``controller.control_memory``) starts from this, not from :meth:`start`: the thresholds in force and the
        guard's clocks carry on, and the first step publishes the whole table, which the router actuator does not
        send when the router already runs it (a router restarted meanwhile gets it back). The gym env restarts the
        same way, at once (:meth:`~env.gym_env.PDClusterEnv.restart_control`).
        """
        return replace(self, published=None, guard=self.guard.after_restart(keep_streaks=keep_streaks))


@dataclass(frozen=True, slots=True)
class ControlInputs:
    """What one step is computed from, besides the policy, the guard and the state.

    Attributes:
        window: the metric window of the interval that just ended.
        tenants: tenants in a fixed order.
        groups: tenant groups with their bounds and budgets.
        current_pools: per group, the prefill/decode instances running or on their way (the adapter's reading).
        base_thresholds: the thresholds of the base policy (what rule policies relax back towards).
        now_s: decision time in seconds (monotonic or simulated; the guard's clock).
        interval_s: control interval in seconds.
        now: wall time (timezone-aware) at which override expiry is judged.
        overrides: overrides known now (expired ones are ignored).
        base_policy: the resolved base policy; when given, the effects carry the policy document to publish.
        document_description: ``description`` of that document.
        capacity: per group, the healthy instances when the group's instance set is fixed
            (:attr:`~policies.base.PolicyContext.capacity`); absent groups are bounded by their budget alone.
    """

    window: MetricWindow
    tenants: tuple[Tenant, ...]
    groups: tuple[TenantGroup, ...]
    current_pools: Mapping[str, PoolTargets]
    base_thresholds: Mapping[str, RoutingThresholds]
    now_s: float
    interval_s: float
    now: datetime
    overrides: Sequence[Override] = ()
    base_policy: ResolvedPolicy | None = None
    document_description: str = ""
    capacity: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ControlEffects:
    """What one step decided and what has to change (plain data; nothing has been done).

    Attributes:
        decision: the policy's action as it asked (before the guard).
        guarded: the action after the guard (the policy's thresholds the next state keeps).
        clamps: every adjustment the guard made.
        action: the action to carry out: ``guarded`` with the active overrides laid over its thresholds.
        pool_changes: new pool targets of the groups whose target differs from ``current_pools``.
        thresholds: the full per-tenant threshold table in force once the effects are carried out.
        publish: whether ``thresholds`` differs from what was last published (and so must be published).
        policy_document: the policy-file document of ``thresholds`` when ``publish`` and a base policy was
            given, else ``None``.
        overrides_active: names of the overrides in force (later name wins).
        override_tenants: tenants whose thresholds an override set.
        rollback: whether a rollback override (``mode: aggregated_only`` for everyone) is in force.
        stale: whether the window was older than the guard's ``max_staleness_s``.
        watchdog: the SLO watchdog's state after this decision, when the policy is one.
        policy_error: ``"Type: message"`` when the policy raised and the step held instead.
        policy_exception: that exception (for a traceback in the adapter's log).
        applied_state: the next state when the effects were carried out (or there was nothing to do).
        held_state: the next state when they were computed but not carried out.
    """

    decision: ControlAction
    guarded: ControlAction
    clamps: tuple[Clamp, ...]
    action: ControlAction
    pool_changes: Mapping[str, PoolTargets]
    thresholds: Mapping[str, RoutingThresholds]
    publish: bool
    policy_document: Mapping[str, Any] | None
    overrides_active: tuple[str, ...]
    override_tenants: tuple[str, ...]
    rollback: bool
    stale: bool
    watchdog: WatchdogState | None
    policy_error: str | None
    policy_exception: Exception | None
    applied_state: ControlState
    held_state: ControlState

    @property
    def reason(self) -> str:
        """Why: the policy's reason, with the overrides in force appended."""
        return self.action.reason

    @property
    def override_active(self) -> bool:
        """Whether any override is in force."""
        return bool(self.overrides_active)

    @property
    def in_fallback(self) -> bool:
        """Whether the SLO watchdog's fallback made this decision."""
        return self.watchdog is not None and self.watchdog.in_fallback

    @property
    def empty(self) -> bool:
        """Nothing to carry out (no pool change, no threshold table to publish)."""
        return not self.pool_changes and not self.publish

    def next_state(self, *, applied: bool) -> ControlState:
        """:attr:`applied_state` or :attr:`held_state` (module docstring)."""
        return self.applied_state if applied else self.held_state


def policy_context(inputs: ControlInputs, state: ControlState) -> PolicyContext:
    """The context a policy decides against in this step (the only place it is built)."""
    return PolicyContext(
        tenants=inputs.tenants,
        groups=inputs.groups,
        current_pools=inputs.current_pools,
        current_thresholds=state.policy_thresholds,
        base_thresholds=inputs.base_thresholds,
        now_s=inputs.now_s,
        interval_s=inputs.interval_s,
        capacity=inputs.capacity,
    )


def _decide(
    decide: Policy | ControlAction, inputs: ControlInputs, context: PolicyContext, *, hold_on_policy_error: bool
) -> tuple[ControlAction, Exception | None]:
    if isinstance(decide, ControlAction):
        return decide, None
    observation = build_observation(inputs.window, context.observation_context())
    try:
        return decide.decide(observation, context), None
    except Exception as exc:
        if not hold_on_policy_error:
            raise
        return ControlAction(reason=POLICY_ERROR_REASON, policy_id=decide.policy_id), exc


def control_step(
    decide: Policy | ControlAction,
    inputs: ControlInputs,
    state: ControlState,
    guard: SafetyGuard,
    *,
    hold_on_policy_error: bool = False,
) -> ControlEffects:
    """Decide, guard, apply overrides and work out what has to change (see the module docstring).

    Args:
        decide: the policy to ask, or an action already decided (it still passes the guard and the overrides).
        inputs: the window and the facts of this step.
        state: what the previous step handed on (:meth:`ControlState.start` before the first).
        guard: the safety guard (its limits; its memory is in ``state``).
        hold_on_policy_error: when the policy raises, hold (no change, reason :data:`POLICY_ERROR_REASON`) and
            report the error instead of raising — what a daemon must do; training and evaluation let it raise.

    Returns:
        The effects, with the next state for either outcome.
    """
    context = policy_context(inputs, state)
    decision, error = _decide(decide, inputs, context, hold_on_policy_error=hold_on_policy_error)
    guarded = guard.apply(decision, context, inputs.window, state.guard)
    merged = apply_overrides(guarded.action, inputs.overrides, inputs.now)
    final = merged.action
    # Tenants an override names get the override; every other tenant what the policy decided.
    thresholds = {**state.policy_thresholds, **final.thresholds}
    publish = thresholds != state.published
    document = None
    if publish and inputs.base_policy is not None:
        document = policy_document(
            inputs.base_policy, ControlAction(thresholds=thresholds), inputs.document_description
        )
    pool_changes = {g: t for g, t in final.pools.items() if t != inputs.current_pools.get(g)}
    watchdog = decide.state if isinstance(decide, SloWatchdog) else None
    return ControlEffects(
        decision=decision,
        guarded=guarded.action,
        clamps=guarded.clamps,
        action=final,
        pool_changes=pool_changes,
        thresholds=thresholds,
        publish=publish,
        policy_document=document,
        overrides_active=merged.active,
        override_tenants=merged.tenants,
        rollback=merged.rollback,
        stale=inputs.window.staleness_s > guard.limits.max_staleness_s,
        watchdog=watchdog,
        policy_error=None if error is None else f"{type(error).__name__}: {error}",
        policy_exception=error,
        applied_state=ControlState(
            policy_thresholds={**state.policy_thresholds, **guarded.action.thresholds},
            published=thresholds,
            guard=guarded.state,
        ),
        held_state=ControlState(state.policy_thresholds, state.published, guarded.state),
    )
