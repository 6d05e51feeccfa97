"""Sweep efficiency and reproducibility benchmark (issue 3, "GPU runs and benchmark").

GPU-seconds are the sweep loop (first round to the end: capture, warm-up, timing, decisions,
journal) times the number of GPUs; model set-up is excluded and reported as part of wall_seconds.

Two subcommands:

``run``      one GPU job: sweeps the ``reference`` backend (DeepSeek-V3-shaped config by default)
             with the listed protocols, in this order, in one process, and writes per protocol
             ``<out-dir>/<protocol>.parquet`` (+ samples, journal) and ``<out-dir>/<protocol>.json``
             with the GPU-seconds (wall time of the sweep, capture included). Under ``torchrun``
             every rank takes part and rank 0 writes.
``compare``  CPU: combines job 1 (adaptive + fixed) and job 2 (adaptive, another GPU job) into
             ``sweep_efficiency.json``: ratio of GPU-seconds, share of cells whose medians agree
             within 1%, coverage of job 2's medians by job 1's stated intervals (and, for contrast,
             by naive within-run sample-bootstrap intervals), and the fixed-vs-adaptive differences.
``compare-heavy``  CPU: two separate jobs of the compute-bound (power-capped) step into the
             ``heavy_step`` key of ``sweep_efficiency.json``: each job's absolute intervals checked
             against the other job's medians (out of sample), the savings of the two jobs within
             0.5 pp, each job's saving interval against the other job's saving, the power-capped
             share of the kept samples, and the between-run components each job estimated.

Run from the repository root with ``PYTHONPATH=src``; see ``benchmarks/gpu_sweep_job.sh``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from dspark_calibrate.artifacts import read_artifact
from dspark_calibrate.calibrate.measurement.dwell import parse_dwell
from dspark_calibrate.calibrate.measurement.ladder import CellSpec, parse_budgets, parse_ladder
from dspark_calibrate.calibrate.measurement.stats import (
    CellSamples,
    Thresholds,
    estimate_between_run,
    sample_interval,
    summarize,
)
from dspark_calibrate.calibrate.measurement.sweep import SweepRequest, execute, samples_path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import git_commit

TARGETS = {"ratio": 0.33, "reproducible_share": 0.95, "ci_coverage": 0.90}
AGREE_REL = 0.01  # medians "agree" within 1%
#: Targets of the compute-bound step's two jobs.
HEAVY_TARGETS = {"ci_coverage_out_of_sample": 0.90, "saving_agreement_share": 0.95}
SAVING_AGREE = 0.005  # savings "agree" within 0.5 pp


def _device_info() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "host": platform.node()}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count_visible"] = torch.cuda.device_count()
            info["cuda"] = torch.version.cuda
    except ImportError:
        pass
    return info


def _thresholds(protocol: str, args: argparse.Namespace) -> Thresholds:
    if protocol == "fixed":
        return Thresholds.fixed_protocol(budget_s=args.fixed_budget)
    base = Thresholds.quick() if args.preset == "quick" else Thresholds.adaptive()
    extra: dict[str, Any] = {}
    if args.max_samples is not None:
        extra["max_samples_per_cell"] = args.max_samples
    if args.recapture_every is not None:
        extra["recapture_every"] = args.recapture_every
    if args.replays is not None:
        extra["replays_per_sample"] = args.replays
    if args.samples_per_visit is not None:
        extra["samples_per_visit"] = args.samples_per_visit
    return Thresholds.from_dict(
        {
            **base.to_dict(),
            "budget_s": args.adaptive_budget,
            "precision_rel": args.precision,
            "throttle_policy": args.throttle_policy,
            **extra,
        }
    )


def _run_passes(args: argparse.Namespace, argv: list[str]) -> int:
    """``--passes N``: the adaptive sweep as N consecutive processes of this script over one
    journal (each pass one epoch; see dspark_calibrate.calibrate.measurement.passes)."""
    for p in range(args.passes):
        cmd = [sys.executable, __file__, *argv, "--pass-index", str(p)]
        rc = subprocess.run(cmd, check=False).returncode
        if rc != 0:
            return rc
        if (Path(args.out_dir) / "adaptive.json").exists() and p < args.passes - 1:
            break  # every cell stopped early; the pass that saw it wrote the report
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run the listed protocols back to back in this process; write artifacts and JSON."""
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    if args.passes > 1 and args.pass_index is None:
        if args.protocols != "adaptive":
            raise SystemExit("--passes needs --protocols adaptive")
        for stale in out_dir.glob("adaptive*"):
            stale.unlink()
        return _run_passes(args, sys.argv[sys.argv.index("run") :])
    in_pass = args.pass_index is not None
    options: dict[str, Any] = {
        "config": args.config,
        "layers": args.layers,
        "context_len": args.context_len,
        "ep": args.ep,
        "max_rows": max(parse_ladder(args.ladder)),
        "max_row_len": args.k + 1,
    }
    if args.device:
        options["device"] = args.device
    for protocol in args.protocols.split(","):
        out = out_dir / f"{protocol}.parquet"
        for stale in (
            out,
            samples_path(out),
            out.with_name(out.stem + ".journal.jsonl"),
            out.with_suffix(".png"),
        ):
            if rank == 0 and stale.exists() and not in_pass:
                stale.unlink()
        thresholds = _thresholds(protocol, args)
        until_round = None
        if in_pass:
            rounds = args.recapture_every or 3
            thresholds = Thresholds.from_dict(
                {**thresholds.to_dict(), "recapture_every": rounds, "epochs_required": args.passes}
            )
            if args.pass_index < args.passes - 1:
                until_round = (args.pass_index + 1) * rounds
        request = SweepRequest(
            backend="reference",
            backend_options=options,
            k=args.k,
            ladder=parse_ladder(args.ladder),
            out=out,
            protocol=protocol,
            thresholds=thresholds,
            seed=args.seed,
            plot=False,
            max_candidates=args.max_candidates,
            budgets=parse_budgets(args.budgets or []),
            clock_policy=args.clock_policy,
            command=tuple(sys.argv),
            resume=in_pass and args.pass_index > 0,
            until_round=until_round,
            pass_epoch=args.pass_index,
            interleave=args.interleave,
            settle_s=args.settle_s,
            dwell=None if args.dwell is None else parse_dwell(args.dwell, parse_ladder(args.ladder)),
            resolve_rel=args.resolve,
        )
        marks: list[float] = []

        def on_event(event: Any, marks: list[float] = marks) -> None:
            # The measurement loop runs from the first round event to the end event; model setup
            # before it is the same for both protocols and is reported separately.
            if not marks or event.kind == "end":
                marks.append(time.perf_counter())

        t0 = time.perf_counter()
        result, output = execute(request, on_event=on_event)
        wall = time.perf_counter() - t0
        seconds = marks[-1] - marks[0] if len(marks) >= 2 else wall
        if in_pass:
            seconds = result.seconds  # every pass's measured seconds, from the shared journal
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass
        if output is None:
            print(f"pass {args.pass_index} of {args.passes} ended before round {result.rounds}")
            continue
        reasons: dict[str, int] = {}
        for c in result.cells:
            reasons[c.decision.reason] = reasons.get(c.decision.reason, 0) + 1
        world = int(os.environ.get("WORLD_SIZE", "1"))
        report = {
            "tag": args.tag,
            "protocol": protocol,
            "cells": len(result.cells),
            "complete": result.complete,
            "rounds": result.rounds,
            "gpu_seconds": seconds * world,
            "sweep_loop_seconds": seconds,
            "wall_seconds": wall,
            "measured_seconds": result.seconds,
            "world_size": world,
            "stop_reasons": reasons,
            "samples": sum(c.samples_taken for c in result.cells),
            "warmup_steps": sum(c.warmup_steps for c in result.cells),
            "median_half_width_rel": float(
                np.median([c.summary.half_width_rel for c in result.cells if c.summary])
            ),
            "summary_file": output.summary_path.name,
            "samples_file": output.samples_path.name,
            "summary_logical_sha256": output.summary_sha256,
            "thresholds": request.thresholds.to_dict(),
            "command": " ".join(sys.argv),
            "commit": git_commit(),
            **_device_info(),
        }
        (out_dir / f"{protocol}.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        print(
            json.dumps(
                {k: report[k] for k in ("tag", "protocol", "cells", "gpu_seconds", "rounds", "stop_reasons")}
            )
        )
    return 0


