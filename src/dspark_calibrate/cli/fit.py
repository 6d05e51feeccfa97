"""``dspark-calibrate fit`` (and ``fit --evaluate``) and ``dspark-calibrate traces synth``.

Thin: parse options, call one library function (``run_fit``, ``run_evaluate`` or
``write_synth_traces``), render a rich table or ``--json``, exit 0 ok, 1 rejected (drift check
failed), 2 usage or I/O error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

import dspark_calibrate
from dspark_calibrate.cli._common import (
    EXIT_OK,
    EXIT_REJECTED,
    JsonFlag,
    StageDisplay,
    check_output_dir,
    check_output_file,
    command,
    err_console,
    exit_with,
    fail,
    fail_error,
    fail_usage,
    make_app,
    out_console,
    print_json,
    print_table,
    stage_line,
    utcnow,
)
from dspark_calibrate.decision import Status
from dspark_calibrate.errors import ConfigError, DsparkError

__all__ = ["register"]

TracesOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--traces",
        help="Trace file or directory (Parquet, JSONL, recorder .pt); repeat for several.",
        show_default=False,
        metavar="PATH",
    ),
]
SamplingOption = Annotated[
    str | None, typer.Option("--sampling", help="Use only rounds with this sampling tag (e.g. greedy).")
]


def _fmt(value: float | None, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _fmt_ci(est: Any, digits: int = 4) -> str:
    if est.value is None:
        return "—"
    if est.low is None or est.high is None:
        return _fmt(est.value, digits)
    return f"{est.value:.{digits}f} [{est.low:.{digits}f}, {est.high:.{digits}f}]"


def _command_line(ctx: typer.Context) -> tuple[str, ...]:
    """The invocation as recorded in provenance: command path and the options' values."""
    parts = [ctx.command_path]
    for name, value in sorted(ctx.params.items()):
        if value is None or value is False or value == []:
            continue
        if isinstance(value, list | tuple):
            value = ",".join(str(v) for v in value)
        parts.append(f"--{name.replace('_', '-')}={value}")
    return tuple(parts)


def _print_notices(notices: Any) -> None:
    for n in notices:
        err_console.print(f"[yellow]warning[/] {n.code}: {n.message}")


def _render_fit(result: Any, outputs: Any, read_seconds: float) -> None:
    table = Table(
        title=f"calibration ({result.calibration.method}) on {result.holdout_rounds} held-out rounds"
    )
    for col in ("pos", "method", "T", "risk set", "held-out", "NLL raw→cal", "ECE raw→cal", "Brier raw→cal"):
        table.add_column(col, justify="right" if col not in ("method",) else "left")
    for pm, b, a in zip(
        result.calibration.positions, result.before.positions, result.after.positions, strict=True
    ):
        table.add_row(
            str(pm.position),
            pm.method.value + (" *" if pm.note else ""),
            _fmt(pm.temperature, 3),
            str(pm.risk_set_size),
            str(a.risk_set_size),
            f"{_fmt(b.nll)} → {_fmt(a.nll)}",
            f"{_fmt(b.ece.value)} → {_fmt(a.ece.value)}",
            f"{_fmt(b.brier)} → {_fmt(a.brier)}",
        )
    print_table(table)
    out_console.print(
        f"NLL(accepted length) {_fmt_ci(result.before.nll)} → {_fmt_ci(result.after.nll)} nats/round; "
        f"E[A] error {_fmt_ci(result.before.ea_error)} → {_fmt_ci(result.after.ea_error)} "
        f"(measured {_fmt(result.after.ea_measured, 3)})"
    )
    if result.grid is not None:
        eces = [p.ece.value for p in result.grid.metrics.positions if p.ece.value is not None]
        mean_ece = sum(eces) / len(eces) if eces else None
        grid_t = ", ".join(f"{t:.3g}" for t in result.grid.calibration.sts_temperatures())
        out_console.print(
            f"grid baseline: T = {grid_t}; "
            f"NLL {_fmt_ci(result.grid.metrics.nll)}, mean ECE {_fmt(mean_ece)} ({result.grid.seconds:.2f} s)"
        )
    if result.cv_nll:
        scores = ", ".join(f"{m} {v:.5f}" for m, v in result.cv_nll.items())
        out_console.print(f"cross-validated NLL: {scores}")
    for pm in result.calibration.positions:
        if pm.note:
            out_console.print(f"* position {pm.position}: {pm.note}")
    out_console.print(f"wrote {outputs.calibration} (unsigned; logical sha256 {outputs.logical_sha256})")
    if outputs.sts is not None:
        out_console.print(f"wrote {outputs.sts} ({outputs.sts_reason})")
    else:
        out_console.print(f"no sts.json: {outputs.sts_reason}")
    for p in (outputs.report, *outputs.plots):
        out_console.print(f"wrote {p}")
    out_console.print(f"read {read_seconds:.2f} s, fit {result.seconds:.2f} s")


