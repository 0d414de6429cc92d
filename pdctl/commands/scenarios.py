"""``pdctl scenarios generate``: draw scenario files from a scenario family, one per seed.

``--family FILE`` names the family (``experiments/families/default.yaml``; format: ``docs/scenario-families.md``);
``--seeds A..B`` (or ``A``, or a comma list of either) picks seeds, ``--split train|validation|test`` the family's
own seed range of that split (``--limit N`` keeps its first N). Each seed writes ``OUT/<family>-<seed>.yaml``, the
same bytes for the same family and seed. Bad input prints one line naming the file, field or option and exits 2.
"""

from __future__ import annotations

from pathlib import Path

import typer

from pdctl.commands.lists import parse_seeds

__all__ = ["register"]

EXIT_INVALID = 2


def _fail(message: str) -> typer.Exit:
    typer.echo(f"pdctl scenarios generate: {message}", err=True)
    return typer.Exit(code=EXIT_INVALID)


def _generate(family_path: Path, seeds: str | None, split: str | None, limit: int | None, out: Path) -> None:
    from env.families import FamilyError, load_family, scenario_name, scenario_yaml

    if (seeds is None) == (split is None):
        raise _fail("give exactly one of --seeds A..B and --split NAME")
    try:
        family = load_family(family_path)
    except FamilyError as exc:
        raise _fail(str(exc)) from None
    try:
        seed_list = parse_seeds(seeds) if seeds is not None else list(family.split_seeds(str(split)))
    except ValueError as exc:
        raise _fail(f"--split: {exc}" if split is not None else str(exc)) from None
    if limit is not None:
        if limit < 1:
            raise _fail("--limit must be at least 1")
        seed_list = seed_list[:limit]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _fail(f"--out {out}: {exc.strerror or exc}") from None
    for seed in seed_list:
        (out / f"{scenario_name(family, seed)}.yaml").write_text(scenario_yaml(family, seed), encoding="utf-8")
    typer.echo(f"wrote {len(seed_list)} scenario(s) of family {family.name} to {out}")


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Add the ``scenarios`` command group to ``app``."""
    group = typer.Typer(help=help_text, no_args_is_help=True)

    @group.command("generate")
    def generate(
        family: Path = typer.Option(..., "--family", help="Scenario family YAML."),  # noqa: B008
        out: Path = typer.Option(..., "--out", help="Output folder (created)."),  # noqa: B008
        seeds: str | None = typer.Option(None, "--seeds", help="Seeds: A..B, A, or a comma list of those."),
        split: str | None = typer.Option(None, "--split", help="A split of the family: train, validation, test."),
        limit: int | None = typer.Option(None, "--limit", help="Keep only the first N seeds."),
    ) -> None:
        """Write one scenario file per seed (same family and seed: same bytes)."""
        _generate(family, seeds, split, limit, out)

    app.add_typer(group, name=name)
