"""An independent check of the sweep's intervals: another protocol timing the same step.

The sweep times each cell in re-warmed visits of a few samples, in randomized rounds, across
capture epochs and passes, and states a 95% interval for every saving. This harness times the same
heavy step the GPU sweep jobs use (8 Llama-8B-shaped layers, K=5, ladder 8-256; see
``gpu_sweep_job.sh``) the way a serving engine runs it: per G, one long sequence in which every
step picks one of the G's cells (native, control and compact), staying on the same cell for a
while or switching, as a policy alternates them; each step is timed by CUDA events recorded
between back-to-back graph replays (no re-warm, no rounds, no re-capture), with NVML read every
few dozen steps. A cell's time is the median of its steps; its saving is against the native
cell's median. Each step stays on the cell before it with probability 1/2 (:data:`STAY`; the
sequences then run 2.7 steps on a cell), else draws one; ``--harness-stays`` draws each G's
sequences at several stay probabilities in every block, and the record keeps every step, with each
saving split by whether the step before ran another cell (``benchmarks/dwell_curve.py`` reads it).
Comparing the two:

- ``saving_ci_coverage``: the share of compact cells whose saving here lies inside the sweep's
  saving interval;
- ``saving_diff_median_pp`` / ``saving_diff_max_pp``: how far the two savings are apart;
- ``absolute_coverage_after_common_offset``: this harness's medians, less one common offset
  (the median log-ratio over cells), inside the sweep's absolute intervals. This harness queues
  every step behind a running one, so the offset is taken against the sweep's median of the same
  kind of step (``pipelined_ms``, the replays after each sample's first; the sample mean where a
  sweep did not time first replays apart): a protocol's difference is the intervals' to carry
  (docs/sweep.md "Step protocol"), the offset only what a process or harness shares over cells;
- ``control_bias_max_pp``: the largest control saving the sweep measured (0 is the truth);
- ``paired_rel``: the sweep's between-run paired SD (REML), with its upper value and the smallest
  shift its design resolves.

Subcommands (run from the repository root with ``PYTHONPATH=src``):

``job --out DIR``      everything in one call: the sweep of the heavy step (four passes, through
                       ``sweep_efficiency.py run``), this harness, the comparison; writes
                       ``DIR/sweep_efficiency.json`` (the repository's file with ``independent``
                       added), ``DIR/independent.json``, ``DIR/job_log.txt`` and
                       ``DIR/independent_work.tgz`` (the sweep's files, written under
                       ``--work``, outside ``DIR``). On one H200 it stays under 8 minutes.
``harness --out DIR``  this harness alone (``DIR/independent.json``).
``compare --sweep DIR --harness FILE [--out FILE] [--recompute]``  the comparison alone (CPU);
                       ``--recompute`` summarises the recorded sweep again with this checkout's
                       statistics (a past job's ``independent_work.tgz``, unpacked) and adds
                       ``mix_designs``: each mix design's savings against the harness's.

Both protocols time the step in one process state: the harness times a matmul before its first
build, as the sweep's resource check does before the sweep loads its backend. A process whose
first GPU work is the step's build runs differently (on an H200, G=8 2.1-2.3% faster, G=64's
compact savings 0.4-1.0 pp higher; ``benchmarks/layout_probe.py``), and no reference-backend sweep is in that
state; ``--harness-process-state first-build`` times it.

A process fixes part of each cell's time for its life (:func:`first_capture_order`): this
harness, capturing in the ladder's order, repeats its savings across jobs to about 0.1 pp while
timing one such draw. ``--harness-processes N`` runs it in N fresh processes, each capturing first
in its own seeded order, and compares with their pool (on an H200 a saving moved by up to 0.59 pp
between processes); ``--harness-recapture block`` captures a G's cells again before each of its
blocks inside one process (at most 0.25 pp), ``both`` runs that beside the capture-once harness in
one job.

``--tiny`` runs all of it on the CPU with the ``tiny`` config in well under a minute (the test of
the pipeline); CUDA events become host-clock timings there.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from dspark_calibrate.artifacts import read_artifact
from dspark_calibrate.calibrate.measurement.ladder import CellKind, CellSpec, parse_budgets, parse_ladder
from dspark_calibrate.calibrate.measurement.protocol import MixTerm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import git_commit

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "sweep_efficiency.json"
TARGETS = {
    "saving_ci_coverage": 0.90,
    "saving_diff_median_pp": 0.3,
    "saving_diff_max_pp": 0.8,
    "absolute_coverage_after_common_offset": 0.90,
    "control_bias_max_pp": 0.3,
}


@dataclass(frozen=True, slots=True)
class Mode:
    """One run's step, sweep design and harness sequence lengths.

    Attributes:
        step: the reference backend's step (config, layers, context, K, ladder, budgets, device).
        sweep: options of ``sweep_efficiency.py run`` beyond the step.
        steps_per_block: steps of one G's alternating sequence.
        blocks: sequences per G (each G's blocks are spread over the run in a random G order).
        discard: the first steps of each sequence, dropped (the switch from the previous G).
        chunk: steps enqueued between two telemetry reads.
        sweep_timeout_s: the sweep's hard limit (its own budget ends it sooner).
        sweep_seed: the sweep's ``--seed`` (its round order and visit sequences).
    """

    step: Mapping[str, Any]
    sweep: Sequence[str]
    steps_per_block: int
    blocks: int
    discard: int
    chunk: int
    sweep_timeout_s: float
    sweep_seed: int = 1

    def cells(self) -> list[CellSpec]:
        """Native, control and the listed compact cells of every G."""
        k = int(self.step["k"])
        budgets = parse_budgets(list(self.step["budgets"]))
        out = []
        for g in parse_ladder(str(self.step["ladder"])):
            out += [CellSpec(g, 0, k), *(CellSpec(g, v, k) for v in budgets[g]), CellSpec(g, g * (k + 1), k)]
        return out


#: The heavy step of the H200 jobs at the power cap (four Llama-70B-width layers: 98% of an H200's
#: samples carried the SW power-cap reason; eight Llama-8B layers drew 530-640 W and did not), with
#: two compact budgets per G (2 and 4 tokens per row) beside the native and control cells: 24 cells.
FULL = Mode(
    step={
        "k": 5,
        "ladder": "8,16,32,64,128,256",
        "config": "llama-70b",
        "layers": 4,
        "context_len": 1024,
        "ep": 1,
        "device": None,
        "budgets": ("8:16,32", "16:32,64", "32:64,128", "64:128,256", "128:256,512", "256:512,1024"),
    },
    sweep=(
        "--passes", "4", "--recapture-every", "6", "--samples-per-visit", "3", "--replays", "2",
        "--precision", "0.004", "--max-samples", "128", "--adaptive-budget", "240",
    ),
    steps_per_block=400,
    blocks=3,
    discard=40,
    chunk=32,
    sweep_timeout_s=420.0,
)  # fmt: skip
#: The same pipeline on the CPU in seconds: the tiny config, two G.
TINY = Mode(
    step={
        "k": 3,
        "ladder": "2,4",
        "config": "tiny",
        "layers": 1,
        "context_len": 32,
        "ep": 1,
        "device": "cpu",
        "budgets": ("2:4,6", "4:8,12"),
    },
    sweep=(
        "--passes", "2", "--recapture-every", "3", "--samples-per-visit", "3", "--preset", "quick",
        "--precision", "0.05", "--adaptive-budget", "15",
    ),
    steps_per_block=60,
    blocks=2,
    discard=5,
    chunk=16,
    sweep_timeout_s=240.0,
)  # fmt: skip


# --- the sweep --------------------------------------------------------------------------------------


#: A sweep's hard limit for a budget B of GPU-seconds: ``1.25 × B + 60`` s (the H200 sweeps ran
#: 1.03-1.06 × their budget in wall time, plus the start and first captures), never below the mode's.
SWEEP_TIMEOUT_PER_BUDGET = 1.25
SWEEP_TIMEOUT_BASE_S = 60.0


def with_budget(
    mode: Mode,
    sweep_budget: float | None,
    steps_per_block: int | None,
    *,
    interleave: bool = False,
    settle_s: float | None = None,
    passes: int | None = None,
    recapture_every: int | None = None,
    samples_per_visit: int | None = None,
    max_samples: int | None = None,
    seed: int | None = None,
    dwell: float | None = None,
    precision: float | None = None,
    resolve: float | None = None,
) -> Mode:
    """``mode`` with another sweep budget (GPU-seconds) and harness sequence length, where given,
    and (``interleave``) a sweep that visits each G's cells in one interleaved sequence, running
    each visit's mix untimed for ``settle_s`` first (the sweep's default where None); ``passes``
    and ``recapture_every`` replace the sweep's (one process re-capturing every two rounds has
    three times the epochs of four passes, so each G's own σ_d rests on more of them), and
    ``samples_per_visit`` its samples per visit, ``max_samples`` its cap of samples per cell (a
    cell at the cap stops, whatever budget is left), ``dwell`` its ``--dwell`` (every visit in runs
    of that mean length: the harness's own dwell is 1 / its ``switch_share``), ``precision`` its
    ``--precision`` (the relative half-width at which a cell stops), ``resolve`` its ``--resolve``
    (each G measured on until its own cells resolve that paired shift). A budget above the
    mode's own raises the sweep's hard limit with it, so that the budget, not the limit, ends the
    sweep."""
    sweep = list(mode.sweep)
    for name, value in (
        ("--passes", passes),
        ("--recapture-every", recapture_every),
        ("--samples-per-visit", samples_per_visit),
        ("--max-samples", max_samples),
    ):
        if value is None:
            continue
        if value < 1:
            raise SystemExit(f"{name} must be >= 1, not {value}")
        if name in sweep:
            sweep[sweep.index(name) + 1] = str(value)
        else:
            sweep += [name, str(value)]
    if precision is not None:
        if not 0 < precision < 1:
            raise SystemExit(f"--sweep-precision must be in (0, 1), not {precision}")
        sweep[sweep.index("--precision") + 1] = f"{precision:g}"
    if interleave and "--interleave" not in sweep:
        sweep.append("--interleave")
    if settle_s is not None:
        if not interleave:
            raise SystemExit("--sweep-settle-s needs --sweep-interleave")
        sweep += ["--settle-s", f"{settle_s:g}"]
    if dwell is not None:
        if not interleave:
            raise SystemExit("--sweep-dwell needs --sweep-interleave")
        sweep += ["--dwell", f"{dwell:g}"]
    if resolve is not None:
        if not interleave:
            raise SystemExit("--sweep-resolve needs --sweep-interleave")
        sweep += ["--resolve", f"{resolve:g}"]
    if sweep_budget is not None:
        if not sweep_budget > 0:
            raise SystemExit(f"--sweep-budget must be > 0, not {sweep_budget}")
        if "--adaptive-budget" in sweep:
            sweep[sweep.index("--adaptive-budget") + 1] = f"{sweep_budget:g}"
        else:
            sweep += ["--adaptive-budget", f"{sweep_budget:g}"]
    if steps_per_block is not None and steps_per_block <= mode.discard:
        raise SystemExit(f"--steps-per-block must exceed the {mode.discard} steps discarded per sequence")
    timeout = mode.sweep_timeout_s
    if sweep_budget is not None:
        timeout = max(timeout, SWEEP_TIMEOUT_PER_BUDGET * sweep_budget + SWEEP_TIMEOUT_BASE_S)
    return replace(
        mode,
        sweep=tuple(sweep),
        steps_per_block=steps_per_block or mode.steps_per_block,
        sweep_seed=mode.sweep_seed if seed is None else seed,
        sweep_timeout_s=timeout,
    )


def sweep_command(mode: Mode, out_dir: Path) -> list[str]:
    """``sweep_efficiency.py run`` for the mode's step and design, writing into ``out_dir``."""
    s = mode.step
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "sweep_efficiency.py"), "run", "--tag", "independent",
        "--protocols", "adaptive", "--seed", str(mode.sweep_seed), "--k", str(s["k"]), "--ladder", str(s["ladder"]),
        "--config", str(s["config"]), "--layers", str(s["layers"]), "--context-len", str(s["context_len"]),
        "--ep", str(s["ep"]), "--throttle-policy", "serving", "--out-dir", str(out_dir),
    ]  # fmt: skip
    for b in s["budgets"]:
        cmd += ["--budgets", b]
    if s["device"]:
        cmd += ["--device", str(s["device"])]
    return [*cmd, *mode.sweep]


