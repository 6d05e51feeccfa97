"""How long a G's step times and savings take to settle after the GPU leaves another G.

The interleaved sweep runs each G's cells as one alternating mix and lets the mix run untimed
for a while before timing it (the settle). A power-capped GPU's clock, power and temperature
follow the load with some delay, so a visit that follows a heavy G starts at another operating
point than one that follows a light G, and a serving engine that stays at one G for seconds sees
the settled point. This benchmark measures that delay on the heavy step of the H200 jobs
(``independent_harness.FULL``): for each transition ``A -> B`` it runs G=A's mix for
``--from-s`` seconds, then G=B's mix for ``--to-s`` seconds, timing every step with CUDA events
between back-to-back graph replays (the device never idles) and reading NVML every chunk.

Per transition and time window since the switch it reports each cell's median step, each compact
cell's saving against the native cell in that window, and the median SM clock and power; and,
per transition, ``settle_s``: the first window edge after which every later window's savings
stay within ``--tolerance-pp`` of the settled savings (the median over the last third of the
dwell) and the native median within ``--tolerance-rel`` of its settled value.

Run (one GPU, ~2 minutes): ``PYTHONPATH=src python3 benchmarks/settling_curve.py --out DIR``;
``--tiny`` runs the same on the CPU with the tiny config in seconds (host-clock timings).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result
from independent_harness import FULL, TINY, Mode, _Nvml, alternating_sequence, open_backend, warm_steps

from dspark_calibrate.calibrate.measurement.ladder import CellSpec, parse_ladder

#: Window edges (seconds since the switch) the curves are binned by.
EDGES_S = (0.0, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0)
#: Transitions on the GPU: into a mid G from both ends, into the heaviest from the lightest and
#: back, and into the heavy G=128 from G=8.
TRANSITIONS = ((8, 64), (256, 64), (8, 256), (256, 8), (8, 128), (64, 256))


def _run_mix(
    torch: Any, steps: Sequence[Any], order: Sequence[int], chunk: int, nvml: _Nvml
) -> tuple[list[float], list[tuple[int, tuple[float, float, int]]]]:
    """Each step's ms (events between back-to-back replays) and NVML readings keyed by the last
    step known to be complete when they were read."""
    stream = torch.cuda.Stream()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(len(order) + 1)]
    readings: list[tuple[int, tuple[float, float, int]]] = []
    with torch.cuda.stream(stream):
        for start in range(0, len(order), chunk):
            for i in range(start, min(start + chunk, len(order))):
                events[i].record(stream)
                steps[order[i]]()
            if start:
                events[start].synchronize()
                r = nvml.read()
                if r is not None:
                    readings.append((start - 1, r))
        events[-1].record(stream)
    events[-1].synchronize()
    return [float(events[i].elapsed_time(events[i + 1])) for i in range(len(order))], readings


def _run_mix_host(steps: Sequence[Any], order: Sequence[int]) -> tuple[list[float], list[Any]]:
    out = []
    for i in order:
        t0 = time.perf_counter()
        steps[i]()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out, []


def curve(
    cells: Sequence[CellSpec],
    order: Sequence[int],
    ms: Sequence[float],
    readings: Sequence[tuple[int, tuple[float, float, int]]],
    edges: Sequence[float],
) -> list[dict[str, Any]]:
    """Bin one dwell by time since its start: per window each cell's median, each cell's saving
    against the native (``cells[0]``) median, and the median clock and power read in it."""
    t_end = np.cumsum(np.asarray(ms, dtype=np.float64)) / 1000.0  # each step's end, seconds
    idx = np.asarray(order)
    out = []
    for lo, hi in itertools.pairwise(edges):
        sel = (t_end > lo) & (t_end <= hi)
        if not sel.any():
            continue
        row: dict[str, Any] = {"from_s": lo, "to_s": hi, "steps": int(sel.sum()), "cells": {}}
        arr = np.asarray(ms)
        medians = {}
        for i, _c in enumerate(cells):
            mine = arr[sel & (idx == i)]
            if len(mine):
                medians[i] = float(np.median(mine))
        native = medians.get(0)
        for i, m in medians.items():
            row["cells"][f"G{cells[i].graph_batch_size}/V{cells[i].verifier_budget}"] = {
                "median_ms": m,
                "saving": (1.0 - m / native) if native else None,
            }
        inside = [r for last, r in readings if lo < t_end[last] <= hi]
        if inside:
            row["sm_clock_mhz"] = float(np.median([r[0] for r in inside]))
            row["power_w"] = float(np.median([r[1] for r in inside]))
        out.append(row)
    return out


def settle_time(
    rows: Sequence[Mapping[str, Any]], *, tolerance_pp: float, tolerance_rel: float
) -> dict[str, Any]:
    """The first window start from which every window's savings stay within ``tolerance_pp`` of
    the settled savings and the native median within ``tolerance_rel`` of its settled value (the
    settled values: medians over the windows that start in the dwell's last third); None when
    only those last windows agree with them (the dwell did not settle before its last third), or
    when no window of that last third ran the native cell (nothing to settle against: a dwell of
    a few slow steps, as on a busy CPU)."""
    if not rows:
        return {"settle_s": None}
    end = rows[-1]["to_s"]
    tail = [r for r in rows if r["from_s"] >= end * 2.0 / 3.0] or [rows[-1]]
    names = sorted({n for r in rows for n in r["cells"]})
    native = next((n for n in names if n.endswith("/V0")), None)
    if native is None or not any(native in r["cells"] for r in tail):
        return {"settle_s": None, "no_native_window": True}
    settled_saving = {
        n: float(np.median(vals))
        for n in names
        if (
            vals := [r["cells"][n]["saving"] for r in tail if r["cells"].get(n, {}).get("saving") is not None]
        )
    }
    settled_native = float(np.median([r["cells"][native]["median_ms"] for r in tail if native in r["cells"]]))
    off = []
    for r in rows:
        worst_pp = max(
            (
                abs(r["cells"][n]["saving"] - s) * 100.0
                for n, s in settled_saving.items()
                if r["cells"].get(n, {}).get("saving") is not None
            ),
            default=0.0,
        )
        nat = r["cells"].get(native)
        rel = abs(nat["median_ms"] / settled_native - 1.0) if nat else 0.0
        off.append((r["from_s"], worst_pp, rel))
    settle: float | None = 0.0
    for start, pp, rel in off:
        if pp > tolerance_pp or rel > tolerance_rel:
            settle = None
        elif settle is None:
            settle = start
    if settle is not None and settle >= tail[0]["from_s"] and off[0][0] < tail[0]["from_s"]:
        settle = None  # only the windows the settled values come from agree with them
    return {
        "settle_s": settle,
        "settled_savings": settled_saving,
        "settled_native_ms": settled_native,
        "first_window_off_pp": off[0][1],
        "first_window_native_rel": off[0][2],
        "windows": [{"from_s": s, "saving_off_pp": pp, "native_off_rel": rel} for s, pp, rel in off],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tiny", action="store_true", help="the CPU pipeline on the tiny config")
    parser.add_argument("--from-s", type=float, default=4.0, help="dwell at the G left (s)")
    parser.add_argument("--to-s", type=float, default=8.0, help="dwell at the G entered (s)")
    parser.add_argument("--repeats", type=int, default=2, help="times each transition runs")
    parser.add_argument("--tolerance-pp", type=float, default=0.2)
    parser.add_argument("--tolerance-rel", type=float, default=0.002)
    args = parser.parse_args(argv)
    mode: Mode = TINY if args.tiny else FULL
    import torch

    s = mode.step
    ladder = parse_ladder(str(s["ladder"]))
    backend, cuda = open_backend(mode)
    nvml = _Nvml(cuda)
    cells = mode.cells()
    by_g = {g: [c for c in cells if c.graph_batch_size == g] for g in ladder}
    steps = {c: backend.prepare(c) for c in cells}
    warm_steps(steps.values(), cuda)
    transitions = TRANSITIONS if cuda else ((ladder[0], ladder[-1]), (ladder[-1], ladder[0]))
    edges = EDGES_S if cuda else tuple(e / 40.0 for e in EDGES_S)
    from_s, to_s = (args.from_s, args.to_s) if cuda else (args.from_s / 40.0, args.to_s / 40.0)
    rng = np.random.default_rng(11)
    medians = {c: float(np.median([_timed(steps[c], torch, cuda) for _ in range(5)])) for c in cells}
    results = []
    t0 = time.perf_counter()
    for rep in range(args.repeats):
        for a, b in transitions:
            for g, dwell in ((a, from_s), (b, to_s)):
                group = by_g[g]
                mean_ms = float(np.mean([medians[c] for c in group]))
                n = max(int(dwell * 1000.0 / mean_ms), 8)
                order = alternating_sequence(rng, group, n)
                fn = [steps[c] for c in group]
                if cuda:
                    ms, readings = _run_mix(torch, fn, order, mode.chunk, nvml)
                else:
                    ms, readings = _run_mix_host(fn, order)
            rows = curve(by_g[b], order, ms, readings, [e for e in edges if e <= to_s] + [to_s])
            results.append(
                {
                    "repeat": rep,
                    "from_g": a,
                    "to_g": b,
                    "steps": len(order),
                    "windows": rows,
                    "settling": settle_time(
                        rows, tolerance_pp=args.tolerance_pp, tolerance_rel=args.tolerance_rel
                    ),
                }
            )
            st: dict[str, Any] = results[-1]["settling"]  # type: ignore[assignment]
            first = (
                f", first window off {st['first_window_off_pp']:.2f} pp / native "
                f"{st['first_window_native_rel'] * 100:.2f}%"
                if "first_window_off_pp" in st
                else " (no window late in the dwell ran the native cell)"
            )
            print(f"rep {rep} G{a}->G{b}: settle {st['settle_s']} s{first}", flush=True)
    gpu = torch.cuda.get_device_name(0) if cuda else "cpu"
    backend.close()
    data = {
        "gpu": gpu,
        "step": dict(s),
        "from_s": from_s,
        "to_s": to_s,
        "tolerance_pp": args.tolerance_pp,
        "tolerance_rel": args.tolerance_rel,
        "seconds": time.perf_counter() - t0,
        "transitions": results,
    }
    write_result("settling_curve", data, out_dir=args.out, argv=argv)
    return 0


def _timed(step: Any, torch: Any, cuda: bool) -> float:
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000.0


if __name__ == "__main__":
    sys.exit(main())
