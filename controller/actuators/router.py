"""The router actuator: per-tenant thresholds and instance roles through the router admin API.

``PUT /admin/policy`` publishes the policy document; ``PUT /admin/roles`` moves instances between prefill
and decode (the router drains an instance before it takes its new role); ``GET /admin/state`` reads roles
back (see ``docs/admin-api.md``). The router cannot add instances: a pool target is realised as a split of
the group's existing instances, and the instances whose role changes are the fewest possible.

Policy writes are compare-and-set: each names the generation after the one the router last reported, so a
write computed from a state another writer has since changed is refused (``409``, outcome ``rejected``) and
the next tick starts from a fresh reading.

A policy document that puts in force the policy the router last reported (``GET /admin/state``, read every
tick) is not sent again: after an unknown outcome the next publication happens only if the state read back
shows it did not take effect, and a restarted controller does not bump the router's generation for nothing.
Both documents are compared as the router runs them, resolved into typed per-tenant policies
(:class:`policies.policy_file.ResolvedPolicy`: thresholds, SLOs, groups, attribution, expiry): key order,
``300`` or ``300.0``, defaults written out or left to inherit do not count, nor does the free-text
``description``. The document is serialised once, by the HTTP call that sends it.

A router that runs another policy than the one this actuator last put in force there (it restarted and loaded
its own policy file, or someone else wrote to it) has drifted: :attr:`RouterActuator.policy_drift` says so after
the tick's reading, and the control loop then publishes its whole table again (the policy is the controller's to
set; an operator's hand goes through override files or the router's rollback, which a drift leaves alone).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from controller.actuators.base import ActuationResult, Outcome, Plan, UnknownOutcomeLatch
from controller.actuators.http import call
from controller.sources.base import InstanceInfo, Topology
from policies.policy_file import PolicyFileError, ResolvedPolicy, load_policy_data, resolve_policy
from policies.schema import PoolTargets, TenantGroup

_log = logging.getLogger("pdctl.controller")

__all__ = ["AdmissionReading", "RouterActuator", "admission_mismatch", "policy_in_force", "role_changes"]


def role_changes(
    topology: Topology, pools: Mapping[str, PoolTargets], groups: Mapping[str, TenantGroup] | None = None
) -> dict[str, str]:
    """Instance → new role moving each group towards its target, inside the bounds whatever the target says.

    Only healthy instances that are not already changing role move (an unhealthy one serves nothing and
    counts in no pool). The target is realised as a split of the existing healthy instances, and neither pool
    is taken below its target or its minimum (``groups``; decode always keeps one instance), nor above its
    maximum. So a target that asks for more of one pool without
    less of the other (more instances than exist) moves nothing: the router cannot add instances. Fewest
    changes; candidates are taken in reverse id order so that the choice is deterministic.
    """
    changes: dict[str, str] = {}
    for group_name, target in pools.items():
        group = None if groups is None else groups.get(group_name)
        members = [i for i in topology.instances if i.group == group_name and i.healthy]
        count = {role: sum(1 for i in members if (i.pending_role or i.role) == role) for role in _ROLES}
        want = {"prefill": target.num_prefill, "decode": target.num_decode}
        for to_role, from_role in (("prefill", "decode"), ("decode", "prefill")):
            floor = max(want[from_role], _min_of(group, from_role))
            room = _max_of(group, to_role) - count[to_role]
            moves = min(want[to_role] - count[to_role], count[from_role] - floor, room)
            if moves <= 0:
                continue
            settled = [i for i in members if i.pending_role in (None, i.role) and i.role == from_role]
            candidates = sorted(settled, key=lambda i: i.id, reverse=True)[:moves]
            changes.update((i.id, to_role) for i in candidates)
            count[to_role] += len(candidates)
            count[from_role] -= len(candidates)
    return changes


_ROLES = ("prefill", "decode")


def _min_of(group: TenantGroup | None, role: str) -> int:
    if group is None:
        return 1 if role == "decode" else 0
    return group.min_prefill if role == "prefill" else group.min_decode


def _max_of(group: TenantGroup | None, role: str) -> int:
    if group is None:
        return 1 << 30
    bound = group.max_prefill if role == "prefill" else group.max_decode
    return group.max_instances if bound is None else bound


_SOURCE = "admin:policy"


def _generation(body: object, key: str = "generation") -> int | None:
    """The ``generation`` (or another counter, ``key``) of an admin API reply, if it has one."""
    value = body.get(key) if isinstance(body, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def policy_in_force(document: object) -> ResolvedPolicy | None:
    """The typed policy ``document`` puts in force, as the router's loader resolves it; ``None`` if refused.

    Two documents are the same to the router exactly when their results are equal.
    """
    try:
        return resolve_policy(load_policy_data(document, _SOURCE), _SOURCE)
    except PolicyFileError:
        return None


@dataclass(frozen=True, slots=True)
class AdmissionReading:
    """The router's admission stage as ``GET /admin/state`` reports it."""

    ttft_slack_frac: float | None
    """The slack in force; ``None``: the stage is off."""

    @staticmethod
    def of(block: object) -> AdmissionReading | None:
        """Parse the ``admission`` block; ``None`` when absent or malformed (a router that does not report it)."""
        if not isinstance(block, dict) or "ttft_slack_frac" not in block:
            return None
        slack = block["ttft_slack_frac"]
        if slack is None:
            return AdmissionReading(None)
        if isinstance(slack, bool) or not isinstance(slack, int | float) or not math.isfinite(slack) or slack <= 0:
            return None
        return AdmissionReading(float(slack))


