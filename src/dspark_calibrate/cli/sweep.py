"""``dspark-calibrate sweep``: measure T(G, V) over the graph ladder and write an unsigned sweep.

Thin: parses options into a :class:`~dspark_calibrate.calibrate.measurement.sweep.SweepRequest`, calls
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
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn
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
    command,
    err_console,
    exit_with,
    fail,
    fail_error,
    json_mode,
    out_console,
    print_json,
    stage_line,
)
from dspark_calibrate.cli._common import (
    parse_ladder as parse_option_ladder,
)
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


def _json_report(result: Any, output: Any) -> dict[str, Any]:
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
        "cells": [
            {
                "graph_batch_size": c.spec.graph_batch_size,
                "verifier_budget": c.spec.verifier_budget,
                "kind": c.spec.kind.value,
                "status": c.decision.status.value,
                "stop_reason": c.decision.reason,
                "step_time_ms": c.summary.median_ms if c.summary else None,
                "ci_low_ms": c.summary.ci_low_ms if c.summary else None,
                "ci_high_ms": c.summary.ci_high_ms if c.summary else None,
                "saving": c.summary.saving if c.summary else None,
                "saving_ci_low": c.summary.saving_ci_low if c.summary else None,
                "saving_ci_high": c.summary.saving_ci_high if c.summary else None,
                "paired_rounds": c.summary.paired_rounds if c.summary else 0,
                "epochs": c.summary.epochs if c.summary else 0,
                "samples": c.summary.samples if c.summary else 0,
                "rounds": c.summary.rounds if c.summary else 0,
                "warnings": list(c.summary.warnings) if c.summary else [],
            }
            for c in result.cells
        ],
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


def _fmt_s(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


class _SweepProgress:
    """What the sweep is doing, truthfully: cells done, visits this round, time per visit measured,
    and the least time left (the minimum rounds the open cells still need, capped by the budget).

    A live bar on a terminal; one line per round otherwise (logs, CI, pipes); nothing with --json.
    """

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.live = not quiet and err_console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]sweep[/] round {task.fields[round]}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} cells done"),
            TextColumn("{task.fields[current]}"),
            TextColumn("{task.fields[left]}"),
            console=err_console,
            transient=True,
            disable=not self.live,
        )
        self.task = self.progress.add_task("sweep", total=None, round=0, current="", left="")
        self.visits = 0
        self.started: float | None = None
        self.last_round = -1

    def __call__(self, event: Any) -> None:
        import time

        if event.kind == "estimate":
            if not self.quiet:
                err_console.print(escape(f"sweep: {event.detail}"), highlight=False)
            return
        now = time.perf_counter()
        if self.started is None:
            self.started = now
        if event.kind == "visit":
            self.visits += 1
        left = f"≥ {_fmt_s(event.eta_s)} left" if event.eta_s is not None else "measuring the first round"
        current = ""
        if event.cell is not None:
            hw = f" ±{100 * event.half_width_rel:.2f}%" if event.half_width_rel is not None else ""
            current = f"{event.cell.label()}{hw}"
        self.progress.update(
            self.task,
            total=event.cells_total,
            completed=event.cells_done,
            round=event.round,
            current=current,
            left=left,
        )
        if event.kind == "round" and not self.live and not self.quiet and event.round != self.last_round:
            self.last_round = event.round
            elapsed = now - self.started
            stage_line(
                "sweep",
                f"round {event.round}",
                f"{event.cells_done}/{event.cells_total} cells done, {self.visits} visits in {elapsed:.1f} s, {left}",
            )


def _thresholds(protocol: str, preset: str, chosen: dict[str, Any]) -> Any:
    from dspark_calibrate.calibrate.measurement.stats import Thresholds

    if preset not in ("default", "quick"):
        raise ConfigError(f"--preset {preset!r} is unknown; use default or quick")
    if protocol == "fixed":
        return Thresholds.fixed_protocol(**chosen)
    if preset == "quick":
        return Thresholds.quick(**chosen)
    return Thresholds.adaptive(**chosen)


def _backend_options(pairs: list[str], named: dict[str, Any]) -> dict[str, Any]:
    options = _parse_options(pairs)
    for key, value in named.items():
        if value is not None:
            options[key] = str(value) if isinstance(value, Path) else value
    return options


def _mixed_table(result: Any) -> Table:
    table = Table(title=f"mixed sweep: K={result.config.k}, {len(result.cells)} arms, {result.rounds} rounds")
    for name in ("step", "capacity", "median ms", "95% interval", "saving (95%)", "n", "rounds", "stop"):
        table.add_column(name, justify="left" if name in ("stop", "95% interval", "saving (95%)") else "right")
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
                    {"rows": output.checks[c.spec.key].rows, "mismatches": output.checks[c.spec.key].mismatches}
                    if c.spec.key in output.checks
                    else None
                ),
            }
            for c in result.cells
        ],
    }


def _sweep_mixed(
    *,
    backend: str,
    options: dict[str, Any],
    k: int,
    ladder: tuple[int, ...],
    out: Path,
    workload: Path | None,
    grid: Path | None,
    buckets: str,
    execution_mode: str,
    max_cells: int,
    min_verify_len: int,
    protocol: str,
    thresholds: Any,
    seed: int,
    fingerprint: Any,
    live: dict[str, Any],
    clock_policy: str | None,
    journal: Path | None,
    resume: bool,
    input_path: Path | None,
    require_precision: bool,
    as_json: bool,
) -> None:
    """``sweep --mixed``: plan, measure (or import) and report; exits the command."""
    import os

    from dspark_calibrate.artifacts import MixedRoute
    from dspark_calibrate.calibrate.deployment.workload import read_workload
    from dspark_calibrate.calibrate.measurement.mixed import plan_from_workload, read_grid
    from dspark_calibrate.calibrate.measurement.mixed_sweep import (
        MixedSweepRequest,
        execute_mixed,
        import_mixed,
    )

    try:
        ws = live.get("gpu_count") or (fingerprint.gpu_count if fingerprint is not None else None)
        ws = ws or int(os.environ.get("WORLD_SIZE", "1") or 1)
        route = MixedRoute(
            physical_k=k,
            world_size=ws,
            body_buckets=parse_option_ladder(buckets, option="--mixed-buckets"),
            execution_mode=execution_mode,
            min_verify_len=min_verify_len,
        )
        if backend == "import-samples":
            if input_path is None:
                raise ConfigError("--backend import-samples needs --input PROFILE.jsonl")
            result, output = import_mixed(
                input_path,
                route=route,
                ladder=ladder,
                out=out,
                fingerprint=fingerprint,
                live=live,
                clock_policy=clock_policy,
                thresholds=thresholds,
                seed=seed,
                command=tuple(sys.argv),
            )
        else:
            if (workload is None) == (grid is None):
                raise ConfigError(
                    "--mixed needs exactly one of --mixed-workload WORKLOAD and --mixed-grid GRID.json; give the "
                    "recorded workload whose mixed steps to measure, or a grid of steps"
                )
            if grid is not None:
                plan = read_grid(grid, route)
            else:
                assert workload is not None
                plan = plan_from_workload(read_workload(workload, k=k), route, max_cells=max_cells)
            progress = _SweepProgress(quiet=as_json)
            with progress.progress:
                result, maybe = execute_mixed(
                    MixedSweepRequest(
                        backend=backend,
                        plan=plan,
                        ladder=ladder,
                        out=out,
                        backend_options=options,
                        protocol=protocol,
                        thresholds=thresholds,
                        seed=seed,
                        fingerprint=fingerprint,
                        live=live,
                        clock_policy=clock_policy,
                        journal=journal,
                        resume=resume,
                        command=tuple(sys.argv),
                    ),
                    on_event=progress,
                )
            if maybe is None:  # not rank 0: rank 0 reports
                exit_with(EXIT_OK)
            output = maybe
    except MeasurementError as exc:
        fail(str(exc), code=exc.code, exit_code=EXIT_REJECTED, label="measurement failed")
    except DsparkError as exc:
        fail_error(exc)
    if as_json:
        print_json(_mixed_json(result, output))
    else:
        out_console.print(_mixed_table(result))
        out_console.print(f"wrote {output.output.summary_path} and {output.output.samples_path}")
    if not result.complete:
        missing = ", ".join(c.label() for c in result.unmeasured())
        err_console.print(f"[bold red]incomplete:[/] no kept samples for {missing}; raise --budget and --resume")
        exit_with(EXIT_REJECTED)
    if require_precision and not result.all_precise:
        exit_with(EXIT_REJECTED)
    exit_with(EXIT_OK)


def _run(request: Any, *, as_json: bool, require_precision: bool) -> None:
    from dspark_calibrate.calibrate.measurement.sweep import execute

    progress = _SweepProgress(quiet=as_json)
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
    except DsparkError as exc:
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
    if as_json:
        print_json(_json_report(result, output))
    else:
        out_console.print(_summary_table(result))
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

_P = "Measurement"


def register(app: typer.Typer) -> None:
    """Add the ``sweep`` command to the ``dspark-calibrate`` app."""

    @command(app, "sweep", *_EXAMPLES)
    def sweep_command(
        k: Annotated[
            int,
            typer.Option("--k", help="Physical draft length K (drafted tokens per block).", metavar="K"),
        ],
        ladder: Annotated[
            str,
            typer.Option("--ladder", help="Rank-local graph batch sizes, e.g. 8,16,32.", metavar="G1,G2,..."),
        ],
        out: Annotated[
            Path,
            typer.Option(
                "--out",
                help="Summary Parquet; samples go to <stem>.samples.parquet.",
                metavar="SWEEP.parquet",
            ),
        ],
        backend: Annotated[
            str,
            typer.Option(
                "--backend",
                help="synthetic | reference | module | trtllm | import-samples | pkg.mod:Factory.",
                metavar="NAME",
            ),
        ] = "synthetic",
        budgets: Annotated[
            list[str] | None,
            typer.Option(
                "--budgets",
                help="Compact budgets for one G, e.g. 16:20,24,32 (repeatable; default: all, thinned to "
                "--max-candidates).",
                metavar="G:V1,V2",
                show_default=False,
            ),
        ] = None,
        max_candidates: Annotated[
            int, typer.Option(help="Default compact candidates per G before thinning.", metavar="N")
        ] = 48,
        control: Annotated[
            bool, typer.Option("--control/--no-control", help="Measure V=G*(K+1) as a control.")
        ] = True,
        forced_k: Annotated[
            bool,
            typer.Option(
                "--forced-k/--no-forced-k",
                help="Measure the forced-K arm (confidence path on, windows forced to K) of every G "
                "when the backend offers it; build charges its excess as the per-step overhead.",
            ),
        ] = True,
        throttle_policy: Annotated[
            str,
            typer.Option(
                help="Which throttled samples to keep: serving (keep power-capped samples, the steady "
                "state of a serving GPU; drop thermal and hardware slowdowns), strict (drop every "
                "slowdown) or keep-all.",
                metavar="POLICY",
            ),
        ] = "serving",
        recapture_every: Annotated[
            int | None,
            typer.Option(
                help="Rounds per capture epoch: every that many rounds each cell is captured again and "
                "fully re-warmed, so the sweep estimates its own between-run variation (0: never; "
                "default 3, quick preset 2).",
                metavar="ROUNDS",
                show_default=False,
            ),
        ] = None,
        passes: Annotated[
            int,
            typer.Option(
                min=1,
                help="Run the sweep as this many consecutive processes over one journal, each one "
                "capture epoch of --recapture-every rounds, so what a new process draws (context, "
                "memory layout, clock state) enters the intervals; every cell spans all passes.",
            ),
        ] = 1,
        until_round: Annotated[
            int | None, typer.Option(hidden=True, help="End this process's pass before this round.")
        ] = None,
        epochs_required: Annotated[
            int | None, typer.Option(hidden=True, help="Epochs a cell spans before it may stop.")
        ] = None,
        pass_index: Annotated[
            int | None, typer.Option(hidden=True, help="This process's pass (its epoch).")
        ] = None,
        protocol: Annotated[
            str, typer.Option(help="adaptive (rounds, stop on precision) or fixed (128+64).", metavar="NAME")
        ] = "adaptive",
        preset: Annotated[
            str,
            typer.Option(
                help="Threshold preset: default, or quick (2% precision, small caps: CPU trials).",
                metavar="NAME",
            ),
        ] = "default",
        precision: Annotated[
            float | None,
            typer.Option(
                help="Target relative half-width (default 0.005 = 0.5%; quick preset 0.02).",
                metavar="REL",
                show_default=False,
            ),
        ] = None,
        min_samples: Annotated[
            int | None,
            typer.Option(
                help="Kept samples before a cell may stop (default 8).", metavar="N", show_default=False
            ),
        ] = None,
        min_rounds: Annotated[
            int | None,
            typer.Option(help="Rounds before a cell may stop (default 6).", metavar="N", show_default=False),
        ] = None,
        min_time: Annotated[
            float | None,
            typer.Option(
                help="Seconds per cell before it may stop (default 0).", metavar="S", show_default=False
            ),
        ] = None,
        max_samples: Annotated[
            int | None,
            typer.Option(help="Per-cell sample cap (default 48).", metavar="N", show_default=False),
        ] = None,
        max_cell_seconds: Annotated[
            float | None,
            typer.Option(
                help="Per-cell time cap in s (default 60; quick 10).", metavar="S", show_default=False
            ),
        ] = None,
        budget: Annotated[
            float | None,
            typer.Option(
                help="Total sweep budget in s (default 3600; quick 600).", metavar="S", show_default=False
            ),
        ] = None,
        warmup: Annotated[
            int | None,
            typer.Option(
                help="Warm-up replays on a cell's first visit (default 8).", metavar="N", show_default=False
            ),
        ] = None,
        rewarm: Annotated[
            int | None,
            typer.Option(
                help="Warm-up replays on later visits (default 2).", metavar="N", show_default=False
            ),
        ] = None,
        replays: Annotated[
            int | None,
            typer.Option(
                help="Back-to-back replays per sample (default 2).", metavar="N", show_default=False
            ),
        ] = None,
        samples_per_visit: Annotated[
            int | None, typer.Option(help="Samples per visit (default 2).", metavar="N", show_default=False)
        ] = None,
        seed: Annotated[
            int, typer.Option(help="Seed of the round order and the bootstrap.", metavar="N")
        ] = 0,
        resume: Annotated[
            bool, typer.Option("--resume", help="Continue the journal of an interrupted sweep.")
        ] = False,
        journal: Annotated[
            Path | None,
            typer.Option(
                help="Journal path (default <stem>.journal.jsonl).", metavar="FILE", show_default=False
            ),
        ] = None,
        config: Annotated[
            str | None,
            typer.Option(
                "--config",
                help="reference: HF-style config.json, or a bundled one: tiny, mla-tiny, deepseek-v3, llama-8b.",
                metavar="CONFIG",
                show_default=False,
            ),
        ] = None,
        layers: Annotated[
            int | None,
            typer.Option(
                help="reference: layers to build (default: the config's).", metavar="N", show_default=False
            ),
        ] = None,
        context_len: Annotated[
            int | None,
            typer.Option(
                help="reference: KV-cache tokens per row (default 256).", metavar="TOKENS", show_default=False
            ),
        ] = None,
        device: Annotated[
            str | None,
            typer.Option(
                help="reference: cpu or cuda[:i] (default: cuda when available).",
                metavar="DEV",
                show_default=False,
            ),
        ] = None,
        model: Annotated[
            str | None,
            typer.Option(
                "--model",
                help="trtllm: the model path or name for tensorrt_llm.LLM.",
                metavar="MODEL",
                show_default=False,
            ),
        ] = None,
        factory: Annotated[
            str | None,
            typer.Option(
                help="module: pkg.mod:factory returning a step for (G, V, K).",
                metavar="PKG.MOD:FN",
                show_default=False,
            ),
        ] = None,
        input_path: Annotated[
            Path | None,
            typer.Option(
                "--input", help="import-samples: profiler JSONL.", metavar="FILE", show_default=False
            ),
        ] = None,
        backend_opt: Annotated[
            list[str] | None,
            typer.Option(
                help="Backend option key=value (JSON value), e.g. ep=8, lm_head=false (repeatable).",
                metavar="KEY=VALUE",
                show_default=False,
            ),
        ] = None,
        memory_check: Annotated[
            bool,
            typer.Option(
                "--memory-check/--no-memory-check",
                help="reference: refuse to start when the estimated memory exceeds what the machine has.",
            ),
        ] = True,
        fingerprint: Annotated[
            Path | None,
            typer.Option(
                help="Fingerprint JSON with fields the sweep cannot establish (docs/fingerprint.md).",
                metavar="FP.json",
                show_default=False,
            ),
        ] = None,
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
        clock_policy: Annotated[
            str | None,
            typer.Option(
                help="GPU clock policy, e.g. default or locked:1980.", metavar="POLICY", show_default=False
            ),
        ] = None,
        plot: Annotated[
            bool, typer.Option("--plot/--no-plot", help="Write <stem>.png (needs matplotlib).")
        ] = True,
        require_precision: Annotated[
            bool, typer.Option(help="Exit 1 unless every cell reached precision.")
        ] = False,
        mixed: Annotated[
            bool,
            typer.Option(
                "--mixed",
                help="Measure mixed prefill+decode cells (each paired with its step's native width) instead of "
                "decode cells; see docs/mixed.md.",
                rich_help_panel="Mixed prefill+decode",
            ),
        ] = False,
        mixed_workload: Annotated[
            Path | None,
            typer.Option(
                help="--mixed: a recorded workload whose mixed steps say what to measure.",
                metavar="WORKLOAD.parquet",
                show_default=False,
                rich_help_panel="Mixed prefill+decode",
            ),
        ] = None,
        mixed_grid: Annotated[
            Path | None,
            typer.Option(
                help="--mixed: a JSON grid of steps to measure (instead of a workload).",
                metavar="GRID.json",
                show_default=False,
                rich_help_panel="Mixed prefill+decode",
            ),
        ] = None,
        mixed_buckets: Annotated[
            str,
            typer.Option(
                help="--mixed: the captured prefill body buckets (rows).",
                metavar="B1,B2,...",
                rich_help_panel="Mixed prefill+decode",
            ),
        ] = "96,128,192,256,384,512",
        mixed_execution_mode: Annotated[
            str,
            typer.Option(
                help="--mixed: the prefill graph mode of the deployment.",
                metavar="MODE",
                rich_help_panel="Mixed prefill+decode",
            ),
        ] = "BREAKABLE",
        mixed_max_cells: Annotated[
            int,
            typer.Option(
                help="--mixed: cells to measure at most (TensorRT-LLM holds <= 256).",
                metavar="N",
                rich_help_panel="Mixed prefill+decode",
            ),
        ] = 256,
        min_verify_len: Annotated[
            int,
            typer.Option(
                help="--mixed: draft tokens an eligible generation always keeps.",
                metavar="N",
                rich_help_panel="Mixed prefill+decode",
            ),
        ] = 1,
        as_json: JsonFlag = False,
    ) -> None:
        """Measure T(G, V) for the native and candidate cells of every G, with honest intervals.

        Before measuring, the reference backend estimates its memory and time and refuses what the
        machine cannot hold. Fields of the deployment fingerprint the sweep cannot probe come from
        the --live-* options or --fingerprint (docs/fingerprint.md). Ctrl-C keeps the journal:
        --resume continues.
        """
        from dspark_calibrate.artifacts import read_fingerprint
        from dspark_calibrate.calibrate.measurement.ladder import parse_budgets, parse_ladder
        from dspark_calibrate.calibrate.measurement.sweep import SweepRequest

        try:
            chosen = {
                name: v
                for name, v in {
                    "precision_rel": precision,
                    "min_samples": min_samples,
                    "min_rounds": min_rounds,
                    "min_time_s": min_time,
                    "max_samples_per_cell": max_samples,
                    "max_seconds_per_cell": max_cell_seconds,
                    "budget_s": budget,
                    "warmup_steps": warmup,
                    "rewarm_steps": rewarm,
                    "replays_per_sample": replays,
                    "samples_per_visit": samples_per_visit,
                    "throttle_policy": throttle_policy,
                    "recapture_every": recapture_every,
                    "epochs_required": epochs_required,
                }.items()
                if v is not None
            }
            if backend == "trtllm" and model is None and "model" not in " ".join(backend_opt or []):
                raise ConfigError(
                    "--backend trtllm needs a model; pass --model MODEL (the path or name tensorrt_llm.LLM loads)"
                )
            options = _backend_options(
                backend_opt or [],
                {
                    "config": config,
                    "layers": layers,
                    "context_len": context_len,
                    "device": device,
                    "factory": factory,
                    "model": model,
                },
            )
            live = LiveOptions(
                topology=live_topology,
                gpu=live_gpu,
                gpu_count=live_gpu_count,
                gpu_snapshot_sha256=live_gpu_snapshot_sha256,
                source_dir=live_source_dir,
                source_head=live_source_head,
                source_diff=live_source_diff,
                runtime_snapshot=live_runtime_snapshot,
                model_config=live_model_config,
                checkpoint_sha256=live_checkpoint_sha256,
                attention_backend=live_attention_backend,
                moe_backend=live_moe_backend,
                kv_dtype=live_kv_dtype,
            ).arguments()
            for name in ("max_draft_len", "rank_local_graph_batch_sizes"):
                live.pop(name)
            base_fp = read_fingerprint(fingerprint) if fingerprint is not None else None
            if mixed:
                _sweep_mixed(
                    backend=backend,
                    options=options,
                    k=k,
                    ladder=parse_ladder(ladder),
                    out=out,
                    workload=mixed_workload,
                    grid=mixed_grid,
                    buckets=mixed_buckets,
                    execution_mode=mixed_execution_mode,
                    max_cells=mixed_max_cells,
                    min_verify_len=min_verify_len,
                    protocol=protocol,
                    thresholds=_thresholds(protocol, preset, chosen),
                    seed=seed,
                    fingerprint=base_fp,
                    live=live,
                    clock_policy=clock_policy,
                    journal=journal,
                    resume=resume,
                    input_path=input_path,
                    require_precision=require_precision,
                    as_json=as_json or json_mode(),
                )
            if mixed_workload is not None or mixed_grid is not None:
                raise ConfigError("--mixed-workload and --mixed-grid need --mixed; add --mixed")
            request = SweepRequest(
                backend=backend,
                backend_options=options,
                k=k,
                ladder=parse_ladder(ladder),
                budgets=parse_budgets(budgets or []),
                max_candidates=max_candidates,
                include_control=control,
                forced_k=forced_k,
                out=out,
                journal=journal,
                resume=resume,
                protocol=protocol,
                thresholds=_thresholds(protocol, preset, chosen),
                seed=seed,
                fingerprint=base_fp,
                clock_policy=clock_policy,
                input=input_path,
                plot=plot and importlib.util.find_spec("matplotlib") is not None,
                command=tuple(sys.argv),
                live=live,
                check_memory=memory_check,
                until_round=until_round,
                pass_epoch=pass_index,
                world_size=live.get("gpu_count"),
            )
            if passes > 1:
                _run_in_passes(passes, request.thresholds.recapture_every or 3, resume, as_json, out)
        except DsparkError as exc:
            fail_error(exc)
        _run(request, as_json=as_json or json_mode(), require_precision=require_precision)