def _cells(path: Path) -> dict[tuple[int, int], dict[str, float]]:
    table = read_artifact(path).table.to_pylist()
    return {(r["graph_batch_size"], r["verifier_budget"]): r for r in table}


def _naive_intervals(summary: Path) -> dict[tuple[int, int], tuple[float, float]]:
    """Within-run sample-bootstrap intervals of each cell (what a back-to-back protocol reports)."""
    rows = read_artifact(samples_path(summary)).table.to_pylist()
    by: dict[tuple[int, int], list[float]] = {}
    for r in rows:
        if r["kept"]:
            by.setdefault((r["graph_batch_size"], r["verifier_budget"]), []).append(r["step_time_ms"])
    out = {}
    for key, values in by.items():
        iv = sample_interval(values, n_boot=500, seed=0)
        out[key] = (iv.low, iv.high)
    return out


def _recomputed_intervals(summary: Path) -> dict[tuple[int, int], tuple[float, float]]:
    """Reproduction intervals recomputed from the kept raw samples with this code's statistics
    (the between-epoch components estimated from the samples; samples without epochs fall back)."""
    k = read_artifact(summary).fingerprint_untrusted().max_draft_len or 1
    rows = read_artifact(samples_path(summary)).table.to_pylist()
    by: dict[tuple[int, int], tuple[list[float], list[int], list[int]]] = {}
    for r in rows:
        if r["kept"]:
            vals, rounds, epochs = by.setdefault((r["graph_batch_size"], r["verifier_budget"]), ([], [], []))
            vals.append(r["step_time_ms"])
            rounds.append(r["round"])
            epochs.append(int(r.get("epoch") or 0))
    cells = {
        CellSpec(g, v, k): CellSamples(CellSpec(g, v, k), tuple(vals), tuple(rounds), tuple(epochs))
        for (g, v), (vals, rounds, epochs) in by.items()
    }
    between = estimate_between_run(cells)
    out = {}
    for spec, samples in cells.items():
        s = summarize(samples, between=between)
        out[spec.key] = (s.ci_low_ms, s.ci_high_ms)
    return out


