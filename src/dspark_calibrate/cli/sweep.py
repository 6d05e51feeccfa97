"""``dspark-calibrate sweep``: measure T(G, V) over the graph ladder and write an unsigned sweep.

Thin: the command collects its options (declared once in cli/_sweep_options.py) into a
:class:`~dspark_calibrate.cli._sweep_options.SweepOptions`; :func:`run_sweep` turns them into a
:class:`~dspark_calibrate.calibrate.measurement.sweep.SweepRequest`, calls
:func:`~dspark_calibrate.calibrate.measurement.sweep.execute`, renders a progress bar and a summary table (or
``--json``). Exit codes: 0 every cell measured, 1 a measurement failed (or, with
``--require-precision``, a cell stopped short of the precision target), 2 usage or I/O error.

``--mixed`` measures mixed prefill+decode cells instead (docs/mixed.md): the steps come from a
recorded workload's mixed steps (``--mixed-workload``) or a grid (``--mixed-grid``); each cell
is paired with the native width of its step through the same harness. One process measuring a
deployment of ``--live-gpu-count`` ranks measures one rank's share (rank 0's for a mixed step).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from dspark_calibrate.cli._common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REJECTED,
    JsonFlag,
    LiveAttention,
    LiveCheckpoint,
    LiveGpu,
    LiveGpuCount,
    LiveGpuSnapshot,
    LiveKvDtype,
    LiveModelConfig,
    LiveMoe,
    LiveOptions,
    LiveRuntimeSnapshot,
    LiveSourceDiff,
    LiveSourceDir,
    LiveSourceHead,
    LiveTopology,
    check_output_file,
    command,
    err_console,
    exit_with,
    fail,
    fail_error,
    json_mode,
    out_console,
    print_json,
    print_table,
)
from dspark_calibrate.cli._common import (
    parse_ladder as parse_option_ladder,
)
from dspark_calibrate.cli._sweep_options import (
    BackendOption,
    BackendOptPairs,
    BudgetOption,
    BudgetsOption,
    ClockPolicyOption,
    ConfigOption,
    ContextLenOption,
    ControlFlag,
    DeviceOption,
    DwellOption,
    EpochsRequiredOption,
    FactoryOption,
    FingerprintOption,
    ForcedKFlag,
    InputPathOption,
    InterleaveFlag,
    JournalOption,
    KOption,
    LadderOption,
    LayersOption,
    MaxCandidatesOption,
    MaxCellSecondsOption,
    MaxSamplesOption,
    MemoryCheckFlag,
    MinRoundsOption,
    MinSamplesOption,
    MinTimeOption,
    MinVerifyLenOption,
    MixedBucketsOption,
    MixedExecutionModeOption,
    MixedFlag,
    MixedGridOption,
    MixedMaxCellsOption,
    MixedWorkloadOption,
    ModelOption,
    OrderOption,
    OutOption,
    PassesOption,
    PassIndexOption,
    PlotFlag,
    PrecisionOption,
    PresetOption,
    ProtocolOption,
    RecaptureEveryOption,
    ReplaysOption,
    RequirePrecisionFlag,
    ResolveOption,
    ResumeFlag,
    RewarmOption,
    SamplesPerVisitOption,
    SeedOption,
    SettleOption,
    SweepOptions,
    ThrottlePolicyOption,
    UntilRoundOption,
    VerboseFlag,
    WarmupOption,
    WorkloadOption,
)
from dspark_calibrate.cli._sweep_progress import SweepProgress, finish_line
from dspark_calibrate.errors import ConfigError, DsparkError, MeasurementError

__all__ = ["register"]


def _parse_options(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--backend-opt {pair!r} is not key=value; write it like --backend-opt ep=8")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _per_g_table(result: Any) -> Table:
    """One row per G: the native step, the best compact saving and how the cells stopped."""
    from collections import Counter, defaultdict

    by_g: dict[int, list[Any]] = defaultdict(list)
    for c in result.cells:
        by_g[c.spec.graph_batch_size].append(c)
    table = Table(
        title=f"sweep: K={result.config.k}, {len(result.cells)} cells over G={list(by_g)}, {result.rounds} rounds"
    )
    for name in ("G", "cells", "native ms (95%)", "best compact saving (95%)", "stopped"):
        table.add_column(name, justify="right" if name in ("G", "cells") else "left")
    for g, cells in by_g.items():
        native = next((c.summary for c in cells if c.spec.kind.value == "native"), None)
        compact = [c for c in cells if c.spec.kind.value == "compact" and c.summary is not None]
        best = max(compact, key=lambda c: c.summary.saving, default=None)
        reasons = Counter(c.decision.reason for c in cells)
        table.add_row(
            str(g),
            str(len(cells)),
            "-"
            if native is None
            else f"{native.median_ms:.4f} [{native.ci_low_ms:.4f}, {native.ci_high_ms:.4f}]",
            "-"
            if best is None
            else f"{100 * best.summary.saving:+.2f}% [{100 * best.summary.saving_ci_low:+.2f}, "
            f"{100 * best.summary.saving_ci_high:+.2f}] at V={best.spec.verifier_budget}",
            ", ".join(f"{n} {reason}" for reason, n in reasons.most_common()),
        )
    return table


def _summary_table(result: Any) -> Table:
    table = Table(title=f"sweep: K={result.config.k}, {len(result.cells)} cells, {result.rounds} rounds")
    names = ("G", "V", "tokens", "median ms", "95% interval", "±%", "saving (95%)", "n", "rounds", "stop")
    for name in names:
        table.add_column(
            name, justify="left" if name in ("stop", "95% interval", "saving (95%)") else "right"
        )
    for c in result.cells:
        s = c.summary
        if s is None:
            table.add_row(
                str(c.spec.graph_batch_size),
                str(c.spec.verifier_budget),
                str(c.spec.tokens),
                "-",
                "-",
                "-",
                "-",
                "0",
                "0",
                c.decision.reason,
            )
            continue
        saving = "-"
        if c.spec.kind.value != "native":
            saving = f"{100 * s.saving:+.2f}% [{100 * s.saving_ci_low:+.2f}, {100 * s.saving_ci_high:+.2f}]"
            if not s.paired_rounds:
                saving += " unpaired"
        table.add_row(
            str(c.spec.graph_batch_size),
            str(c.spec.verifier_budget),
            str(c.spec.tokens),
            f"{s.median_ms:.4f}",
            f"[{s.ci_low_ms:.4f}, {s.ci_high_ms:.4f}]",
            f"{100 * s.half_width_rel:.2f}",
            saving,
            str(s.samples),
            str(s.rounds),
            c.decision.reason,
        )
    return table


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _between_line(between: Any, confidence: float) -> str:
    """The paired between-run estimate as measured: never a bare 0 where the design could not see it."""
    from dspark_calibrate.calibrate.measurement.reml import MAX_EPOCHS_FACTOR
    from dspark_calibrate.calibrate.measurement.stats import RESOLVE_TARGET_REL

    if not between.estimated:
        return (
            "between-run: fewer than two epochs, nothing estimated (paired savings carry no between-run "
            "term; use --recapture-every or --passes)"
        )
    resolve = ""
    if between.resolvable_shift_rel is not None:
        resolve = f"; the design resolves shifts >= {_pct(between.resolvable_shift_rel)}"
        by_g = [g for g in between.paired_groups if g.resolvable is not None]
        if by_g:
            worst = max(by_g, key=lambda g: g.resolvable)
            resolve += (
                f" pooled over every G (each G alone {_pct(min(g.resolvable for g in by_g))}-"
                f"{_pct(worst.resolvable)}, {worst.native.split('/')[0]} the least"
            )
            if worst.resolvable > RESOLVE_TARGET_REL:
                resolve += (
                    f"; {_pct(RESOLVE_TARGET_REL)} at {worst.native.split('/')[0]} needs "
                    + (
                        f"{worst.epochs_factor}x its epochs (--resolve {RESOLVE_TARGET_REL:g} measures each G on until it does, budget permitting)"
                        if worst.epochs_factor
                        else f"over {MAX_EPOCHS_FACTOR}x its epochs"
                    )
                )
            resolve += ")"
        if between.resolvable_shift_rel > RESOLVE_TARGET_REL:
            resolve += (
                f", not the {_pct(RESOLVE_TARGET_REL)} an H200 at its power cap has shown: add passes (--passes 4) "
                "or rounds per epoch (--recapture-every)"
            )
    carried = _pct(between.paired_carried(confidence))
    if between.paired_resolved:
        what = (
            f"paired SD {_pct(between.paired_rel)} (95% {_pct(between.paired_rel_low)}-"
            f"{_pct(between.paired_rel_upper)})"
        )
    else:
        what = f"paired SD not resolved (REML {_pct(between.paired_rel)}, 95% upper {carried})"
    line = f"between-run ({between.estimator}, {between.epochs} epochs): {what}; intervals carry {carried}{resolve}"
    groups = [g for g in between.paired_groups if g.upper > (between.paired_rel_upper or 0.0)]
    if groups:
        line += "; per G above the pool: " + ", ".join(
            f"{g.native.split('/')[0]} {_pct(g.estimate)} (carries {_pct(g.upper)})" for g in groups
        )
    return line


def _check_lines(result: Any) -> list[str]:
    """What the sweep's own bias checks found: control bias per G, carry-over and re-warm, clocks."""
    lines = [_between_line(result.between, result.config.thresholds.confidence)]
    biases = result.control_summary()
    if biases:
        parts = [
            f"G{g} {100 * b['control_bias']:+.2f}% [{100 * b['ci_low']:+.2f}, {100 * b['ci_high']:+.2f}]"
            + (" BIASED: compact savings widened" if b["widened"] else "")
            for g, b in biases.items()
        ]
        lines.append("control bias (0 is the truth): " + "; ".join(parts))
    carry = result.carryover
    if carry is not None:
        effects = [
            f"G{g} {100 * e.effect:+.2f}%"
            for g, e in sorted(carry.per_g.items())
            if e.effect is not None and e.after
        ]
        lines.append(
            "carry-over after a larger G: "
            + (", ".join(effects) or "none measured")
            + f"; re-warm {result.rewarm_steps} replays; it moves a saving by at most "
            f"{100 * carry.largest_saving_shift():.2f} pp (limit {100 * result.config.thresholds.carryover_limit_rel:.2f} pp)"
        )
    lines.append(_protocol_line(result.protocol_summary(), mix=result.mix_summary()))
    settling = result.settling_summary()
    if settling["measured"] and settling["largest_g"] is not None:
        parts = [f"G{g} {100 * d:+.2f}%" for g, d in settling["per_g"].items() if d is not None]
        moves = settling.get("saving_move_per_g", {})
        largest = max(moves.items(), key=lambda x: abs(x[1]), default=None)
        moved = (
            f"; a compact saving moves by up to {100 * largest[1]:+.2f} pp over a visit "
            f"({settling['saving_move_cell'][largest[0]]})"
            if largest is not None
            else ""
        )
        lines.append(
            f"settling (after {settling['settle_s']:g} s of untimed mix per visit): a native step moves "
            "from a visit's first sample to its last by "
            + ", ".join(parts)
            + moved
            + "; the intervals also hold where the visits end (a process that stays at one G runs there)"
        )
    clock_term = result.clock_summary()
    if clock_term["cell"]:
        lines.append(
            "clock: at its native cell's SM clock a compact saving would move by up to "
            f"{-100 * clock_term['largest_saving_shift']:+.2f} pp ({clock_term['cell']}), as a mix of steps switching "
            "cells may run it; intervals hold both"
            + ("" if result.config.interleave else " (--interleave times each G's cells in their mix instead)")
        )
    clocks = [c.clock_rel for c in result.cells if c.clock_rel is not None and c.spec.kind.value != "native"]
    if clocks:
        lines.append(
            f"SM clock relative to native: {100 * (min(clocks) - 1):+.1f}%..{100 * (max(clocks) - 1):+.1f}%"
        )
    return lines