def admission_mismatch(fitted_slack_frac: float | None, reading: AdmissionReading | None) -> str | None:
    """Why the router's admission stage does not match the policy (one line), ``None`` when it does or is unknown.

    Only a policy fitted behind the stage (``fitted_slack_frac``, :func:`policies.registry.fitted_admission_slack`)
    asks for it; any policy may run behind a stage it was not fitted behind.
    """
    if fitted_slack_frac is None or reading is None or reading.ttft_slack_frac == fitted_slack_frac:
        return None
    here = "is off" if reading.ttft_slack_frac is None else f"runs at slack {reading.ttft_slack_frac:g}"
    return (
        f"the policy was fitted behind the router's admission stage at slack {fitted_slack_frac:g}, and the "
        f"router's stage {here}; set admission.ttft_slack_frac: {fitted_slack_frac:g} in the router config, or run "
        "a policy fitted without it (learned:default)"
    )


class RouterActuator:
    """Actuates through the router admin API."""

    def __init__(self, url: str, token: str | None, timeout_s: float, groups: Sequence[TenantGroup] = ()) -> None:
        self.url = url.rstrip("/")
        self.groups = {g.name: g for g in groups}
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self.latch = UnknownOutcomeLatch()
        self._live_policy: ResolvedPolicy | None = None
        self._live_generation: int | None = None
        self._live_roles_generation: int | None = None
        self._put_in_force: ResolvedPolicy | None = None
        self._put_generation: int | None = None
        self.policy_drift: str | None = None
        """Set by :meth:`observe` when the router runs another policy than the one this actuator last put in force
        (a one-line description; ``None``: it runs that policy, nothing was put yet, or the state was not read)."""
        self._rollback_seen: object = None
        self.admission: AdmissionReading | None = None
        """The router's admission slack as last read (``None``: not read yet, or the router does not report it)."""

    @property
    def name(self) -> str:
        """``router``."""
        return "router"

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def observe(self, topology: Topology) -> Topology | None:
        """Roles and pending roles from ``GET /admin/state`` for the instances the topology knows."""
        reply = await call(self._http(), "GET", f"{self.url}/admin/state", headers=self._headers)
        self.policy_drift = None
        if reply.outcome is not Outcome.APPLIED or not isinstance(reply.body, dict):
            self._live_policy = None  # not read this tick: publish rather than trust an older reading
            self._live_generation = None
            self._live_roles_generation = None
            return None
        self.latch.clear()
        self._live_policy = policy_in_force(reply.body.get("policy"))
        self._live_generation = _generation(reply.body)
        self._note_drift()
        self._live_roles_generation = _generation(reply.body, "roles_generation")
        self._note_rollback(reply.body.get("rollback"))
        self.admission = AdmissionReading.of(reply.body.get("admission"))
        live = {str(i.get("id")): i for i in reply.body.get("instances", []) if isinstance(i, dict)}
        instances: list[InstanceInfo] = []
        for info in topology.instances:
            state = live.get(info.id)
            if state is None:
                instances.append(info)
                continue
            role = str(state.get("role", info.role))
            pending = state.get("pending_role")
            healthy = state.get("healthy", True) is not False
            instances.append(replace(info, role=role, pending_role=str(pending) if pending else None, healthy=healthy))
        # Groups with listed instances get their counts (and pending changes, zero once settled) and their
        # capacity (healthy instances: the router cannot add any) from the roles; others keep theirs.
        read = Topology.from_instances(instances, tuple(dict.fromkeys(i.group for i in instances)))
        return Topology(
            instances=read.instances,
            pools={**topology.pools, **read.pools},
            pending={**topology.pending, **read.pending},
            capacity={**topology.capacity, **read.capacity},
        )

    async def apply(self, plan: Plan, topology: Topology) -> ActuationResult:
        """Publish the policy document, then the role changes; stop at the first failure."""
        if self.latch.set:
            return self.latch.held(self.name)
        done: list[str] = []
        document = plan.policy_document
        planned = None if document is None else policy_in_force(document)
        if planned is not None and planned == self._live_policy:
            document = None  # already in force
            self._put_in_force, self._put_generation = planned, self._live_generation
        if document is not None:
            if self._live_generation is None:  # compare-and-set needs the generation the router holds
                read = await call(self._http(), "GET", f"{self.url}/admin/state", headers=self._headers)
                self._live_generation = _generation(read.body) if read.outcome is Outcome.APPLIED else None
                if self._live_generation is None:  # a GET changes nothing: refused or not, never an unknown outcome
                    refused = read.outcome is Outcome.REJECTED
                    return self._failed(Outcome.REJECTED if refused else Outcome.FAILED, read.detail)
            reply = await call(
                self._http(),
                "PUT",
                f"{self.url}/admin/policy",
                body={"generation": self._live_generation + 1, "policy": document},
                headers=self._headers,
            )
            if reply.outcome is not Outcome.APPLIED:
                return self._failed(reply.outcome, reply.detail)
            self._live_policy = planned  # in force now, until the next reading says otherwise
            self._live_generation = _generation(reply.body)
            self._put_in_force, self._put_generation = planned, self._live_generation
            done.append("policy")
        changes = role_changes(topology, plan.pools, self.groups)
        if changes:
            # compare-and-set on the roles this plan was decided from: a write after another writer's is refused
            body: dict[str, Any] = {"roles": changes}
            if self._live_roles_generation is not None:
                body["generation"] = self._live_roles_generation + 1
            reply = await call(self._http(), "PUT", f"{self.url}/admin/roles", body=body, headers=self._headers)
            if reply.outcome is not Outcome.APPLIED:
                return self._failed(reply.outcome, reply.detail)
            self._live_roles_generation = _generation(reply.body, "roles_generation")
            done.append("roles " + ",".join(f"{k}->{v}" for k, v in sorted(changes.items())))
        if not done:
            return ActuationResult(self.name, Outcome.UNCHANGED, "nothing to change")
        return ActuationResult(self.name, Outcome.APPLIED, "; ".join(done))

    def _note_drift(self) -> None:
        """Compare the policy just read with the one last put in force (unreadable or never put: no drift)."""
        if self._put_in_force is None or self._live_policy is None or self._live_policy == self._put_in_force:
            return
        restarted = (
            self._live_generation is not None
            and self._put_generation is not None
            and self._live_generation < self._put_generation
        )
        self.policy_drift = (
            f"router {self.url} runs another policy (generation {self._live_generation}) than the one published at "
            f"generation {self._put_generation}" + (" (it restarted)" if restarted else " (another writer)")
        )

    def _note_rollback(self, rollback: object) -> None:
        """Log once per change an operator's rollback on the router (``/admin/rollback``): it wins over our writes."""
        if rollback == self._rollback_seen:
            return
        self._rollback_seen = rollback
        if rollback:
            _log.warning(
                "router %s: operator rollback to aggregated serving in force (%s); routing writes do not lift it",
                self.url,
                rollback,
            )
        else:
            _log.info("router %s: no operator rollback in force", self.url)

    def _failed(self, outcome: Outcome, detail: str) -> ActuationResult:
        self._live_policy = None  # whatever we knew may be stale now (a 409: another writer was first)
        self._live_generation = None
        self._live_roles_generation = None
        if outcome is Outcome.UNKNOWN:
            self.latch.trip(detail)
        return ActuationResult(self.name, outcome, detail)

    async def ready(self) -> bool:
        """Whether ``GET /admin/state`` answers."""
        reply = await call(self._http(), "GET", f"{self.url}/admin/state", headers=self._headers)
        return reply.outcome is Outcome.APPLIED

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