def cmd_compare(args: argparse.Namespace) -> int:
    """Combine two jobs' results into the benchmark JSON."""
    job1, job2 = Path(args.job1), Path(args.job2)
    a1, fx, a2 = (
        _cells(job1 / "adaptive.parquet"),
        _cells(job1 / "fixed.parquet"),
        _cells(job2 / "adaptive.parquet"),
    )
    meta_a1 = json.loads((job1 / "adaptive.json").read_text())
    meta_fx = json.loads((job1 / "fixed.json").read_text())
    meta_a2 = json.loads((job2 / "adaptive.json").read_text())
    common = sorted(set(a1) & set(a2))
    agree = [
        abs(a2[c]["step_time_ms"] - a1[c]["step_time_ms"]) / a1[c]["step_time_ms"] <= AGREE_REL
        for c in common
    ]
    covered = [a1[c]["ci_low_ms"] <= a2[c]["step_time_ms"] <= a1[c]["ci_high_ms"] for c in common]
    covered_back = [a2[c]["ci_low_ms"] <= a1[c]["step_time_ms"] <= a2[c]["ci_high_ms"] for c in common]
    naive = _naive_intervals(job1 / "adaptive.parquet")
    naive_cov = [naive[c][0] <= a2[c]["step_time_ms"] <= naive[c][1] for c in common if c in naive]
    # Coverage of job 2's medians by job 1's intervals recomputed from raw samples with the current
    # statistics (between-run term included); with a third job this is an out-of-sample check.
    recomputed = _recomputed_intervals(job1 / "adaptive.parquet")
    recomputed_cov = [
        recomputed[c][0] <= a2[c]["step_time_ms"] <= recomputed[c][1] for c in common if c in recomputed
    ]
    both = sorted(set(a1) & set(fx))
    diffs = {c: (fx[c]["step_time_ms"] - a1[c]["step_time_ms"]) / a1[c]["step_time_ms"] for c in both}
    # A fixed sweep cut short by its budget measured fewer cells; scale its cost to all cells so
    # the ratio compares like with like (flagged in the output).
    fixed_seconds = meta_fx["gpu_seconds"] * max(len(a1), 1) / max(len(fx), 1)
    ratio = meta_a1["gpu_seconds"] / fixed_seconds
    result: dict[str, Any] = {
        "gpu": meta_a1.get("gpu"),
        "cells": len(common),
        "adaptive_gpu_seconds": meta_a1["gpu_seconds"],
        "fixed_gpu_seconds": fixed_seconds,
        "fixed_gpu_seconds_raw": meta_fx["gpu_seconds"],
        "fixed_cells_measured": len(fx),
        "ratio": ratio,
        "reproducible_share": float(np.mean(agree)),
        "ci_coverage": float(np.mean(covered)),
        "ci_coverage_reverse": float(np.mean(covered_back)),
        "naive_within_run_ci_coverage": float(np.mean(naive_cov)) if naive_cov else None,
        "ci_coverage_recomputed": float(np.mean(recomputed_cov)) if recomputed_cov else None,
        "between_run_rel": "estimated per sweep from capture epochs",
        "max_fixed_vs_adaptive_rel": float(max(abs(d) for d in diffs.values())),
        "median_fixed_vs_adaptive_rel": float(np.median([abs(d) for d in diffs.values()])),
        "fixed_vs_adaptive_rel": {f"G{g}/V{v}": d for (g, v), d in sorted(diffs.items())},
        "adaptive_rounds": [meta_a1["rounds"], meta_a2["rounds"]],
        "adaptive_stop_reasons": [meta_a1["stop_reasons"], meta_a2["stop_reasons"]],
        "second_sweep_gpu_seconds": meta_a2["gpu_seconds"],
        "targets": TARGETS,
        "meets": {
            "ratio": ratio <= TARGETS["ratio"],
            "reproducible_share": float(np.mean(agree)) >= TARGETS["reproducible_share"],
            "ci_coverage": float(np.mean(covered)) >= TARGETS["ci_coverage"],
        },
        "command": meta_a1["command"],
        "command_job2": meta_a2["command"],
        "commit": meta_a1.get("commit"),
        "torch": meta_a1.get("torch"),
    }
    # Later jobs (other machine starts): each one's stated intervals are checked against every
    # other job's medians. Jobs swept with the current between-run term give the out-of-sample
    # coverage, since that term was fixed before they ran.
    jobs = {"job1": a1, "job2": a2}
    extra = []
    for path in args.job3 or []:
        name = Path(path).name
        cells = _cells(Path(path) / "adaptive.parquet")
        meta = json.loads((Path(path) / "adaptive.json").read_text())
        jobs[name] = cells
        extra.append((name, cells, meta))
    current = Thresholds().between_run_rel
    out_of_sample: list[bool] = []
    result["later_jobs"] = []
    for name, cells, meta in extra:
        term = meta.get("thresholds", {}).get("between_run_rel")
        entry: dict[str, Any] = {
            "job": name,
            "gpu_seconds": meta["gpu_seconds"],
            "rounds": meta["rounds"],
            "between_run_rel": term,
            "commit": meta.get("commit"),
            "command": meta["command"],
        }
        for other, ocells in jobs.items():
            if other == name:
                continue
            both_ = sorted(set(cells) & set(ocells))
            cov = [
                cells[c]["ci_low_ms"] <= ocells[c]["step_time_ms"] <= cells[c]["ci_high_ms"] for c in both_
            ]
            agree_ = [
                abs(cells[c]["step_time_ms"] - ocells[c]["step_time_ms"]) / ocells[c]["step_time_ms"]
                <= AGREE_REL
                for c in both_
            ]
            entry[f"ci_coverage_of_{other}_medians"] = float(np.mean(cov))
            entry[f"reproducible_share_vs_{other}"] = float(np.mean(agree_))
            if term == current:
                out_of_sample.extend(cov)
        result["later_jobs"].append(entry)
    if out_of_sample:
        result["ci_coverage_out_of_sample"] = float(np.mean(out_of_sample))
        result["meets"]["ci_coverage_out_of_sample"] = (
            result["ci_coverage_out_of_sample"] >= TARGETS["ci_coverage"]
        )
    if args.tp:
        tp = json.loads((Path(args.tp) / "adaptive.json").read_text())
        result["tp2"] = {
            k: tp.get(k)
            for k in (
                "gpu",
                "world_size",
                "cells",
                "complete",
                "gpu_seconds",
                "rounds",
                "stop_reasons",
                "median_half_width_rel",
                "command",
            )
        }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(
        json.dumps(
            {
                k: result[k]
                for k in ("cells", "ratio", "reproducible_share", "ci_coverage", "max_fixed_vs_adaptive_rel")
            }
        )
    )
    return 0