def _protocol_line(summary: dict[str, Any], *, mix: dict[str, Any]) -> str:
    """What the step protocol moves: the launch a waiting step pays, the largest saving shift; for
    an interleaved sweep, what the layout of the mix moves instead."""
    if mix.get("dwell") is not None:
        from dspark_calibrate.calibrate.measurement.dwell import describe_dwell

        return (
            "visits: each G's cells interleaved, queued back to back (a serving loop that launches ahead, "
            f"at the clock of the G's mix), in runs of {describe_dwell(mix['dwell'])} on average (--dwell), "
            "each visit balanced; the savings are those of a policy with that dwell"
        )
    if mix["measured"]:
        moved = (
            f"; runs instead of switching every step move a saving by up to "
            f"{100 * mix['runs_minus_switching']:+.2f} pp ({mix['cell']}); intervals hold both"
            if mix["cell"]
            else ""
        )
        return (
            "visits: each G's cells interleaved, queued back to back (a serving loop that launches ahead, "
            f"at the clock of the G's mix), switching every step or in runs, by round, each visit balanced{moved}"
        )
    if not summary["measured"]:
        return (
            "step protocol: not measured (single-replay samples, or a timer that cannot time a first "
            "replay apart); intervals describe the sweep's own protocol only"
        )
    launch = ", ".join(
        f"G{g} {ms:.3f} ms" for g, ms in sorted(summary["launch_ms_per_g"].items(), key=lambda x: int(x[0]))
    )
    return (
        f"step protocol: a step that waits for the one before pays {launch or 'nothing measured'} more than one "
        f"queued behind it; that moves a saving by up to {100 * summary['largest_saving_shift']:.2f} pp"
        + (f" ({summary['cell']})" if summary["cell"] else "")
        + "; intervals hold both"
    )