def _render_drift(report: Any) -> None:
    table = Table(title=f"drift check of {report.calibration_path} on {report.metrics.rounds} rounds")
    for col in ("check", "value [95% CI]", "threshold", "status"):
        table.add_column(col)
    for c in report.checks:
        table.add_row(c.name, _fmt_ci(c.value), _fmt(c.threshold), c.decision.status.value)
    print_table(table)
    out_console.print(f"{report.decision.status.value}: {report.decision.detail}")


OutOption = Annotated[
    Path | None,
    typer.Option(
        "--out", help="Output directory (required unless --evaluate).", metavar="DIR", show_default=False
    ),
]
MethodOption = Annotated[str, typer.Option("--method", help="auto | sts | platt | beta | isotonic.")]
HoldoutOption = Annotated[float, typer.Option("--holdout", help="Fraction of requests held out for metrics.")]
SeedOption = Annotated[int, typer.Option("--seed", help="Seed of the request split and the bootstrap.")]
FoldsOption = Annotated[int, typer.Option("--folds", help="Request-grouped CV folds for --method auto.")]
BootstrapOption = Annotated[int, typer.Option("--bootstrap", help="Request-level bootstrap replicates.")]
KOption = Annotated[
    int | None, typer.Option("--k", help="Expected draft length K (default: from the traces).")
]
SharedSlopeFlag = Annotated[bool, typer.Option("--shared-slope", help="Platt: one slope for all positions.")]
StsApproxFlag = Annotated[
    bool,
    typer.Option("--sts-approx", help="Write sts.json with the best STS approximation of a non-STS fit."),
]
GridBaselineFlag = Annotated[
    bool, typer.Option("--grid-baseline", help="Also score the 41-point grid STS baseline.")
]
ForceFlag = Annotated[bool, typer.Option("--force", help="Fit even below the minimum number of rounds.")]
FingerprintOption = Annotated[
    Path | None,
    typer.Option("--fingerprint", help="Fingerprint JSON of the deployment the traces came from."),
]
NoPlotsFlag = Annotated[bool, typer.Option("--no-plots", help="Skip the PNG plots.")]
EvaluateOption = Annotated[
    Path | None,
    typer.Option(
        "--evaluate", help="Re-score this calibration.parquet or sts.json on --traces (drift check)."
    ),
]
EceToleranceOption = Annotated[
    float, typer.Option("--ece-tolerance", help="Drift: allowed ECE increase per position.")
]
NllToleranceOption = Annotated[
    float, typer.Option("--nll-tolerance", help="Drift: allowed NLL regret vs a refit (nats/round).")
]
StrictFlag = Annotated[bool, typer.Option("--strict", help="Drift: treat UNDECIDED as rejected.")]