def _paired(path: Path) -> dict[tuple[int, int], dict[str, Any]]:
    return {c: r for c, r in _cells(path).items()}


def _saving_half(row: dict[str, Any]) -> float:
    return max(row["saving"] - row["saving_ci_low"], row["saving_ci_high"] - row["saving"])


def cmd_compare_heavy(args: argparse.Namespace) -> int:
    """Two separate jobs of the compute-bound step into the ``heavy_step`` key of the result JSON."""
    dirs = [Path(args.job1), Path(args.job2)]
    jobs = [_paired(d / "adaptive.parquet") for d in dirs]
    metas = [json.loads((d / "adaptive.json").read_text()) for d in dirs]
    provs = [read_artifact(d / "adaptive.parquet").provenance_untrusted().extra for d in dirs]
    common = sorted(set(jobs[0]) & set(jobs[1]))
    compact = [c for c in common if c[1] > 0 and jobs[0][c]["paired_rounds"] and jobs[1][c]["paired_rounds"]]
    covered, saving_cov = [], []
    for mine, other in ((jobs[0], jobs[1]), (jobs[1], jobs[0])):
        covered += [mine[c]["ci_low_ms"] <= other[c]["step_time_ms"] <= mine[c]["ci_high_ms"] for c in common]
        saving_cov += [
            mine[c]["saving_ci_low"] <= other[c]["saving"] <= mine[c]["saving_ci_high"] for c in compact
        ]
    diffs = [abs(jobs[0][c]["saving"] - jobs[1][c]["saving"]) for c in compact]
    # Each job's saving interval is a statement about the true saving; the other job's saving is
    # an estimate with its own error, so the fair check widens by both intervals in quadrature.
    reproduced = [
        diffs[i] <= math.hypot(_saving_half(jobs[0][c]), _saving_half(jobs[1][c]))
        for i, c in enumerate(compact)
    ]
    level = [float(np.log(jobs[0][c]["step_time_ms"] / jobs[1][c]["step_time_ms"])) for c in common]
    half = [
        (jobs[0][c]["ci_high_ms"] - jobs[0][c]["ci_low_ms"]) / 2 / jobs[0][c]["step_time_ms"] for c in common
    ]
    capped = [p.get("throttle", {}).get("power_capped_share") for p in provs]
    result: dict[str, Any] = {
        "gpu": metas[0].get("gpu"),
        "cells": len(common),
        "compact_cells": len(compact),
        "power_capped_share": min(x for x in capped if x is not None)
        if any(x is not None for x in capped)
        else None,
        "power_capped_share_per_job": capped,
        "throttle": [p.get("throttle") for p in provs],
        "ci_coverage_out_of_sample": float(np.mean(covered)),
        "saving_agreement_share": float(np.mean([d <= SAVING_AGREE for d in diffs])) if diffs else None,
        "saving_prediction_coverage": float(np.mean(saving_cov)) if saving_cov else None,
        "saving_reproduction_coverage": float(np.mean(reproduced)) if reproduced else None,
        "median_abs_saving_diff_pp": float(100 * np.median(diffs)) if diffs else None,
        "max_abs_saving_diff_pp": float(100 * np.max(diffs)) if diffs else None,
        "common_mode_shift_rel": float(np.median(level)),
        "median_abs_level_diff_rel": float(np.median(np.abs(level))),
        "median_ci_half_width_rel": float(np.median(half)),
        "between_run": [p.get("between_run") for p in provs],
        "gpu_seconds": [m["gpu_seconds"] for m in metas],
        "rounds": [m["rounds"] for m in metas],
        "stop_reasons": [m["stop_reasons"] for m in metas],
        "targets": HEAVY_TARGETS,
        "command": [m["command"] for m in metas],
        "commit": metas[0].get("commit"),
        "torch": metas[0].get("torch"),
    }
    result["meets"] = {
        "ci_coverage_out_of_sample": result["ci_coverage_out_of_sample"]
        >= HEAVY_TARGETS["ci_coverage_out_of_sample"],
        "saving_agreement_share": (result["saving_agreement_share"] or 0.0)
        >= HEAVY_TARGETS["saving_agreement_share"],
    }
    out = Path(args.out)
    record = json.loads(out.read_text()) if out.exists() else {}
    record["heavy_step"] = result
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "gpu",
                    "cells",
                    "power_capped_share",
                    "ci_coverage_out_of_sample",
                    "saving_agreement_share",
                    "median_abs_saving_diff_pp",
                    "common_mode_shift_rel",
                )
            }
        )
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and dispatch."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="one GPU job: sweep with the listed protocols")
    run.add_argument("--tag", required=True)
    run.add_argument("--protocols", default="adaptive,fixed")
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--k", type=int, default=5)
    run.add_argument("--ladder", default="1,2,4,8,16,32")
    run.add_argument("--config", default="deepseek-v3")
    run.add_argument("--layers", type=int, default=4)
    run.add_argument("--context-len", type=int, default=2048)
    run.add_argument("--ep", type=int, default=8)
    run.add_argument("--device", default=None)
    run.add_argument("--max-candidates", type=int, default=48)
    run.add_argument("--precision", type=float, default=0.005)
    run.add_argument("--preset", choices=("default", "quick"), default="default")
    run.add_argument("--adaptive-budget", type=float, default=150.0, help="seconds")
    run.add_argument("--fixed-budget", type=float, default=230.0, help="seconds")
    run.add_argument("--clock-policy", default="default")
    run.add_argument("--throttle-policy", default="serving", choices=("serving", "strict", "keep-all"))
    run.add_argument("--recapture-every", type=int, default=None)
    run.add_argument("--max-samples", type=int, default=None)
    run.add_argument("--replays", type=int, default=None, help="back-to-back replays per sample")
    run.add_argument("--samples-per-visit", type=int, default=None, help="samples per visit")
    run.add_argument("--passes", type=int, default=1, help="separate processes, each one epoch")
    run.add_argument("--pass-index", type=int, default=None, help=argparse.SUPPRESS)
    run.add_argument("--budgets", action="append", default=None, help="G:V1,V2 (repeatable)")
    run.add_argument(
        "--interleave", action="store_true", help="visit a G's cells in one step-by-step alternating sequence"
    )
    run.add_argument(
        "--settle-s", type=float, default=None, help="with --interleave: seconds of untimed mix per visit"
    )
    run.add_argument(
        "--dwell",
        default=None,
        help="with --interleave: mean run on one cell, steps, for every G or per G (--dwell)",
    )
    run.add_argument(
        "--resolve",
        type=float,
        default=None,
        help="with --interleave: measure each G on until its own cells resolve this paired shift (--resolve)",
    )
    run.add_argument("--out-dir", required=True)
    run.set_defaults(fn=cmd_run)
    heavy = sub.add_parser("compare-heavy", help="two jobs of the compute-bound step -> heavy_step")
    heavy.add_argument("--job1", required=True)
    heavy.add_argument("--job2", required=True)
    heavy.add_argument(
        "--out", default=str(Path(__file__).resolve().parent / "results" / "sweep_efficiency.json")
    )
    heavy.set_defaults(fn=cmd_compare_heavy)
    cmp_ = sub.add_parser("compare", help="combine job 1 and job 2 into sweep_efficiency.json")
    cmp_.add_argument("--job1", required=True)
    cmp_.add_argument("--job2", required=True)
    cmp_.add_argument("--tp", default=None)
    cmp_.add_argument(
        "--job3",
        action="append",
        default=None,
        help="a later adaptive job (repeatable), e.g. on another machine",
    )
    cmp_.add_argument(
        "--out", default=str(Path(__file__).resolve().parent / "results" / "sweep_efficiency.json")
    )
    cmp_.set_defaults(fn=cmd_compare)
    args = parser.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
