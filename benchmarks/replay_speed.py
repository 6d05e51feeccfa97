"""Replay speed: 1M workload steps with 1,000 bootstrap resamples, plus the selector's per-step time.

Workload: synthetic, 1 rank, 1..16 rows per step (about 9 rows on average), K=5, generated first
and not timed. Cells: a deployed table of 3 graph sizes (4, 8, 16) with the native cell and 4
compact cells each. Timed, end to end as ``build`` runs it after cell selection:
``prepare_evidence`` (survivals, per-step ranking, every cell's yield and realized tokens, per-row
tokens for the request bootstrap), ``estimate_drain_guard`` and ``replay`` (selection, goodput,
block bootstrap over steps and request bootstrap, 1,000 resamples each, economics, per-bucket and
per-cell statistics, the selector-replay digest).

Run: ``.venv/bin/python benchmarks/replay_speed.py`` → ``benchmarks/results/replay.json``.
Target: <= 60 s wall on 2 cores for 1M steps and 1,000 resamples.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_result
from planner_speed import time_step

from dspark_calibrate.calibrate.deployment.replay import (
    BootstrapSettings,
    CellGrid,
    estimate_drain_guard,
    prepare_evidence,
    replay,
)
from dspark_calibrate.calibrate.deployment.workload import synthesize_workload
from dspark_calibrate.runtime_plugin.planner import Calibration

K = 5
TEMPERATURES = (1.3, 1.4, 1.5, 1.6, 1.7)
TARGET_S = 60.0


def grid() -> CellGrid:
    """Native + 4 compact cells for G = 4, 8, 16 (a staircase in V), with paired savings, so the
    replay runs the joint uncertainty model (workload x cost table)."""
    rows = []
    for g in (4, 8, 16):
        for v in (0, g + g // 2, 2 * g, 3 * g, 4 * g):
            tokens = g * (K + 1) if v == 0 else v
            t = 4.0 + 0.02 * g + 0.25 * -(-tokens // 8) + (0.05 if v else 0.0)
            t0 = 4.0 + 0.02 * g + 0.25 * -(-(g * (K + 1)) // 8)
            s = 1 - t / t0
            w = 0.002 if v else 0.0
            rows.append(
                {"graph_batch_size": g, "verifier_budget": v, "step_time_ms": t, "ci_low_ms": 0.996 * t,
                 "ci_high_ms": 1.004 * t, "saving": s, "saving_ci_low": s - w, "saving_ci_high": s + w,
                 "paired_rounds": 8, "common_mode_rel": 0.003, "level_rel": 0.0015}
            )  # fmt: skip
    return CellGrid.from_rows(K, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--max-rows", type=int, default=16)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    workload = synthesize_workload(
        k=K,
        steps=args.steps,
        ranks=args.ranks,
        max_rows=args.max_rows,
        seed=args.seed,
        temperatures=TEMPERATURES,
    )
    workload.arrays()
    generate_s = time.perf_counter() - t0
    cells = grid()
    calibration = Calibration.sts(TEMPERATURES)
    settings = BootstrapSettings(resamples=args.resamples, seed=args.seed)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    evidence = prepare_evidence(workload, cells, calibration, per_row=True)
    prepare_s = time.perf_counter() - wall0
    guard, estimate = estimate_drain_guard(evidence, minimum_predicted_gain=0.01)
    t1 = time.perf_counter()
    report = replay(evidence, drain_guard=guard, drain_guard_estimate=estimate, bootstrap=settings)
    replay_s = time.perf_counter() - t1
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    selector = time_step(1, repeat=5, number=300)
    results: dict[str, Any] = {
        "steps": args.steps,
        "rows": workload.rows,
        "ranks": args.ranks,
        "resamples": args.resamples,
        "bootstrap_methods": report.bootstrap["methods"],
        "cpus_available": len(os.sched_getaffinity(0)),
        "generate_seconds": round(generate_s, 2),
        "prepare_seconds": round(prepare_s, 2),
        "replay_seconds": round(replay_s, 2),
        "wall_seconds": round(wall, 2),
        "cpu_seconds": round(cpu, 2),
        "peak_rss_mib": round(peak_mib, 1),
        "target_seconds": TARGET_S,
        "meets_target": wall <= TARGET_S,
        "predicted_gain": report.predicted_gain,
        "predicted_gain_ci": [report.predicted_gain_ci_low, report.predicted_gain_ci_high],
        "compact_step_share": report.compact_step_share,
        "selector_per_step": selector,
    }
    path = write_result("replay", results)
    print(
        f"{args.steps} steps ({workload.rows} rows), {args.resamples} resamples: {wall:.1f} s wall "
        f"(prepare {prepare_s:.1f} s, replay {replay_s:.1f} s), {cpu:.1f} s CPU, peak {peak_mib:.0f} MiB; "
        f"target {TARGET_S:.0f} s"
    )
    print(f"selector: best {selector['us_per_step_best_single_call']} us per 256-row step")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
