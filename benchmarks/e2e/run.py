"""End-to-end experiment of issue 7: does the toolkit's predicted gain come true on a GPU?

One script, one GPU job::

    PYTHONPATH=src:/tmp/site python3 benchmarks/e2e/run.py --out $OUT

Stages (each prints timestamped progress and rewrites ``$OUT/e2e.json``, so a job killed at any
point still returns what was measured):

1. train: the byte-level target LM on the stdlib sources, then the drafter and its confidence
   head distilled from the target's greedy rollouts (:mod:`model`);
2. engine: the serving engine with one CUDA graph per (G, V) cell (:mod:`serving`);
3. toolkit: live fingerprint, ``sweep`` (module backend on the engine's own step), traces under
   full verification, one recorded static workload per concurrency level, ``fit``, the release
   bracket's overhead arm per level (the confidence path on, every window forced to K, minus
   static K; both planners; :mod:`bracket`), an ephemeral signing key and trust root, ``build``
   per level drawing the dynamic arm's planner's measured runs, ``export`` (when the toolkit provides it),
   ``admit`` per level (:mod:`pipeline`);
4. experiment: per level, static K and dynamic (the admitted selector/allocator: the device
   planner by default, ``--host-planner`` for the host one) on the same prompts, interleaved
   A B A B; outputs checked token for token;
5. analysis: realised gain with a CI across pairs against build's predicted gain and CI, the
   failed modelling assumption when they disagree (:mod:`analysis`), and ``e2e.png``.

``--tiny`` runs everything on the CPU with a tiny model in well under a minute (the CI test).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parents[2]
for _p in (str(_REPO), str(_REPO / "src")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from benchmarks.e2e import analysis, bracket, data, model, pipeline, serving  # noqa: E402
from benchmarks.e2e.plot import GainPoint, plot_gains  # noqa: E402

#: The minimum number of interleaved A/B pairs per level (issue 7).
MIN_PAIRS = 3


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the experiment's shape depends on (recorded in ``e2e.json``)."""

    preset: model.Preset
    k: int
    ladder: tuple[int, ...]
    levels: tuple[int, ...]
    pairs: int
    prompt_len: int
    max_new: int
    gemm_chunk: int
    budget_multiples: tuple[float, ...]
    trace_requests: int
    min_requests: int
    requests_per_slot: int
    sweep_budget_s: float
    sweep_precision: float
    sweep_min_rounds: int
    sweep_cell_cap_s: float
    sweep_warmup: int
    n_boot: int
    build_resamples: int
    budget_s: float
    seed: int
    bracket_runs: int
    bracket_modes: tuple[str, ...] = ()
    ungated: bool = False
    planner: pipeline.PlannerSettings = field(default_factory=pipeline.PlannerSettings)

    @property
    def max_len(self) -> int:
        """Cache positions per slot, rounded up to 16 (attention-mask alignment)."""
        need = self.prompt_len + self.max_new + self.k + 1
        return -(-need // 16) * 16

    def requests(self, concurrency: int) -> int:
        """Requests served per run at a concurrency level (several waves of continuous batching)."""
        return max(self.requests_per_slot * concurrency, self.min_requests)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "preset": self.preset.name,
            "k": self.k,
            "ladder": list(self.ladder),
            "levels": list(self.levels),
            "pairs": self.pairs,
            "prompt_len": self.prompt_len,
            "max_new": self.max_new,
            "max_len": self.max_len,
            "gemm_chunk": self.gemm_chunk,
            "budget_multiples": list(self.budget_multiples),
            "trace_requests": self.trace_requests,
            "requests_per_level": {str(c): self.requests(c) for c in self.levels},
            "sweep": {
                "budget_s": self.sweep_budget_s,
                "precision_rel": self.sweep_precision,
                "min_rounds": self.sweep_min_rounds,
                "cell_cap_s": self.sweep_cell_cap_s,
            },
            "build_resamples": self.build_resamples,
            "bracket_runs": self.bracket_runs,
            "bracket_modes": list(self.bracket_modes or (self.planner.mode,)),
            "planner": self.planner.to_dict(),
            "budget_s": self.budget_s,
            "seed": self.seed,
        }


