"""The confidence path's per-step cost in the serving loop: the device planner against the host one.

What it measures is the release bracket's "feature on, windows forced to K" arm (DESIGN §9): the
whole confidence path (logits staged, selector, allocator, snapshot, bookkeeping) runs every step
of a real serving run of the end-to-end testbed's engine, every step verifies the full block, and
static K runs interleaved with it step by step (:mod:`benchmarks.e2e.bracket`). Per concurrency,
the forced-K step time minus static K's, with a Student-t 95% interval over runs, for the device
planner in each ``--modes`` mode (default: fused into the engine's cell graphs with compiled
ranking, the same with eager kernels, and the lagged planner with graphs of its own) and the host
reference planner, side by side in one run.

One H200, one command (about 3 minutes: a short training, the native graphs of every arm, the
compilation, eight bracket runs per level)::

    PYTHONPATH=src:/tmp/site python3 benchmarks/device_planner.py --out $OUT

writes ``$OUT/device_planner.json``: ``gpu``, ``commit``, ``command``, and per concurrency
``{"256": {"device_overhead_ms": ..., "host_overhead_ms": ..., "ci": {"device": [lo, hi],
"host": [lo, hi]}, ...}}``, plus the planner graph's own GPU time per G (eager and compiled
ranking and allocation, the selection), the host time of a lagged launch and of the fused
planner's commit, a check that a lagged launch never synchronises with the device, and the device's
decisions against the reference planner's. ``--checkpoint FILE`` loads the weights an e2e run
saved instead of training. ``--from-e2e E2E_JSON`` writes the same file from the bracket an
e2e run already measured (no device time). ``--tiny`` runs the same code on the CPU in seconds.

The planners price a cost table modelled on the measured native steps (four compact cells per
G); the device planner's work does not depend on the values (fixed shapes), the host planner's
only through how often it allocates a compact cell.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parents[1]
for _p in (str(_REPO), str(_REPO / "src")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from benchmarks.e2e import data, pipeline, run, serving  # noqa: E402

from dspark_calibrate.runtime_plugin.device_planner import DevicePlanner, ServingPlanner  # noqa: E402
from dspark_calibrate.runtime_plugin.engine import DynamicVerifier  # noqa: E402
from dspark_calibrate.runtime_plugin.fused_planner import FusedServingPlanner  # noqa: E402
from dspark_calibrate.runtime_plugin.planner import Calibration, CostTable, DrainGuard, StepRows, plan  # noqa: E402

#: The issue's target for the device planner's overhead at the highest concurrency.
TARGET_MS = 0.05
#: Share of a native step's time that does not shrink with V in the modelled table.
FIXED_SHARE = 0.5


def _parser() -> Any:
    ap = run.build_parser(__doc__.split("\n\n")[0])
    ap.add_argument("--from-e2e", type=Path, default=None, help="write the result from an e2e run's e2e.json")
    ap.add_argument(
        "--modes",
        default="fused+compile,fused,lagged",
        help="device planner serving modes to measure, the first one reported as the device's (comma-separated)",
    )
    ap.set_defaults(bracket_runs=8)  # 2 x 4 arms: every arm at every place of a cycle twice
    return ap


def level_rows(bracket_levels: dict[str, Any], modes: list[str]) -> dict[str, Any]:
    """Per concurrency: the device (first mode) and host overheads, their intervals, the rest."""
    out: dict[str, Any] = {}
    for c, arms in bracket_levels.items():
        host = arms.get("forced-host", {})
        dev = arms.get(f"forced-device-{modes[0]}", {})
        row: dict[str, Any] = {
            "device_overhead_ms": dev.get("overhead_ms"),
            "host_overhead_ms": host.get("overhead_ms"),
            "ci": {"device": dev.get("ci"), "host": host.get("ci")},
            "device_mode": modes[0],
            "static_step_ms": host.get("static_mean_ms"),
            "runs": host.get("runs"),
            "cycles": host.get("cycles"),
        }
        for m in modes[1:]:
            other = arms.get(f"forced-device-{m}", {})
            key = m.replace("+", "_")
            row[f"device_{key}_overhead_ms"] = other.get("overhead_ms")
            row["ci"][f"device_{key}"] = other.get("ci")
        if row["device_overhead_ms"] is not None and row["host_overhead_ms"]:
            row["device_over_host"] = row["device_overhead_ms"] / row["host_overhead_ms"]
        out[str(c)] = row
    return out


def _verdict(levels: dict[str, Any]) -> dict[str, Any]:
    top = max(levels, key=int) if levels else None
    if top is None:
        return {}
    row = levels[top]
    hi = (row["ci"].get("device") or [None, None])[1]
    return {
        "concurrency": int(top),
        "target_ms": TARGET_MS,
        "device_overhead_ms": row["device_overhead_ms"],
        "device_upper_ms": hi,
        "meets_target": bool(hi is not None and math.isfinite(hi) and hi <= TARGET_MS),
    }


def from_e2e(path: Path, out: Path, modes: list[str]) -> int:
    """``device_planner.json`` from the bracket of an e2e run (no device time)."""
    e2e = json.loads(path.read_text(encoding="utf-8"))
    stage = (e2e.get("stages") or {}).get("bracket") or {}
    levels = level_rows({c: x["arms"] for c, x in (stage.get("levels") or {}).items()}, modes)
    result = {
        "benchmark": "device_planner",
        "source": f"the overhead bracket of the e2e run {path}",
        "gpu": e2e.get("gpu"),
        "commit": e2e.get("commit"),
        "dirty": e2e.get("dirty"),
        "command": e2e.get("command"),
        "settings": e2e.get("settings"),
        "device_planner": stage.get("device_planner"),
        "levels": levels,
        "verdict": _verdict(levels),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "device_planner.json").write_text(
        json.dumps(run.json_safe(result), indent=2, sort_keys=True) + "\n"
    )
    print(json.dumps(run.json_safe(result["levels"]), indent=2))
    return 0


def _native_ms(engine: serving.Engine, g: int, context: int, reps: int) -> float:
    step = engine.synthetic_step(g, 0, context)
    for _ in range(3):
        step()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return 1000.0 * float(np.median(times))


def modelled_verifier(s: run.Settings, native: dict[int, float]) -> DynamicVerifier:
    """Four compact cells per G priced as ``T(G,0) * (FIXED_SHARE + (1 - FIXED_SHARE) * V / (G(K+1)))``."""
    cells: dict[tuple[int, int], float] = {}
    budgets = pipeline.candidate_budgets(s.ladder, s.k, s.budget_multiples)
    for g in s.ladder:
        cells[(g, 0)] = native[g]
        for v in budgets[g][-4:]:
            cells[(g, v)] = native[g] * (FIXED_SHARE + (1.0 - FIXED_SHARE) * v / (g * (s.k + 1)))
    table = CostTable.from_cells(s.k, cells, drain_guard=DrainGuard(1.0, 1.0, 0.0, max(s.ladder)))
    return DynamicVerifier(table, Calibration.sts([1.0] * s.k), digest="modelled-table", min_verify_len=1)


def _gpu_ms(fn: Any, reps: int) -> float:
    """GPU time of ``fn`` (graph replays) per call: the GPU is kept busy while the host enqueues,
    so the events time the device's work, not the host's launch rate."""
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(50_000_000)  # ~30 ms of spinning: the replays below queue up behind it
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / reps


def _fused_host_ms(
    verifier: DynamicVerifier, device: torch.device, g: int, k: int, rng: np.random.Generator, reps: int
) -> float:
    """Host time of the fused planner's part of a step: commit, the logits into the (pinned)
    input buffer, and observing the decision that came back (no device work: the engine's
    graph does that)."""
    fused = FusedServingPlanner(DevicePlanner(verifier.cost_table, verifier.calibration, device=device))
    pin = device.type == "cuda"
    ints_host = torch.zeros(3, dtype=torch.int64, pin_memory=pin)
    size = fused.decision_size(g)
    fused.bind(
        g,
        logits=torch.zeros(1, g, k, device=device),
        ints=torch.zeros(3, dtype=torch.int64, device=device),
        ints_host=ints_host.numpy(),
        windows=torch.zeros(g, dtype=torch.int64, device=device),
        decision=torch.zeros(size, device=device),
    )
    host_logits = torch.zeros(g, k, pin_memory=pin).numpy()
    logits = rng.normal(1.0, 2.0, (g, k)).astype(np.float32)
    decision = np.zeros(size, dtype=np.float32)
    decision[0] = 0.0  # the first compact cell: the lag rule then re-validates it every step
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fused.commit((g,))
        host_logits[:g] = logits
        fused.observe(decision)
        times.append(time.perf_counter() - t)
    return 1000.0 * float(np.median(times))


def micro(verifier: DynamicVerifier, device: torch.device, s: run.Settings, seed: int) -> dict[str, Any]:
    """The planner alone: GPU time per G of the part before the engine's step (survivals,
    allocation) and of the selection beside it, eager and compiled, host time of a lagged launch
    and of the fused commit, no-sync check, agreement (eager and compiled) with the reference."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"per_g": {}}
    dp = DevicePlanner(verifier.cost_table, verifier.calibration, device=device)
    cuda = device.type == "cuda"
    compiled = DevicePlanner(verifier.cost_table, verifier.calibration, device=device, compile=cuda)
    for g in s.ladder:
        step = dp.step(g)
        x = torch.from_numpy(rng.normal(1.0, 2.0, (1, g, s.k)).astype(np.float32))
        reps = 200 if cuda else 20
        row: dict[str, Any] = {}
        for name, st in (("critical", step), ("critical_compiled", compiled.step(g))):
            st.logits.copy_(x)
            st.ints[0], st.ints[1], st.ints[2] = g, len(st.budgets) - 1, 0
            st.capture()
            if cuda:
                row[f"{name}_gpu_ms"] = _gpu_ms(st.run_critical, reps)
        if cuda:
            row["select_gpu_ms"] = _gpu_ms(step.run_select, reps)
            row["select_compiled_gpu_ms"] = _gpu_ms(compiled.step(g).run_select, reps)
            row["critical_compiled_equal"] = bool(torch.equal(step.windows, compiled.step(g).windows))
        row["fused_host_ms_median"] = _fused_host_ms(verifier, device, g, s.k, rng, reps)
        sp = ServingPlanner(dp, mode="lagged")
        logits = rng.normal(1.0, 2.0, (g, s.k)).astype(np.float32)
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            sp.launch(logits, [g])
            times.append(time.perf_counter() - t)
            if cuda:
                torch.cuda.synchronize()  # outside the timed launch: one launch at a time
        sp.finish()
        row["launch_host_ms_median"] = 1000.0 * float(np.median(times))
        out["per_g"][str(g)] = row
    # No host synchronisation inside a lagged launch (CUDA's sync debug mode raises on one).
    if cuda:
        sp = ServingPlanner(dp, mode="lagged")
        sp.prepare()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(50):
                g = int(rng.choice(s.ladder))
                sp.launch(rng.normal(0.0, 2.0, (g, s.k)).astype(np.float32), [g])
            out["lagged_launch_syncs"] = "none"
        except RuntimeError as exc:
            out["lagged_launch_syncs"] = f"synchronised: {exc}"
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        sp.finish()
    # The device's decisions against the reference planner's, on random steps of every occupancy.
    agree, total = 0, 0
    sync = ServingPlanner(dp, mode="sync")
    for _ in range(300 if cuda else 40):
        n = int(rng.integers(1, max(s.ladder) + 1))
        logits = rng.normal(rng.choice([-2.0, 0.5, 3.0]), 2.0, (n, s.k)).astype(np.float32)
        ref = plan(verifier.cost_table, verifier.calibration, StepRows.single_rank(logits.astype(np.float64)))
        agree += sync.launch(logits, [n]) == (ref.graph_batch_size, ref.verifier_budget)
        total += 1
    sync.finish()
    out["decisions_equal_to_reference"] = {"equal": agree, "steps": total}
    out["compiled_decisions_equal_to_reference"] = _compiled_agreement(verifier, compiled, s, rng)
    out["compile_errors"] = sorted({st.compile_error for st in compiled._steps.values() if st.compile_error})
    return out