def fit(
    ctx: typer.Context,
    traces: TracesOption = None,
    out: OutOption = None,
    method: MethodOption = "auto",
    holdout: HoldoutOption = 0.2,
    seed: SeedOption = 0,
    folds: FoldsOption = 5,
    bootstrap: BootstrapOption = 200,
    k: KOption = None,
    sampling: SamplingOption = None,
    shared_slope: SharedSlopeFlag = False,
    sts_approx: StsApproxFlag = False,
    grid_baseline: GridBaselineFlag = False,
    force: ForceFlag = False,
    fingerprint: FingerprintOption = None,
    no_plots: NoPlotsFlag = False,
    evaluate: EvaluateOption = None,
    ece_tolerance: EceToleranceOption = 0.02,
    nll_tolerance: NllToleranceOption = 0.02,
    strict: StrictFlag = False,
    json_out: JsonFlag = False,
) -> None:
    """Calibrate the confidence head into prefix-survival probabilities (or check drift with --evaluate)."""
    from dspark_calibrate.calibrate.confidence.fit import FitOptions

    if not traces:
        fail_usage("--traces is required; pass trace files or directories (Parquet, JSONL, recorder .pt)")
    if evaluate is not None:
        _evaluate(
            evaluate,
            traces,
            tolerances=(ece_tolerance, nll_tolerance),
            sampling=sampling,
            force=force,
            bootstrap=bootstrap,
            seed=seed,
            strict=strict,
            json_out=json_out,
        )
    if out is None:
        fail_usage(
            "--out is required with --traces; pass --out DIR for calibration.parquet, sts.json, the report and plots"
        )
    try:
        check_output_dir(out)
        options = FitOptions(
            method=method,
            holdout=holdout,
            seed=seed,
            folds=folds,
            bootstrap=bootstrap,
            shared_slope=shared_slope,
            force=force,
            grid_baseline=grid_baseline,
        )
    except (DsparkError, OSError) as exc:
        fail_error(exc)
    _fit(
        traces,
        out,
        options=options,
        fingerprint=fingerprint,
        k=k,
        sampling=sampling,
        command=_command_line(ctx),
        sts_approx=sts_approx,
        plots=not no_plots,
        json_out=json_out,
    )


def _evaluate(
    calibration: Path,
    traces: list[Path],
    *,
    tolerances: tuple[float, float],
    strict: bool,
    json_out: bool,
    **options: Any,
) -> None:
    """``fit --evaluate``: re-score a calibration on the traces and exit (1 when drift is found,
    or with ``--strict`` when it is undecided). ``tolerances``: the (ECE, NLL) drift tolerances."""
    from dspark_calibrate.calibrate.confidence.fit import DriftTolerances, run_evaluate

    try:
        ece, nll = tolerances
        report = run_evaluate(calibration, traces, tolerances=DriftTolerances(ece=ece, nll=nll), **options)
    except (DsparkError, OSError) as exc:
        fail_error(exc)
    _print_notices(report.notices)
    if json_out:
        print_json(report.to_dict())
    else:
        _render_drift(report)
    status = report.decision.status
    if status is Status.ACCEPT or (status is Status.UNDECIDED and not strict):
        if status is Status.UNDECIDED:
            err_console.print(
                f"[yellow]warning[/] UNDECIDED: {report.decision.detail} (use --strict to fail)"
            )
        exit_with(EXIT_OK)
    fail(
        f"drift check failed: {report.decision.detail}",
        code="DRIFT",
        fix="refit the calibration on fresh traces (dspark-calibrate fit --traces ...)",
        exit_code=EXIT_REJECTED,
        label="rejected",
    )


