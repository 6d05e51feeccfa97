"""``dspark-calibrate sweep``: measure T(G, V) over the graph ladder and write an unsigned sweep.

Thin: parses options into a :class:`~dspark_calibrate.calibrate.measurement.sweep.SweepRequest`, calls
:func:`~dspark_calibrate.calibrate.measurement.sweep.execute`, renders a progress bar and a summary table (or
``--json``). Exit codes: 0 every cell measured, 1 a measurement failed (or, with
``--require-precision``, a cell stopped short of the precision target), 2 usage or I/O error.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from dspark_calibrate.cli._common import (
    EXIT_OK,
    EXIT_REJECTED,
    JsonFlag,
    err_console,
    exit_with,
    fail_usage,
    out_console,
    print_json,
)
from dspark_calibrate.errors import ConfigError, DsparkError, MeasurementError

__all__ = ["register"]


def _parse_options(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--backend-opt {pair!r} must look like key=value")
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


def register(app: typer.Typer) -> None:
    """Add the ``sweep`` command to the ``dspark-calibrate`` app."""

    @app.command("sweep")
    def sweep_command(
        k: Annotated[int, typer.Option("--k", help="Physical draft length K (drafted tokens per block).")],
        ladder: Annotated[str, typer.Option("--ladder", help="Rank-local graph batch sizes, e.g. 8,16,32.")],
        out: Annotated[
            Path, typer.Option("--out", help="Summary Parquet; samples go to <stem>.samples.parquet.")
        ],
        backend: Annotated[
            str,
            typer.Option(
                "--backend",
                help="synthetic | reference | module | trtllm | import-samples | pkg.mod:Factory.",
            ),
        ] = "synthetic",
        budgets: Annotated[
            list[str] | None,
            typer.Option("--budgets", help="Compact budgets for one G, e.g. 16:20,24,32 (repeatable)."),
        ] = None,
        max_candidates: Annotated[
            int, typer.Option(help="Default compact candidates per G before thinning.")
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
            str | None,
            typer.Option(
                help="Which throttled samples to keep: serving (default: keep power-capped samples, the "
                "steady state of a serving GPU; drop thermal and hardware slowdowns), strict (drop every "
                "slowdown) or keep-all.",
            ),
        ] = None,
        recapture_every: Annotated[
            int | None,
            typer.Option(
                help="Rounds per capture epoch: every that many rounds each cell is captured again and "
                "fully re-warmed, so the sweep estimates its own between-run variation (0: never).",
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
            str, typer.Option(help="adaptive (rounds, stop on precision) or fixed (128+64).")
        ] = "adaptive",
        preset: Annotated[str, typer.Option(help="Threshold preset: default or quick.")] = "default",
        precision: Annotated[
            float | None, typer.Option(help="Target relative half-width (0.005 = 0.5%).")
        ] = None,
        min_samples: Annotated[int | None, typer.Option(help="Kept samples before a cell may stop.")] = None,
        min_rounds: Annotated[int | None, typer.Option(help="Rounds before a cell may stop.")] = None,
        min_time: Annotated[float | None, typer.Option(help="Seconds per cell before it may stop.")] = None,
        max_samples: Annotated[int | None, typer.Option(help="Per-cell sample cap.")] = None,
        max_cell_seconds: Annotated[float | None, typer.Option(help="Per-cell time cap (s).")] = None,
        budget: Annotated[float | None, typer.Option(help="Total sweep budget (s).")] = None,
        warmup: Annotated[int | None, typer.Option(help="Warm-up replays on a cell's first visit.")] = None,
        rewarm: Annotated[int | None, typer.Option(help="Warm-up replays on later visits.")] = None,
        replays: Annotated[int | None, typer.Option(help="Back-to-back replays per sample.")] = None,
        samples_per_visit: Annotated[int | None, typer.Option(help="Samples per visit.")] = None,
        seed: Annotated[int, typer.Option(help="Seed of the round order and the bootstrap.")] = 0,
        resume: Annotated[
            bool, typer.Option("--resume", help="Continue the journal of an interrupted sweep.")
        ] = False,
        journal: Annotated[
            Path | None, typer.Option(help="Journal path (default <stem>.journal.jsonl).")
        ] = None,
        config: Annotated[
            Path | None, typer.Option("--config", help="reference: HF-style config.json.")
        ] = None,
        layers: Annotated[int | None, typer.Option(help="reference: number of layers to build.")] = None,
        context_len: Annotated[int | None, typer.Option(help="reference: KV-cache tokens per row.")] = None,
        device: Annotated[str | None, typer.Option(help="reference: cpu or cuda[:i].")] = None,
        factory: Annotated[
            str | None, typer.Option(help="module: pkg.mod:factory returning a step for (G, V, K).")
        ] = None,
        input_path: Annotated[
            Path | None, typer.Option("--input", help="import-samples: profiler JSONL.")
        ] = None,
        backend_opt: Annotated[
            list[str] | None, typer.Option(help="Backend option key=value (JSON value).")
        ] = None,
        fingerprint: Annotated[
            Path | None, typer.Option(help="Fingerprint JSON with fields the sweep cannot establish.")
        ] = None,
        clock_policy: Annotated[
            str | None, typer.Option(help="GPU clock policy, e.g. default or locked:1980.")
        ] = None,
        plot: Annotated[
            bool, typer.Option("--plot/--no-plot", help="Write <stem>.png (needs matplotlib).")
        ] = True,
        require_precision: Annotated[
            bool, typer.Option(help="Exit 1 unless every cell reached precision.")
        ] = False,
        as_json: JsonFlag = False,
    ) -> None:
        """Measure T(G, V) for the native and candidate cells of every G, with honest intervals."""
        from dspark_calibrate.artifacts import read_fingerprint
        from dspark_calibrate.calibrate.measurement.ladder import parse_budgets, parse_ladder
        from dspark_calibrate.calibrate.measurement.stats import Thresholds
        from dspark_calibrate.calibrate.measurement.sweep import SweepEvent, SweepRequest, execute

        try:
            if preset not in ("default", "quick"):
                raise ConfigError(f"--preset {preset!r} is unknown; use default or quick")
            overrides = {
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
            }
            chosen = {name: v for name, v in overrides.items() if v is not None}
            if protocol == "fixed":
                thresholds = Thresholds.fixed_protocol(**chosen)
            elif preset == "quick":
                thresholds = Thresholds.quick(**chosen)
            else:
                thresholds = Thresholds.adaptive(**chosen)
            options = _parse_options(backend_opt or [])
            for key, value in (
                ("config", config),
                ("layers", layers),
                ("context_len", context_len),
                ("device", device),
                ("factory", factory),
            ):
                if value is not None:
                    options[key] = str(value) if isinstance(value, Path) else value
            base_fp = read_fingerprint(fingerprint) if fingerprint is not None else None
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
                thresholds=thresholds,
                seed=seed,
                fingerprint=base_fp,
                clock_policy=clock_policy,
                input=input_path,
                plot=plot and importlib.util.find_spec("matplotlib") is not None,
                command=tuple(sys.argv),
                until_round=until_round,
                pass_epoch=pass_index,
            )
            if passes > 1:
                _run_in_passes(passes, thresholds.recapture_every or 3, resume, as_json, out)
        except ConfigError as exc:
            fail_usage(str(exc))

        progress = Progress(
            TextColumn("[bold]sweep[/] round {task.fields[round]}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} cells"),
            TextColumn("{task.fields[current]}"),
            TimeRemainingColumn(),
            console=err_console,
            transient=True,
            disable=as_json or not err_console.is_terminal,
        )
        task = progress.add_task("sweep", total=None, round=0, current="")

        def on_event(event: SweepEvent) -> None:
            current = ""
            if event.cell is not None:
                hw = f" ±{100 * event.half_width_rel:.2f}%" if event.half_width_rel is not None else ""
                current = f"{event.cell.label()}{hw}"
            progress.update(
                task, total=event.cells_total, completed=event.cells_done, round=event.round, current=current
            )

        try:
            with progress:
                result, output = execute(request, on_event=on_event)
        except MeasurementError as exc:
            err_console.print(f"[bold red]measurement failed:[/] {exc}")
            if as_json:
                print_json({"ok": False, "error": "MEASUREMENT_FAILED", "message": str(exc)})
            exit_with(EXIT_REJECTED)
        except DsparkError as exc:
            if as_json:
                print_json({"ok": False, "error": "USAGE_OR_IO", "message": str(exc)})
            fail_usage(str(exc))
        if result.paused:
            err_console.print(
                f"pass ended before round {result.rounds}: {sum(c.decision.stops for c in result.cells)} of "
                f"{len(result.cells)} cells done; the next pass continues with --resume"
            )
            if as_json:
                print_json(
                    {"ok": True, "paused": True, "rounds": result.rounds, "journal": str(request.journal)}
                )
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
