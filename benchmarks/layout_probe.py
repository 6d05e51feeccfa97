"""Does where the step's buffers land in device memory move its time and its savings?

The independent harness builds the heavy step twice in one process. Its first build ran G=8's
native step 2.3% faster than its second in every job, at the same SM clock, and G=64's compact
savings 0.4-0.6 pp higher; the weights are drawn from the same seed both times, so the two builds
differ in where their buffers were allocated, not in what they hold. This benchmark builds the
step several times in one process, each time after freeing the previous build and holding a pad
of a chosen size on the device first (so the build's buffers land elsewhere), and times each G's
cells in the harness's alternating mix (CUDA events between back-to-back replays, after a settle
of the same mix), with the SM clock, power and GPU and memory temperatures read during it.

If builds at different pads differ by more than builds at the same pad, a sweep that builds its
step once per process measures one placement and its intervals cannot hold another's (a serving
engine's); ``--pads`` repeats 0 to tell the two apart. ``--matmul-first`` times a matmul before
the first build, as the sweep's resource check does before it loads its backend.

Run (one GPU, ~3 minutes): ``PYTHONPATH=src python3 benchmarks/layout_probe.py --out DIR``;
``--tiny`` runs it on the CPU with the tiny config in seconds (no pad, host timing).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result
from independent_harness import FULL, TINY, Mode, _Nvml, alternating_sequence, open_backend, warm_steps
from settling_curve import _run_mix, _run_mix_host, _timed

from dspark_calibrate.calibrate.measurement.ladder import parse_ladder


def temperatures(nvml: _Nvml) -> dict[str, float | None]:
    """GPU and memory (HBM) temperature in °C, None where NVML cannot say."""
    out: dict[str, float | None] = {"gpu_c": None, "memory_c": None}
    if nvml.handle is None:
        return out
    n = nvml.nvml
    with contextlib.suppress(n.NVMLError):
        out["gpu_c"] = float(n.nvmlDeviceGetTemperature(nvml.handle, n.NVML_TEMPERATURE_GPU))
    with contextlib.suppress(n.NVMLError, AttributeError, ValueError):
        (value,) = n.nvmlDeviceGetFieldValues(nvml.handle, [n.NVML_FI_DEV_MEMORY_TEMP])
        if value.nvmlReturn == 0:
            out["memory_c"] = float(value.value.uiVal)
    return out


#: Steps of each sequence in the tiny CPU mode: host-timed steps vary with the machine's load, so
#: sequences sized by time would too (and a short one can miss a cell).
TINY_STEPS = 120


def sequence_steps(seconds: float, mean_ms: float, *, tiny: bool) -> int:
    """Steps that fill ``seconds`` at ``mean_ms`` a step (at least 16); :data:`TINY_STEPS` in the
    tiny mode."""
    return TINY_STEPS if tiny else max(int(seconds * 1000.0 / mean_ms), 16)


def cell_stats(order: Sequence[int], ms: Sequence[float], cells: int) -> tuple[list[float], list[float]]:
    """Each cell's median step (ms, NaN for a cell without steps) and its saving against the
    native one (index 0)."""
    per = [[m for i, m in zip(order, ms, strict=True) if i == c] for c in range(cells)]
    med = [float(np.median(p)) if p else math.nan for p in per]
    return med, [1.0 - m / med[0] for m in med]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--pads", default="0,0,1536,0,4096,2560", help="MiB held before each build")
    parser.add_argument("--g", default="8,64,256", help="G to time in each build")
    parser.add_argument("--settle-s", type=float, default=1.0)
    parser.add_argument("--timed-s", type=float, default=2.5)
    parser.add_argument(
        "--matmul-first",
        action="store_true",
        help="time a matmul before the first build, as the sweep's resource check does",
    )
    args = parser.parse_args(argv)
    mode: Mode = TINY if args.tiny else FULL
    import torch

    pads = [int(p) for p in args.pads.split(",")]
    ladder = parse_ladder(str(mode.step["ladder"]))
    gs = [int(g) for g in args.g.split(",")] if not args.tiny else [ladder[-1]]
    rng = np.random.default_rng(11)
    builds: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    gpu = "cpu"
    if args.matmul_first and torch.cuda.is_available() and not args.tiny:
        from dspark_calibrate.calibrate.measurement import resources

        resources.matmul_flops_per_second(torch, "cuda", "bfloat16")
    for b, pad_mib in enumerate(pads):
        cuda = torch.cuda.is_available() and not args.tiny
        pad = torch.empty(pad_mib * 2**20, dtype=torch.uint8, device="cuda") if cuda and pad_mib else None
        backend, cuda = open_backend(mode)
        nvml = _Nvml(cuda)
        if cuda:
            gpu = torch.cuda.get_device_name(0)
        row: dict[str, Any] = {"build": b, "pad_mib": pad_mib, "g": {}}
        for g in gs:
            group = [c for c in mode.cells() if c.graph_batch_size == g]
            steps = [backend.prepare(c) for c in group]
            warm_steps(steps, cuda)
            mean_ms = float(np.mean([_timed(st, torch, cuda) for st in steps]))
            settle = alternating_sequence(rng, group, sequence_steps(args.settle_s, mean_ms, tiny=args.tiny))
            timed = alternating_sequence(rng, group, sequence_steps(args.timed_s, mean_ms, tiny=args.tiny))
            if cuda:
                _run_mix(torch, steps, settle, mode.chunk, nvml)
                ms, readings = _run_mix(torch, steps, timed, mode.chunk, nvml)
            else:
                _run_mix_host(steps, settle)
                ms, readings = _run_mix_host(steps, timed)
            med, sav = cell_stats(timed, ms, len(group))
            entry: dict[str, Any] = {
                "cells": [f"G{c.graph_batch_size}/V{c.verifier_budget}" for c in group],
                "median_ms": med,
                "saving": sav,
                **temperatures(nvml),
            }
            if readings:
                entry["sm_clock_mhz"] = float(np.median([r[1][0] for r in readings]))
                entry["power_w"] = float(np.median([r[1][1] for r in readings]))
            row["g"][str(g)] = entry
            for c in group:
                backend.release(c)
            print(
                f"build {b} pad {pad_mib} MiB G{g}: native {med[0]:.4f} ms clock {entry.get('sm_clock_mhz')} "
                f"mem {entry['memory_c']} C, savings " + ", ".join(f"{100 * x:.2f}" for x in sav[1:]),
                flush=True,
            )
        backend.close()
        del backend, pad
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        builds.append(row)
    data = {
        "gpu": gpu,
        "step": dict(mode.step),
        "pads_mib": pads,
        "matmul_first": args.matmul_first,
        "settle_s": args.settle_s,
        "timed_s": args.timed_s,
        "seconds": time.perf_counter() - t0,
        "builds": builds,
    }
    write_result("layout_probe", data, out_dir=args.out, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
