"""``dspark-calibrate workload synth|import-trtllm``: make workload traces for ``build``.

Exit codes: 0 written, 2 usage or I/O errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from dspark_calibrate.cli._common import (
    EXIT_OK,
    JsonFlag,
    check_output_file,
    command,
    exit_with,
    fail_error,
    fail_usage,
    make_app,
    out_console,
    print_json,
)
from dspark_calibrate.errors import DsparkError

__all__ = ["register", "workload_app"]

workload_app = make_app(None, "Create workload traces (recorded serving steps) for build.")

#: Suffixes of the workload file (a Parquet table, whatever name it is given).
_PARQUET = (".parquet", ".pq")


def _report(path: Path, describe: Mapping[str, Any], json_out: bool) -> None:
    if json_out:
        print_json({"path": str(path), **describe})
        return
    out_console.print(
        f"wrote {path}: {describe['steps']} steps, {describe['rows']} rows, K={describe['k']}, "
        f"{describe['num_ranks']} rank(s), approximate={describe['approximate']}, "
        f"synthetic={describe['synthetic']}"
    )
    for note in describe.get("notes") or []:
        out_console.print(f"note: {note}")


@command(
    workload_app,
    "synth",
    "dspark-calibrate workload synth --k 5 --steps 4000 --out workload.parquet",
)
def synth(
    out: Annotated[Path, typer.Option("--out", help="Parquet file to write.", metavar="WORKLOAD.parquet")],
    k: Annotated[int, typer.Option("--k", help="Draft length K.")] = 5,
    steps: Annotated[int, typer.Option("--steps", help="Decode steps.")] = 4000,
    ranks: Annotated[int, typer.Option("--ranks", help="Attention-DP ranks.")] = 1,
    max_rows: Annotated[int, typer.Option("--max-rows", help="Most rows per rank in a step.")] = 32,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    temperatures: Annotated[
        str | None,
        typer.Option(
            "--temperatures",
            help="STS temperatures of the synthetic head, one per position, e.g. 1.3,1.4,1.5,1.6,1.7 "
            "(default: built in).",
            metavar="T1,...,TK",
            show_default=False,
        ),
    ] = None,
    prefill_share: Annotated[
        float,
        typer.Option(
            "--prefill-share",
            help="Share of mixed (prefill + decode) steps; above 0 the load takes --levels rows per rank "
            "and a mixed step runs one context chunk (writes <stem>.mixed.parquet beside --out).",
        ),
    ] = 0.0,
    levels: Annotated[
        str, typer.Option("--levels", help="With --prefill-share: rows per rank, e.g. 6,10,14.")
    ] = "6,10,14",
    chunk_sizes: Annotated[
        str, typer.Option("--chunk-sizes", help="With --prefill-share: context chunk sizes.")
    ] = "48,96",
    positions: Annotated[
        str, typer.Option("--positions", help="With --prefill-share: prompt positions of the chunks.")
    ] = "128,256",
    history: Annotated[
        int, typer.Option("--history", help="With --prefill-share: KV history of generations.")
    ] = 1024,
    json_out: JsonFlag = False,
) -> None:
    """Generate a synthetic workload (marked synthetic: build needs --allow-synthetic)."""
    from dspark_calibrate.calibrate.deployment.workload import (
        synthesize_mixed_workload,
        synthesize_workload,
        write_workload,
    )

    try:
        temps = [float(t) for t in temperatures.split(",")] if temperatures else None
    except ValueError:
        fail_usage(f"--temperatures {temperatures!r} is not a list of numbers; give e.g. 1.3,1.4,1.5")
    def ints(text: str, option: str) -> list[int]:
        try:
            return [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            fail_usage(f"{option} {text!r} is not a list of integers; give e.g. 48,96")

    try:
        check_output_file(out, suffixes=_PARQUET, what="the workload (a Parquet file)")
        if prefill_share > 0:
            w = synthesize_mixed_workload(
                k=k,
                steps=steps,
                ranks=ranks,
                levels=ints(levels, "--levels"),
                prefill_share=prefill_share,
                chunk_sizes=ints(chunk_sizes, "--chunk-sizes"),
                positions=ints(positions, "--positions"),
                history=history,
                seed=seed,
                temperatures=temps,
            )
        else:
            w = synthesize_workload(
                k=k, steps=steps, ranks=ranks, max_rows=max_rows, seed=seed, temperatures=temps
            )
        write_workload(out, w)
    except DsparkError as exc:
        fail_error(exc)
    _report(out, w.describe(), json_out)
    exit_with(EXIT_OK)


@command(
    workload_app,
    "import-trtllm",
    "dspark-calibrate workload import-trtllm traces/conf.rank0.pt traces/conf.rank1.pt --out workload.parquet",
)
def import_trtllm(
    shards: Annotated[
        list[Path],
        typer.Argument(
            help="TensorRT-LLM confidence-trace shards (<stem>.rank<r>.pt).",
            metavar="SHARD.pt",
            show_default=False,
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="Parquet file to write.", metavar="WORKLOAD.parquet")],
    json_out: JsonFlag = False,
) -> None:
    """Convert TensorRT-LLM recorder shards into a workload (approximate when step ids are absent)."""
    from dspark_calibrate.calibrate.deployment.workload import read_recorder_shards, write_workload

    try:
        check_output_file(out, suffixes=_PARQUET, what="the workload (a Parquet file)")
        w = read_recorder_shards(shards)
        write_workload(out, w)
    except DsparkError as exc:
        fail_error(exc)
    _report(out, w.describe(), json_out)
    exit_with(EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add the ``workload`` group to the app."""
    app.add_typer(workload_app, name="workload")
