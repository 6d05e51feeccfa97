"""``dspark-calibrate build``: select cells, replay the workload, sign and verify a bundle.

Exit codes: 0 a verified bundle whose receipt admits, 1 the evidence says no (a flat table, cells
that never change a decision, or a bundle written but not admitted), 2 usage or I/O errors.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from dspark_calibrate.cli._common import (
    EXIT_OK,
    EXIT_REJECTED,
    AllowSyntheticFlag,
    JsonFlag,
    TrustRootOption,
    check_output_dir,
    command,
    err_console,
    exit_with,
    fail,
    fail_error,
    fail_usage,
    json_mode,
    out_console,
    parse_expiry,
    print_json,
    print_table,
    stage_line,
    utcnow,
)
from dspark_calibrate.cli._numeric import check_expires
from dspark_calibrate.cli.trust import (
    KeyOption,
    PassEnv,
    SignerPublicKeyOption,
    SignerUriOption,
    load_root_or_exit,
    signers_from_keys,
)
from dspark_calibrate.errors import ConfigError, DsparkError

if TYPE_CHECKING:
    from dspark_calibrate.calibrate.deployment.build import BuildResult

__all__ = ["register", "render_build"]


SweepOption = Annotated[
    list[Path],
    typer.Option("--sweep", help="Unsigned sweep summary (repeat to merge sweeps).", metavar="SWEEP.parquet"),
]
CalibrationOption = Annotated[
    Path,
    typer.Option(
        "--calibration", help="Unsigned calibration table from `fit`.", metavar="CALIBRATION.parquet"
    ),
]
WorkloadOption = Annotated[
    Path,
    typer.Option(
        "--workload",
        help="Workload trace: `workload import-trtllm` (recorded) or `workload synth` (synthetic).",
        metavar="WORKLOAD.parquet",
    ),
]
OutOption = Annotated[Path, typer.Option("--out", help="Bundle directory to create.", metavar="DIR")]
VersionOption = Annotated[
    int, typer.Option("--version", help="Version of the artifacts in their series.", metavar="N")
]
ExpiresOption = Annotated[
    str, typer.Option("--expires", help="Expiry: a duration (30d) or an ISO time.", callback=check_expires)
]
MinGainOption = Annotated[
    float, typer.Option("--min-gain", help="Runtime minimum predicted gain (0.01 = 1%).")
]
MinVerifyLenOption = Annotated[int, typer.Option("--min-verify-len", help="The engine's verify floor.")]
OverheadMsOption = Annotated[
    float | None,
    typer.Option("--overhead-ms", help="Measured upper bound of the confidence-path overhead per step."),
]
SafetyMarginMsOption = Annotated[
    float | None, typer.Option("--safety-margin-ms", help="Receipt safety margin.")
]
MinGroupValueMsOption = Annotated[
    float, typer.Option("--min-group-value-ms", help="Drain guard: value a compact step must exceed.")
]
LossMultiplierOption = Annotated[
    float | None,
    typer.Option("--loss-multiplier", help="Drain guard loss multiplier (default: estimated)."),
]
ResamplesOption = Annotated[int, typer.Option("--resamples", help="Bootstrap resamples.")]
BlockStepsOption = Annotated[
    int | None, typer.Option("--block-steps", help="Bootstrap block length in steps.")
]
SeedOption = Annotated[int, typer.Option("--seed", help="Bootstrap seed.")]
CalibrationUseOption = Annotated[
    str,
    typer.Option("--calibration-use", help="sts (what TensorRT-LLM applies) or native (the fitted maps)."),
]
PlotsFlag = Annotated[bool, typer.Option("--plots/--no-plots", help="Write report/*.png.")]
ForceFlag = Annotated[bool, typer.Option("--force", help="Replace an existing --out directory.")]
MixedSweepOption = Annotated[
    Path | None,
    typer.Option(
        "--mixed-sweep",
        help="A `sweep --mixed` summary of this deployment: prices the workload's mixed steps and adds "
        "the signed mixed evidence (mixed/) to the bundle.",
    ),
]
ObjectiveOption = Annotated[
    str | None,
    typer.Option(
        "--objective",
        help="What the gate tests: throughput (tokens per GPU-second, lost tokens priced) or latency "
        "(per-step time at the recorded arrivals). Default: the load regime's own.",
        metavar="throughput|latency",
    ),
]
RegimeOption = Annotated[
    str | None,
    typer.Option(
        "--regime",
        help="The load regime, when the workload records no queue depth (or to override it): saturated "
        "(requests wait for slots) or arrival-bound (arrivals set the pace).",
        metavar="saturated|arrival-bound",
    ),
]
PlannerOption = Annotated[
    str | None,
    typer.Option(
        "--planner",
        help="The serving planner the deployment runs (fused, device, host, or the engine's own); --overhead "
        "must have been measured with it.",
    ),
]
OverheadFileOption = Annotated[
    Path | None,
    typer.Option(
        "--overhead",
        help='Measured runs of the deployed planner\'s confidence path: JSON {"planner", "per_step_ms": '
        '[one mean per run], "source"}; drawn in the joint replicates.',
        metavar="OVERHEAD.json",
    ),
]
SavingShiftOption = Annotated[
    float | None,
    typer.Option(
        "--saving-shift-sd",
        help="SD of a saving shift common to every compact cell, as a fraction (0.008 = 0.8 pp), from an "
        "independent check or between-process passes; below the documented floor (0.005) the floor is used.",
    ),
]
MixedMinGainOption = Annotated[
    float | None,
    typer.Option("--mixed-min-gain", help="The mixed cost file's minimum predicted gain (>= 0.01)."),
]


def _summary_table(result: BuildResult) -> Table:
    """The bundle's headline numbers: verification, cells, gain, value and the receipt's decision."""
    s = result.summary
    r = result.report
    table = Table(title=f"bundle {result.out_dir}", show_header=False, title_justify="left")
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row("verified", "yes" if result.bundle.ok else f"NO ({result.bundle.code})")
    table.add_row("cells", ", ".join(f"{g}/{v}" for g, v in result.selection.cells))
    table.add_row("objective", f"{s['objective']} (regime {s['regime']}: {s['regime_source']})")
    table.add_row(
        "predicted gain",
        f"{s['predicted_gain']:+.2%}  (95% CI {s['predicted_gain_ci_low']:+.2%} .. "
        f"{s['predicted_gain_ci_high']:+.2%};"
        f" pessimistic {r.pessimistic_gain:+.2%})",
    )
    other = "latency" if s["objective"] == "throughput" else "throughput"
    alt = s["predictions"][other]
    table.add_row(
        f"{other} gain (not gated)",
        f"{alt['gain']:+.2%}  (95% CI {alt['ci_low']:+.2%} .. {alt['ci_high']:+.2%}); TPOT {s['tpot_gain']:+.2%}",
    )
    if s["mixed_share"]:
        table.add_row("mixed steps", f"{s['mixed_share']:.1%} of the workload, priced with every step")
    table.add_row("planner charged", str(s["planner"] or "not stated"))
    table.add_row(
        "goodput (tok/ms)",
        f"static {s['static_goodput_tok_per_ms']:.4g} -> dynamic {s['dynamic_goodput_tok_per_ms']:.4g}",
    )
    table.add_row(
        "compact steps", f"{s['compact_choices']} of {s['policy_steps']} ({s['compact_step_share']:.1%})"
    )
    table.add_row("gross value (lower bound)", f"{s['gross_compact_value_ms_lower_bound']:.4g} ms")
    table.add_row(
        "overhead",
        f"{s['fixed_confidence_path_overhead_ms_upper_bound']:.4g} ms/step ({r.economics.overhead_source})",
    )
    table.add_row("safety margin", f"{s['safety_margin_ms']:.4g} ms ({r.economics.safety_margin_source})")
    table.add_row("net value", f"{s['net_value_ms']:.4g} ms")
    table.add_row(
        "admitted", "[green]yes[/]" if s["admitted"] else "[red]no[/] (TensorRT-LLM would run static K)"
    )
    dg = s["drain_guard"]
    table.add_row(
        "drain guard",
        f"tail G={dg['tail_graph_batch_size']}, "
        f"{dg['mean_output_tokens_per_request_iteration']:.3g} tok/req/iter, "
        f"loss x{dg['loss_multiplier']:.3g}, min value {dg['minimum_group_value_ms']:.3g} ms",
    )
    table.add_row("decision", f"{r.decision.status.value} ({r.decision.reason}): {r.decision.detail}")
    table.add_row(
        "workload", f"{s['workload_identity_sha256']} approximate={s['workload_approximate']}"
    )
    return table


def _bucket_table(result: BuildResult) -> Table:
    """The predicted gain per graph batch size."""
    buckets = Table(title="per graph batch size", title_justify="left")
    for col in ("G", "steps", "gain", "95% CI", "compact share"):
        buckets.add_column(col, justify="right")
    for b in result.summary["per_bucket"]:
        buckets.add_row(
            str(b["graph_batch_size"]),
            str(b["steps"]),
            f"{b['predicted_gain']:+.2%}",
            f"{b['ci_low']:+.2%} .. {b['ci_high']:+.2%}",
            f"{b['compact_share']:.1%}",
        )
    return buckets


def _cells_table(result: BuildResult) -> Table:
    """The deployed compact cells with their value."""
    cells = Table(title="deployed compact cells", title_justify="left")
    for col in ("G", "V", "steps", "value ms", "lower bound ms"):
        cells.add_column(col, justify="right")
    for c in result.report.per_cell:
        if c["verifier_budget"]:
            cells.add_row(
                *(str(c[k]) for k in ("graph_batch_size", "verifier_budget", "chosen_steps")),
                f"{c['value_ms']:.4g}",
                f"{c['value_ms_lower_bound']:.4g}",
            )
    return cells


def _mixed_table(mixed: Mapping[str, Any]) -> Table:
    """The mixed prefill+decode evidence: its share, gains, value and receipt gates."""
    m = Table(title="mixed prefill+decode evidence (mixed/)", title_justify="left")
    m.add_column("")
    m.add_column("value")
    part = mixed["mixed_part"]
    m.add_row(
        "mixed share of the workload",
        f"{part['share']:.1%} ({part['steps']} of {part['workload_steps']} steps)",
    )
    m.add_row(
        "decode + mixed gain",
        f"{mixed['predicted_gain']:+.2%} [{mixed['predicted_gain_ci_low']:+.2%}, {mixed['predicted_gain_ci_high']:+.2%}]",
    )
    d = mixed["decode_part"]
    m.add_row("  decode steps", f"{d['predicted_gain']:+.2%} [{d['ci_low']:+.2%}, {d['ci_high']:+.2%}]")
    m.add_row(
        "  mixed steps", f"{part['predicted_gain']:+.2%} [{part['ci_low']:+.2%}, {part['ci_high']:+.2%}]"
    )
    m.add_row(
        "mixed compact steps", f"{mixed['compact_choices']} ({part['covered_steps']} covered by a cell)"
    )
    m.add_row(
        "mixed net value",
        f"{mixed['net_value_ms']:.4g} ms; admitted {'yes' if mixed['admitted'] else 'no'}",
    )
    failed = [g for g, ok in mixed["gates"].items() if not ok]
    m.add_row("receipt gates", "all passed" if not failed else f"[red]not passed: {failed}[/]")
    return m


def render_build(result: BuildResult) -> None:
    """Print the build summary as rich tables."""
    print_table(_summary_table(result))
    print_table(_bucket_table(result))
    print_table(_cells_table(result))
    if result.mixed_summary is not None:
        print_table(_mixed_table(result.mixed_summary))
    for note in result.notes:
        out_console.print(f"note: {note}")


def build(
    sweep: SweepOption,
    calibration: CalibrationOption,
    workload: WorkloadOption,
    trust_root: TrustRootOption,
    out: OutOption,
    version: VersionOption,
    key: KeyOption = None,
    expires: ExpiresOption = "30d",
    min_gain: MinGainOption = 0.01,
    min_verify_len: MinVerifyLenOption = 1,
    overhead_ms: OverheadMsOption = None,
    safety_margin_ms: SafetyMarginMsOption = None,
    min_group_value_ms: MinGroupValueMsOption = 0.0,
    loss_multiplier: LossMultiplierOption = None,
    resamples: ResamplesOption = 1000,
    block_steps: BlockStepsOption = None,
    seed: SeedOption = 0,
    calibration_use: CalibrationUseOption = "sts",
    allow_synthetic: AllowSyntheticFlag = False,
    plots: PlotsFlag = True,
    force: ForceFlag = False,
    passphrase_env: PassEnv = None,
    signer_uri: SignerUriOption = None,
    signer_public_key: SignerPublicKeyOption = None,
    mixed_sweep: MixedSweepOption = None,
    mixed_min_gain: MixedMinGainOption = None,
    objective: ObjectiveOption = None,
    regime: RegimeOption = None,
    planner: PlannerOption = None,
    overhead: OverheadFileOption = None,
    saving_shift_sd: SavingShiftOption = None,
    json_out: JsonFlag = False,
) -> None:
    """Build a signed bundle (cost-table, calibration, admission + manifest) and verify it."""
    from dspark_calibrate.calibrate.deployment.build import BuildOptions, load_overhead_evidence
    from dspark_calibrate.calibrate.deployment.replay import BootstrapSettings

    if version < 1:
        fail_usage(f"--version {version}: artifact versions start at 1; give 1 for a new series")
    root = load_root_or_exit(trust_root)
    now = utcnow()
    try:
        check_output_dir(out, force=force)
        evidence = load_overhead_evidence(overhead) if overhead is not None else None
        options = BuildOptions(
            version=version,
            issued_at=now,
            expires_at=parse_expiry(expires, now=now),
            minimum_predicted_gain=min_gain,
            min_verify_len=min_verify_len,
            overhead_ms=overhead_ms,
            safety_margin_ms=safety_margin_ms,
            minimum_group_value_ms=min_group_value_ms,
            loss_multiplier=loss_multiplier,
            bootstrap=BootstrapSettings(resamples=resamples, block_steps=block_steps, seed=seed),
            calibration_use=calibration_use,
            allow_synthetic=allow_synthetic,
            mixed_minimum_predicted_gain=mixed_min_gain,
            plots=plots,
            force=force,
            command=tuple(shlex.quote(a) for a in sys.argv),
            objective=objective,
            regime=regime,
            planner=planner,
            overhead_evidence=evidence,
            saving_shift_sd=saving_shift_sd,
            saving_shift_source=None if saving_shift_sd is None else "--saving-shift-sd",
        )
        signers = signers_from_keys(
            key, passphrase_env, signer_uris=signer_uri, signer_public_keys=signer_public_key
        )
        _check_signers_trusted(signers, root, trust_root)
    except (DsparkError, OSError) as exc:
        fail_error(exc)
    inputs = _BuildInputs(sweep, calibration, workload, mixed_sweep)
    result = _run_build(inputs, out, signers, root, options, quiet=json_out or json_mode())
    _report_build(result, out, json_out)


def _check_signers_trusted(signers: Any, root: Any, trust_root: Path) -> None:
    """Refuse, before any work, signing keys the trust root would not accept on an artifact.

    Raises:
        ConfigError: fewer distinct keys than the root's artifact threshold are artifact keys.
    """
    from dspark_calibrate.artifacts import public_key_of

    given = sorted({public_key_of(s).keyid for s in signers})
    trusted = [k for k in given if k in root.artifact_keys]
    if len(trusted) < root.artifact_threshold:
        raise ConfigError(
            f"--trust-root {trust_root}: its artifact signers are {', '.join(sorted(root.artifact_keys))} "
            f"(threshold {root.artifact_threshold}), and the signing key(s) given are {', '.join(given)} "
            f"({len(trusted)} trusted); sign with the key(s) the trust root lists, or add this key to "
            "the root with `dspark-calibrate trust rotate --add-artifact-key PUB.pem`"
        )


@dataclass(frozen=True, slots=True)
class _BuildInputs:
    """The unsigned tables a build reads."""

    sweeps: list[Path]
    calibration: Path
    workload: Path
    mixed_sweep: Path | None


def _run_build(
    inputs: _BuildInputs, out: Path, signers: Any, root: Any, options: Any, *, quiet: bool
) -> BuildResult:
    """Read the inputs and build the bundle, naming each stage (a spinner on a terminal); exits 1
    when cell selection refuses, 2 on other errors."""
    from dspark_calibrate.calibrate.deployment.build import build_bundle, load_build_inputs
    from dspark_calibrate.calibrate.deployment.select_cells import SelectionRefused

    def on_stage(name: str) -> None:
        stage_line("build", name)
        if status is not None:
            status.update(f"build: {name}")

    status = None if quiet or not err_console.is_terminal else err_console.status("build: reading inputs")
    try:
        if status is not None:
            status.start()
        stage_line("build", "reading inputs")
        tables = load_build_inputs(
            inputs.sweeps, inputs.calibration, inputs.workload, mixed_sweep=inputs.mixed_sweep
        )
        return build_bundle(tables, out, signers=signers, trust_root=root, options=options, on_stage=on_stage)
    except SelectionRefused as exc:
        fail(
            str(exc),
            code=exc.decision.reason,
            label="REJECTED",
            exit_code=EXIT_REJECTED,
            extra={"valid": False, "status": exc.decision.status.value},
        )
    except (DsparkError, OSError) as exc:
        fail_error(exc)
    finally:
        if status is not None:
            status.stop()


def _report_build(result: BuildResult, out: Path, json_out: bool) -> None:
    """Print the build (tables or ``--json``) and exit: 0 admitted, 1 written but not admitted."""
    if json_out:
        doc = result.to_dict()
        admitted = bool(result.summary["admitted"])
        doc.update(
            {
                "ok": admitted,
                "error": None if admitted else "NOT_ADMITTED",
                "message": None if admitted else _not_admitted(result, out),
                "fix": None if admitted else _NOT_ADMITTED_FIX,
            }
        )
        print_json(doc)
    else:
        render_build(result)
    if not result.summary["admitted"]:
        err_console.print(f"[bold red]NOT ADMITTED[/] {_not_admitted(result, out)}; {_NOT_ADMITTED_FIX}")
        exit_with(EXIT_REJECTED)
    exit_with(EXIT_OK)


_NOT_ADMITTED_FIX = (
    "measure the confidence path's overhead (the forced-K arm) or record a longer workload; "
    "see docs/build.md §3.1"
)


def _not_admitted(result: BuildResult, out: Path) -> str:
    return (
        f"{out}: net value {result.summary['net_value_ms']:.4g} ms <= 0 or no compact choice; the bundle is "
        "written but TensorRT-LLM would run static K"
    )


def register(app: typer.Typer) -> None:
    """Add ``build`` to the app."""
    command(
        app,
        "build",
        "dspark-calibrate build --sweep sweep.parquet --calibration fit/calibration.parquet "
        "--workload workload.parquet --key keys/signing-key.pem --trust-root root.json --version 1 --out bundle/",
    )(build)
