"""Benchmark of ``dspark-calibrate fit --method sts`` at serving scale, and continuous vs grid STS.

Generates synthetic traces (default 10M rounds, K=5) with a known truth, writes them as a trace
Parquet file, then measures separately:

- ``read_seconds``: reading and validating the file into a ``TraceSet``;
- ``seconds``: the whole fit without reading (data checks, request split, risk sets, the
  continuous STS maximum-likelihood solve, held-out metrics before and after with 200
  request-level bootstrap replicates), the number the issue's target (<= 10 s on 2 cores)
  applies to; the fastest of ``--repeat`` runs, with every run's wall and CPU time kept;
- the grid baseline (41 temperatures, greedy left to right, minimising ECE) fitted on the same
  fit set and scored on the same held-out requests, for ``nll_grid`` / ``ece_grid``.

ECE values are the mean over positions of the held-out equal-width (15-bin, L1) ECE of S_j.
Writes ``benchmarks/results/fit.json``.

Usage:
    python benchmarks/fit_speed.py [--rounds 10000000] [--k 5] [--out benchmarks/results/fit.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dspark_calibrate.calibrate.confidence.fit import FitOptions, fit_traces
from dspark_calibrate.calibrate.confidence.synth_traces import SynthSpec, write_synth_traces
from dspark_calibrate.calibrate.confidence.traces import read_traces

TARGET_SECONDS = 10.0  # the target for 10M rounds, K=5, on 2 cores


def _commit(repo: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.strip()
    return text or None


def _machine() -> dict[str, object]:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        affinity = os.cpu_count() or 0
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpus": affinity,
    }


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10_000_000)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="timed fits; the fastest is reported")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fit.json")
    args = parser.parse_args(argv)

    repo = Path(__file__).resolve().parent.parent
    spec = SynthSpec(rounds=args.rounds, k=args.k, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="dspark-fit-bench-") as tmp:
        path = Path(tmp) / "traces.parquet"
        t0 = time.perf_counter()
        write_synth_traces(path, spec)
        gen_seconds = time.perf_counter() - t0
        file_bytes = path.stat().st_size
        t0 = time.perf_counter()
        traces = read_traces([path])
        read_seconds = time.perf_counter() - t0

    # The timed runs: the whole fit without reading, repeated because the host is shared; the
    # fastest run is reported (the usual convention for wall-clock benchmarks), every run is kept.
    options = FitOptions(method="sts", seed=args.seed)
    runs, cpu_runs = [], []
    for _ in range(args.repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fit_traces(traces, options)
        runs.append(time.perf_counter() - w0)
        cpu_runs.append(time.process_time() - c0)
    # One more run with the grid baseline for the quality comparison (its time is reported apart).
    result = fit_traces(traces, FitOptions(method="sts", seed=args.seed, grid_baseline=True))
    assert result.grid is not None
    truth = spec.true_temperatures()
    fitted = result.calibration.sts_temperatures()
    record = {
        "rounds": traces.rounds,
        "k": traces.k,
        "seconds": round(min(runs), 3),
        "seconds_runs": [round(r, 3) for r in runs],
        "cpu_seconds_runs": [round(r, 3) for r in cpu_runs],
        "read_seconds": round(read_seconds, 3),
        "target_seconds": TARGET_SECONDS,
        "meets_target": min(runs) <= TARGET_SECONDS,
        "stage_seconds": {name: round(v, 3) for name, v in result.timings.items()},
        "grid_seconds": round(result.grid.seconds, 3),
        "generate_seconds": round(gen_seconds, 3),
        "trace_file_bytes": file_bytes,
        "fit_rounds": result.fit_rounds,
        "holdout_rounds": result.holdout_rounds,
        "holdout_requests": result.holdout_requests,
        "bootstrap_replicates": result.after.bootstrap,
        "nll_continuous": result.after.nll.value,
        "nll_grid": result.grid.metrics.nll.value,
        "nll_raw": result.before.nll.value,
        "ece_continuous": _mean([p.ece.value for p in result.after.positions]),
        "ece_grid": _mean([p.ece.value for p in result.grid.metrics.positions]),
        "ece_continuous_per_position": [p.ece.value for p in result.after.positions],
        "ece_grid_per_position": [p.ece.value for p in result.grid.metrics.positions],
        "ece_definition": "mean over positions of held-out 15-bin equal-width L1 ECE of S_j",
        "true_temperatures": list(truth),
        "temperatures_continuous": list(fitted),
        "temperatures_grid": list(result.grid.calibration.sts_temperatures()),
        "max_relative_temperature_error": max(abs(f - t) / t for f, t in zip(fitted, truth, strict=True)),
        "machine": _machine(),
        "command": " ".join(
            ["python", "benchmarks/fit_speed.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "commit": _commit(repo),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(json.dumps(record, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