def _cell_json(c: Any) -> dict[str, Any]:
    s = c.summary
    return {
        "graph_batch_size": c.spec.graph_batch_size,
        "verifier_budget": c.spec.verifier_budget,
        "kind": c.spec.kind.value,
        "status": c.decision.status.value,
        "stop_reason": c.decision.reason,
        "step_time_ms": s.median_ms if s else None,
        "ci_low_ms": s.ci_low_ms if s else None,
        "ci_high_ms": s.ci_high_ms if s else None,
        "saving": s.saving if s else None,
        "saving_ci_low": s.saving_ci_low if s else None,
        "saving_ci_high": s.saving_ci_high if s else None,
        "paired_rounds": s.paired_rounds if s else 0,
        "epochs": s.epochs if s else 0,
        "samples": s.samples if s else 0,
        "rounds": s.rounds if s else 0,
        "warnings": list(s.warnings) if s else [],
        "control_widened": c.control_widened,
        "clock_rel": c.clock_rel,
        "power_rel": c.power_rel,
        "carryover_rel": c.carryover_rel,
        **_protocol_json(c.protocol),
        "saving_at_native_clock": c.at_native_clock(),
    }


def _protocol_json(term: Any) -> dict[str, float | None]:
    """The step protocol's per-cell values for ``--json`` (null where not measured)."""
    names = ("pipelined_ms", "synchronous_ms", "saving_pipelined", "saving_synchronous")
    return {n: None if term is None else getattr(term, n) for n in names}


def _json_report(result: Any, output: Any) -> dict[str, Any]:
    from dspark_calibrate.calibrate.measurement.sweep import decode_checks

    return {
        "ok": result.complete,
        "error": None if result.complete else "INCOMPLETE",
        "all_precise": result.all_precise,
        "out": str(output.summary_path) if output else None,
        "samples": str(output.samples_path) if output else None,
        "plot": str(output.plot_path) if output and output.plot_path else None,
        "summary_logical_sha256": output.summary_sha256 if output else None,
        "samples_logical_sha256": output.samples_sha256 if output else None,
        "rounds": result.rounds,
        "sweep_seconds": result.seconds,
        "resumed": result.resumed,
        "between_run": result.between.to_dict(),
        "throttle": result.throttle_summary(),
        **decode_checks(result),
        "cells": [_cell_json(c) for c in result.cells],
    }


