"""Route levels: one name for one whole-tenant routing configuration, shared by the grid search and the planner.

A route level is what a static configuration sets for every request of a tenant:

* ``aggregated`` — no disaggregation: every request is prefilled locally on its decode instance
  (``disaggregation_enabled`` false, the ``aggregated_only`` rule);
* ``always_remote`` — every prompt is prefilled remotely (peer baseline B1, the ``always_remote`` rule);
* ``remote>=T`` — this project's rule (:mod:`policies.routing`) with a *crisp* threshold: a request goes remote
  iff its effective input (after prefix-cache hits) is at least ``T`` tokens (``min_remote_input_tokens = T``,
  ``max_local_input_tokens = T - 1``, so there is no gap), whatever its expected output
  (``min_expected_output_tokens = 0``) and the decode pool's pressure (``require_decode_pool_pressure`` off);
  the seed's prefill-queue overload fallback stays on.

``local`` and ``remote`` are accepted as older spellings of ``aggregated`` and ``always_remote``.

Why the crisp meaning: the level's name says "remote iff the prompt is at least T tokens", the capacity planner
documents and tests exactly that (``docs/planning.md``), and the policy file it emits is what the controller
then runs. The grid search's earlier reading (local up to ``T/2``, a gap decided by decode pressure, and short
outputs kept local) was a different rule under the same name.
"""

from __future__ import annotations

from dataclasses import replace

from policies.schema import RouteRule, RoutingThresholds

__all__ = [
    "AGGREGATED",
    "ALWAYS_REMOTE",
    "RouteLevelError",
    "level_min_remote_tokens",
    "remote_level",
    "route_thresholds",
]

AGGREGATED = "aggregated"
ALWAYS_REMOTE = "always_remote"
_PREFIX = "remote>="
_ALIASES = {"local": AGGREGATED, "remote": ALWAYS_REMOTE}


class RouteLevelError(ValueError):
    """A route level that is not ``aggregated``, ``always_remote`` or ``remote>=T`` (T ≥ 1 tokens)."""


def remote_level(tokens: int) -> str:
    """The level name ``remote>=T`` for ``tokens`` = T."""
    if tokens < 1:
        raise RouteLevelError(f"route level remote>={tokens}: T must be >= 1 token")
    return f"{_PREFIX}{tokens}"


def _canonical(level: str) -> str:
    return _ALIASES.get(level, level)


def level_min_remote_tokens(level: str) -> int | None:
    """T of ``remote>=T``, 0 for ``always_remote``, ``None`` for ``aggregated``.

    Raises:
        RouteLevelError: ``level`` is not a route level.
    """
    name = _canonical(level)
    if name == AGGREGATED:
        return None
    if name == ALWAYS_REMOTE:
        return 0
    body = name.removeprefix(_PREFIX)
    if name == body or not body.isdigit() or int(body) < 1:
        raise RouteLevelError(
            f"unknown route level {level!r} (expected {AGGREGATED}, {ALWAYS_REMOTE} or remote>=T with T >= 1)"
        )
    return int(body)


def route_thresholds(level: str, base: RoutingThresholds | None = None) -> RoutingThresholds:
    """The routing thresholds of a route level (module docstring), laid over ``base`` (default: the seed's).

    Raises:
        RouteLevelError: ``level`` is not a route level.
    """
    base = base or RoutingThresholds()
    tokens = level_min_remote_tokens(level)
    if tokens is None:
        return replace(base, disaggregation_enabled=False, rule=RouteRule.AGGREGATED_ONLY, buckets=())
    if tokens == 0:
        return replace(base, rule=RouteRule.ALWAYS_REMOTE, buckets=())
    return replace(
        base,
        rule=RouteRule.PDCTL,
        buckets=(),
        min_remote_input_tokens=tokens,
        max_local_input_tokens=tokens - 1,
        min_expected_output_tokens=0,
        require_decode_pool_pressure=False,
    )