def make_settings(args: argparse.Namespace) -> Settings:
    """The GPU (``h200``) or CPU (``tiny``) settings, with command-line overrides."""
    if args.tiny:
        base = Settings(
            preset=model.PRESETS["tiny"],
            k=5,
            ladder=(2, 4, 8),
            levels=(2, 4, 8),
            pairs=MIN_PAIRS,
            prompt_len=24,
            max_new=24,
            # One token per GEMM launch: on a CPU the per-launch overhead then gives T(G, V) a slope.
            gemm_chunk=1,
            budget_multiples=(2.0, 3.0, 4.0),
            trace_requests=48,
            min_requests=8,
            requests_per_slot=2,
            sweep_budget_s=6.0,
            sweep_precision=0.03,
            sweep_min_rounds=3,
            sweep_cell_cap_s=1.5,
            sweep_warmup=1,
            n_boot=100,
            build_resamples=200,
            budget_s=55.0,
            seed=args.seed,
            bracket_runs=3,
        )
    else:
        base = Settings(
            preset=model.PRESETS["h200"],
            k=5,
            ladder=(8, 16, 32, 64, 128, 256),
            levels=(8, 64, 256),
            pairs=5,
            prompt_len=64,
            max_new=128,
            gemm_chunk=128,
            budget_multiples=(1.5, 2.0, 2.5, 3.0, 4.0, 5.0),
            trace_requests=512,
            min_requests=96,
            requests_per_slot=4,
            sweep_budget_s=90.0,
            sweep_precision=0.01,
            sweep_min_rounds=4,
            sweep_cell_cap_s=6.0,
            sweep_warmup=8,
            n_boot=300,
            build_resamples=1000,
            budget_s=540.0,
            seed=args.seed,
            bracket_runs=6,
        )
    if args.ungated:
        base = replace(base, ungated=True)
    # The device planner is the default; --tiny runs its code on the CPU (no CUDA there).
    planner_device = args.planner_device or ("cpu" if args.tiny else None)
    base = replace(
        base,
        planner=pipeline.PlannerSettings(
            prefer="host" if args.host_planner else "device",
            device=planner_device,
            mode=args.device_decision,
            dtype=args.planner_dtype,
        ),
    )
    if args.bracket_runs:
        base = replace(base, bracket_runs=max(2, args.bracket_runs))
    if args.levels:
        base = replace(base, levels=tuple(int(x) for x in args.levels.split(",")))
    if args.pairs:
        base = replace(base, pairs=max(MIN_PAIRS, args.pairs))
    if args.budget_s:
        base = replace(base, budget_s=args.budget_s)
    if args.target_steps:
        base = replace(base, preset=replace(base.preset, target_steps=args.target_steps))
    if max(base.levels) > max(base.ladder):
        raise SystemExit(f"--levels {base.levels} exceed the largest graph batch size {max(base.ladder)}")
    return base


def sweep_settings(s: Settings, budgets: dict[int, tuple[int, ...]]) -> pipeline.SweepSettings:
    """The decode sweep's settings of ``s`` over the candidate ``budgets``."""
    return pipeline.SweepSettings(
        budgets=budgets,
        precision_rel=s.sweep_precision,
        budget_s=s.sweep_budget_s,
        max_seconds_per_cell=s.sweep_cell_cap_s,
        min_rounds=s.sweep_min_rounds,
        warmup_steps=s.sweep_warmup,
        n_boot=s.n_boot,
    )


class Recorder:
    """Timestamped progress on stdout and the result file, rewritten atomically after each stage."""

    def __init__(self, out: Path, name: str = "e2e.json") -> None:
        self.out = out
        self.name = name
        self.t0 = time.perf_counter()
        self.result: dict[str, Any] = {"status": "running", "stages": {}}

    def elapsed(self) -> float:
        """Seconds since the script started."""
        return time.perf_counter() - self.t0

    def log(self, message: str) -> None:
        """One progress line: wall clock, elapsed seconds, message."""
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        print(f"[{stamp} +{self.elapsed():6.1f}s] {message}", flush=True)

    def stage(self, name: str, seconds: float, **info: Any) -> None:
        """Record a finished stage and write the file."""
        self.result["stages"][name] = {"seconds": round(seconds, 3), **info}
        self.write()

    def finish(self) -> None:
        """Close the run (call it in ``finally``): whatever stopped it (an error, a
        KeyboardInterrupt), the file says how far it got and why."""
        if self.result["status"] != "done":
            exc = sys.exc_info()[1]
            self.result["status"] = "failed"
            self.result["error"] = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown"
            self.log(f"FAILED: {self.result['error']}")
        self.write()
        self.log(f"done in {self.elapsed():.0f}s; results in {self.out / self.name}")

    def write(self) -> None:
        """Atomically replace the result file (``e2e.json``)."""
        self.result["elapsed_s"] = round(self.elapsed(), 3)
        tmp = self.out / f".{self.name}.tmp"
        tmp.write_text(json.dumps(json_safe(self.result), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, self.out / self.name)


def json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.generic):
        return json_safe(obj.item())
    if isinstance(obj, Path):
        return str(obj)
    return obj


def command_line(argv: list[str] | None, script: str = "benchmarks/e2e/run.py") -> str:
    """The command line as run, with the PYTHONPATH it ran under."""
    args = sys.argv if argv is None else [script, *argv]
    path = os.environ.get("PYTHONPATH")
    return " ".join(([f"PYTHONPATH={path}"] if path else []) + ["python3", *args])


#: Modules the toolkit stages need beyond torch and numpy (signing, verification, the export
#: command). Checked before training so a missing wheel costs seconds, not a GPU job.
REQUIRED_MODULES: tuple[str, ...] = (
    "pyarrow", "scipy", "typer", "rich", "yaml", "filelock", "cryptography", "securesystemslib", "tuf",
)  # fmt: skip


def preflight() -> None:
    """Fail fast, naming every missing module and toolkit module that does not import.

    Raises:
        SystemExit: something is missing (the message lists it and how to provide it).
    """
    missing = [name for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]
    broken = []
    for module in (
        "dspark_calibrate.calibrate.deployment.build",
        "dspark_calibrate.calibrate.confidence.fit",
        "dspark_calibrate.runtime_plugin.admission",
        "dspark_calibrate.runtime_plugin.engine",
    ):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            broken.append(f"{module}: {exc}")
    if missing or broken:
        raise SystemExit(
            f"missing modules {missing}; toolkit imports failing {broken}. Install the wheels (e.g. "
            "pip install --no-index --target /tmp/site ...) and put them on PYTHONPATH."
        )


