"""``pdctl plan --policy SPEC``: the policy-in-the-loop part of the plan (:mod:`agents.planning.policy_loop`).

:func:`policy_maker` checks the spec once (bad spec: one line naming ``--policy``, exit 2) and returns a function
that builds a fresh policy for each episode; :func:`print_policy` prints the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["policy_maker", "print_policy"]


def policy_maker(spec: str, scenario: Any, fail: Callable[[str], typer.Exit]) -> Callable[[Any], Any]:
    """A builder of fresh ``spec`` policies for deployed scenarios; ``fail`` turns a bad spec into the exit."""
    from agents.policy_specs import make_policy
    from policies.policy_file import PolicyFileError
    from policies.registry import PolicySpecError

    resolver = None
    if "registry:" in spec:
        from controller.policy_registry import mlflow_resolver

        resolver = mlflow_resolver()

    def make(deployed: Any) -> Any:
        return make_policy(spec, deployed, resolver=resolver)

    try:
        make(scenario)
    except PolicyFileError as exc:
        raise fail(f"--policy: {exc.problems[0] if exc.problems else exc}") from None
    except (PolicySpecError, ValueError, OSError) as exc:
        raise fail(f"--policy: {str(exc).splitlines()[0] if str(exc) else spec}") from None
    return make


def print_policy(found: Any, static_rate_scale: float, static_rate_rps: float, console: Console) -> None:
    """The GPUs the policy needs vs the best static split, and its sustainable rate at the budget."""
    table = Table(title=f"Policy in the loop: {found.spec} (whole source, >= {found.target_frac:.0%} SLO attainment)")
    for column in ("", "GPUs needed at 1x", "configuration", f"max rate at {found.budget_gpus} GPUs"):
        table.add_column(column, justify="left" if column in ("", "configuration") else "right")

    def gpus(value: int | None) -> str:
        return "none within the ladder" if value is None else str(value)

    def rate(scale: float, rps: float) -> str:
        return "-" if scale <= 0 else f"x{scale:.3g} ({rps:.2f} req/s)"

    table.add_row(
        "policy",
        gpus(found.policy_gpus),
        "controller (from a half split)",
        rate(found.policy_rate_scale, found.policy_rate_rps),
    )
    table.add_row(
        "best static", gpus(found.static_gpus), found.static_config or "-", rate(static_rate_scale, static_rate_rps)
    )
    console.print(table)
    saved = found.gpus_saved
    if saved is not None:
        verb = "saves" if saved >= 0 else "costs"
        console.print(f"[bold]the controller {verb} {abs(saved)} GPU(s)[/bold] at the workload's rate")
    console.print(f"policy episodes: {len(found.episodes)} in {found.wall_s:.1f} s")