def _run_in_passes(passes: int, rounds: int, resume: bool, as_json: bool, out: Path) -> None:
    """Run the sweep as ``passes`` child processes and exit with the first failing pass's code."""
    import os

    from dspark_calibrate.calibrate.measurement.passes import pass_commands, run_passes

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("--passes runs child processes and cannot run under torchrun; use --passes 1")
    argv = sys.argv[sys.argv.index("sweep") + 1 :] if "sweep" in sys.argv else sys.argv[1:]
    commands = pass_commands(argv, passes=passes, rounds_per_pass=rounds, resume=resume, as_json=as_json)
    exit_with(run_passes(commands, out=out))


def _thresholds(protocol: str, preset: str, chosen: dict[str, Any]) -> Any:
    from dspark_calibrate.calibrate.measurement.stats import Thresholds
    from dspark_calibrate.calibrate.measurement.telemetry import THROTTLE_POLICIES

    if preset not in PRESETS:
        raise ConfigError(f"--preset {preset!r} is unknown; use {', '.join(PRESETS[:-1])} or {PRESETS[-1]}")
    policy = chosen.get("throttle_policy")
    if policy is not None and policy not in THROTTLE_POLICIES:
        raise ConfigError(
            f"--throttle-policy {policy!r} is unknown; use one of {', '.join(THROTTLE_POLICIES)} "
            "(serving keeps power-capped samples, the state a serving GPU runs in)"
        )
    if protocol == "fixed":
        if preset == POWER_CAPPED:
            raise ConfigError(f"--preset {POWER_CAPPED} is an adaptive design; drop --protocol fixed")
        return Thresholds.fixed_protocol(**chosen)
    if preset == "quick":
        return Thresholds.quick(**chosen)
    if preset == POWER_CAPPED:
        return Thresholds.power_capped(**chosen)
    return Thresholds.adaptive(**chosen)


#: ``--preset`` names; ``power-capped`` also sets ``--interleave`` and ``--settle-s`` (:func:`with_preset`).
POWER_CAPPED = "power-capped"
PRESETS = ("default", "quick", POWER_CAPPED)


def with_preset(opts: SweepOptions) -> SweepOptions:
    """``opts`` with what its preset implies beyond thresholds: ``power-capped`` visits a G's
    cells interleaved (unless ``--no-interleave``) and settles each visit for
    ``POWER_CAPPED_SETTLE_S`` (unless ``--settle-s``); every other preset leaves ``--interleave``
    off unless given.

    Raises:
        ConfigError: ``power-capped`` with ``--mixed`` (a mixed sweep cannot interleave).
    """
    from dspark_calibrate.calibrate.measurement.sweep import POWER_CAPPED_SETTLE_S

    if opts.preset != POWER_CAPPED:
        return replace(opts, interleave=bool(opts.interleave))
    if opts.mixed:
        raise ConfigError(
            f"--preset {POWER_CAPPED} interleaves decode cells, which a --mixed sweep cannot; "
            "use --preset default with --mixed"
        )
    interleave = True if opts.interleave is None else opts.interleave
    settle = opts.settle_s if opts.settle_s is not None or not interleave else POWER_CAPPED_SETTLE_S
    return replace(opts, interleave=interleave, settle_s=settle)


def _backend_options(pairs: list[str], named: dict[str, Any]) -> dict[str, Any]:
    options = _parse_options(pairs)
    for key, value in named.items():
        if value is not None:
            options[key] = str(value) if isinstance(value, Path) else value
    return options


def _mixed_table(result: Any) -> Table:
    table = Table(title=f"mixed sweep: K={result.config.k}, {len(result.cells)} arms, {result.rounds} rounds")
    for name in ("step", "capacity", "median ms", "95% interval", "saving (95%)", "n", "rounds", "stop"):
        table.add_column(
            name, justify="left" if name in ("stop", "95% interval", "saving (95%)") else "right"
        )
    for c in result.cells:
        s = c.summary
        arm = "native" if c.spec.key[1] == 0 else str(c.spec.key[1])
        if s is None:
            table.add_row(str(c.spec.key[0]), arm, "-", "-", "-", "0", "0", c.decision.reason)
            continue
        saving = (
            "-"
            if c.spec.key[1] == 0
            else f"{100 * s.saving:+.2f}% [{100 * s.saving_ci_low:+.2f}, {100 * s.saving_ci_high:+.2f}]"
        )
        table.add_row(
            str(c.spec.key[0]),
            arm,
            f"{s.median_ms:.4f}",
            f"[{s.ci_low_ms:.4f}, {s.ci_high_ms:.4f}]",
            saving,
            str(s.samples),
            str(s.rounds),
            c.decision.reason,
        )
    return table