# --- the harness ------------------------------------------------------------------------------------


#: The harness's stay probability: each step stays on the previous cell with it (module docstring).
STAY = 0.5


def alternating_sequence(
    rng: np.random.Generator, cells: Sequence[CellSpec], steps: int, stay_p: float = STAY
) -> list[int]:
    """Indices into ``cells`` (native first) for ``steps`` steps: each step stays on the previous
    cell with probability ``stay_p``, else draws a cell, the native one with weight 0.4 and the
    rest sharing 0.6, as a policy alternates native and compact steps."""
    if not 0.0 <= stay_p < 1.0:
        raise SystemExit(f"a harness stay probability must be in [0, 1), not {stay_p}")
    weights = np.array([0.4] + [0.6 / (len(cells) - 1)] * (len(cells) - 1))
    draws = rng.choice(len(cells), size=steps, p=weights)
    stay = rng.random(steps) < stay_p
    out = [int(draws[0])]
    for i in range(1, steps):
        out.append(out[-1] if stay[i] else int(draws[i]))
    return out


class _Nvml:
    """SM clock (MHz), power (W) and throttle reasons of GPU 0; nothing when ``enabled`` is False
    or NVML cannot start (no nvidia-ml-py, no driver)."""

    def __init__(self, enabled: bool) -> None:
        self.handle: Any = None
        self.nvml: Any = None
        if not enabled:
            return
        try:
            import pynvml
        except ImportError:
            return
        try:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except pynvml.NVMLError:
            return
        self.nvml = pynvml

    def read(self) -> tuple[float, float, int] | None:
        if self.handle is None:
            return None
        n = self.nvml
        reasons = (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return (
            float(n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM)),
            n.nvmlDeviceGetPowerUsage(self.handle) / 1000.0,
            int(reasons(self.handle)),
        )


