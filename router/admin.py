"""The admin API (``docs/admin-api.md``): live policy swaps and role changes, guarded by a bearer token.

``PUT /admin/policy`` validates the document with the policy-file loader (:func:`policies.policy_file.load_policy_data`)
and resolver; ``PUT /admin/roles`` validates every instance id and role before changing anything. A malformed
body is answered ``400 {"error": {"message", "field"}}`` with the dotted path of the field, and nothing changes.
A missing or wrong token is ``401``, logged (method, path, reason, peer; never the token). A policy write is
compare-and-set on ``generation``: one that names a generation not newer than the one the router holds is ``409``
(``current_generation`` in the error), so of two writers that read the same state only the first wins; a write
without a generation gets the next one. Role writes are compare-and-set the same way on their own counter,
``roles_generation`` (in ``GET /admin/state``), so a writer that decided moves on a stale reading of the roles is
refused rather than moving instances twice.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from policies.policy_file import PolicyFile, PolicyFileError, ResolvedPolicy, load_policy_data, resolve_policy
from router.limits import BodyError, parse_json
from router.registry import InstanceRegistry, Role
from router.rollback import Rollback

__all__ = ["AdminApi", "PolicyState", "document_of", "policy_state_from"]

_log = logging.getLogger("pdctl.router")


def document_of(policy: PolicyFile) -> dict[str, Any]:
    """A policy file as the JSON document the admin API exchanges."""
    doc: dict[str, Any] = policy.model_dump(mode="json", exclude_unset=True)
    return doc


@dataclass(frozen=True, slots=True)
class PolicyState:
    """The routing policy in force: swapped as a whole (one attribute assignment)."""

    generation: int
    document: dict[str, Any]
    resolved: ResolvedPolicy


def policy_state_from(policy: PolicyFile, generation: int, source: str) -> PolicyState:
    """Resolve a validated policy file into a :class:`PolicyState`."""
    return PolicyState(generation, document_of(policy), resolve_policy(policy, source))


class _BadRequest(Exception):
    def __init__(self, field: str, message: str, status: int = 400, **extra: Any) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.status = status
        self.extra = extra


def _bad(exc: _BadRequest) -> web.Response:
    return web.json_response({"error": {"message": exc.message, "field": exc.field, **exc.extra}}, status=exc.status)


def _newer_generation(value: object, held: int, state_key: str) -> int:
    """The generation a write takes: ``value`` when newer than ``held`` (compare-and-set), ``held + 1`` without one.

    Raises:
        _BadRequest: not a non-negative integer (400), or not newer than ``held`` (409, ``current_generation``).
    """
    if value is None:
        return held + 1
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BadRequest("generation", f"generation must be an integer, got {value!r}")
    if value < 0:
        raise _BadRequest("generation", "generation must be >= 0")
    if value <= held:  # compare-and-set: only a newer write wins
        raise _BadRequest(
            "generation",
            f"stale generation {value}: the router holds {state_key} {held} (another writer was first); "
            f"read GET /admin/state and write again with a newer generation",
            status=409,
            current_generation=held,
        )
    return value


class AdminApi:
    """Handlers of the admin endpoints."""

    def __init__(
        self,
        token: str | None,
        get_policy: Callable[[], PolicyState],
        set_policy: Callable[[PolicyState], None],
        registry: InstanceRegistry,
        transfer_healthy: Callable[[], bool],
        on_roles_changed: Callable[[], None],
        max_json_depth: int = 64,
        rollback: Rollback | None = None,
        admission_ttft_slack_frac: float | None = None,
    ) -> None:
        self._token = token
        self._admission_ttft_slack_frac = admission_ttft_slack_frac
        self._get_policy = get_policy
        self._set_policy = set_policy
        self._registry = registry
        self._transfer_healthy = transfer_healthy
        self._on_roles_changed = on_roles_changed
        self._max_json_depth = max_json_depth
        self._roles_generation = 0
        self._rollback = rollback if rollback is not None else Rollback()

    def add_routes(self, app: web.Application) -> None:
        """Register the admin routes on ``app``."""
        app.router.add_put("/admin/policy", self.put_policy)
        app.router.add_put("/admin/roles", self.put_roles)
        app.router.add_get("/admin/state", self.get_state)
        app.router.add_put("/admin/rollback", self.put_rollback)
        app.router.add_delete("/admin/rollback", self.delete_rollback)

    def _authorized(self, request: web.Request) -> bool:
        if not self._token:
            return False
        header = request.headers.get("Authorization", "")
        scheme, _, credential = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(credential.strip().encode(), self._token.encode())

    def _unauthorized(self, request: web.Request) -> web.Response:
        """401, and one log line saying which call was refused, why and from where (never the token)."""
        if not self._token:
            reason = "no admin token is configured"
        elif "Authorization" not in request.headers:
            reason = "no Authorization header"
        else:
            reason = "wrong or malformed bearer token"
        _log.warning("admin %s %s refused (401): %s; from %s", request.method, request.path, reason, request.remote)
        return web.json_response(
            {"error": {"message": "missing or wrong admin bearer token", "field": "Authorization"}},
            status=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    async def _json_object(self, request: web.Request) -> dict[str, Any]:
        try:
            body = parse_json(await request.read(), self._max_json_depth)
        except BodyError as exc:
            raise _BadRequest("<body>", exc.message) from None
        if not isinstance(body, dict):
            raise _BadRequest("<body>", "body must be a JSON object")
        return body

    def state(self) -> dict[str, Any]:
        """The body of ``GET /admin/state``."""
        policy = self._get_policy()
        return {
            "generation": policy.generation,
            "policy": policy.document,
            "roles_generation": self._roles_generation,
            "instances": self._registry.state(),
            "kv_transfer_healthy": self._transfer_healthy(),
            "rollback": self._rollback.state(),
            # the controller checks that a policy fitted behind the admission stage runs behind it (null: off)
            "admission": {"ttft_slack_frac": self._admission_ttft_slack_frac},
        }

    async def get_state(self, request: web.Request) -> web.Response:
        """``GET /admin/state``."""
        if not self._authorized(request):
            return self._unauthorized(request)
        return web.json_response(self.state())

    async def put_policy(self, request: web.Request) -> web.Response:
        """``PUT /admin/policy``: validate, then swap atomically."""
        if not self._authorized(request):
            return self._unauthorized(request)
        try:
            new_state = self._parse_policy(await self._json_object(request))
        except _BadRequest as exc:
            return _bad(exc)
        self._set_policy(new_state)
        return web.json_response({"generation": new_state.generation, "tenants": sorted(new_state.resolved.tenants)})

    def _parse_policy(self, body: dict[str, Any]) -> PolicyState:
        for key in body:
            if key not in ("generation", "policy"):
                raise _BadRequest(key, "unknown key (expected 'generation' and 'policy')")
        next_generation = _newer_generation(body.get("generation"), self._get_policy().generation, "generation")
        if "policy" not in body:
            raise _BadRequest("policy", "policy is required")
        document = body["policy"]
        if not isinstance(document, dict):
            raise _BadRequest("policy", "policy must be a JSON object (a policy-file document)")
        try:
            parsed = load_policy_data(document, "admin:policy")
            return policy_state_from(parsed, next_generation, "admin:policy")
        except PolicyFileError as exc:
            first = exc.problems[0]
            field = f"policy.{first.field_path}" if first.field_path else "policy"
            raise _BadRequest(
                field, "; ".join(f"{p.field_path or '<top>'}: {p.message}" for p in exc.problems)
            ) from None

    async def put_rollback(self, request: web.Request) -> web.Response:
        """``PUT /admin/rollback``: serve the named tenants (all without ``tenants``) aggregated until lifted."""
        if not self._authorized(request):
            return self._unauthorized(request)
        try:
            body = await self._json_object(request)
            for key in body:
                if key != "tenants":
                    raise _BadRequest(key, "unknown key (expected 'tenants')")
            names = body.get("tenants")
            if names is not None and (
                not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names)
            ):
                raise _BadRequest("tenants", "tenants must be a non-empty list of tenant names (omit it for all)")
        except _BadRequest as exc:
            return _bad(exc)
        self._rollback.set(None if names is None else frozenset(names), time.time())
        _log.warning("rollback to aggregated serving set by the admin API: %s", self._rollback.state())
        return web.json_response(self.state())

    async def delete_rollback(self, request: web.Request) -> web.Response:
        """``DELETE /admin/rollback``: lift the rollback for every tenant."""
        if not self._authorized(request):
            return self._unauthorized(request)
        if self._rollback.active:
            _log.warning("rollback to aggregated serving lifted by the admin API (was %s)", self._rollback.state())
        self._rollback.lift()
        return web.json_response(self.state())

    async def put_roles(self, request: web.Request) -> web.Response:
        """``PUT /admin/roles``: validate every entry, then change roles (busy instances drain first)."""
        if not self._authorized(request):
            return self._unauthorized(request)
        try:
            body = await self._json_object(request)
            for key in body:
                if key not in ("generation", "roles"):
                    raise _BadRequest(key, "unknown key (expected 'generation' and 'roles')")
            generation = _newer_generation(body.get("generation"), self._roles_generation, "roles_generation")
            roles = body.get("roles")
            if not isinstance(roles, dict):
                raise _BadRequest("roles", "roles must be an object {instance id: 'prefill' | 'decode'}")
            problem = self._registry.validate_roles(roles)
            if problem is not None:
                raise _BadRequest(*problem)
        except _BadRequest as exc:
            return _bad(exc)
        checked: dict[str, Role] = {k: ("prefill" if v == "prefill" else "decode") for k, v in roles.items()}
        self._registry.change_roles(checked)
        self._roles_generation = generation
        self._on_roles_changed()
        return web.json_response(self.state())
