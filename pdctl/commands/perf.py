"""``pdctl perf``: query the calibrated performance model."""

from __future__ import annotations

import json

import typer

__all__ = ["register"]

EXIT_INVALID = 2


def _predict(
    profile: str,
    tp: int,
    prefill_tokens: int,
    prefill_context: int,
    decode_batch: int,
    decode_context: int,
    as_json: bool,
) -> None:
    from env.perf.model import InterpolatedExecutionTimeModel
    from env.perf.profile import ProfileError, load_operator_profile

    try:
        loaded = load_operator_profile(profile)
        model = InterpolatedExecutionTimeModel(loaded, tp)
    except (ProfileError, ValueError) as exc:
        typer.echo(f"pdctl perf predict: {exc}", err=True)
        raise typer.Exit(code=EXIT_INVALID) from None
    breakdown = model.breakdown(prefill_tokens, prefill_context, decode_batch, decode_context)
    payload = {
        "profile": profile,
        "gpu": loaded.gpu,
        "tp": tp,
        "measured_tp": model.measured_tp,
        "prefill_tokens": prefill_tokens,
        "prefill_context_tokens": prefill_context,
        "decode_batch": decode_batch,
        "decode_context_tokens": decode_context,
        "step_time_s": breakdown.step_time_s,
        "breakdown": breakdown.as_dict(),
    }
    if as_json:
        typer.echo(json.dumps(payload, indent=2))
        return
    typer.echo(f"{profile} TP{tp} ({loaded.gpu}): step time {breakdown.step_time_s * 1000:.3f} ms")
    for key, value in breakdown.as_dict().items():
        typer.echo(f"  {key:<22} {value * 1000:9.3f} ms")


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Add the ``perf`` command group to ``app``."""
    group = typer.Typer(help=help_text, no_args_is_help=True)

    @group.command("predict")
    def predict(
        profile: str = typer.Option("h200-llama3-8b", "--profile", help="Profile <dir>-<model>."),
        tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree."),
        prefill_tokens: int = typer.Option(0, "--prefill-tokens", min=0, help="New tokens of the prefill chunk."),
        prefill_context: int = typer.Option(0, "--prefill-context", min=0, help="Tokens already cached before it."),
        decode_batch: int = typer.Option(0, "--decode-batch", min=0, help="Decoding sequences co-batched."),
        decode_context: int = typer.Option(0, "--decode-context", min=0, help="Context of each decoding sequence."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Predict one engine step's time (a prefill chunk co-batched with decodes) and its components."""
        _predict(profile, tp, prefill_tokens, prefill_context, decode_batch, decode_context, as_json)

    app.add_typer(group, name=name)