def _mixed_json(result: Any, output: Any) -> dict[str, Any]:
    return {
        "ok": result.complete,
        "all_precise": result.all_precise,
        "mixed": True,
        "out": str(output.output.summary_path),
        "samples": str(output.output.samples_path),
        "summary_logical_sha256": output.output.summary_sha256,
        "samples_logical_sha256": output.output.samples_sha256,
        "protocol_sha256": output.protocol_sha256,
        "rounds": result.rounds,
        "between_run": result.between.to_dict(),
        "cells": [
            {
                "mixed_group": c.spec.key[0],
                "capacity": c.spec.key[1],
                "status": c.decision.status.value,
                "stop_reason": c.decision.reason,
                "step_time_ms": c.summary.median_ms if c.summary else None,
                "saving": c.summary.saving if c.summary else None,
                "saving_ci_low": c.summary.saving_ci_low if c.summary else None,
                "saving_ci_high": c.summary.saving_ci_high if c.summary else None,
                "accuracy": (
                    {
                        "rows": output.checks[c.spec.key].rows,
                        "mismatches": output.checks[c.spec.key].mismatches,
                    }
                    if c.spec.key in output.checks
                    else None
                ),
            }
            for c in result.cells
        ],
    }


def _mixed_route(opts: SweepOptions, fingerprint: Any, live: dict[str, Any]) -> Any:
    """The mixed route the cells are measured for (world size: live, fingerprint, then torchrun's)."""
    import os

    from dspark_calibrate.artifacts import MixedRoute

    ws = live.get("gpu_count") or (fingerprint.gpu_count if fingerprint is not None else None)
    ws = ws or int(os.environ.get("WORLD_SIZE", "1") or 1)
    return MixedRoute(
        physical_k=opts.k,
        world_size=ws,
        body_buckets=parse_option_ladder(opts.mixed_buckets, option="--mixed-buckets"),
        execution_mode=opts.mixed_execution_mode,
        min_verify_len=opts.min_verify_len,
    )


def _mixed_plan(opts: SweepOptions, route: Any) -> Any:
    """The mixed steps to measure: from ``--mixed-grid`` or the ``--mixed-workload``'s mixed steps."""
    from dspark_calibrate.calibrate.deployment.workload import read_workload
    from dspark_calibrate.calibrate.measurement.mixed import plan_from_workload, read_grid

    if (opts.mixed_workload is None) == (opts.mixed_grid is None):
        raise ConfigError(
            "--mixed needs exactly one of --mixed-workload WORKLOAD and --mixed-grid GRID.json; give the "
            "recorded workload whose mixed steps to measure, or a grid of steps"
        )
    if opts.mixed_grid is not None:
        return read_grid(opts.mixed_grid, route)
    assert opts.mixed_workload is not None
    return plan_from_workload(
        read_workload(opts.mixed_workload, k=opts.k), route, max_cells=opts.mixed_max_cells
    )


def _measure_mixed(
    opts: SweepOptions, *, route: Any, backend_options: dict[str, Any], ladder: tuple[int, ...], **common: Any
) -> tuple[Any, Any]:
    """Import or measure the mixed cells; ``(result, output)``, or exits on a rank other than 0.

    ``common`` holds what both paths take: thresholds, seed, fingerprint, live, clock_policy.
    """
    from dspark_calibrate.calibrate.measurement.mixed_sweep import (
        MixedSweepRequest,
        execute_mixed,
        import_mixed,
    )

    if opts.backend == "import-samples":
        if opts.input_path is None:
            raise ConfigError("--backend import-samples needs --input PROFILE.jsonl")
        return import_mixed(
            opts.input_path, route=route, ladder=ladder, out=opts.out, command=tuple(sys.argv), **common
        )
    request = MixedSweepRequest(
        backend=opts.backend,
        plan=_mixed_plan(opts, route),
        ladder=ladder,
        out=opts.out,
        backend_options=backend_options,
        protocol=opts.protocol,
        journal=opts.journal,
        resume=opts.resume,
        command=tuple(sys.argv),
        **common,
    )
    progress = SweepProgress(
        quiet=opts.as_json or json_mode(), precision_rel=common["thresholds"].precision_rel
    )
    with progress.progress:
        result, maybe = execute_mixed(request, on_event=progress)
    if maybe is None:  # not rank 0: rank 0 reports
        exit_with(EXIT_OK)
    if not progress.quiet:
        err_console.print(escape(f"sweep: {finish_line(result, progress.elapsed(), progress.visits)}"))
    return result, maybe


def _report_mixed(result: Any, output: Any, *, as_json: bool, require_precision: bool) -> None:
    """Print the mixed sweep's table (or JSON) and exit: 1 incomplete or, when required, imprecise."""
    if as_json:
        print_json(_mixed_json(result, output))
    else:
        print_table(_mixed_table(result))
        out_console.print(f"wrote {output.output.summary_path} and {output.output.samples_path}")
    if not result.complete:
        missing = ", ".join(c.label() for c in result.unmeasured())
        err_console.print(
            f"[bold red]incomplete:[/] no kept samples for {missing}; raise --budget and --resume"
        )
        exit_with(EXIT_REJECTED)
    if require_precision and not result.all_precise:
        exit_with(EXIT_REJECTED)
    exit_with(EXIT_OK)


def _sweep_mixed(
    opts: SweepOptions,
    *,
    backend_options: dict[str, Any],
    ladder: tuple[int, ...],
    thresholds: Any,
    fingerprint: Any,
    live: dict[str, Any],
) -> None:
    """``sweep --mixed``: plan, measure (or import) and report; exits the command."""
    try:
        route = _mixed_route(opts, fingerprint, live)
        result, output = _measure_mixed(
            opts,
            route=route,
            backend_options=backend_options,
            ladder=ladder,
            thresholds=thresholds,
            seed=opts.seed,
            fingerprint=fingerprint,
            live=live,
            clock_policy=opts.clock_policy,
        )
    except MeasurementError as exc:
        fail(str(exc), code=exc.code, exit_code=EXIT_REJECTED, label="measurement failed")
    except (DsparkError, OSError) as exc:
        fail_error(exc)
    _report_mixed(
        result, output, as_json=opts.as_json or json_mode(), require_precision=opts.require_precision
    )


