"""``pdctl perf``: query, check and measure the calibrated performance model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from env.perf.profile import OperatorProfile

__all__ = ["register"]

EXIT_INVALID = 2


def _fail(command: str, message: object) -> typer.Exit:
    typer.echo(f"pdctl perf {command}: {message}", err=True)
    return typer.Exit(code=EXIT_INVALID)


def _load(command: str, profile: str, profile_dir: Path | None, model_config: Path | None) -> OperatorProfile:
    from env.perf.profile import ProfileError, load_operator_profile

    try:
        return load_operator_profile(profile, profile_dir, model_config=model_config)
    except ProfileError as exc:
        raise _fail(command, exc) from None


def _predict(
    profile: str,
    profile_dir: Path | None,
    model_config: Path | None,
    tp: int,
    prefill_tokens: int,
    prefill_context: int,
    decode_batch: int,
    decode_context: int,
    as_json: bool,
    allreduce: tuple[float | None, float | None] = (None, None),
    prefill_sequences: int = 1,
) -> None:
    from env.perf.model import InterpolatedExecutionTimeModel, StepOverheads

    loaded = _load("predict", profile, profile_dir, model_config)
    latency_us, bandwidth_gbps = allreduce
    overheads = StepOverheads(
        allreduce_latency_s=None if latency_us is None else latency_us * 1e-6,
        allreduce_bandwidth_bytes_per_s=None if bandwidth_gbps is None else bandwidth_gbps * 1e9,
    )
    try:
        model = InterpolatedExecutionTimeModel(loaded, tp, overheads)
    except (KeyError, ValueError) as exc:
        raise _fail("predict", f"{loaded.source}: cannot compose TP {tp} ({exc})") from None
    breakdown = model.breakdown(prefill_tokens, prefill_context, decode_batch, decode_context, prefill_sequences)
    name = profile if model_config is None else loaded.model.name
    payload = {
        "profile": name,
        "profile_dir": loaded.source,
        "gpu": loaded.gpu,
        "tp": tp,
        "measured_tp": model.measured_tp,
        "prefill_tokens": prefill_tokens,
        "prefill_context_tokens": prefill_context,
        "prefill_sequences": prefill_sequences,
        "decode_batch": decode_batch,
        "decode_context_tokens": decode_context,
        "step_time_s": breakdown.step_time_s,
        "breakdown": breakdown.as_dict(),
    }
    if as_json:
        typer.echo(json.dumps(payload, indent=2))
        return
    typer.echo(f"{name} TP{tp} ({loaded.gpu}): step time {breakdown.step_time_s * 1000:.3f} ms")
    for key, value in breakdown.as_dict().items():
        typer.echo(f"  {key:<22} {value * 1000:9.3f} ms")


def _check(
    profile: str, profile_dir: Path | None, model_config: Path | None, tp: int, fit: bool, operator_only: bool
) -> None:
    from env.perf.fidelity import fit_overheads, load_e2e_points, relative_errors, summarize
    from env.perf.model import StepOverheads

    loaded = _load("check", profile, profile_dir, model_config)
    try:
        points = load_e2e_points(loaded.source, loaded.model.name)
    except ValueError as exc:
        raise _fail("check", exc) from None
    if not points:
        raise _fail("check", f"{loaded.source}: no e2e_*.csv rows for model {loaded.model.name}")
    overheads = StepOverheads.operator_only_for(loaded) if operator_only else StepOverheads()
    label = "shipped constants"
    if operator_only:
        derived = loaded.elementwise_bandwidth_frac is not None
        label = "operator-only: priors" + (", element-wise rate from elementwise.csv" if derived else "")
    if fit:
        try:
            overheads = fit_overheads(loaded, points, tp)
        except ValueError as exc:
            raise _fail("check", exc) from None
        label = "constants fitted on these points"
    typer.echo(
        f"{loaded.model.name} TP{tp} from {loaded.source} ({label}): layer_overhead_s "
        f"{overheads.layer_overhead_s * 1e6:.1f} us, elementwise_bandwidth_frac "
        f"{overheads.elementwise_bandwidth_frac:.3f}, prefill_attention_factor {overheads.prefill_attention_factor:.3f}"
    )
    errors = relative_errors(loaded, points, overheads, tp)
    typer.echo(f"{'file':<16} {'step':<32} {'measured ms':>12} {'predicted ms':>13} {'error':>8}")
    for point, predicted_s, error in errors:
        typer.echo(
            f"{point.source:<16} {point.label:<32} {point.measured_s * 1e3:12.2f} {predicted_s * 1e3:13.2f}"
            f" {100 * error:+7.1f}%"
        )
    typer.echo(f"{'file':<16} {'points':>6} {'median |err|':>13} {'worst |err|':>12}")
    for source, (median, worst, count) in summarize(errors).items():
        typer.echo(f"{source:<16} {count:6d} {100 * median:12.1f}% {100 * worst:11.1f}%")


def register(app: typer.Typer, name: str, help_text: str) -> None:
    """Add the ``perf`` command group to ``app``."""
    group = typer.Typer(help=help_text, no_args_is_help=True)
    profile_opt = typer.Option("h200-llama3-8b", "--profile", help="Profile <dir>-<model> (with a config: a model).")
    dir_opt = typer.Option(None, "--profile-dir", help="Operator-timing folder (gemm.csv, attn_*.csv, ...).")
    config_opt = typer.Option(None, "--model-config", help="Hugging Face config.json of the model (needs a folder).")

    @group.command("predict")
    def predict(
        profile: str = profile_opt,
        profile_dir: Path | None = dir_opt,
        model_config: Path | None = config_opt,
        tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree."),
        prefill_tokens: int = typer.Option(0, "--prefill-tokens", min=0, help="New tokens of the prefill chunk."),
        prefill_context: int = typer.Option(0, "--prefill-context", min=0, help="Tokens already cached before it."),
        prefill_sequences: int = typer.Option(1, "--prefill-sequences", min=1, help="Prefill chunks of that size."),
        decode_batch: int = typer.Option(0, "--decode-batch", min=0, help="Decoding sequences co-batched."),
        decode_context: int = typer.Option(0, "--decode-context", min=0, help="Context of each decoding sequence."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
        allreduce_us: float | None = typer.Option(None, "--allreduce-latency-us", min=0, help="TP all-reduce latency."),
        allreduce_gbps: float | None = typer.Option(None, "--allreduce-gbps", min=1e-3, help="TP all-reduce GB/s."),
    ) -> None:
        """Predict one engine step's time (a prefill chunk co-batched with decodes) and its components."""
        args = (prefill_tokens, prefill_context, decode_batch, decode_context)
        allreduce = (allreduce_us, allreduce_gbps)
        _predict(profile, profile_dir, model_config, tp, *args, as_json, allreduce, prefill_sequences)

    @group.command("check")
    def check(
        profile: str = profile_opt,
        profile_dir: Path | None = dir_opt,
        model_config: Path | None = config_opt,
        tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree the e2e files were measured at."),
        fit: bool = typer.Option(False, "--fit", help="Fit the three constants on these points first."),
        operator_only: bool = typer.Option(
            False, "--operator-only", help="No e2e fit: priors (element-wise rate from elementwise.csv)."
        ),
    ) -> None:
        """Compare predicted with measured whole steps (e2e_*.csv in the profile folder): per point and per file."""
        _check(profile, profile_dir, model_config, tp, fit, operator_only)

    @group.command("measure")
    def measure(
        model_config: Path = typer.Option(..., "--model-config", help="Hugging Face config.json to measure."),  # noqa: B008
        tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree whose shards are measured."),
        out: Path = typer.Option(..., "--out", help="Folder to write (created)."),  # noqa: B008
        tiny: bool = typer.Option(False, "--tiny", help="A tiny stand-in model and grid: checks the logic on a CPU."),
        model_name: str | None = typer.Option(None, "--model-name", help="Model column (default: config's folder)."),
        only: list[str] | None = typer.Option(  # noqa: B008
            None, "--only", help="Measure only these tables (repeatable): ceilings, gemm, attention, elementwise."
        ),
    ) -> None:
        """Measure the operator timings of one model on this machine's GPU and write a profile folder."""
        from env.perf.profile import ProfileError, model_spec_from_hf_config

        try:
            spec = model_spec_from_hf_config(model_config, model_name)
        except ProfileError as exc:
            raise _fail("measure", exc) from None
        from env.perf.measure import TABLES, measure_profile

        try:
            written = measure_profile(
                spec, tp, out, tiny=tiny, log=lambda line: typer.echo(line, err=True), tables=only or TABLES
            )
        except (OSError, RuntimeError, ValueError) as exc:
            raise _fail("measure", exc) from None
        typer.echo(str(written))

    app.add_typer(group, name=name)
