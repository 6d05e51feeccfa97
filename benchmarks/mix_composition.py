"""Does a compact cell's saving at the power cap depend on how much of the mix is native steps?

An interleaved sweep alternates a G's cells with equal shares; a serving policy (and the
independent harness, 40% native) may run the native graph more often. Under a power cap the
mix's share of heavy steps sets the clock, and a compute-bound native step slows with the clock
more than a lighter compact one, so the saving can move with the share. This benchmark times, per
G, designs that differ only in the native share and the stay probability (every step timed with
CUDA events between back-to-back replays, each design run after ``--settle-s`` of its own mix,
designs in a random order per repeat) and reports each compact cell's saving two ways: the
median of its steps over the native's (the harness's estimator) and the median of the means of
two consecutive steps of each cell (the sweep's sample).

Run (one GPU, ~3 minutes): ``PYTHONPATH=src python3 benchmarks/mix_composition.py --out DIR``;
``--tiny`` runs it on the CPU with the tiny config in seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result
from independent_harness import FULL, TINY, Mode, _Nvml, open_backend, warm_steps
from settling_curve import _run_mix, _run_mix_host, _timed

from dspark_calibrate.calibrate.measurement.ladder import parse_ladder

#: (name, native share, stay probability): the sweep's two designs, the harness's, native-heavy.
DESIGNS = (
    ("equal-switching", None, 0.0),
    ("equal-runs", None, 0.75),
    ("harness", 0.4, 0.5),
    ("native-half-switching", 0.5, 0.0),
    ("native-half-runs", 0.5, 0.75),
)


def weighted_sequence(
    rng: np.random.Generator, cells: int, steps: int, native_share: float | None, stay: float
) -> list[int]:
    """``steps`` cell indices (0 = native): each step stays on the previous cell with probability
    ``stay``, else draws a cell, the native one with probability ``native_share`` (equal shares
    where None) and the rest sharing the remainder."""
    share = 1.0 / cells if native_share is None else native_share
    weights = np.array([share] + [(1.0 - share) / (cells - 1)] * (cells - 1))
    draws = rng.choice(cells, size=steps, p=weights)
    keep = rng.random(steps) < stay
    out = [int(draws[0])]
    for i in range(1, steps):
        out.append(out[-1] if keep[i] else int(draws[i]))
    return out


def savings(order: Sequence[int], ms: Sequence[float], cells: int) -> dict[str, Any]:
    """Per cell: its steps' median and the median of means of two consecutive steps of it; the
    saving of each against the native cell's same statistic; the native share realised."""
    per = [[m for i, m in zip(order, ms, strict=True) if i == c] for c in range(cells)]
    med = [float(np.median(p)) if p else float("nan") for p in per]
    pairs = [
        float(np.median([(p[j] + p[j + 1]) / 2 for j in range(0, len(p) - 1, 2)]))
        if len(p) > 1
        else float("nan")
        for p in per
    ]
    return {
        "native_share": float(np.mean(np.asarray(order) == 0)),
        "median_ms": med,
        "saving_median": [1.0 - m / med[0] for m in med],
        "saving_pairs": [1.0 - m / pairs[0] for m in pairs],
        "steps": [len(p) for p in per],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--g", default="64,256", help="G to time (default 64,256)")
    parser.add_argument("--settle-s", type=float, default=1.5)
    parser.add_argument("--timed-s", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    mode: Mode = TINY if args.tiny else FULL
    import torch

    s = mode.step
    ladder = parse_ladder(str(s["ladder"]))
    backend, cuda = open_backend(mode)
    nvml = _Nvml(cuda)
    gs = [int(g) for g in args.g.split(",")] if cuda else [ladder[-1]]
    scale = 1.0 if cuda else 1.0 / 40.0
    cells = mode.cells()
    rng = np.random.default_rng(5)
    results = []
    t0 = time.perf_counter()
    for g in gs:
        group = [c for c in cells if c.graph_batch_size == g]
        steps = [backend.prepare(c) for c in group]
        warm_steps(steps, cuda)
        probe = [_timed(st, torch, cuda) for st in steps]
        mean_ms = float(np.mean(probe))
        for rep in range(args.repeats):
            for d in rng.permutation(len(DESIGNS)).tolist():
                name, share, stay = DESIGNS[d]
                settle = weighted_sequence(
                    rng, len(group), max(int(args.settle_s * scale * 1000 / mean_ms), 8), share, stay
                )
                timed = weighted_sequence(
                    rng, len(group), max(int(args.timed_s * scale * 1000 / mean_ms), 16), share, stay
                )
                if cuda:
                    _run_mix(torch, steps, settle, mode.chunk, nvml)
                    ms, readings = _run_mix(torch, steps, timed, mode.chunk, nvml)
                else:
                    _run_mix_host(steps, settle)
                    ms, readings = _run_mix_host(steps, timed)
                row = {"g": g, "design": name, "repeat": rep, **savings(timed, ms, len(group))}
                row["cells"] = [f"G{c.graph_batch_size}/V{c.verifier_budget}" for c in group]
                if readings:
                    row["sm_clock_mhz"] = float(np.median([r[1][0] for r in readings]))
                    row["power_w"] = float(np.median([r[1][1] for r in readings]))
                results.append(row)
                print(
                    f"G{g} {name:22s} rep {rep}: native share {row['native_share']:.2f}, clock "
                    f"{row.get('sm_clock_mhz')}, savings (median) "
                    + ", ".join(f"{100 * x:.2f}" for x in row["saving_median"][1:])
                    + " | (pairs) "
                    + ", ".join(f"{100 * x:.2f}" for x in row["saving_pairs"][1:]),
                    flush=True,
                )
    gpu = torch.cuda.get_device_name(0) if cuda else "cpu"
    backend.close()
    data = {
        "gpu": gpu,
        "step": dict(s),
        "designs": [list(d) for d in DESIGNS],
        "settle_s": args.settle_s,
        "timed_s": args.timed_s,
        "seconds": time.perf_counter() - t0,
        "results": results,
    }
    write_result("mix_composition", data, out_dir=args.out, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