def commit_info() -> dict[str, Any]:
    def git(*a: str) -> str | None:
        try:
            done = subprocess.run(["git", *a], capture_output=True, check=True, cwd=_REPO, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.decode().strip()

    # A lent machine's copy of the tree may carry a stale .git: the caller's commit wins.
    head = os.environ.get("GIT_COMMIT") or git("rev-parse", "HEAD")
    status = git("status", "--porcelain")
    return {"commit": head, "dirty": None if status is None else bool(status)}


def gpu_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "device": str(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if device.type != "cuda":
        info["name"] = "CPU"
        info["cpu_threads"] = torch.get_num_threads()
        return info
    props = torch.cuda.get_device_properties(device)
    info.update(
        {
            "name": torch.cuda.get_device_name(device),
            "memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
            "cuda": torch.version.cuda,
        }
    )
    try:
        import pynvml
    except ImportError:
        info["nvml"] = "nvidia-ml-py not installed"
        return info
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        info["driver"] = pynvml.nvmlSystemGetDriverVersion()
        info["sm_clock_max_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
        info["power_limit_w"] = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
    except pynvml.NVMLError as exc:
        info["nvml"] = f"unavailable: {exc}"
    return info


def attention_backend_probe(device: torch.device) -> tuple[str, str]:
    """The SDPA kernel the engine uses: memory-efficient on CUDA when it accepts the engine's
    masked grouped call (per-(row, head) tiles, batch-invariant), else the math kernel.

    Returns:
        ``(engine attention setting, description)``.
    """
    if device.type != "cuda":
        return "math", "sdpa-math"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.zeros(2, 4, 24, 128, device=device, dtype=torch.bfloat16)
    kv = torch.zeros(2, 208, 4, 128, device=device, dtype=torch.bfloat16).transpose(1, 2)
    mask = torch.ones(2, 1, 24, 208, device=device, dtype=torch.bool)
    try:
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)
    except RuntimeError as exc:
        return "math", f"sdpa-math (memory-efficient kernel refused the masked call: {exc})"
    return "efficient", "sdpa-efficient"


# -- stages ---------------------------------------------------------------------------------------
@dataclass
class Trained:
    """The trained pair in serving dtype."""

    target: model.TargetLM
    drafter: model.Drafter
    summaries: dict[str, Any]


def stage_train(
    s: Settings, corpus: data.Corpus, device: torch.device, rec: Recorder, checkpoint: Path | None
) -> Trained:
    """Train (or load) the target and the drafter; returns them in the serving dtype."""
    torch.manual_seed(s.seed)
    target = model.TargetLM(s.preset.model).to(device)
    drafter = model.Drafter(
        model.DrafterConfig(d_target=s.preset.model.d_model, d_draft=s.preset.d_draft, k=s.k)
    ).to(device)
    serve_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, map_location=device, weights_only=True)
        target.load_state_dict(state["target"])
        drafter.load_state_dict(state["drafter"])
        rec.log(f"loaded target and drafter from {checkpoint}")
        target, drafter = target.to(serve_dtype).eval(), drafter.to(serve_dtype).eval()
        return Trained(target, drafter, {"loaded_from": str(checkpoint)})
    held = np.frombuffer(b"".join(corpus.heldout[:50]), dtype=np.uint8)
    rec.log(f"target: {target.n_params() / 1e6:.1f}M parameters, {s.preset.target_steps} steps")
    ts = model.train_target(target, corpus.train, held, s.preset, seed=s.seed, device=device, log=rec.log)
    rec.log(
        f"target trained in {ts.seconds:.1f}s: loss {ts.final_loss:.3f}, "
        f"held-out {ts.eval['heldout_loss_nats_per_byte']:.3f}"
    )
    target = target.to(serve_dtype).eval()
    rollout_prompts = data.sample_prompts(
        corpus.heldout, s.preset.rollout_prompts, s.prompt_len, seed=s.seed + 11
    )
    ds = model.train_drafter(
        drafter,
        target,
        torch.from_numpy(rollout_prompts).to(device),
        s.preset,
        seed=s.seed,
        device=device,
        log=rec.log,
    )
    rec.log(f"drafter trained in {ds.seconds:.1f}s: held-out {ds.eval}")
    drafter = drafter.to(serve_dtype).eval()
    if checkpoint is not None:
        torch.save({"target": target.state_dict(), "drafter": drafter.state_dict()}, checkpoint)
    return Trained(target, drafter, {"target": ts.to_dict(), "drafter": ds.to_dict()})


@dataclass
class Level:
    """Per-concurrency state of the toolkit stages and the experiment."""

    concurrency: int
    prompts: np.ndarray
    reference: np.ndarray | None = None
    workload_path: Path | None = None
    build: dict[str, Any] = field(default_factory=dict)
    predicted: dict[str, Any] = field(default_factory=dict)
    admission: dict[str, Any] = field(default_factory=dict)
    policy: serving.Policy | None = None
    pairs: list[tuple[serving.RunResult, serving.RunResult]] = field(default_factory=list)
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    steps: list[np.ndarray] = field(default_factory=list)  # the recorded static run's logits per step
    bracket: dict[str, Any] = field(default_factory=dict)
    overhead: dict[str, Any] = field(default_factory=dict)  # what build was handed (JSON-ready)
    evidence: Any = None  # the dynamic arm's planner's bracket runs (OverheadEvidence), if measured
    verifier: Any = None  # the admitted DynamicVerifier (None when admission kept static K)
    host_policy: serving.Policy | None = None  # the host planner over the same deployment (comparison)
    host_runs: list[serving.RunResult] = field(default_factory=list)


def serve_level(
    engine: serving.Engine,
    prompts: np.ndarray,
    c: int,
    s: Settings,
    policy: serving.Policy,
    record: bool = False,
    log_steps: bool = False,
) -> serving.RunResult:
    gc.collect()
    gc.disable()
    try:
        return serving.serve(
            engine,
            prompts,
            concurrency=c,
            max_new=s.max_new,
            policy=policy,
            record=record,
            log_steps=log_steps,
        )
    finally:
        gc.enable()


def first_mismatch(a: np.ndarray, b: np.ndarray) -> dict[str, Any] | None:
    diff = np.argwhere(a != b)
    if diff.size == 0:
        return None
    r, j = (int(x) for x in diff[0])
    return {
        "request": r,
        "position": j,
        "expected": int(a[r, j]),
        "got": int(b[r, j]),
        "tokens_differing": int(diff.shape[0]),
    }


def stage_toolkit(
    s: Settings,
    engine: serving.Engine,
    trained: Trained,
    levels: list[Level],
    corpus: data.Corpus,
    attention: str,
    out: Path,
    rec: Recorder,
) -> dict[tuple[int, int], float]:
    """Sweep, traces, workloads, fit, keys, build, export and admit; fills each level's policy."""
    tk = out / "toolkit"
    tk.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    live, described = pipeline.deployment_live(
        engine, trained.target, trained.drafter, attention_backend=attention
    )
    rec.result["deployment"] = described
    rec.stage("fingerprint", time.perf_counter() - t, missing=list(live.missing))

    t = time.perf_counter()
    budgets = pipeline.candidate_budgets(s.ladder, s.k, s.budget_multiples)
    settings = sweep_settings(s, budgets)
    result, output = pipeline.run_sweep_stage(engine, live, tk, settings, seed=s.seed, log=rec.log)
    table = result.summary_table().to_pylist()
    table_ms = {
        (int(r["graph_batch_size"]), int(r["verifier_budget"])): float(r["step_time_ms"]) for r in table
    }
    rec.result["cost_table_measured"] = [
        {
            k: r[k]
            for k in (
                "graph_batch_size",
                "verifier_budget",
                "tokens",
                "step_time_ms",
                "ci_low_ms",
                "ci_high_ms",
                "samples",
                "stop_reason",
            )
        }
        for r in table
    ]
    rec.stage(
        "sweep",
        time.perf_counter() - t,
        cells=len(table),
        rounds=result.rounds,
        path=str(output.summary_path) if output else None,
    )
    slope = {}
    for g in s.ladder:
        native = table_ms.get((g, 0))
        compact = [(ms, v) for (gg, v), ms in table_ms.items() if gg == g and v != 0]
        if native and compact:
            ms, v = min(compact)
            slope[str(g)] = {
                "native_ms": native,
                "cheapest_v": v,
                "cheapest_ms": ms,
                "saving": 1 - ms / native,
            }
    rec.result["cost_table_slope"] = slope
    rec.log(
        f"sweep: {len(table)} cells in {result.rounds} rounds; T(G,0) and the cheapest compact cell: "
        + "; ".join(
            f"G{g} {x['native_ms']:.2f} ms, V={x['cheapest_v']} {x['cheapest_ms']:.2f} ms "
            f"({-x['saving']:+.0%})"
            for g, x in slope.items()
        )
    )

    static = serving.StaticPolicy(s.ladder, s.k)
    t = time.perf_counter()
    trace_prompts = data.sample_prompts(corpus.heldout, s.trace_requests, s.prompt_len, seed=s.seed + 101)
    run = serve_level(engine, trace_prompts, max(s.levels), s, static, record=True)
    trace_path = tk / "traces.parquet"
    rounds = pipeline.write_trace_file(run.records, trace_path, s.k, source="e2e trace prompts, static K")
    accept = np.array([r.accepted for r in run.records])
    rec.stage(
        "traces",
        time.perf_counter() - t,
        rounds=rounds,
        mean_accepted=float(accept.mean()),
        accepted_histogram=np.bincount(accept, minlength=s.k + 1).tolist(),
    )
    rec.log(f"traces: {rounds} rounds, mean accepted {accept.mean():.2f} of K={s.k}")

    t = time.perf_counter()
    for lv in levels:
        run = serve_level(engine, lv.prompts, lv.concurrency, s, static, record=True)
        lv.reference = run.outputs.copy()
        lv.steps = analysis.step_logits(run.records)
        lv.workload_path = tk / f"workload-c{lv.concurrency}.parquet"
        w = pipeline.write_workload_file(
            run.records,
            lv.workload_path,
            live.fingerprint,
            source=f"concurrency {lv.concurrency}",
            step_ms=run.step_ms,
            waiting=run.waiting,
        )
        rec.log(
            f"workload C={lv.concurrency}: {w.steps} steps, {w.rows} rows, "
            f"{run.summary()['tokens_per_step']:.1f} tokens/step"
        )
    rec.stage("workloads", time.perf_counter() - t)

    t = time.perf_counter()
    fit_result, fit_out = pipeline.run_fit_stage(
        trace_path, tk / "fit", live.fingerprint, s.k, seed=s.seed, force=s.preset.name == "tiny"
    )
    rec.stage("fit", time.perf_counter() - t, summary=fit_result.summary(), outputs=fit_out.to_dict())
    rec.log(f"fit: {fit_result.summary()}")

    calibration = pipeline.fit_calibration(tk / "fit" / "calibration.parquet")
    bracket_verifier = pipeline.bracket_verifier(s.ladder, s.k, table_ms, budgets, calibration)
    stage_bracket(s, engine, levels, bracket_verifier, rec)

    t = time.perf_counter()
    trust = pipeline.make_trust(tk)
    try:
        # Versions grow with the clock, so a re-run into the same output directory (same rollback
        # state, and the same series when --checkpoint reuses the weights) never looks like a rollback.
        for version, lv in enumerate(levels, start=int(time.time())):
            assert lv.workload_path is not None
            outcome = pipeline.build_level(
                trust,
                tk / "fit" / "calibration.parquet",
                tk / "sweep.parquet",
                lv.workload_path,
                tk / f"bundle-c{lv.concurrency}",
                version=version,
                overhead=lv.evidence,
                planner=lv.overhead.get("planner"),
                resamples=s.build_resamples,
                seed=s.seed,
            )
            lv.build = outcome
            lv.predicted = pipeline.predicted_from_build(outcome)
            rec.log(
                f"build C={lv.concurrency}: {outcome['status']} "
                f"predicted {lv.predicted['predicted_gain']:+.3f} "
                f"CI {[round(x, 3) for x in lv.predicted['predicted_ci']]}"
            )
    finally:
        shutil.rmtree(trust.key_dir, ignore_errors=True)
    rec.stage(
        "build",
        time.perf_counter() - t,
        overhead={str(lv.concurrency): lv.overhead for lv in levels},
        levels={str(lv.concurrency): lv.build for lv in levels},
    )

    t = time.perf_counter()
    exports = {}
    for lv in levels:
        if lv.build.get("status") == "built":
            exports[str(lv.concurrency)] = pipeline.export_level(
                Path(lv.build["bundle"]), tk / f"trtllm-c{lv.concurrency}", trust.root_path, live
            )
    rec.stage("export", time.perf_counter() - t, levels=exports)

    t = time.perf_counter()
    state = tk / "state" / "rollback.json"
    for lv in levels:
        policy, record, lv.verifier = pipeline.admit_level(
            lv.build, trust.root_path, live, state, engine, s.planner
        )
        lv.policy = policy
        lv.admission = record
        if s.ungated and not record["active"] and lv.build.get("status") == "built":
            # Diagnostic: the bundle's own cells, drain guard and calibration drive the dynamic arm
            # with the gain test bypassed; the prediction judged stays the gated build's.
            lv.verifier = pipeline.ungated_verifier(
                Path(lv.build["bundle"]), trust.root_path, live.fingerprint
            )
            lv.policy, record["planner"] = pipeline.planner_policy(
                lv.verifier, engine, s.planner, name="dynamic"
            )
            record["ungated"] = "the dynamic arm runs the bundle's cells with the gain test bypassed"
        elif not record["active"] and lv.build.get("status") == "built":
            # The hook kept static K: the deployment's predicted gain is exactly 0. Build's own
            # replayed prediction stays in the result for comparison.
            lv.predicted = {
                "predicted_gain": 0.0,
                "predicted_ci": (0.0, 0.0),
                "source": f"admission refused ({record['reason_code']}), static K",
                "build_predicted_gain": lv.predicted["predicted_gain"],
                "build_predicted_ci": lv.predicted["predicted_ci"],
            }
        served = record.get("planner")
        if (
            served is not None
            and pipeline.planner_name(served["kind"], served.get("mode")) != lv.overhead["planner"]
        ):
            # Build charged another planner than the one the arm serves (a device planner that did
            # not load here): the prediction's overhead is not this arm's.
            record["planner_mismatch"] = f"build charged {lv.overhead['planner']!r}, the arm serves {served}"
        rec.log(
            f"admit C={lv.concurrency}: active={record['active']} "
            f"{record['reason_code']}: {record['message']}"
        )
    rec.stage("admit", time.perf_counter() - t, levels={str(lv.concurrency): lv.admission for lv in levels})

    # The lag's cost on recorded data: the one-step-lagged cell against the same-step decision,
    # over each level's recorded steps, with the deployed table (or the bracket's when none is).
    t = time.perf_counter()
    lag = {}
    for lv in levels:
        verifier, source = lv.verifier, "deployed (admitted) table and calibration"
        if verifier is None:
            verifier, source = (
                bracket_verifier,
                "bracket inputs: the sweep's medians, the fit, a permissive drain guard",
            )
        if verifier is not None and lv.steps:
            lag[str(lv.concurrency)] = {
                "source": source,
                **analysis.lag_report(verifier.cost_table, verifier.calibration, lv.steps),
            }
    rec.stage("lag", time.perf_counter() - t, levels=lag)
    return table_ms


def stage_bracket(
    s: Settings,
    engine: serving.Engine,
    levels: list[Level],
    verifier: Any,
    rec: Recorder,
) -> None:
    """The release bracket's overhead arm per level, before build; sets each level's overhead.

    Static K and the forced-K arms of both planners (host, and device when it loads) cycle step
    by step in ``s.bracket_runs`` runs per level (levels interleaved in each round); every run's
    outputs must equal the static reference. The dynamic arm's planner gives the level's bound.
    """
    t = time.perf_counter()
    static = serving.StaticPolicy(s.ladder, s.k)
    if verifier is None:
        planner = pipeline.planner_name(s.planner.prefer, s.planner.mode)
        for lv in levels:
            lv.overhead = {
                "planner": planner,
                "source": "not measured: the sweep lacks the largest native cell (build states its default)",
            }
        rec.stage("bracket", time.perf_counter() - t, levels={}, note="no planner inputs")
        return
    host = pipeline.PlannerPolicy(verifier, name="forced-host", force_native=True)
    arms: list[serving.Policy] = [host]
    choice: dict[str, Any] = {}
    for mode in s.bracket_modes or (s.planner.mode,):
        settings = replace(s.planner, prefer="device", mode=mode)
        device, choice = pipeline.planner_policy(verifier, engine, settings, name="forced", force_native=True)
        if choice["kind"] != "device":
            break  # no device planner here (its reason is logged and recorded): the host arm only
        arms.append(device)
    names = [bracket.STATIC_ARM, *(a.name for a in arms)]
    runs: dict[int, list[dict[str, Any]]] = {lv.concurrency: [] for lv in levels}
    for i in range(s.bracket_runs):
        for lv in levels:
            assert lv.reference is not None
            ref = lv.reference

            def check(result: serving.RunResult, lv: Level = lv, ref: np.ndarray = ref, i: int = i) -> None:
                miss = first_mismatch(ref, result.outputs)
                if miss:
                    lv.mismatches.append({"run": f"bracket {i}", **miss})

            def serve(policy: serving.Policy, log: bool, lv: Level = lv) -> serving.RunResult:
                return serve_level(engine, lv.prompts, lv.concurrency, s, policy, log_steps=log)

            runs[lv.concurrency].append(bracket.run_bracket(serve, static, arms, run_index=i, check=check))
        rec.log(f"bracket round {i + 1}/{s.bracket_runs} done")
    device_arm = f"forced-device-{s.planner.mode}"
    dynamic_arm = device_arm if s.planner.prefer == "device" and device_arm in names else "forced-host"
    # The planner the dynamic arm serves with, as build names it (what the arm really ran).
    planner = pipeline.planner_name("device" if dynamic_arm == device_arm else "host", s.planner.mode)
    out = {}
    for lv in levels:
        summary = bracket.summarize(runs[lv.concurrency], names)
        lv.bracket = summary
        arm = summary.get(dynamic_arm, {})
        where = f"at concurrency {lv.concurrency}"
        lv.evidence = bracket.overhead_evidence(planner, dynamic_arm, arm, where) if arm else None
        lv.overhead = charged_record(planner, dynamic_arm, lv.evidence)
        out[str(lv.concurrency)] = {
            "arms": summary,
            "dynamic_arm": dynamic_arm,
            "overhead_for_build": lv.overhead,
            "runs": [{k: v for k, v in r.items()} for r in runs[lv.concurrency]],
        }
        parts = ", ".join(
            f"{a} {x['overhead_ms'] * 1000:+.1f} us (CI {x['ci'][0] * 1000:+.1f}..{x['ci'][1] * 1000:+.1f})"
            for a, x in summary.items()
            if math.isfinite(x["overhead_ms"]) and all(math.isfinite(c) for c in x["ci"])
        )
        rec.log(f"bracket C={lv.concurrency}: {parts}; build draws {lv.overhead['source']}")
    rec.stage("bracket", time.perf_counter() - t, device_planner=choice, levels=out)


def charged_record(planner: str, arm: str, evidence: Any) -> dict[str, Any]:
    """What build is handed for the confidence path (JSON-ready): the planner and its runs."""
    if evidence is None:
        return {
            "planner": planner,
            "arm": arm,
            "source": "the bracket gave fewer than two usable runs (build states its default)",
        }
    return {
        "planner": planner,
        "arm": arm,
        "per_step_ms": list(evidence.per_step_ms),
        "mean_ms": evidence.mean_ms,
        "source": evidence.source,
    }


def stage_experiment(
    s: Settings, engine: serving.Engine, levels: list[Level], rec: Recorder, deadline: float
) -> None:
    """Interleaved A/B pairs at every level until ``s.pairs`` or the deadline (at least MIN_PAIRS).

    Where the device planner drives an admitted level, each pair round also runs the host planner
    over the same admitted deployment (after the same static run; the two dynamic arms swap
    places every round), so the realised gains of both planners come from one job.
    """
    static = serving.StaticPolicy(s.ladder, s.k)
    for lv in levels:  # untimed warm-up of the dynamic path (also checked for identity)
        assert lv.policy is not None and lv.reference is not None
        warm = serve_level(engine, lv.prompts, lv.concurrency, s, lv.policy)
        miss = first_mismatch(lv.reference, warm.outputs)
        if miss:
            lv.mismatches.append({"run": "dynamic warm-up", **miss})
        if lv.verifier is not None and not isinstance(lv.policy, pipeline.PlannerPolicy):
            lv.host_policy = pipeline.PlannerPolicy(lv.verifier, name="dynamic-host")
    per_pair: list[float] = []
    for i in range(s.pairs):
        if out_of_time(i, per_pair, deadline, rec.log):
            break
        t = time.perf_counter()
        for lv in levels:
            assert lv.policy is not None and lv.reference is not None
            a = serve_level(engine, lv.prompts, lv.concurrency, s, static)
            arms = [("dynamic", lv.policy)] + (
                [("host", lv.host_policy)] if lv.host_policy is not None else []
            )
            order = arms if i % 2 == 0 else arms[::-1]
            runs = {name: serve_level(engine, lv.prompts, lv.concurrency, s, pol) for name, pol in order}
            b = runs["dynamic"]
            for name, r in (("static", a), *runs.items()):
                miss = first_mismatch(lv.reference, r.outputs)
                if miss:
                    lv.mismatches.append({"run": f"pair {i} {name}", **miss})
            lv.pairs.append((a, b))
            if "host" in runs:
                lv.host_runs.append(runs["host"])
            host = f", host planner {runs['host'].goodput / a.goodput - 1:+.2%}" if "host" in runs else ""
            rec.log(
                f"pair {i} C={lv.concurrency}: static {a.goodput:,.0f} tok/s, dynamic {b.goodput:,.0f} tok/s "
                f"({b.goodput / a.goodput - 1:+.2%}{host}), dynamic cells {dict(b.cells)}"
            )
        per_pair.append(time.perf_counter() - t)
        rec.result["experiment_progress"] = {
            str(lv.concurrency): [[a.summary(), b.summary()] for a, b in lv.pairs] for lv in levels
        }
        rec.stage("experiment", sum(per_pair), pairs_done=i + 1)


def out_of_time(done: int, durations: Sequence[float], deadline: float, log: Callable[[str], None]) -> bool:
    """Whether another round (of ``durations``' longest) would overrun ``deadline``; never before
    :data:`MIN_PAIRS` rounds are ``done``. Says so through ``log`` when it stops."""
    left = deadline - time.perf_counter()
    if done < MIN_PAIRS or not durations or left >= 1.5 * max(durations):
        return False
    log(f"stopping after {done} rounds: {left:.0f}s left, a round takes {max(durations):.0f}s")
    return True


def stage_analysis(
    s: Settings, levels: list[Level], table_ms: dict[tuple[int, int], float], out: Path, rec: Recorder
) -> None:
    """Per-level reports, the identity verdict, the headline verdict and the plot."""
    reports = {}
    for lv in levels:
        report = analysis.level_report(
            lv.concurrency, lv.pairs, lv.predicted, table_ms, host_runs=lv.host_runs
        )
        report["confidence_path_overhead"] = {"bracket": lv.bracket, "charged_by_build": lv.overhead}
        report["admission"] = {k: lv.admission.get(k) for k in ("active", "reason_code", "message")}
        report["identical_outputs"] = not lv.mismatches
        report["mismatches"] = lv.mismatches[:5]
        reports[str(lv.concurrency)] = report
    rec.result["levels"] = reports
    rec.result["identical_outputs"] = all(not lv.mismatches for lv in levels)
    top = reports[str(max(s.levels))]
    lo = top["realised_ci"][0]
    rec.result["verdict"] = {
        "all_within_3pp": all(r["within_agreement_band"] for r in reports.values()),
        "highest_concurrency_positive_with_positive_lower_bound": bool(
            top["realised_gain"] is not None
            and top["realised_gain"] > 0
            and lo is not None
            and math.isfinite(lo)
            and lo > 0
        ),
        "agreement": {c: r["agreement"] for c, r in reports.items()},
        "misses": {c: r["failed_assumption"] for c, r in reports.items() if not r["within_agreement_band"]},
    }
    points = [
        GainPoint(
            f"C={r['concurrency']}",
            r["predicted_gain"],
            tuple(r["predicted_ci"]),
            r["realised_gain"],
            (r["realised_ci"][0], r["realised_ci"][1])
            if all(math.isfinite(x) for x in r["realised_ci"])
            else (r["realised_gain"],) * 2,
        )
        for r in reports.values()
        if math.isfinite(r["realised_gain"])
    ]
    title = f"{rec.result.get('gpu', {}).get('name', '?')}: predicted (build) vs realised gain"
    renderer = plot_gains(points, out / "e2e.png", title) if points else None
    rec.result["plot"] = {"path": str(out / "e2e.png") if points else None, "renderer": renderer}
    for c, r in reports.items():
        ci = [round(x, 3) if math.isfinite(x) else None for x in r["realised_ci"]]
        rec.log(
            f"C={c}: realised {r['realised_gain']:+.3f} CI {ci} vs predicted {r['predicted_gain']:+.3f}; "
            f"within 3pp: {r['within_agreement_band']}"
        )


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The experiment's command line (also the base of ``benchmarks/device_planner.py``'s)."""
    ap = argparse.ArgumentParser(
        description=description or __doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", type=Path, default=None, help="output directory (default $OUT, else ./e2e-out)")
    ap.add_argument("--tiny", action="store_true", help="tiny model on the CPU (CI smoke run, < 60 s)")
    ap.add_argument(
        "--device", default=None, help="torch device (default cuda when available, cpu with --tiny)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--levels", default=None, help="concurrency levels, e.g. 8,64,256")
    ap.add_argument("--pairs", type=int, default=None, help=f"A/B pairs per level (at least {MIN_PAIRS})")
    ap.add_argument(
        "--budget-s", type=float, default=None, help="wall-clock budget; extra pairs stop before it"
    )
    ap.add_argument("--target-steps", type=int, default=None, help="override the target's training steps")
    ap.add_argument("--no-graphs", action="store_true", help="eager steps on the GPU (no CUDA graphs)")
    ap.add_argument(
        "--ungated",
        action="store_true",
        help="diagnostic: the dynamic arm runs each built bundle's cells with the runtime's gain test "
        "bypassed, so it runs even where the signed economics refuse it; the gated verdict and prediction "
        "are the ones kept and judged",
    )
    ap.add_argument(
        "--checkpoint", type=Path, default=None, help="load trained weights from / save them to this file"
    )
    ap.add_argument(
        "--host-planner",
        action="store_true",
        help="the dynamic arm runs the host reference planner (default: the device planner)",
    )
    ap.add_argument(
        "--planner-device",
        default=None,
        help="torch device of the device planner (default: the current CUDA device; cpu with --tiny)",
    )
    ap.add_argument(
        "--device-decision",
        choices=pipeline.PLANNER_MODES,
        default="fused+compile",
        help="the device planner's serving mode: inside the engine's cell graphs with compiled ranking "
        "(fused+compile, the default) or eager kernels (fused); beside them as its own graphs with the "
        "previous step's decision (lagged) or this step's (sync, one host sync per step)",
    )
    ap.add_argument("--planner-dtype", choices=("float64", "float32"), default="float64")
    ap.add_argument(
        "--bracket-runs", type=int, default=None, help="runs of the overhead bracket per level (default 6)"
    )
    return ap


def torch_device(args: argparse.Namespace) -> torch.device:
    """The device to run on (CUDA when available, the CPU with ``--tiny``), configured."""
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cpu":
        torch.set_flush_denormal(True)  # denormals slow CPU training by an order of magnitude
        torch.set_num_threads(1)  # one thread: deterministic, and robust to a busy machine
    return device


def build_engine(
    s: Settings,
    trained: Trained,
    device: torch.device,
    cells: list[tuple[int, int]],
    *,
    graphs: bool,
    log: Callable[[str], None],
) -> tuple[serving.Engine, str, str]:
    """The serving engine with ``cells`` prepared; returns it, the attention setting and its description."""
    attention, attention_desc = attention_backend_probe(device)
    cfg = serving.EngineConfig(
        k=s.k,
        ladder=s.ladder,
        max_len=s.max_len,
        gemm_chunk=s.gemm_chunk,
        use_graphs=device.type == "cuda" and graphs,
        attention=attention,
    )
    engine = serving.Engine(trained.target, trained.drafter, cfg, device)
    engine.prepare_cells(cells, log=log)
    return engine, attention, attention_desc


def main(argv: list[str] | None = None) -> int:
    """Run the experiment; returns the process exit code (0 also when the prediction misses)."""
    args = build_parser().parse_args(argv)
    out = (args.out or Path(os.environ.get("OUT") or "e2e-out")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    s = make_settings(args)
    device = torch_device(args)
    rec = Recorder(out)
    deadline = time.perf_counter() + s.budget_s
    rec.result.update(
        {
            "issue": 7,
            "command": command_line(argv),
            **commit_info(),
            "gpu": gpu_info(device),
            "settings": s.to_dict(),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
    )
    rec.write()
    rec.log(f"e2e on {rec.result['gpu'].get('name')} ({device}); out {out}")
    try:
        preflight()
        t = time.perf_counter()
        corpus = data.load_corpus(s.preset.corpus_bytes)
        rec.result["corpus"] = corpus.describe()
        trained = stage_train(s, corpus, device, rec, args.checkpoint)
        rec.result["training"] = trained.summaries
        rec.stage("train", time.perf_counter() - t)

        t = time.perf_counter()
        cells = [(g, 0) for g in s.ladder] + [
            (g, v)
            for g, vs in pipeline.candidate_budgets(s.ladder, s.k, s.budget_multiples).items()
            for v in vs
        ]
        engine, attention, attention_desc = build_engine(
            s, trained, device, cells, graphs=not args.no_graphs, log=rec.log
        )
        rec.stage("engine", time.perf_counter() - t, cells=len(cells), attention=attention_desc)

        levels = [
            Level(c, data.sample_prompts(corpus.heldout, s.requests(c), s.prompt_len, seed=s.seed + 1000 + c))
            for c in s.levels
        ]
        table_ms = stage_toolkit(s, engine, trained, levels, corpus, f"sdpa-{attention}", out, rec)
        stage_experiment(s, engine, levels, rec, deadline)
        stage_analysis(s, levels, table_ms, out, rec)
        rec.result["status"] = "done"
    finally:
        rec.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