@dataclass
class _Block:
    """One G's timed sequence: which cell each step ran and how long it took (ms), and the stay
    probability it was drawn with."""

    g: int
    cells: list[int]
    stay: float = STAY
    ms: list[float] = field(default_factory=list)
    telemetry: list[tuple[float, float, int]] = field(default_factory=list)


def _time_block_cuda(torch: Any, steps: Sequence[Any], block: _Block, chunk: int, nvml: _Nvml) -> None:
    """Events between back-to-back replays on one stream; a chunk is enqueued before the previous
    one is waited for, so the GPU never idles for the host, and NVML is read at each wait."""
    stream = torch.cuda.Stream()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(len(block.cells) + 1)]
    with torch.cuda.stream(stream):
        for start in range(0, len(block.cells), chunk):
            for i in range(start, min(start + chunk, len(block.cells))):
                events[i].record(stream)
                steps[block.cells[i]]()
            if start:
                events[start - 1].synchronize()
                reading = nvml.read()
                if reading is not None:
                    block.telemetry.append(reading)
        events[-1].record(stream)
    events[-1].synchronize()
    block.ms = [float(events[i].elapsed_time(events[i + 1])) for i in range(len(block.cells))]


def _time_block_host(steps: Sequence[Any], block: _Block) -> None:
    """The CPU path: each step timed by the host clock (eager steps run synchronously)."""
    for i in block.cells:
        t0 = time.perf_counter()
        steps[i]()
        block.ms.append((time.perf_counter() - t0) * 1000.0)


def open_backend(mode: Mode) -> tuple[Any, bool]:
    """The reference backend of the mode's step, and whether it runs on CUDA (the GPU benchmarks
    beside this harness build theirs here too)."""
    from dspark_calibrate.calibrate.measurement.backends.reference import ReferenceBackend

    s = mode.step
    ladder = parse_ladder(str(s["ladder"]))
    backend = ReferenceBackend(
        config=str(s["config"]), layers=int(s["layers"]), context_len=int(s["context_len"]), ep=int(s["ep"]),
        device=s["device"], max_rows=max(ladder), max_row_len=int(s["k"]) + 1,
    )  # fmt: skip
    return backend, backend.describe()["device"] == "cuda"


def warm_steps(steps: Iterable[Any], cuda: bool, replays: int = 4) -> None:
    """Replay every step a few times (autotuning, allocator growth) and wait for them."""
    for step in steps:
        for _ in range(replays):
            step()
    if cuda:
        import torch

        torch.cuda.synchronize()


#: How the harness captures its cells (``--harness-recapture``; :func:`run_job`).
RECAPTURE = ("never", "block", "both")
#: What the process has run on the GPU before the harness builds its step (module docstring).
#: ``sweep``: a timed matmul, as the sweep's resource check runs before it loads its backend;
#: ``first-build``: nothing, the step is the process's first GPU work.
PROCESS_STATES = ("sweep", "first-build")


def run_harness(
    mode: Mode,
    *,
    seed: int = 7,
    process_state: str = "sweep",
    stays: Sequence[float] = (STAY,),
    recapture: bool = False,
    capture_seed: int | None = None,
) -> dict[str, Any]:
    """Capture every cell once, then time each G's alternating sequences (module docstring), in
    ``process_state`` (:data:`PROCESS_STATES`; it decides only a process's first build).

    ``stays``: the stay probabilities to draw sequences with. Each block times, for every G (in
    random order), one sequence per stay (in random order), so every stay meets the same captures
    and the same drift. The result's cells are those of the first stay; ``by_stay`` holds each.

    ``recapture``: before each of a G's blocks, release that G's cells and capture them again in
    a random order (:func:`recapture_group`), so each block times its own captures.

    ``capture_seed``: the process captures its cells first in an order drawn from it, not in the
    ladder's order (:func:`first_capture_order`)."""
    import torch

    from dspark_calibrate.calibrate.measurement import resources

    if process_state not in PROCESS_STATES:
        raise SystemExit(f"--harness-process-state {process_state!r} is unknown; use one of {PROCESS_STATES}")
    if not stays or len(set(stays)) != len(stays):
        raise SystemExit(f"--harness-stays needs distinct stay probabilities, not {list(stays)}")
    cells = mode.cells()
    ladder = parse_ladder(str(mode.step["ladder"]))
    if process_state == "sweep" and torch.cuda.is_available() and mode.step["device"] in (None, "cuda"):
        resources.matmul_flops_per_second(torch, "cuda", "bfloat16")
    backend, cuda = open_backend(mode)
    nvml = _Nvml(cuda)
    t0 = time.perf_counter()
    by_g = {g: [c for c in cells if c.graph_batch_size == g] for g in ladder}
    steps = {c: backend.prepare(c) for c in first_capture_order(cells, capture_seed)}
    warm_steps(steps.values(), cuda)
    rng = np.random.default_rng(seed)
    blocks: list[_Block] = []
    layouts = np.random.default_rng([seed, 0xCA])  # capture orders apart from the sequences
    for _ in range(mode.blocks):
        for g in rng.permutation(ladder).tolist():
            if recapture:
                recapture_group(backend, steps, by_g[g], layouts, cuda)
            for stay in rng.permutation(np.asarray(stays, dtype=np.float64)).tolist():
                seq = alternating_sequence(rng, by_g[g], mode.steps_per_block, float(stay))
                block = _Block(int(g), seq, float(stay))
                group = [steps[c] for c in by_g[g]]
                if cuda:
                    _time_block_cuda(torch, group, block, mode.chunk, nvml)
                else:
                    _time_block_host(group, block)
                blocks.append(block)
    seconds = time.perf_counter() - t0
    gpu = torch.cuda.get_device_name(0) if cuda else "cpu"
    backend.close()
    each = {
        stay: summarize_harness(
            by_g, [b for b in blocks if b.stay == stay], discard=mode.discard, gpu=gpu, seconds=seconds
        )
        for stay in stays
    }
    result = dict(each[stays[0]])
    if len(stays) > 1:
        result["by_stay"] = {
            f"{stay:g}": {k: r[k] for k in ("cells", "switch_share")} for stay, r in each.items()
        }
    result["steps"] = [
        {"g": b.g, "stay": b.stay, "cells": b.cells, "ms": [round(x, 5) for x in b.ms]} for b in blocks
    ]
    return {
        **result,
        "process_state": process_state,
        "stays": list(stays),
        "recapture": recapture,
        "capture_seed": capture_seed,
        "pid": os.getpid(),
    }