def _run(request: Any, *, as_json: bool, require_precision: bool, verbose: bool = False) -> None:
    from dspark_calibrate.calibrate.measurement.sweep import execute

    progress = SweepProgress(quiet=as_json, precision_rel=request.thresholds.precision_rel)
    try:
        with progress.progress:
            result, output = execute(request, on_event=progress)
    except KeyboardInterrupt:
        journal = request.journal or request.out.with_name(request.out.stem + ".journal.jsonl")
        fail(
            f"interrupted; the journal {journal} keeps every finished visit",
            code="INTERRUPTED",
            fix="run the same command with --resume to continue without re-measuring finished cells",
            exit_code=EXIT_INTERRUPTED,
            label="interrupted",
        )
    except MeasurementError as exc:
        fail(str(exc), code=exc.code, exit_code=EXIT_REJECTED, label="measurement failed")
    except (DsparkError, OSError) as exc:
        fail_error(exc)
    if result.paused:
        err_console.print(
            f"pass ended before round {result.rounds}: {sum(c.decision.stops for c in result.cells)} of "
            f"{len(result.cells)} cells done; the next pass continues with --resume"
        )
        if as_json:
            print_json({"ok": True, "paused": True, "rounds": result.rounds, "journal": str(request.journal)})
        exit_with(EXIT_OK)
    if output is None:  # not rank 0: rank 0 reports
        exit_with(EXIT_OK)
    if not as_json:
        # The last line says how the sweep ended, on a terminal and in a log alike.
        err_console.print(escape(f"sweep: {finish_line(result, progress.elapsed(), progress.visits)}"))
    if as_json:
        print_json(_json_report(result, output))
    else:
        print_table(_summary_table(result) if verbose else _per_g_table(result))
        if not verbose:
            out_console.print(
                f"every cell's median, interval and saving: --verbose, or the table in {output.summary_path}"
            )
        for line in _check_lines(result):
            out_console.print(escape(line), highlight=False)
        out_console.print(
            f"wrote {output.summary_path} and {output.samples_path}"
            + (f" and {output.plot_path}" if output.plot_path else "")
        )
    if not result.complete:
        missing = ", ".join(c.label() for c in result.unmeasured())
        err_console.print(
            f"[bold red]incomplete:[/] no kept samples for {missing}; raise --budget and --resume"
        )
        exit_with(EXIT_REJECTED)
    if require_precision and not result.all_precise:
        short = ", ".join(c.spec.label() for c in result.cells if c.decision.reason != "precision")
        err_console.print(f"[bold red]imprecise:[/] cells stopped short of precision: {short}")
        exit_with(EXIT_REJECTED)
    exit_with(EXIT_OK)


_EXAMPLES = (
    "dspark-calibrate sweep --backend synthetic --k 5 --ladder 8,16,32 --out sweep.parquet",
    "dspark-calibrate sweep --backend reference --config deepseek-v3 --layers 4 --backend-opt ep=8 "
    "--context-len 2048 --k 5 --ladder 1,2,4,8 --live-topology DEP8 --live-gpu-count 8 "
    "--live-source-dir TensorRT-LLM/ --out sweep.parquet",
    "dspark-calibrate sweep ... --resume      # continue an interrupted sweep",
)

#: ``Thresholds`` fields set by options: (field, option) pairs; an option left unset keeps the preset's value.
_THRESHOLD_OPTIONS = (
    ("precision_rel", "precision"),
    ("min_samples", "min_samples"),
    ("min_rounds", "min_rounds"),
    ("min_time_s", "min_time"),
    ("max_samples_per_cell", "max_samples"),
    ("max_seconds_per_cell", "max_cell_seconds"),
    ("budget_s", "budget"),
    ("warmup_steps", "warmup"),
    ("rewarm_steps", "rewarm"),
    ("replays_per_sample", "replays"),
    ("samples_per_visit", "samples_per_visit"),
    ("throttle_policy", "throttle_policy"),
    ("recapture_every", "recapture_every"),
    ("epochs_required", "epochs_required"),
)

#: Options passed to the backend under their own names (besides ``--backend-opt`` pairs).
_NAMED_BACKEND_OPTIONS = ("config", "layers", "context_len", "device", "factory", "model")


def _sweep_thresholds(opts: SweepOptions) -> Any:
    """The thresholds of the protocol and preset, with the options given on the command line."""
    chosen = {name: getattr(opts, option) for name, option in _THRESHOLD_OPTIONS}
    return _thresholds(opts.protocol, opts.preset, {n: v for n, v in chosen.items() if v is not None})