def _compiled_agreement(
    verifier: DynamicVerifier, compiled: DevicePlanner, s: run.Settings, rng: np.random.Generator
) -> dict[str, int]:
    """The compiled parts' decision (cell) and windows against the reference planner's."""
    agree = windows_equal = total = 0
    for _ in range(300 if compiled.device.type == "cuda" else 40):
        n = int(rng.integers(1, max(s.ladder) + 1))
        logits = rng.normal(rng.choice([-2.0, 0.5, 3.0]), 2.0, (n, s.k)).astype(np.float32)
        ref = plan(verifier.cost_table, verifier.calibration, StepRows.single_rank(logits.astype(np.float64)))
        g = ref.graph_batch_size
        step = compiled.step(g)
        grid = np.zeros((1, g, s.k), dtype=np.float32)
        grid[0, :n] = logits
        step.logits.copy_(torch.from_numpy(grid))
        budgets = step.budgets
        column = budgets.index(ref.verifier_budget) if ref.verifier_budget else -1
        step.ints.copy_(torch.tensor([n, column, 0]))
        step.enqueue_critical()
        step.enqueue_select()
        got = step.read()
        agree += (got.graph_batch_size, got.verifier_budget) == (g, ref.verifier_budget)
        windows_equal += step.windows[0, :n].cpu().numpy().tolist() == ref.windows.tolist()
        total += 1
    return {"equal": agree, "windows_equal": windows_equal, "steps": total}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit code."""
    args = _parser().parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    out = (args.out or Path("device-planner-out")).resolve()
    if args.from_e2e is not None:
        return from_e2e(args.from_e2e, out, modes)
    out.mkdir(parents=True, exist_ok=True)
    s = run.make_settings(args)
    # A shorter training than the e2e run's: what costs is the step's shape; the drafter only
    # needs to give the planners realistic confidences.
    preset = s.preset
    if args.target_steps is None:
        short = {"h200": (80, 256, 300), "tiny": (30, 16, 30)}[preset.name]
        preset = replace(preset, target_steps=short[0], rollout_prompts=short[1], drafter_steps=short[2])
    s = replace(s, preset=preset, bracket_modes=tuple(modes))
    device = run.torch_device(args)
    rec = run.Recorder(out, name="device_planner.json")
    rec.result.update(
        {
            "benchmark": "device_planner",
            "source": "standalone",
            "command": run.command_line(argv, script="benchmarks/device_planner.py"),
            **run.commit_info(),
            "gpu": run.gpu_info(device),
            "settings": s.to_dict(),
            "target_ms": TARGET_MS,
        }
    )
    rec.write()
    try:
        t = time.perf_counter()
        corpus = data.load_corpus(s.preset.corpus_bytes)
        trained = run.stage_train(s, corpus, device, rec, args.checkpoint)
        rec.stage("train", time.perf_counter() - t, summaries=trained.summaries)

        t = time.perf_counter()
        engine, _, attention = run.build_engine(
            s, trained, device, [(g, 0) for g in s.ladder], graphs=not args.no_graphs, log=rec.log
        )
        context = s.max_len // 2
        native = {g: _native_ms(engine, g, context, 15 if device.type == "cuda" else 3) for g in s.ladder}
        verifier = modelled_verifier(s, native)
        rec.stage("engine", time.perf_counter() - t, attention=attention, native_ms=native)
        rec.log(f"native steps: {', '.join(f'G{g} {ms:.2f} ms' for g, ms in native.items())}")

        t = time.perf_counter()
        static = serving.StaticPolicy(s.ladder, s.k)
        levels = []
        for c in s.levels:
            lv = run.Level(
                c, data.sample_prompts(corpus.heldout, s.requests(c), s.prompt_len, seed=s.seed + 1000 + c)
            )
            lv.reference = run.serve_level(engine, lv.prompts, c, s, static).outputs.copy()
            levels.append(lv)
        rec.stage("reference", time.perf_counter() - t)
        run.stage_bracket(s, engine, levels, verifier, rec)
        rows = level_rows({str(lv.concurrency): lv.bracket for lv in levels}, modes)
        rec.result["levels"] = rows
        rec.result["identical_outputs"] = all(not lv.mismatches for lv in levels)
        rec.result["mismatches"] = [m for lv in levels for m in lv.mismatches][:5]
        rec.result["verdict"] = _verdict(rows)
        rec.write()

        t = time.perf_counter()
        rec.result["micro"] = micro(verifier, device, s, s.seed)
        rec.stage("micro", time.perf_counter() - t)
        rec.result["status"] = "done"
    finally:
        if rec.result.get("status") != "done":
            exc = sys.exc_info()[1]
            rec.result["status"] = "failed"
            rec.result["error"] = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown"
            rec.log(f"FAILED: {rec.result['error']}")
        rec.write()
    for c, row in rec.result.get("levels", {}).items():
        rec.log(
            f"C={c}: device {row['device_overhead_ms']} ms, host {row['host_overhead_ms']} ms per step "
            f"(static step {row['static_step_ms']} ms)"
        )
    rec.log(f"done in {rec.elapsed():.0f}s; {out / 'device_planner.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
