"""``dspark-calibrate demo``: every pipeline stage on CPU with synthetic data."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dspark_calibrate.cli._common import (
    EXIT_OK,
    JsonFlag,
    command,
    err_console,
    exit_with,
    fail_error,
    out_console,
    print_json,
    print_table,
)
from dspark_calibrate.errors import DsparkError

__all__ = ["register"]


def demo(
    out: Annotated[
        Path, typer.Option("--out", help="Output directory (replaced if it holds an earlier demo).")
    ],
    seed: Annotated[int, typer.Option("--seed", help="Seed of every synthetic input.")] = 0,
    force: Annotated[
        bool, typer.Option("--force", help="Replace a non-empty directory that is not a demo.")
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Run sweep → traces → fit → workload → build → export → verify → admit → report on synthetic data."""
    from dspark_calibrate.calibrate.demo import run_demo

    try:
        with err_console.status("demo") as status:
            result = run_demo(out, seed=seed, force=force, on_stage=lambda s: status.update(f"demo: {s}"))
    except (DsparkError, OSError) as exc:
        fail_error(exc)
    if json_out:
        print_json(result.to_dict())
        exit_with(EXIT_OK)
    table = Table(title="dspark-calibrate demo (synthetic evidence, ephemeral key)", show_header=False)
    lo, hi = result.predicted_gain_ci
    rows = [
        ("trust root", str(result.trust_root)),
        ("signed bundle", str(result.bundle)),
        ("cost table", str(result.cost_table)),
        ("TensorRT-LLM files", str(result.trtllm)),
        ("release report", str(result.report)),
        ("predicted gain", f"{result.predicted_gain:+.2%} (95% CI {lo:+.2%} .. {hi:+.2%})"),
        (
            "runtime admission",
            f"{'active' if result.admission_active else 'static K'} ({result.admission_reason})",
        ),
        ("stage times", ", ".join(f"{n} {s:.1f}s" for n, s in result.stages)),
    ]
    for name, value in rows:
        table.add_row(name, value)
    print_table(table)
    out_console.print(
        f"verify: dspark-verify {result.cost_table} --trust-root {result.trust_root} --allow-synthetic"
    )
    exit_with(EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add ``demo`` to the app."""
    command(app, "demo", "dspark-calibrate demo --out demo-out")(demo)