def _sweep_backend_options(opts: SweepOptions) -> dict[str, Any]:
    """The backend's options: ``--backend-opt`` pairs, then the named options that were given."""
    if opts.backend == "trtllm" and opts.model is None and "model" not in " ".join(opts.backend_opt or []):
        raise ConfigError(
            "--backend trtllm needs a model; pass --model MODEL (the path or name tensorrt_llm.LLM loads)"
        )
    if (
        opts.backend == "module"
        and opts.factory is None
        and "factory" not in " ".join(opts.backend_opt or [])
    ):
        raise ConfigError(
            "--backend module needs a factory; pass --factory pkg.mod:fn (a function returning the "
            "engine's step for (G, V, K))"
        )
    return _backend_options(
        opts.backend_opt or [], {name: getattr(opts, name) for name in _NAMED_BACKEND_OPTIONS}
    )


def _sweep_live(opts: SweepOptions) -> dict[str, Any]:
    """The ``--live-*`` values as ``collect_live`` arguments (K and the ladder are the sweep's own)."""
    live = LiveOptions.from_options(opts).arguments()
    for name in ("max_draft_len", "rank_local_graph_batch_sizes"):
        live.pop(name)
    return live


def _serving_order(opts: SweepOptions, ladder: tuple[int, ...]) -> Any:
    """``--order serving``: the G-to-G moves of ``--workload``'s steps (rows per rank and step);
    None for the random order.

    Raises:
        ConfigError: an unknown order, serving without a workload, or a workload without a use.
    """
    from dspark_calibrate.calibrate.deployment.workload import read_workload
    from dspark_calibrate.calibrate.measurement.order import ORDERS, rows_per_step, serving_transitions

    if opts.order not in ORDERS:
        raise ConfigError(f"--order {opts.order!r} is unknown; use one of {list(ORDERS)}")
    if opts.order == "random":
        if opts.workload is not None:
            raise ConfigError("--workload sets the serving order; add --order serving")
        return None
    if opts.workload is None:
        raise ConfigError(
            "--order serving needs --workload WORKLOAD.parquet, the recorded steps whose moves between G to follow"
        )
    workload = read_workload(opts.workload, k=opts.k)
    a = workload.arrays()
    rows = rows_per_step(a.step, a.rank)
    return serving_transitions(
        rows, ladder, source=f"{opts.workload.name} ({workload.identity_sha256[:12]}, {len(rows)} steps)"
    )


def _sweep_request(
    opts: SweepOptions, backend_options: dict[str, Any], live: dict[str, Any], fingerprint: Any
) -> Any:
    """The decode sweep's :class:`~dspark_calibrate.calibrate.measurement.sweep.SweepRequest`."""
    from dspark_calibrate.calibrate.measurement.ladder import parse_budgets, parse_ladder
    from dspark_calibrate.calibrate.measurement.sweep import SweepRequest

    ladder = parse_ladder(opts.ladder)
    return SweepRequest(
        backend=opts.backend,
        backend_options=backend_options,
        k=opts.k,
        ladder=ladder,
        budgets=parse_budgets(opts.budgets or []),
        max_candidates=opts.max_candidates,
        include_control=opts.control,
        forced_k=opts.forced_k,
        out=opts.out,
        journal=opts.journal,
        resume=opts.resume,
        protocol=opts.protocol,
        thresholds=_sweep_thresholds(opts),
        seed=opts.seed,
        fingerprint=fingerprint,
        clock_policy=opts.clock_policy,
        input=opts.input_path,
        plot=opts.plot and importlib.util.find_spec("matplotlib") is not None,
        command=tuple(sys.argv),
        live=live,
        check_memory=opts.memory_check,
        until_round=opts.until_round,
        pass_epoch=opts.pass_index,
        world_size=live.get("gpu_count"),
        order=_serving_order(opts, ladder),
        interleave=bool(opts.interleave),
        settle_s=opts.settle_s,
        dwell=_sweep_dwell(opts),
        resolve_rel=opts.resolve,
    )


def _sweep_dwell(opts: SweepOptions) -> Any:
    """``--dwell``'s text as a dwell over the ladder (:func:`~.dwell.parse_dwell`); None without it."""
    from dspark_calibrate.calibrate.measurement.dwell import parse_dwell
    from dspark_calibrate.calibrate.measurement.ladder import parse_ladder

    return None if opts.dwell is None else parse_dwell(opts.dwell, parse_ladder(opts.ladder))