def first_capture_order(cells: Sequence[CellSpec], capture_seed: int | None) -> list[CellSpec]:
    """The order a harness process captures its cells in first: the ladder's where ``capture_seed``
    is None, else a permutation drawn from it.

    A cell's step time carries a component fixed for a process's life (:mod:`~dspark_calibrate.
    calibrate.measurement.passes`: about 0.5 pp per saving between two sweep processes on an H200);
    capturing again inside the process does not draw it anew (run 24: at most 0.25 pp), a process
    capturing in another order does (run 25: up to 0.59 pp). Where the cells' memory lands is the
    likely carrier, not a proven one. In the ladder's order every process draws the same component,
    and the harness repeats itself across jobs while timing one draw; a seeded order draws another
    per process."""
    if capture_seed is None:
        return list(cells)
    order = np.random.default_rng([capture_seed, 0x0D]).permutation(len(cells))
    return [cells[int(i)] for i in order]


def harness_in_processes(
    mode: Mode,
    processes: int,
    *,
    process_state: str = "sweep",
    stays: Sequence[float] = (STAY,),
    recapture: bool = False,
) -> list[dict[str, Any]]:
    """:func:`run_harness` ``processes`` times, each in a fresh process (spawned, one run each),
    process ``i`` capturing first in the order of capture seed ``i`` and drawing its sequences from
    seed ``7 + i``: the placements of ``processes`` processes, not one (:func:`first_capture_order`)."""
    if processes < 1:
        raise SystemExit(f"--harness-processes must be >= 1, not {processes}")
    context = multiprocessing.get_context("spawn")
    runs = []
    with ProcessPoolExecutor(max_workers=1, mp_context=context, max_tasks_per_child=1) as pool:
        for i in range(processes):
            job = pool.submit(
                run_harness,
                mode,
                seed=7 + i,
                process_state=process_state,
                stays=stays,
                recapture=recapture,
                capture_seed=i,
            )
            runs.append(job.result())
    return runs


def recapture_group(
    backend: Any, steps: dict[CellSpec, Any], cells: Sequence[CellSpec], rng: np.random.Generator, cuda: bool
) -> None:
    """Release ``cells``, capture them again in an order drawn from ``rng`` and warm them (``steps``
    updated in place): the next block times new captures, as a sweep's epoch does.

    ``--harness-recapture`` asks whether that draws what a new process draws: on an H200 it moved
    the harness's savings by at most 0.25 pp (run 24), where processes capturing in their own
    orders moved them by up to 0.59 pp (run 25; :func:`first_capture_order`)."""
    for cell in cells:
        backend.release(cell)
        del steps[cell]
    for i in rng.permutation(len(cells)).tolist():
        steps[cells[i]] = backend.prepare(cells[i])
    warm_steps([steps[c] for c in cells], cuda)


def _after(block: _Block, discard: int) -> list[tuple[int, float, bool]]:
    """A block's kept steps as (cell index, ms, whether the step before it ran another cell)."""
    return [
        (block.cells[i], block.ms[i], block.cells[i] != block.cells[i - 1])
        for i in range(max(discard, 1), len(block.cells))
    ]


def _saving(mine: Sequence[float], native: Sequence[float]) -> float | None:
    return 1.0 - float(np.median(mine)) / float(np.median(native)) if mine and native else None


def summarize_harness(
    by_g: Mapping[int, Sequence[CellSpec]],
    blocks: Sequence[_Block],
    *,
    discard: int,
    gpu: str,
    seconds: float,
) -> dict[str, Any]:
    """Per cell, the median step time over every step after each block's first ``discard``, the
    saving against the native cell's median, and the saving in each block (its spread); and the
    split by the step before: ``switch_share`` (the share of the cell's steps that follow another
    cell), ``saving_after_switch`` and ``saving_after_stay`` (the cell's steps that follow another
    cell, or itself, against the native cell's steps that do the same)."""
    times: dict[CellSpec, list[float]] = {c: [] for cs in by_g.values() for c in cs}
    split: dict[tuple[CellSpec, bool], list[float]] = {(c, w): [] for c in times for w in (False, True)}
    per_block: dict[CellSpec, list[float]] = {c: [] for c in times}
    telemetry: dict[int, list[tuple[float, float, int]]] = {}
    for b in blocks:
        cells = by_g[b.g]
        kept = _after(b, discard)
        medians = {}
        for i, cell in enumerate(cells):
            mine = [ms for j, ms, _ in kept if j == i]
            times[cell] += mine
            for switched in (False, True):
                split[cell, switched] += [ms for j, ms, w in kept if j == i and w == switched]
            if mine:
                medians[cell] = float(np.median(mine))
        native = medians.get(cells[0])
        for cell, m in medians.items():
            if native:
                per_block[cell].append(1.0 - m / native)
        telemetry.setdefault(b.g, []).extend(b.telemetry)
    out_cells = []
    shares: list[float] = []
    for cells in by_g.values():
        native = float(np.median(times[cells[0]]))
        for cell in cells:
            med = float(np.median(times[cell]))
            n_switch, n_all = len(split[cell, True]), len(times[cell])
            shares.append(n_switch / n_all)
            out_cells.append(
                {
                    "graph_batch_size": cell.graph_batch_size,
                    "verifier_budget": cell.verifier_budget,
                    "kind": cell.kind.value,
                    "steps": n_all,
                    "median_ms": med,
                    "p10_ms": float(np.quantile(times[cell], 0.1)),
                    "p90_ms": float(np.quantile(times[cell], 0.9)),
                    "saving": 1.0 - med / native,
                    "saving_per_block": per_block[cell],
                    "switch_share": n_switch / n_all,
                    "saving_after_switch": _saving(split[cell, True], split[cells[0], True]),
                    "saving_after_stay": _saving(split[cell, False], split[cells[0], False]),
                }
            )
    tel = {
        str(g): {
            "sm_clock_mhz_median": float(np.median([r[0] for r in rs])),
            "power_w_median": float(np.median([r[1] for r in rs])),
            "power_capped_share": float(np.mean([bool(r[2] & 0x4) for r in rs])),
        }
        for g, rs in telemetry.items()
        if rs
    }
    return {
        "gpu": gpu,
        "seconds": seconds,
        "cells": out_cells,
        "telemetry": tel,
        "discard": discard,
        "switch_share": float(np.mean(shares)),
    }