def _fit(traces: list[Path], out: Path, *, fingerprint: Path | None, json_out: bool, **options: Any) -> None:
    """Fit the calibration, write it with its report and plots, print the result and exit 0."""
    from dspark_calibrate.calibrate.confidence.fit import load_fingerprint, run_fit

    try:
        fp = load_fingerprint(fingerprint) if fingerprint is not None else None
        with StageDisplay("fit", quiet=json_out) as stages:
            result, outputs, read_seconds = run_fit(
                traces,
                out,
                fingerprint=fp,
                tool_version=dspark_calibrate.__version__,
                created_at=utcnow().isoformat(),
                on_stage=stages,
                **options,
            )
    except (DsparkError, OSError) as exc:
        fail_error(exc)
    stage_line("fit", "done", str(outputs.calibration))
    _print_notices(result.notices)
    if json_out:
        print_json(
            {
                "ok": True,
                "status": "ok",
                "calibration": result.calibration.to_dict(),
                "summary": result.summary(),
                "outputs": outputs.to_dict(),
                "timings": dict(result.timings),
                "read_seconds": read_seconds,
                "synthetic": result.synthetic,
            }
        )
    else:
        _render_fit(result, outputs, read_seconds)
    exit_with(EXIT_OK)


def _parse_floats(text: str, option: str) -> tuple[float, ...]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ConfigError(f"{option} is empty; give comma-separated numbers like 0.7,0.9,1.1")
    try:
        return tuple(float(p) for p in parts)
    except ValueError:
        raise ConfigError(f"{option} {text!r}: every entry must be a number") from None


def synth(
    out: Annotated[Path, typer.Option("--out", help="Output trace file (.parquet).", show_default=False)],
    rounds: Annotated[int, typer.Option("--rounds", help="Rounds to generate.")] = 200_000,
    k: Annotated[int, typer.Option("--k", help="Draft length K.")] = 5,
    temperatures: Annotated[
        str | None,
        typer.Option(
            "--temperatures", help="True T*_1..T*_K, comma-separated (default 0.7,0.9,1.1,1.4,1.8)."
        ),
    ] = None,
    rounds_per_request: Annotated[
        float, typer.Option("--rounds-per-request", help="Mean rounds per request.")
    ] = 200.0,
    censor_fraction: Annotated[
        float, typer.Option("--censor-fraction", help="Fraction of rounds with a trimmed (censored) block.")
    ] = 0.0,
    censor_mode: Annotated[str, typer.Option("--censor-mode", help="confidence | random.")] = "confidence",
    request_spread: Annotated[
        float, typer.Option("--request-spread", help="Std-dev of the per-request logit offset.")
    ] = 0.75,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    sampling: Annotated[
        str | None, typer.Option("--sampling", help="Sampling tag written on every round.")
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Generate synthetic traces from a known ground truth (for recovery tests and demos)."""
    from dspark_calibrate.calibrate.confidence.synth_traces import SynthSpec, write_synth_traces

    try:
        check_output_file(out, suffixes=(".parquet", ".pq"), what="synthetic traces (a Parquet file)")
        spec = SynthSpec(
            rounds=rounds,
            k=k,
            temperatures=_parse_floats(temperatures, "--temperatures") if temperatures is not None else None,
            rounds_per_request=rounds_per_request,
            censor_fraction=censor_fraction,
            censor_mode=censor_mode,
            request_spread=request_spread,
            seed=seed,
            sampling=sampling,
        )
        summary = write_synth_traces(out, spec)
    except (DsparkError, OSError) as exc:
        fail_error(exc)
    if json_out:
        print_json(summary.to_dict())
    else:
        out_console.print(
            f"wrote {summary.path}: {summary.rounds} rounds, {summary.requests} requests, K={summary.k}, "
            f"{summary.censored_rounds} censored, mean accepted {summary.mean_accepted:.3f}; "
            f"true T = {', '.join(f'{t:g}' for t in summary.temperatures)}"
        )
    exit_with(EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add ``fit`` and the ``traces`` group (``traces synth``) to the ``dspark-calibrate`` app."""
    command(
        app,
        "fit",
        "dspark-calibrate fit --traces traces/ --out fit/",
        "dspark-calibrate fit --evaluate fit/calibration.parquet --traces fresh/   # drift check",
    )(fit)
    traces_app = make_app(None, "Draft-round traces: generate synthetic ones.")
    command(
        traces_app,
        "synth",
        "dspark-calibrate traces synth --out traces.parquet --rounds 300000 --censor-fraction 0.3",
    )(synth)
    app.add_typer(traces_app, name="traces")
