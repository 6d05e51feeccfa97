"""The toolkit on this deployment: sweep, traces, workload, fit, keys, build, export, admit.

Every stage calls the toolkit's library API (never re-implements it):

- **sweep**: ``calibrate.execute`` with the ``module`` backend, whose factory
  (:func:`serving.sweep_factory`) returns the engine's own serving step for a cell; the sweep's
  base fingerprint is the live context collected for this deployment;
- **traces**: draft rounds recorded under full verification (static K) written with
  ``calibrate.traces.write_trace_parquet``;
- **workload**: the recorded static steps of a concurrency level, ``calibrate.workload``;
- **fit**: ``calibrate.fit.run_fit`` with STS (the runtime's map);
- **keys**: an ephemeral Ed25519 key in a temporary directory and a one-key trust root;
- **build** / **export**: ``calibrate.build`` (signed cost table, calibration, admission, bundle)
  and the TensorRT-LLM export;
- **admit**: ``runtime_plugin.admit`` on the signed bundle, then
  ``runtime_plugin.engine.DynamicVerifier`` bound to the verified members and, through
  ``runtime_plugin.engine.choose_planner``, the device planner (default) or the host reference
  planner as the serving loop's dynamic :class:`serving.Policy`;
- **bracket**: the same planners over the unsigned sweep and fit, with every window forced to K,
  for the release bracket's overhead arm (:mod:`bracket`).

The deployment fingerprint binds the exact model (config and checkpoint digests), the engine
source (digest of ``model.py`` and ``serving.py``), the GPU, K and the graph ladder.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import torch

from dspark_calibrate import __version__ as TOOL_VERSION
from dspark_calibrate.artifacts import Fingerprint, canonical_json, sha256_hex
from dspark_calibrate.runtime_plugin import LiveContext, collect_live
from dspark_calibrate.runtime_plugin.engine import DynamicVerifier, choose_planner
from dspark_calibrate.runtime_plugin.planner import (
    DEFAULT_MIN_VERIFY_LEN,
    Calibration,
    CostTable,
    DrainGuard,
    StepRows,
)

from . import serving
from .model import Drafter, TargetLM
from .serving import Engine, Plan, StepRecord

if TYPE_CHECKING:
    from dspark_calibrate.calibrate.deployment.uncertainty import OverheadEvidence

__all__ = [
    "ENGINE_SOURCE_FILES",
    "PLANNER_MODES",
    "DevicePlannerPolicy",
    "FusedPlannerPolicy",
    "PlannerPolicy",
    "PlannerSettings",
    "SweepSettings",
    "TrustMaterial",
    "admit_level",
    "bracket_verifier",
    "build_level",
    "candidate_budgets",
    "charged_overhead_ms",
    "deployment_live",
    "direct_policy",
    "export_level",
    "fit_calibration",
    "make_trust",
    "per_row",
    "planner_name",
    "planner_policy",
    "predicted_from_build",
    "request_key",
    "run_fit_stage",
    "run_sweep_stage",
    "selector_identity_sha256",
    "sweep_thresholds",
    "ungated_verifier",
    "write_trace_file",
    "write_workload_file",
]

Log = Callable[[str], None]
#: Files whose bytes define the "engine source" of this deployment.
ENGINE_SOURCE_FILES: tuple[str, ...] = ("model.py", "serving.py", "mixed_serving.py")
#: Import string of the sweep's module-backend factory.
SWEEP_FACTORY = "benchmarks.e2e.serving:sweep_factory"


def request_key(request: int) -> str:
    """Request id as stored in traces and workloads: zero-padded so string order is numeric order
    (the selector's tie-break order between requests)."""
    return f"r{request:07d}"


def _engine_source_sha256() -> str:
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in ENGINE_SOURCE_FILES:
        data = (here / name).read_bytes()
        h.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def _checkpoint_sha256(*modules: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for module in modules:
        for name, tensor in sorted(module.state_dict().items()):
            h.update(name.encode() + b"\0")
            h.update(tensor.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def deployment_live(
    engine: Engine, target: TargetLM, drafter: Drafter, *, attention_backend: str
) -> tuple[LiveContext, dict[str, Any]]:
    """Collect the live context of this deployment (explicit engine arguments win over probes).

    Returns:
        The live context and a JSON-ready description of what went into it.
    """
    cfg = engine.cfg
    model_config = {
        "target": asdict(target.cfg),
        "drafter": asdict(drafter.cfg),
        "engine": {
            "k": cfg.k,
            "ladder": list(cfg.ladder),
            "max_len": cfg.max_len,
            "gemm_chunk": cfg.gemm_chunk,
        },
        "dtype": str(next(target.parameters()).dtype),
    }
    source = _engine_source_sha256()
    overrides: dict[str, Any] = {
        "model_config_sha256": sha256_hex(canonical_json(model_config)),
        "checkpoint_sha256": _checkpoint_sha256(target, drafter),
        "attention_backend": attention_backend,
        "kv_dtype": str(engine.cache_k.dtype).replace("torch.", ""),
        "context_len": cfg.max_len,
    }
    gpu = None
    if engine.device.type != "cuda":
        gpu = "CPU"
        overrides["gpu_snapshot_sha256"] = sha256_hex(f"cpu:{torch.get_num_threads()}".encode())
    live = collect_live(
        max_draft_len=cfg.k,
        rank_local_graph_batch_sizes=list(cfg.ladder),
        topology="TP1",
        gpu=gpu,
        gpu_count=1,
        source_head=f"e2e-engine-{source[:16]}",
        source_diff_sha256=source,
        runtime_snapshot=f"torch=={torch.__version__}",
        overrides=overrides,
    )
    return live, {"model_config": model_config, "live": live.to_dict()}


# -- sweep ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SweepSettings:
    """How the sweep is run.

    Attributes:
        budgets: candidate compact V per G.
        precision_rel: target CI half-width of each cell's median.
        budget_s: total sweep budget (seconds of measurement).
        max_seconds_per_cell: per-cell cap.
        min_rounds: rounds per cell before it may stop.
        warmup_steps: replays discarded on a cell's first visit.
        n_boot: bootstrap resamples per interval.
    """

    budgets: dict[int, tuple[int, ...]]
    precision_rel: float
    budget_s: float
    max_seconds_per_cell: float
    min_rounds: int
    warmup_steps: int
    n_boot: int


def candidate_budgets(
    ladder: Sequence[int], k: int, multiples: Sequence[float]
) -> dict[int, tuple[int, ...]]:
    """Compact candidates ``round(m * G)`` per G, kept strictly inside (G, G·(K+1))."""
    out: dict[int, tuple[int, ...]] = {}
    for g in ladder:
        vs = sorted({round(m * g) for m in multiples if g < round(m * g) < g * (k + 1)})
        out[g] = tuple(vs)
    return out


def sweep_thresholds(settings: SweepSettings, *, replays_per_sample: int) -> Any:
    """The sweep's stopping rule and protocol settings (``calibrate.Thresholds``) for ``settings``."""
    from dspark_calibrate.calibrate import Thresholds

    return Thresholds(
        precision_rel=settings.precision_rel,
        min_rounds=settings.min_rounds,
        min_samples=2 * settings.min_rounds,
        max_seconds_per_cell=settings.max_seconds_per_cell,
        budget_s=settings.budget_s,
        warmup_steps=settings.warmup_steps,
        rewarm_steps=2,
        replays_per_sample=replays_per_sample,
        samples_per_visit=2,
        n_boot=settings.n_boot,
        # Serving runs under whatever power and thermal state the GPU is in; a table cleaned of
        # throttled samples would price steps faster than the experiment can run them.
        throttle_policy="keep-all",
    )


def run_sweep_stage(
    engine: Engine, live: LiveContext, out_dir: Path, settings: SweepSettings, *, seed: int, log: Log
) -> tuple[Any, Any]:
    """Sweep every native and candidate cell with the ``module`` backend on the engine's own step.

    Returns:
        The toolkit's ``(SweepResult, SweepOutput)``.
    """
    from dspark_calibrate.calibrate import SweepRequest, execute

    cfg = engine.cfg
    context = cfg.max_len // 2
    serving.register_engine(engine, context)
    cuda = engine.device.type == "cuda"
    out = out_dir / "sweep.parquet"
    journal = out.with_name(out.stem + ".journal.jsonl")
    thresholds = sweep_thresholds(settings, replays_per_sample=4)
    request = SweepRequest(
        backend="module",
        backend_options={
            "factory": SWEEP_FACTORY,
            "sync": "torch.cuda:synchronize" if cuda else None,
            "telemetry_device": 0 if cuda else None,
        },
        k=cfg.k,
        ladder=cfg.ladder,
        out=out,
        budgets=settings.budgets,
        include_control=False,
        resume=journal.exists() and not out.exists(),
        thresholds=thresholds,
        seed=seed,
        fingerprint=live.fingerprint,
        command=tuple(shlex.quote(a) for a in sys.argv),
    )
    state = {"rounds": -1}

    def on_event(event: Any) -> None:
        if event.kind == "round" and event.round != state["rounds"]:
            state["rounds"] = event.round
            eta = f", eta {event.eta_s:.0f}s" if event.eta_s is not None else ""
            log(f"sweep round {event.round}: {event.cells_done}/{event.cells_total} cells done{eta}")

    result, output = execute(request, on_event=on_event)
    return result, output


# -- traces and workloads -----------------------------------------------------------------------
def write_trace_file(records: Sequence[StepRecord], path: Path, k: int, *, source: str) -> int:
    """Write the recorded draft rounds as a trace Parquet file; returns the rounds written."""
    from dspark_calibrate.calibrate.confidence.traces import TraceBatch, trace_footer, write_trace_parquet

    batch = TraceBatch(
        request_id=pa.array([request_key(r.request) for r in records], pa.string()),
        round=np.array([r.round for r in records], dtype=np.int64),
        logits=np.stack([r.confidence for r in records]).astype(np.float32),
        accepted=np.array([r.accepted for r in records], dtype=np.int8),
        verified=np.array([r.verified for r in records], dtype=np.int8),
    )
    footer = trace_footer(synthetic=False, generator={"source": source, "policy": "static-K"}, k=k)
    return int(write_trace_parquet(path, [batch], footer=footer))


def per_row(values: Sequence[float] | None, steps: np.ndarray) -> np.ndarray | None:
    """A per-step series (indexed by step id) copied onto every row of its step (None: not recorded)."""
    if values is None:
        return None
    out: np.ndarray = np.asarray(values, dtype=np.float64)[steps]
    return out


def write_workload_file(
    records: Sequence[StepRecord],
    path: Path,
    fingerprint: Fingerprint,
    *,
    source: str,
    step_ms: Sequence[float] | None = None,
    waiting: Sequence[int] | None = None,
) -> Any:
    """Write the recorded static steps as a ``workload`` artifact; returns the toolkit ``Workload``.

    ``step_ms`` and ``waiting`` (per step id, as :class:`serving.RunResult` records them) become the
    workload's per-step wall time and queue depth: what build infers the load regime from.
    """
    from dspark_calibrate.calibrate.deployment.workload import workload_from_arrays, write_workload

    steps = np.array([r.step for r in records], dtype=np.int64)
    workload = workload_from_arrays(
        step=steps,
        rank=np.zeros(len(records), dtype=np.int64),
        request_id=[request_key(r.request) for r in records],
        logits=np.stack([r.confidence for r in records]).astype(np.float32),
        accepted=np.array([r.accepted for r in records], dtype=np.int64),
        output_len=np.array([r.output_len for r in records], dtype=np.int64),
        num_ranks=1,
        notes=(f"recorded by benchmarks/e2e under static K (full verification): {source}",),
        source=source,
        fingerprint=fingerprint,
        step_time_ms=per_row(step_ms, steps),
        waiting=per_row(waiting, steps),
    )
    write_workload(path, workload, fingerprint=fingerprint)
    return workload


# -- fit ------------------------------------------------------------------------------------------
def run_fit_stage(
    trace_path: Path, out_dir: Path, fingerprint: Fingerprint, k: int, *, seed: int, force: bool = False
) -> tuple[Any, Any]:
    """STS fit of the confidence head on the recorded traces (held-out requests scored).

    ``force`` lets the CPU smoke run fit below the toolkit's round floor.

    Returns:
        The toolkit's ``(FitResult, FitOutputs)``.
    """
    import importlib.util

    from dspark_calibrate.calibrate import FitOptions, run_fit

    result, outputs, _ = run_fit(
        [trace_path],
        out_dir,
        options=FitOptions(method="sts", holdout=0.2, seed=seed, bootstrap=200, force=force),
        k=k,
        fingerprint=fingerprint,
        tool_version=TOOL_VERSION,
        command=tuple(sys.argv),
        plots=importlib.util.find_spec("matplotlib") is not None,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    return result, outputs


def fit_calibration(path: Path) -> Calibration:
    """The STS calibration (what the runtime applies) from the fit's ``calibration.parquet``."""
    import pyarrow.parquet as pq

    return Calibration.from_rows(pq.read_table(path).to_pylist(), use="sts")


# -- keys -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TrustMaterial:
    """An ephemeral signing key (in a temporary directory) and the trust root that trusts it."""

    key_dir: Path
    private_key: Path
    public_key: Path
    root_path: Path
    keyid: str


def make_trust(out_dir: Path, *, days: int = 7) -> TrustMaterial:
    """Generate an ephemeral Ed25519 key and a one-key trust root (``out_dir/root.json``).

    The private key lives in a fresh temporary directory (deleted by the caller after build);
    only the public key and the root are written under ``out_dir``.
    """
    from dspark_calibrate.artifacts import (
        atomic_write_bytes,
        generate_keypair,
        init_root,
        load_signer,
        public_key_of,
    )

    key_dir = Path(tempfile.mkdtemp(prefix="e2e-key-"))
    pair = generate_keypair(key_dir, name="e2e-signing")
    signer = load_signer(pair.private_path)
    key = public_key_of(signer)
    root = init_root(
        root_signers=[signer],
        root_keys=[key],
        root_threshold=1,
        artifact_keys=[key],
        artifact_threshold=1,
        expires=datetime.now(UTC) + timedelta(days=days),
    )
    root_path = out_dir / "root.json"
    atomic_write_bytes(root_path, root.to_bytes())
    public_copy = out_dir / "e2e-signing.pub.pem"
    atomic_write_bytes(public_copy, pair.public_path.read_bytes())
    return TrustMaterial(key_dir, pair.private_path, public_copy, root_path, pair.keyid)


# -- the dynamic policy -----------------------------------------------------------------------------
class PlannerPolicy:
    """The serving loop's dynamic policy on the host: the reference selector/allocator, every step.

    Rows are passed in slot order with their slot index as the request key (the tie-break order).

    Args:
        planner: anything with ``plan(StepRows) -> planner.Plan`` (``DynamicVerifier`` in the
            experiment; tests may pass a verifier built from unsigned tables).
        name: the policy's name in results.
        force_native: plan every step but run it native with every window K (the release
            bracket's "feature on, windows forced to K" arm).
    """

    def __init__(self, planner: Any, name: str = "dynamic", *, force_native: bool = False) -> None:
        self.planner = planner
        self.name = name
        self.force_native = force_native

    def plan(self, confidence: np.ndarray) -> Plan:
        """Select the cell and allocate the windows of one step."""
        rows = StepRows.single_rank(confidence.astype(np.float64, copy=False))
        p = self.planner.plan(rows)
        if self.force_native:
            k = rows.k
            return Plan(int(p.graph_batch_size), 0, np.full(len(rows), k, dtype=np.int64))
        return Plan(int(p.graph_batch_size), int(p.verifier_budget), np.asarray(p.windows, dtype=np.int64))


class DevicePlannerPolicy:
    """The dynamic policy on the device: ``device_planner.ServingPlanner`` bound to the engine.

    Each step stages the rows' logits, replays the planner's graph for the step's G (which writes
    the windows into :meth:`serving.Engine.window_buffer`) and returns the committed cell; the
    windows never come back to the host before the step.

    Args:
        serving_planner: a ``ServingPlanner`` (mode, ``force_native``) of a ``DevicePlanner`` on the
            engine's device.
        engine: the engine whose window buffers the planner writes.
        name: the policy's name in results.
    """

    def __init__(self, serving_planner: Any, engine: Engine, name: str = "dynamic-device") -> None:
        self.serving = serving_planner
        self.name = name
        for g in serving_planner.planner.table.graph_batch_sizes:
            serving_planner.bind(g, engine.window_buffer(g))
        serving_planner.prepare()

    def plan(self, confidence: np.ndarray) -> Plan:
        """Commit this step's cell; the device allocates it."""
        g, v = self.serving.launch(confidence, (confidence.shape[0],))
        return Plan(g, v, None)

    def finish(self) -> dict[str, Any]:
        """The run's planner counters (lag, non-finite steps, verified tokens)."""
        stats: dict[str, Any] = self.serving.finish()
        return stats


_FUSED_TOKENS = itertools.count(1)


class FusedPlannerPolicy:
    """The dynamic policy with the device planner inside the engine's cell graphs
    (``fused_planner.FusedServingPlanner``): per step the host commits the cell and writes the
    rows' logits into the engine's input buffer; ranking, allocation and the selection for the
    next step run in the cell's own graph, and the decision comes back with the step's output.

    Args:
        fused: the fused planner (``force_native`` for the bracket's forced-K arm).
        engine: the engine whose buffers it binds and whose cells it captures.
        name: the policy's name in results.
        log: where the engine reports the capture.
    """

    def __init__(
        self, fused: Any, engine: Engine, name: str = "dynamic-device-fused", log: Any = None
    ) -> None:
        self.fused = fused
        self.engine = engine
        self.name = name
        # A token of its own, never reused (an id() may be, once an earlier planner is gone, and
        # would replay graphs captured around that planner's buffers).
        self.token = next(_FUSED_TOKENS)
        table = fused.planner.table
        self._conf: dict[int, np.ndarray] = {}
        cells: list[tuple[int, int]] = []
        for g in table.graph_batch_sizes:
            bufs = engine.planner_buffers(g)
            fused.bind(
                g,
                logits=bufs["logits"],
                ints=bufs["ints"],
                ints_host=bufs["ints_host"],
                windows=bufs["windows"],
                decision=bufs["decision"][: fused.decision_size(g)],
            )
            self._conf[g] = bufs["logits_host"]
            cells.append((g, 0))
            if not fused.force_native:
                cells += [(g, v) for v in table.compact_budgets(g)]
        engine.prepare_fused(self.token, cells, fused.hooks, log=log)

    def plan(self, confidence: np.ndarray) -> Plan:
        """Commit this step's cell and hand the rows' logits to the engine's input buffer."""
        n = confidence.shape[0]
        g, v = self.fused.commit((n,))
        if g == 0:
            return Plan(0, 0, None)
        self._conf[g][:n] = confidence
        return Plan(g, v, None, fused=self.token)

    def observe(self, out: serving.StepOutput) -> None:
        """The decision that came back with the step's output."""
        if out.decision is not None:
            self.fused.observe(out.decision)

    def finish(self) -> dict[str, Any]:
        """The run's planner counters (lag, non-finite steps, verified tokens)."""
        stats: dict[str, Any] = self.fused.finish()
        return stats


#: Device planner decision modes of the testbed: the two of ``ServingPlanner``, and ``fused``
#: (``FusedServingPlanner``); a ``+compile`` suffix compiles its critical part and selection (CUDA).
PLANNER_MODES: tuple[str, ...] = ("lagged", "sync", "fused", "fused+compile")


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    """Which planner the dynamic arm runs.

    Attributes:
        prefer: ``device`` (default) or ``host``.
        device: torch device of the device planner (None: the current CUDA device, falling back
            to the host planner without one; ``cpu`` runs the device code on the CPU).
        mode: the device planner's decision mode (:data:`PLANNER_MODES`).
        dtype: the device planner's float type.
    """

    prefer: str = "device"
    device: str | None = None
    mode: str = "fused+compile"
    dtype: str = "float64"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def planner_policy(
    verifier: DynamicVerifier,
    engine: Engine,
    settings: PlannerSettings,
    *,
    name: str,
    force_native: bool = False,
) -> tuple[serving.Policy, dict[str, Any]]:
    """The policy of ``settings``' planner over ``verifier``'s deployment (host on fallback).

    Returns:
        The policy and a JSON-ready record of the choice (kind, fallback reason code, message).
    """
    from dspark_calibrate.runtime_plugin.device_planner import ServingPlanner
    from dspark_calibrate.runtime_plugin.fused_planner import FusedServingPlanner

    if settings.mode not in PLANNER_MODES:
        raise ValueError(f"planner mode must be one of {PLANNER_MODES}, got {settings.mode!r}")
    mode, _, option = settings.mode.partition("+")
    choice = choose_planner(
        verifier,
        prefer=settings.prefer,
        device=settings.device,
        mode=mode,
        dtype=settings.dtype,
        compile=option == "compile",
        force_native=force_native,
    )
    record = {"kind": choice.kind, "reason_code": choice.reason_code, "message": choice.message}
    planner = choice.planner
    if isinstance(planner, DynamicVerifier):
        return PlannerPolicy(verifier, name=f"{name}-host", force_native=force_native), record
    record["mode"] = settings.mode
    policy_name = f"{name}-device-{settings.mode}"
    if isinstance(planner, FusedServingPlanner):
        return FusedPlannerPolicy(planner, engine, name=policy_name), record
    assert isinstance(planner, ServingPlanner)
    return DevicePlannerPolicy(planner, engine, name=policy_name), record


def bracket_verifier(
    ladder: Sequence[int],
    k: int,
    table_ms: dict[tuple[int, int], float],
    budgets: dict[int, tuple[int, ...]],
    calibration: Calibration,
) -> DynamicVerifier | None:
    """The planners' inputs for the overhead bracket, before build exists: the sweep's medians.

    Four compact cells per G (the largest candidates: the most the engine deploys, so the planners
    do the most work they can), the fit's calibration, and a permissive drain guard so compact
    cells are evaluated and allocated as in a deployment that admits them. Unsigned: this binds
    no serving decision; it only prices the confidence path.

    Returns:
        A verifier over those inputs, or None when the sweep lacks the largest G's native cell.
    """
    g_max = max(ladder)
    cells = {(g, 0): table_ms[(g, 0)] for g in ladder if (g, 0) in table_ms}
    if (g_max, 0) not in cells:
        return None
    for g in ladder:
        for v in budgets.get(g, ())[-4:]:
            if (g, v) in table_ms and (g, 0) in cells:
                cells[(g, v)] = table_ms[(g, v)]
    table = CostTable.from_cells(k, cells, drain_guard=DrainGuard(1.0, 1.0, 0.0, g_max))
    return DynamicVerifier(table, calibration, digest="unsigned-bracket-inputs", min_verify_len=1)


class _Direct:
    """``plan`` over plain planner inputs (tests; not admitted)."""

    def __init__(self, table: Any, calibration: Any) -> None:
        self.table = table
        self.calibration = calibration

    def plan(self, rows: StepRows) -> Any:
        from dspark_calibrate.runtime_plugin.planner import plan

        return plan(self.table, self.calibration, rows)


def direct_policy(table: Any, calibration: Any, name: str = "dynamic-unsigned") -> PlannerPolicy:
    """A :class:`PlannerPolicy` over unsigned planner inputs (tests of the serving logic only)."""
    return PlannerPolicy(_Direct(table, calibration), name=name)


# -- build, export, admit -------------------------------------------------------------------------
def build_level(
    trust: TrustMaterial,
    calibration: Path,
    sweep: Path,
    workload: Path,
    out_dir: Path,
    *,
    version: int,
    resamples: int,
    seed: int,
    overhead: OverheadEvidence | None,
    planner: str | None,
    mixed_sweep: Path | None = None,
) -> dict[str, Any]:
    """``build`` one signed bundle for one recorded workload; a refused build is an outcome, not an error.

    ``overhead`` is the measured runs of the deployed planner's confidence path (one mean per
    run, drawn in build's joint replicates; None: build's own default, which it states), and
    ``planner`` the planner the dynamic arm serves with (build refuses evidence of another).
    ``mixed_sweep`` (a ``sweep --mixed`` summary) prices the workload's mixed steps with their
    measured cells.

    Returns:
        ``status`` (``built`` or ``refused``), the bundle path, the signed admission summary, the
        cell selection, the replay report (``replay.overhead``: what was charged) and, with a
        mixed sweep, the mixed part (JSON-ready).
    """
    import importlib.util

    from dspark_calibrate.artifacts import load_signer, load_trust_root
    from dspark_calibrate.calibrate import BootstrapSettings, BuildOptions, build_bundle, load_build_inputs
    from dspark_calibrate.errors import ConfigError

    now = datetime.now(UTC).replace(microsecond=0)
    root = load_trust_root(trust.root_path.read_bytes(), now=now)
    evidence = None if overhead is None else overhead.to_dict()
    try:
        options = BuildOptions(
            version=version,
            issued_at=now,
            expires_at=now + timedelta(days=7),
            planner=planner,
            overhead_evidence=overhead,
            bootstrap=BootstrapSettings(resamples=resamples, seed=seed),
            plots=importlib.util.find_spec("matplotlib") is not None,
            force=True,
            command=tuple(sys.argv),
        )
        inputs = load_build_inputs([sweep], calibration, workload, mixed_sweep=mixed_sweep)
        result = build_bundle(
            inputs, out_dir, signers=[load_signer(trust.private_key)], trust_root=root, options=options
        )
    except ConfigError as exc:
        return {
            "status": "refused",
            "reason": str(exc),
            "version": version,
            "planner": planner,
            "overhead": evidence,
        }
    full = result.to_dict()
    return {
        "status": "built",
        "version": version,
        "planner": planner,
        "overhead": evidence,
        "bundle": str(out_dir),
        "valid": full.get("valid"),
        "summary": full.get("summary"),
        "selection": full.get("selection"),
        "replay": {k: v for k, v in (full.get("replay") or {}).items() if k not in ("per_cell",)},
        "notes": full.get("notes"),
        "mixed": full.get("mixed"),
    }


def charged_overhead_ms(outcome: dict[str, Any]) -> float | None:
    """The confidence path's per-step point a build charged (its replay's mean over the planner's
    runs); for a refused build, what it would have charged (the runs' mean, at least 0)."""
    charged = ((outcome.get("replay") or {}).get("overhead") or {}).get("mean_ms")
    if charged is not None:
        return float(charged)
    runs = (outcome.get("overhead") or {}).get("per_step_ms")
    return max(0.0, float(np.mean(runs))) if runs else None


def planner_name(kind: str, mode: str | None = None) -> str:
    """The planner as build and the overhead evidence name it: ``host`` (the reference planner on
    the host), ``fused`` (the device planner inside the engine's cell graphs) or ``device`` (the
    device planner beside them, its own graphs)."""
    if kind != "device":
        return "host"
    return "fused" if (mode or "").startswith("fused") else "device"


def ungated_verifier(
    bundle: Path,
    root_path: Path,
    fingerprint: Fingerprint,
    *,
    now: datetime | None = None,
    allow_synthetic: bool = False,
) -> DynamicVerifier:
    """The selector/allocator of a built bundle with the runtime's gain test bypassed.

    The bundle is verified (signatures, hashes, binding to ``fingerprint``) as admission verifies
    it, and its deployed cells, drain guard, gain threshold and calibration drive the selector
    exactly as an admitted decision's would; only the economics' verdict is not asked. A
    diagnostic (``--ungated``, the prediction matrix): the dynamic arm then runs the policy the
    build priced, also where the gate refuses it. ``now`` (default: the clock) and
    ``allow_synthetic`` are the verification's.

    Raises:
        RuntimeError: the bundle does not verify (the message says why).
    """
    from dspark_calibrate.artifacts import Expectation, load_trust_root, verify_bundle
    from dspark_calibrate.runtime_plugin import AdmissionEconomics
    from dspark_calibrate.runtime_plugin.engine import planner_inputs

    now = now or datetime.now(UTC)
    root = load_trust_root(root_path.read_bytes(), now=now)
    expected = Expectation(fingerprint=fingerprint, allow_synthetic=allow_synthetic)
    report = verify_bundle(bundle, root, now=now, expected=expected)
    cost, calib, admission = (report.artifact(k) for k in ("cost-table", "calibration", "admission"))
    if not report.ok or cost is None or calib is None or admission is None:
        raise RuntimeError(f"{bundle}: does not verify ({report.code}: {report.message})")
    k = cost.fingerprint.max_draft_len
    assert k is not None  # a verified cost table binds K
    table, calibration = planner_inputs(
        cost.table, calib.table, k, AdmissionEconomics.from_summary(admission.summary)
    )
    return DynamicVerifier(
        table, calibration, digest=f"ungated:{report.version}", min_verify_len=DEFAULT_MIN_VERIFY_LEN
    )


def predicted_from_build(outcome: dict[str, Any]) -> dict[str, Any]:
    """The prediction a level is judged against, with its source.

    A built bundle predicts its replayed gain and CI. A refused build deploys nothing, so the
    runtime stays on static K and the predicted gain is exactly 0.
    """
    if outcome.get("status") == "built":
        summary = outcome["summary"]
        return {
            "predicted_gain": float(summary["predicted_gain"]),
            "predicted_ci": (
                float(summary["predicted_gain_ci_low"]),
                float(summary["predicted_gain_ci_high"]),
            ),
            "source": "build: replay of the recorded static workload with the deployed cells",
        }
    return {
        "predicted_gain": 0.0,
        "predicted_ci": (0.0, 0.0),
        "source": f"build refused, static K: {outcome.get('reason', '')}",
    }


def selector_identity_sha256() -> str:
    """This engine's selector identity: the SHA-256 of the reference planner's source bytes."""
    import dspark_calibrate.runtime_plugin.planner as planner_module

    return hashlib.sha256(Path(planner_module.__file__).read_bytes()).hexdigest()


def export_level(bundle: Path, out_dir: Path, root_path: Path, live: LiveContext) -> dict[str, Any]:
    """``export trtllm`` of a built bundle, bound to the live fingerprint (the bundle is verified first).

    Uses the library's public ``artifacts.export_trtllm`` when this toolkit version exports it, and
    the ``dspark-calibrate export trtllm`` command otherwise.

    Returns:
        ``status`` (``exported``, ``refused`` or ``failed``) and the exporter's report.
    """
    import dspark_calibrate.artifacts as artifacts

    selector = selector_identity_sha256()
    if "export_trtllm" in artifacts.__all__:
        from dspark_calibrate.artifacts import Expectation, load_trust_root, verify_bundle
        from dspark_calibrate.errors import DsparkError

        now = datetime.now(UTC)
        root = load_trust_root(root_path.read_bytes(), now=now)
        report = verify_bundle(bundle, root, now=now, expected=Expectation(fingerprint=live.fingerprint))
        if not report.ok:
            return {"status": "refused", "reason": f"{report.code}: {report.message}"}
        try:
            exported = artifacts.export_trtllm(
                report, out_dir, selector_identity=selector, live_fingerprint=live.fingerprint, overwrite=True
            )
        except DsparkError as exc:
            return {"status": "refused", "reason": str(exc)}
        return {"status": "exported", "via": "library", **exported.to_dict()}
    live_path = out_dir.with_name(out_dir.name + ".live-fingerprint.json")
    live_path.write_bytes(canonical_json(live.fingerprint.to_dict()))
    cmd = [
        sys.executable, "-m", "dspark_calibrate.cli", "export", "trtllm", str(bundle), "--out", str(out_dir),
        "--trust-root", str(root_path), "--selector-identity", selector, "--live-fingerprint", str(live_path),
        "--force", "--json",
    ]  # fmt: skip
    import dspark_calibrate

    env = dict(os.environ)
    package_root = str(Path(dspark_calibrate.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=120, check=False, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"status": "failed", "reason": repr(exc), "command": shlex.join(cmd)}
    try:
        report_json = json.loads(done.stdout.decode() or "null")
    except ValueError:
        report_json = None
    status = {0: "exported", 1: "refused"}.get(done.returncode, "failed")
    return {
        "status": status,
        "via": "cli",
        "exit_code": done.returncode,
        "report": report_json,
        "stderr": done.stderr.decode(errors="replace")[-2000:],
        "command": shlex.join(cmd),
    }


def admit_level(
    outcome: dict[str, Any],
    root_path: Path,
    live: LiveContext,
    state_path: Path,
    engine: Engine,
    planner: PlannerSettings,
) -> tuple[serving.Policy, dict[str, Any], DynamicVerifier | None]:
    """``admit`` the level's bundle; an active decision drives the selector/allocator.

    Returns:
        The dynamic policy (the device or host planner; the static fallback when inactive), a
        JSON-ready record (the admission and which planner runs) and the admitted verifier.
    """
    from dspark_calibrate.runtime_plugin.admission import AdmissionPolicy, admit

    ladder, k = engine.cfg.ladder, engine.cfg.k

    if outcome.get("status") != "built":
        record = {
            "active": False,
            "reason_code": "NO_BUNDLE",
            "message": str(outcome.get("reason", "not built")),
        }
        return serving.StaticPolicy(ladder, k, name="static-fallback"), record, None
    decision = admit(
        Path(outcome["bundle"]), root_path, live=live, policy=AdmissionPolicy(state_path=state_path)
    )
    record = {
        "active": decision.active,
        "reason_code": decision.reason_code,
        "message": decision.message,
        "timings_ms": dict(decision.timings_ms),
        "bundle_sha256": decision.bundle_sha256,
        "bundle_version": decision.bundle_version,
        "engine_config": {key: str(v) for key, v in decision.engine_config.items()},
    }
    if not decision.active:
        return serving.StaticPolicy(ladder, k, name="static-fallback"), record, None
    verifier = DynamicVerifier.from_decision(decision)
    policy, record["planner"] = planner_policy(verifier, engine, planner, name="dynamic")
    return policy, record, verifier