# --- the comparison ---------------------------------------------------------------------------------


def pooled_harness(first: Mapping[str, Any], *others: Mapping[str, Any]) -> dict[str, Any]:
    """Several runs of this harness as one (pure): per cell the mean of the runs' medians and of
    their savings (each run's own estimate carries its run's noise and, run in its own process,
    its process's placement; the mean of n has 1/n of their variance), and every run's per-block
    savings. Cells missing from any run are left out."""
    runs = [first, *others]
    by_run = [{(c["graph_batch_size"], c["verifier_budget"]): c for c in r["cells"]} for r in runs]
    cells = []
    for c in first["cells"]:
        key = (c["graph_batch_size"], c["verifier_budget"])
        mine = [b[key] for b in by_run if key in b]
        if len(mine) < len(runs):
            continue
        cells.append(
            {
                **c,
                "median_ms": float(np.mean([m["median_ms"] for m in mine])),
                "saving": float(np.mean([m["saving"] for m in mine])),
                "saving_per_block": [x for m in mine for x in m.get("saving_per_block", [])],
                "saving_per_run": [m["saving"] for m in mine],
            }
        )
    return {**first, "cells": cells, "pooled_runs": len(runs)}


def process_spread(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How far this harness's runs in separate processes are apart (pure): per compact cell the SD
    of their savings (pp), and the median and largest of those SDs; what one process's saving
    carries of its placement (with its own noise) where the runs captured in different orders."""
    pooled = pooled_harness(*runs)
    sds = {
        f"G{c['graph_batch_size']}/V{c['verifier_budget']}": float(
            np.std([_pp(x) for x in c["saving_per_run"]], ddof=1)
        )
        for c in pooled["cells"]
        if c["kind"] == CellKind.COMPACT.value and len(runs) > 1
    }
    return {
        "processes": len(runs),
        "capture_seeds": [r.get("capture_seed") for r in runs],
        "saving_sd_pp": sds,
        "saving_sd_median_pp": float(np.median(list(sds.values()))) if sds else None,
        "saving_sd_max_pp": max(sds.values(), default=None),
    }


def harness_agreement(first: Mapping[str, Any], second: Mapping[str, Any]) -> dict[str, Any]:
    """How far two runs of this harness in one job are apart (pure): the compact savings (pp) and
    the medians (relative, after their common offset). What a sweep can be expected to match is
    bounded by this: the harness's own savings move between runs too."""
    one = {(c["graph_batch_size"], c["verifier_budget"]): c for c in first["cells"]}
    two = {(c["graph_batch_size"], c["verifier_budget"]): c for c in second["cells"]}
    common = sorted(set(one) & set(two))
    diffs = [abs(_pp(one[k]["saving"] - two[k]["saving"])) for k in common if one[k]["kind"] == "compact"]
    logs = [math.log(two[k]["median_ms"] / one[k]["median_ms"]) for k in common]
    offset = float(np.median(logs)) if logs else 0.0
    return {
        "cells": len(common),
        "saving_diff_median_pp": float(np.median(diffs)) if diffs else None,
        "saving_diff_max_pp": float(np.max(diffs)) if diffs else None,
        "saving_diff_pp": {
            f"G{k[0]}/V{k[1]}": d
            for k, d in zip([k for k in common if one[k]["kind"] == "compact"], diffs, strict=True)
        },
        "common_offset_rel": offset,
        "median_rel_diff_after_offset_max": float(np.max([abs(x - offset) for x in logs])) if logs else None,
        # One run's level SD per cell beyond the common offset: the pair's SD over √2.
        "level_sd_rel": float(np.std([x - offset for x in logs], ddof=1) / math.sqrt(2.0))
        if len(logs) > 1
        else None,
    }


def _pp(x: float) -> float:
    return 100.0 * x


def compare(
    sweep_rows: Sequence[Mapping[str, Any]],
    between: Mapping[str, Any],
    harness: Mapping[str, Any],
    *,
    level_prior_rel: float | None = None,
) -> dict[str, Any]:
    """The sweep's stated intervals against the harness's measurements (module docstring). Pure.

    ``level_prior_rel``: a per-run SD of a cell's level beyond the common offset, measured
    elsewhere (``harness_agreement``'s ``level_sd_rel`` of another job): the absolute coverage is
    then also stated with each interval widened by it, in quadrature, for two runs (the sweep's
    and the harness's), ``absolute_coverage_with_level_prior``."""
    mine = {(r["graph_batch_size"], r["verifier_budget"]): r for r in sweep_rows}
    other = {(c["graph_batch_size"], c["verifier_budget"]): c for c in harness["cells"]}
    common = sorted(set(mine) & set(other))
    queued = all(mine[c].get("pipelined_ms") is not None for c in common)
    reference = "pipelined_ms" if queued else "step_time_ms"
    offset = float(np.median([math.log(other[c]["median_ms"] / mine[c][reference]) for c in common]))
    cells, covered, diffs, absolute, shifted, widened = [], [], [], [], [], []
    for key in common:
        s, h = mine[key], other[key]
        kind = str(h["kind"])
        entry = {
            "cell": f"G{key[0]}/V{key[1]}",
            "kind": kind,
            "sweep_ms": s["step_time_ms"],
            "sweep_ci_ms": [s["ci_low_ms"], s["ci_high_ms"]],
            "independent_ms": h["median_ms"],
            "sweep_saving": s["saving"],
            "sweep_saving_ci": [s["saving_ci_low"], s["saving_ci_high"]],
            "independent_saving": h["saving"],
            "sweep_pipelined_ms": s.get("pipelined_ms"),
            "sweep_synchronous_ms": s.get("synchronous_ms"),
            "sweep_saving_pipelined": s.get("saving_pipelined"),
            "sweep_saving_synchronous": s.get("saving_synchronous"),
            "sweep_saving_at_native_clock": s.get("saving_at_native_clock"),
            "control_widened": s.get("control_widened"),
            "clock_rel": s.get("clock_rel"),
            "carryover_rel": s.get("carryover_rel"),
        }
        absolute.append(s["ci_low_ms"] <= h["median_ms"] <= s["ci_high_ms"])
        moved = h["median_ms"] * math.exp(-offset)
        shifted.append(s["ci_low_ms"] <= moved <= s["ci_high_ms"])
        if level_prior_rel is not None:
            lo, hi = math.log(s["ci_low_ms"]), math.log(s["ci_high_ms"])
            half = math.hypot((hi - lo) / 2.0, 1.96 * math.sqrt(2.0) * level_prior_rel)
            widened.append(abs(math.log(moved) - (hi + lo) / 2.0) <= half)
        if kind == CellKind.COMPACT.value:
            inside = s["saving_ci_low"] <= h["saving"] <= s["saving_ci_high"]
            covered.append(inside)
            diffs.append(abs(_pp(s["saving"] - h["saving"])))
            entry.update(saving_covered=inside, saving_diff_pp=diffs[-1])
        cells.append(entry)
    controls: dict[int, float] = {
        int(r["graph_batch_size"]): float(r["control_bias"])
        for r in sweep_rows
        if r.get("control_bias") is not None
    }
    independent_controls = [
        abs(_pp(c["saving"])) for c in harness["cells"] if c["kind"] == CellKind.CONTROL.value
    ]
    result: dict[str, Any] = {
        "gpu": harness.get("gpu"),
        "cells": len(common),
        "compact_cells": len(covered),
        "saving_ci_coverage": float(np.mean(covered)) if covered else None,
        "saving_diff_median_pp": float(np.median(diffs)) if diffs else None,
        "saving_diff_max_pp": float(np.max(diffs)) if diffs else None,
        "absolute_coverage": float(np.mean(absolute)),
        "common_offset_rel": math.expm1(offset),
        "common_offset_against": reference,
        "absolute_coverage_after_common_offset": float(np.mean(shifted)),
        "level_prior_rel": level_prior_rel,
        "absolute_coverage_with_level_prior": float(np.mean(widened)) if widened else None,
        "control_bias_max_pp": max((abs(_pp(v)) for v in controls.values()), default=None),
        "control_bias_per_g_pp": {str(g): _pp(v) for g, v in sorted(controls.items())},
        "independent_control_max_pp": max(independent_controls, default=None),
        "paired_rel": between.get("paired_rel"),
        "paired_rel_upper": between.get("paired_rel_upper"),
        "paired_resolved": between.get("paired_resolved"),
        "resolvable_shift_rel": between.get("resolvable_shift_rel"),
        "between_run": dict(between),
        "per_cell": cells,
        "targets": TARGETS,
    }
    # Coverages must reach their target, differences and the bias stay below theirs.
    meets = {}
    for name, bar in TARGETS.items():
        value = result[name]
        meets[name] = value is not None and (value >= bar if "coverage" in name else value <= bar)
    result["meets"] = meets
    return result


def by_mix_design(cells: list[dict[str, Any]], designs: Mapping[str, MixTerm]) -> dict[str, Any] | None:
    """An interleaved sweep's compact savings in each mix design's rounds against the harness's.

    The sweep's point is the paired saving over all rounds, half of each design (switching every
    step, runs); ``designs`` maps a cell's label to its mix term. Each compact
    entry of ``cells`` gains ``sweep_saving_switching`` and ``sweep_saving_runs``; the return
    value holds, per design, how far its savings are from the harness's (median and max, pp):
    which design the harness's own mix is nearer. None for a sweep of one cell per visit."""
    apart: dict[str, list[float]] = {"switching": [], "runs": []}
    for entry in cells:
        term = designs.get(entry["cell"])
        if entry["kind"] != CellKind.COMPACT.value or term is None:
            continue
        for name, value in (("switching", term.saving_switching), ("runs", term.saving_runs)):
            entry[f"sweep_saving_{name}"] = value
            if value is not None:
                apart[name].append(abs(_pp(value - entry["independent_saving"])))
    if not any(apart.values()):
        return None
    return {
        name: {"cells": len(v), "diff_median_pp": float(np.median(v)), "diff_max_pp": float(np.max(v))}
        for name, v in apart.items()
        if v
    }


def compare_files(
    sweep_dir: Path, harness_file: Path, *, level_prior_rel: float | None = None, recompute: bool = False
) -> dict[str, Any]:
    """:func:`compare` on a sweep directory (``adaptive.parquet``) and a harness JSON;
    ``recompute``: the sweep's rows summarised again from its journal with this checkout's
    statistics (:func:`~dspark_calibrate.calibrate.measurement.sweep.resummarize`), not as
    recorded."""
    art = read_artifact(sweep_dir / "adaptive.parquet")
    extra = art.provenance_untrusted().extra
    harness = json.loads(harness_file.read_text())
    rows, between = art.table.to_pylist(), extra.get("between_run", {})
    if recompute:
        from dspark_calibrate.calibrate.measurement.sweep import resummarize

        again = resummarize(
            sweep_dir / "adaptive.journal.jsonl", passes=bool(between.get("epochs_are_processes"))
        )
        rows, between = again.summary_table().to_pylist(), again.between.to_dict()
    result = compare(rows, between, harness, level_prior_rel=level_prior_rel)
    result["recomputed"] = recompute
    if recompute:
        designs = {c.spec.label(): c.mix for c in again.cells if c.mix is not None}
        result["mix_designs"] = by_mix_design(result["per_cell"], designs)
    meta_file = sweep_dir / "adaptive.json"
    if meta_file.exists():
        meta = json.loads(meta_file.read_text())
        result["sweep"] = {
            k: meta.get(k) for k in ("gpu_seconds", "rounds", "stop_reasons", "samples", "command")
        }
    result["sweep"] = {
        **result.get("sweep", {}),
        "carryover": extra.get("carryover"),
        "throttle": extra.get("throttle"),
        "order": extra.get("order"),
        "step_protocol": extra.get("step_protocol"),
        "clock_term": extra.get("clock_term"),
        "visits": extra.get("visits"),
        "mix_term": extra.get("mix_term"),
        "settling": extra.get("settling"),
    }
    result["harness"] = {k: harness.get(k) for k in ("seconds", "telemetry", "discard", "process_state")}
    return result


def write_independent(result: Mapping[str, Any], out: Path, *, base: Path = RESULT) -> Path:
    """``base`` (the repository's ``sweep_efficiency.json``, every key kept) with ``independent``
    set to ``result``, written to ``out``."""
    record = json.loads(base.read_text()) if base.exists() else {}
    record["independent"] = dict(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return out


# --- the one-call job -------------------------------------------------------------------------------


def run_job(
    mode: Mode,
    out: Path,
    log: Any,
    work: Path,
    *,
    repeat: bool = False,
    process_state: str = "sweep",
    stays: Sequence[float] = (STAY,),
    recapture: str = "never",
    processes: int = 1,
) -> int:
    """Sweep, harness, comparison; see the module docstring. The sweep's files go to ``work``
    (outside ``out``: a lent machine returns few files) and come back in one archive. Returns 0,
    or 1 when a stage failed.

    ``recapture`` (:data:`RECAPTURE`): ``never`` captures the harness's cells once, ``block``
    again before each of a G's blocks (:func:`recapture_group`), ``both`` runs the two harnesses
    one after the other: the comparison is against the re-capturing one, ``against_capture_once``
    against the other, and ``harness_layouts`` says how far the two are apart.

    ``processes`` > 1 runs the harness that many times, each in its own process capturing first
    in its own order (:func:`harness_in_processes`): ``independent.json`` is their pool, each run
    is in ``independent_processes.json`` (``runs``; a lent machine returns at most eight files) and ``harness_processes`` says how far they are apart."""
    if recapture not in RECAPTURE:
        raise SystemExit(f"--harness-recapture {recapture!r} is unknown; use one of {RECAPTURE}")
    if processes < 1 or (processes > 1 and recapture == "both"):
        raise SystemExit(
            f"--harness-processes {processes} needs to be >= 1, and 1 with --harness-recapture both"
        )
    if repeat and processes > 1:  # a repeat in this process would be pooled with the processes' pool
        raise SystemExit("--harness-repeat runs one more harness process; use --harness-processes alone")
    sweep_dir = work / "sweep"
    sweep_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    cmd = sweep_command(mode, sweep_dir)
    print("sweep:", " ".join(cmd), file=log, flush=True)
    try:
        rc = subprocess.run(
            cmd, stdout=log, stderr=subprocess.STDOUT, timeout=mode.sweep_timeout_s, check=False
        ).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    sweep_s = time.perf_counter() - started
    print(f"sweep rc={rc} after {sweep_s:.0f} s", file=log, flush=True)
    once = None
    if recapture == "both":
        once = run_harness(mode, process_state=process_state, stays=stays)
        (out / "independent_capture_once.json").write_text(json.dumps(once, indent=2, sort_keys=True) + "\n")
        print(f"capture-once harness done after {time.perf_counter() - started:.0f} s", file=log, flush=True)
    spread = None
    if processes > 1:
        runs = harness_in_processes(
            mode, processes, process_state=process_state, stays=stays, recapture=recapture != "never"
        )
        # One file for every run: a lent machine returns at most eight files.
        (out / "independent_processes.json").write_text(
            json.dumps({"runs": runs}, indent=2, sort_keys=True) + "\n"
        )
        harness, spread = pooled_harness(*runs), process_spread(runs)
    else:
        harness = run_harness(mode, process_state=process_state, stays=stays, recapture=recapture != "never")
    (out / "independent.json").write_text(json.dumps(harness, indent=2, sort_keys=True) + "\n")
    print(f"harness done after {time.perf_counter() - started:.0f} s", file=log, flush=True)
    agreement = None
    if repeat:
        again = run_harness(mode, seed=8)
        (out / "independent_repeat.json").write_text(json.dumps(again, indent=2, sort_keys=True) + "\n")
        agreement = harness_agreement(harness, again)
        print(f"harness repeat done after {time.perf_counter() - started:.0f} s", file=log, flush=True)
    status = 0
    if (sweep_dir / "adaptive.parquet").exists():
        result = compare_files(sweep_dir, out / "independent.json")
    else:
        result = {"gpu": harness["gpu"], "error": f"the sweep wrote no summary (rc={rc}); see job_log.txt"}
        status = 1
    if spread is not None:
        result["harness_processes"] = spread
    if once is not None:
        result["harness_layouts"] = harness_agreement(once, harness)
        if (sweep_dir / "adaptive.parquet").exists():
            other = compare_files(sweep_dir, out / "independent_capture_once.json")
            result["against_capture_once"] = {k: other.get(k) for k in (*TARGETS, "meets", "per_cell")}
    if agreement is not None:
        result["harness_repeat"] = agreement
        pooled = pooled_harness(harness, json.loads((out / "independent_repeat.json").read_text()))
        (out / "independent_pooled.json").write_text(json.dumps(pooled, indent=2, sort_keys=True) + "\n")
        for name, file in (
            ("against_repeat", "independent_repeat.json"),
            ("against_pooled", "independent_pooled.json"),
        ):
            if (sweep_dir / "adaptive.parquet").exists():
                other = compare_files(sweep_dir, out / file)
                result[name] = {k: other.get(k) for k in (*TARGETS, "meets")}
    result.update(
        command=" ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        commit=git_commit(),
        sweep_wall_s=sweep_s,
        job_wall_s=time.perf_counter() - started,
    )
    write_independent(result, out / "sweep_efficiency.json")
    with tarfile.open(out / "independent_work.tgz", "w:gz") as tar:
        tar.add(work, arcname="work")
    summary = {
        k: result.get(k)
        for k in (
            "gpu",
            "cells",
            *TARGETS,
            "paired_rel",
            "meets",
            "harness_repeat",
            "harness_layouts",
            "harness_processes",
            "job_wall_s",
        )
    }
    print(json.dumps(summary, sort_keys=True), file=log, flush=True)
    print(json.dumps(summary, sort_keys=True))
    return status


def _stays(text: str) -> tuple[float, ...]:
    """``--harness-stays``, checked when parsed: a job must not learn after its sweep that the
    harness cannot draw its sequences."""
    try:
        stays = tuple(float(x) for x in text.split(","))
    except ValueError:
        stays = ()
    if not stays or len(set(stays)) != len(stays) or not all(0.0 <= x < 1.0 for x in stays):
        raise argparse.ArgumentTypeError(f"expected distinct comma-separated numbers in [0, 1), got {text!r}")
    return stays


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and dispatch."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("job", "harness"):
        p = sub.add_parser(name)
        p.add_argument("--out", required=True, type=Path)
        p.add_argument("--tiny", action="store_true", help="the CPU pipeline on the tiny config")
        p.add_argument(
            "--work", type=Path, default=None, help="job: the sweep's directory (default: a temporary one)"
        )
        p.add_argument(
            "--sweep-budget",
            type=float,
            default=None,
            help="job: the sweep's GPU-second budget (default: the mode's, 240 on the GPU)",
        )
        p.add_argument(
            "--steps-per-block",
            type=int,
            default=None,
            help="steps of each G's harness sequence (default 400)",
        )
        p.add_argument(
            "--harness-repeat",
            action="store_true",
            help="job: run the harness a second time (another seed) and state how far its two runs are apart",
        )
        p.add_argument(
            "--sweep-interleave",
            action="store_true",
            help="job: the sweep visits each G's cells in one step-by-step alternating sequence (--interleave)",
        )
        p.add_argument(
            "--harness-process-state",
            choices=PROCESS_STATES,
            default="sweep",
            help="what the process runs on the GPU before the harness's first build (default: a matmul, as the sweep does)",
        )
        p.add_argument(
            "--harness-stays",
            type=_stays,
            default=(STAY,),
            help="comma-separated stay probabilities the harness draws its sequences with, each in "
            "every block (default 0.5); the comparison uses the first, the others go to by_stay",
        )
        p.add_argument(
            "--harness-recapture",
            choices=RECAPTURE,
            default="never",
            help="never: capture every cell once (default); block: capture a G's cells again before each "
            "of its blocks; both (job): the two harnesses, compared against the second",
        )
        p.add_argument(
            "--harness-blocks",
            type=int,
            default=None,
            help="sequences per G (default 3); with --harness-recapture block, the captures each G averages",
        )
        p.add_argument(
            "--harness-processes",
            type=int,
            default=1,
            help="run the harness this many times, each in its own process capturing first in its own "
            "order, and compare with their pool (default 1: one process, the ladder's order)",
        )
        p.add_argument("--sweep-seed", type=int, default=None, help="job: the sweep's --seed (default 1)")
        p.add_argument(
            "--sweep-dwell",
            type=float,
            default=None,
            help="job: with --sweep-interleave, the sweep's --dwell (mean run on one cell, steps)",
        )
        p.add_argument(
            "--sweep-resolve",
            type=float,
            default=None,
            help="job: with --sweep-interleave and one pass, the sweep's --resolve (e.g. 0.004)",
        )
        p.add_argument("--sweep-passes", type=int, default=None, help="job: the sweep's --passes (default 4)")
        p.add_argument(
            "--sweep-recapture-every",
            type=int,
            default=None,
            help="job: the sweep's --recapture-every (default 6: with four passes, one epoch each)",
        )
        p.add_argument(
            "--sweep-samples-per-visit",
            type=int,
            default=None,
            help="job: the sweep's --samples-per-visit (default 3)",
        )
        p.add_argument(
            "--sweep-max-samples",
            type=int,
            default=None,
            help="job: the sweep's --max-samples, its cap of samples per cell (default 128)",
        )
        p.add_argument(
            "--sweep-precision",
            type=float,
            default=None,
            help="job: the sweep's --precision, the relative half-width at which a cell stops (default 0.004)",
        )
        p.add_argument(
            "--sweep-settle-s",
            type=float,
            default=None,
            help="job: with --sweep-interleave, seconds each visit runs its mix untimed (--settle-s)",
        )
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("--sweep", required=True, type=Path, help="the sweep's out dir (adaptive.parquet)")
    cmp_.add_argument("--harness", required=True, type=Path, help="independent.json")
    cmp_.add_argument("--out", type=Path, default=RESULT)
    cmp_.add_argument(
        "--level-prior-rel",
        type=float,
        default=None,
        help="a per-run level SD measured in another job (its harness_repeat.level_sd_rel)",
    )
    cmp_.add_argument(
        "--recompute",
        action="store_true",
        help="summarise the sweep again from its journal with this checkout's statistics",
    )
    args = parser.parse_args(argv)
    if args.cmd == "compare":
        write_independent(
            compare_files(
                args.sweep, args.harness, level_prior_rel=args.level_prior_rel, recompute=args.recompute
            ),
            args.out,
        )
        return 0
    mode = with_budget(
        TINY if args.tiny else FULL,
        args.sweep_budget,
        args.steps_per_block,
        interleave=args.sweep_interleave,
        settle_s=args.sweep_settle_s,
        passes=args.sweep_passes,
        recapture_every=args.sweep_recapture_every,
        samples_per_visit=args.sweep_samples_per_visit,
        max_samples=args.sweep_max_samples,
        seed=args.sweep_seed,
        dwell=args.sweep_dwell,
        precision=args.sweep_precision,
        resolve=args.sweep_resolve,
    )
    if args.harness_blocks is not None:
        if args.harness_blocks < 1:
            raise SystemExit(f"--harness-blocks must be >= 1, not {args.harness_blocks}")
        mode = replace(mode, blocks=args.harness_blocks)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.cmd == "harness":
        if args.harness_recapture == "both":
            raise SystemExit(
                "--harness-recapture both needs the job (it compares two harnesses with one sweep)"
            )
        recapture = args.harness_recapture == "block"
        if args.harness_processes == 1:  # in this process, in the ladder's order, as always
            result = run_harness(
                mode, process_state=args.harness_process_state, stays=args.harness_stays, recapture=recapture
            )
        else:
            runs = harness_in_processes(
                mode,
                args.harness_processes,
                process_state=args.harness_process_state,
                stays=args.harness_stays,
                recapture=recapture,
            )
            result = pooled_harness(*runs)
        (args.out / "independent.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="independent-"))
    with open(args.out / "job_log.txt", "a", encoding="utf-8") as log:
        return run_job(
            mode,
            args.out,
            log,
            work,
            repeat=args.harness_repeat,
            process_state=args.harness_process_state,
            stays=args.harness_stays,
            recapture=args.harness_recapture,
            processes=args.harness_processes,
        )


if __name__ == "__main__":
    sys.exit(main())