def run_sweep(opts: SweepOptions) -> None:
    """Run ``sweep`` for parsed options: measure (or import) the cells, report, exit the command.

    ``--mixed`` goes to the mixed sweep; ``--passes N`` re-runs the command as N child processes;
    otherwise one decode sweep runs in this process.
    """
    from dspark_calibrate.artifacts import read_fingerprint
    from dspark_calibrate.calibrate.measurement.ladder import parse_ladder

    try:
        opts = with_preset(opts)
        # Outputs first: a sweep measures for minutes and must not learn at the end that it
        # cannot write (the journal and the samples file go beside --out).
        check_output_file(opts.out, suffixes=(".parquet", ".pq"), what="the sweep summary (a Parquet file)")
        if opts.journal is not None:
            check_output_file(opts.journal, option="--journal", suffixes=(), what="the sweep journal")
        backend_options = _sweep_backend_options(opts)
        live = _sweep_live(opts)
        base_fp = read_fingerprint(opts.fingerprint) if opts.fingerprint is not None else None
        if opts.mixed and (
            opts.order != "random"
            or opts.workload is not None
            or opts.interleave
            or opts.dwell is not None
            or opts.resolve is not None
        ):
            raise ConfigError(
                "--order serving, --workload, --interleave, --dwell and --resolve order decode cells; drop "
                "them with --mixed"
            )
        if opts.mixed:
            _sweep_mixed(
                opts,
                backend_options=backend_options,
                ladder=parse_ladder(opts.ladder),
                thresholds=_sweep_thresholds(opts),
                fingerprint=base_fp,
                live=live,
            )
        if opts.mixed_workload is not None or opts.mixed_grid is not None:
            raise ConfigError("--mixed-workload and --mixed-grid need --mixed; add --mixed")
        from dspark_calibrate.calibrate.measurement.dwell import check_dwell
        from dspark_calibrate.calibrate.measurement.sweep import check_resolve, check_settle

        check_settle(opts.settle_s, interleave=bool(opts.interleave))
        check_dwell(_sweep_dwell(opts), interleave=bool(opts.interleave))
        request = _sweep_request(opts, backend_options, live, base_fp)
        check_resolve(
            request.resolve_rel,
            interleave=request.interleave,
            recapture=request.thresholds.recapture_every > 0,
            in_passes=opts.passes > 1 or opts.pass_index is not None,
        )
        if opts.passes > 1:
            rounds = request.thresholds.recapture_every or 3
            _run_in_passes(opts.passes, rounds, opts.resume, opts.as_json, opts.out)
    except DsparkError as exc:
        fail_error(exc)
    _run(
        request,
        as_json=opts.as_json or json_mode(),
        require_precision=opts.require_precision,
        verbose=opts.verbose,
    )


def sweep_command(
    k: KOption,
    ladder: LadderOption,
    out: OutOption,
    backend: BackendOption = "synthetic",
    budgets: BudgetsOption = None,
    max_candidates: MaxCandidatesOption = 48,
    control: ControlFlag = True,
    forced_k: ForcedKFlag = True,
    throttle_policy: ThrottlePolicyOption = "serving",
    recapture_every: RecaptureEveryOption = None,
    passes: PassesOption = 1,
    until_round: UntilRoundOption = None,
    epochs_required: EpochsRequiredOption = None,
    pass_index: PassIndexOption = None,
    protocol: ProtocolOption = "adaptive",
    order: OrderOption = "random",
    interleave: InterleaveFlag = None,
    settle_s: SettleOption = None,
    dwell: DwellOption = None,
    resolve: ResolveOption = None,
    workload: WorkloadOption = None,
    preset: PresetOption = "default",
    precision: PrecisionOption = None,
    min_samples: MinSamplesOption = None,
    min_rounds: MinRoundsOption = None,
    min_time: MinTimeOption = None,
    max_samples: MaxSamplesOption = None,
    max_cell_seconds: MaxCellSecondsOption = None,
    budget: BudgetOption = None,
    warmup: WarmupOption = None,
    rewarm: RewarmOption = None,
    replays: ReplaysOption = None,
    samples_per_visit: SamplesPerVisitOption = None,
    seed: SeedOption = 0,
    resume: ResumeFlag = False,
    journal: JournalOption = None,
    config: ConfigOption = None,
    layers: LayersOption = None,
    context_len: ContextLenOption = None,
    device: DeviceOption = None,
    model: ModelOption = None,
    factory: FactoryOption = None,
    input_path: InputPathOption = None,
    backend_opt: BackendOptPairs = None,
    memory_check: MemoryCheckFlag = True,
    fingerprint: FingerprintOption = None,
    live_topology: LiveTopology = None,
    live_gpu: LiveGpu = None,
    live_gpu_count: LiveGpuCount = None,
    live_gpu_snapshot_sha256: LiveGpuSnapshot = None,
    live_source_dir: LiveSourceDir = None,
    live_source_head: LiveSourceHead = None,
    live_source_diff: LiveSourceDiff = None,
    live_runtime_snapshot: LiveRuntimeSnapshot = None,
    live_model_config: LiveModelConfig = None,
    live_checkpoint_sha256: LiveCheckpoint = None,
    live_attention_backend: LiveAttention = None,
    live_moe_backend: LiveMoe = None,
    live_kv_dtype: LiveKvDtype = None,
    clock_policy: ClockPolicyOption = None,
    plot: PlotFlag = True,
    require_precision: RequirePrecisionFlag = False,
    verbose: VerboseFlag = False,
    mixed: MixedFlag = False,
    mixed_workload: MixedWorkloadOption = None,
    mixed_grid: MixedGridOption = None,
    mixed_buckets: MixedBucketsOption = "96,128,192,256,384,512",
    mixed_execution_mode: MixedExecutionModeOption = "BREAKABLE",
    mixed_max_cells: MixedMaxCellsOption = 256,
    min_verify_len: MinVerifyLenOption = 1,
    as_json: JsonFlag = False,
) -> None:
    """Measure T(G, V) for the native and candidate cells of every G, with honest intervals.

    Before measuring, the reference backend estimates its memory and time and refuses what the
    machine cannot hold. Fingerprint fields the sweep cannot probe come from the --live-* options
    or --fingerprint (docs/fingerprint.md). Ctrl-C keeps the journal: --resume continues.
    """
    run_sweep(SweepOptions(**locals()))  # every parameter is one SweepOptions field, nothing else local


def register(app: typer.Typer) -> None:
    """Add the ``sweep`` command to the ``dspark-calibrate`` app."""
    command(app, "sweep", *_EXAMPLES)(sweep_command)
