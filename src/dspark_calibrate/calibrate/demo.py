"""The built-in demo: every pipeline stage on CPU, on synthetic data, in well under a minute.

synthetic sweep → synthetic traces → fit → synthetic workload with prefill traffic → mixed sweep
of its mixed steps → build (sign) → export trtllm (decode and mixed) → verify → admit → report.
The demo deployment is TensorRT-LLM's mixed route (K = 3, DEP8, the six BREAKABLE body buckets),
so its package carries the mixed evidence too. Everything is marked synthetic and signed with an ephemeral key written
into the output directory, so ``dspark-verify`` accepts it only with ``--allow-synthetic``. The
demo composes the library's own entry points; it adds no logic of its own beyond choosing inputs.
Signing, verification and export are imported lazily (they need ``cryptography``).
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_calibrate import __version__
from dspark_calibrate.artifacts import (
    MIXED_EXECUTION_MODE,
    TRTLLM_BODY_BUCKETS,
    Fingerprint,
    MixedLive,
    MixedRoute,
    Provenance,
    canonical_json,
    detached_envelope_path,
)
from dspark_calibrate.calibrate.confidence.fit import FitOptions, run_fit
from dspark_calibrate.calibrate.confidence.synth_traces import SynthSpec, write_synth_traces
from dspark_calibrate.calibrate.deployment.build import BuildOptions, build_bundle, load_build_inputs
from dspark_calibrate.calibrate.deployment.workload import Workload, synthesize_mixed_workload, write_workload
from dspark_calibrate.calibrate.measurement.mixed import plan_from_workload
from dspark_calibrate.calibrate.measurement.mixed_sweep import MixedSweepRequest, execute_mixed
from dspark_calibrate.calibrate.measurement.stats import Thresholds
from dspark_calibrate.calibrate.measurement.sweep import SweepRequest, execute
from dspark_calibrate.calibrate.report import write_report
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin import AdmissionDecision, AdmissionPolicy, admit

if TYPE_CHECKING:
    from securesystemslib.signer import Signer

    from dspark_calibrate.artifacts import Expectation, TrustRoot

__all__ = ["DEMO_MARKER", "DEMO_SELECTOR_IDENTITY", "DemoResult", "demo_fingerprint", "run_demo"]

#: File that marks a directory as demo output (so a re-run may replace it, and nothing else).
DEMO_MARKER = ".dspark-demo"
#: A stand-in for the engine's selector constant; a real export takes it from the engine's source.
DEMO_SELECTOR_IDENTITY = hashlib.sha256(b"dspark-calibrate demo: not an engine selector identity").hexdigest()
_K = 3
_LADDER = (8, 16)
_RANKS = 8
#: The synthetic step's verification cost: tiles of 8 tokens at 0.4 ms (a K=3 staircase).
_SWEEP_MODEL = {"tile": 8, "per_tile_ms": 0.4}


def demo_fingerprint() -> Fingerprint:
    """The synthetic deployment the demo measures (all ten engine fields established)."""
    return Fingerprint(
        gpu="synthetic",
        gpu_count=_RANKS,
        gpu_snapshot_sha256=hashlib.sha256(b"synthetic").hexdigest(),
        topology="DEP8",
        source_head="synthetic",
        source_diff_sha256=hashlib.sha256(b"").hexdigest(),
        runtime_snapshot=f"dspark-calibrate={__version__};backend=synthetic",
        max_draft_len=_K,
        rank_local_graph_batch_sizes=_LADDER,
        global_graph_batch_sizes=tuple(g * _RANKS for g in _LADDER),
        model_config_sha256=hashlib.sha256(b"dspark-calibrate synthetic model").hexdigest(),
        clock_policy="synthetic",
    )


@dataclass(frozen=True)
class DemoResult:
    """Where the demo wrote its outputs, and what the runtime hook decided."""

    out: Path
    trust_root: Path
    cost_table: Path
    bundle: Path
    trtllm: Path
    report: Path
    predicted_gain: float
    predicted_gain_ci: tuple[float, float]
    admission_active: bool
    admission_reason: str
    stages: tuple[tuple[str, float], ...]
    mixed_active: bool = False
    mixed_reason: str = ""
    mixed_predicted_gain: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "out": str(self.out),
            "trust_root": str(self.trust_root),
            "cost_table": str(self.cost_table),
            "bundle": str(self.bundle),
            "trtllm": str(self.trtllm),
            "report": str(self.report),
            "predicted_gain": self.predicted_gain,
            "predicted_gain_ci": list(self.predicted_gain_ci),
            "admission": {"active": self.admission_active, "reason_code": self.admission_reason},
            "mixed": {
                "active": self.mixed_active,
                "reason_code": self.mixed_reason,
                "predicted_gain": self.mixed_predicted_gain,
            },
            "stages_s": {name: round(s, 3) for name, s in self.stages},
        }


def _prepare(out: Path, force: bool) -> None:
    if out.exists() and any(out.iterdir()):
        if not (out / DEMO_MARKER).exists() and not force:
            raise ConfigError(f"{out} is not empty and holds no earlier demo output; choose an empty --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / DEMO_MARKER).write_text("output of `dspark-calibrate demo`; safe to delete\n", encoding="utf-8")


class _StageClock:
    """Times each stage from its start to the next one's, and reports each start to ``on_stage``."""

    def __init__(self, on_stage: Callable[[str], None] | None) -> None:
        self.stages: list[tuple[str, float]] = []
        self._current: tuple[str, float] | None = None  # the stage under way and its start time
        self._on_stage = on_stage

    def __call__(self, name: str) -> None:
        t = time.perf_counter()
        if self._current is not None:
            self.stages.append((self._current[0], t - self._current[1]))
            self._current = None
        if name != "done":
            self._current = (name, t)
        if self._on_stage is not None:
            self._on_stage(name)


_COMMAND = ("dspark-calibrate", "demo")


def run_demo(
    out: Path,
    *,
    seed: int = 0,
    force: bool = False,
    now: datetime | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> DemoResult:
    """Run every stage into ``out`` (replacing an earlier demo there).

    Raises:
        ConfigError: ``out`` holds something that is not demo output, or a stage refused its input.
    """
    now = now or datetime.now(UTC)
    out = Path(out)
    _prepare(out, force)
    stage = _StageClock(on_stage)
    inputs = out / "inputs"
    inputs.mkdir()
    fp = demo_fingerprint()
    stage("keys")
    signer, root = _demo_keys(out, now)
    stage("sweep")
    sweep_summary = _demo_sweep(inputs, fp, seed)
    stage("traces")
    traces = inputs / "traces.parquet"
    write_synth_traces(traces, SynthSpec(rounds=60_000, k=_K, seed=seed, censor_fraction=0.1))
    stage("fit")
    calibration = _demo_fit(traces, out, fp, seed)
    stage("workload")
    workload, traffic = _demo_workload(inputs, fp, seed)
    stage("mixed sweep")
    mixed_summary = _demo_mixed_sweep(inputs, fp, traffic, seed)
    stage("build")
    bundle = out / "bundle"
    result = build_bundle(
        load_build_inputs([sweep_summary], calibration, workload, mixed_sweep=mixed_summary),
        bundle,
        signers=[signer],
        trust_root=root,
        options=BuildOptions(
            version=1,
            issued_at=now,
            expires_at=now + timedelta(days=7),
            allow_synthetic=True,
            command=_COMMAND,
        ),
    )
    cost_table = _copy_cost_table(bundle, out)
    stage("export")
    _demo_export(bundle, root, out, now)
    stage("admit")
    decision = _demo_admit(bundle, root, fp, out, now)
    stage("report")
    html = out / "report.html"
    # With the exported package, the first screen states the receipt digest the options pin.
    write_report([bundle], root, html, now=now, expected=_expected(), trtllm=out / "trtllm")
    stage("done")
    summary = result.summary
    mixed_decision = decision.mixed
    return DemoResult(
        out=out,
        trust_root=out / "trust-root.json",
        cost_table=cost_table,
        bundle=bundle,
        trtllm=out / "trtllm",
        report=html,
        predicted_gain=float(summary["predicted_gain"]),
        predicted_gain_ci=(float(summary["predicted_gain_ci_low"]), float(summary["predicted_gain_ci_high"])),
        admission_active=decision.active,
        admission_reason=decision.reason_code,
        stages=tuple(stage.stages),
        mixed_active=mixed_decision is not None and mixed_decision.active,
        mixed_reason=mixed_decision.reason_code if mixed_decision is not None else "",
        mixed_predicted_gain=float(result.mixed_summary["predicted_gain"]) if result.mixed_summary else None,
    )


def _expected() -> Expectation:
    """What the demo's verifications expect: synthetic evidence is allowed."""
    from dspark_calibrate.artifacts import Expectation

    return Expectation(allow_synthetic=True)


def _demo_keys(out: Path, now: datetime) -> tuple[Signer, TrustRoot]:
    """Ephemeral signing key and trust root (written to ``out/trust-root.json``): the demo's only
    trust anchor."""
    from dspark_calibrate.artifacts import generate_keypair, init_root, load_signer, public_key_of

    pair = generate_keypair(out / "keys", name="demo-signing-key")
    signer = load_signer(pair.private_path)
    key = public_key_of(signer)
    root = init_root(
        root_signers=[signer],
        root_keys=[key],
        root_threshold=1,
        artifact_keys=[key],
        artifact_threshold=1,
        expires=now + timedelta(days=30),
    )
    (out / "trust-root.json").write_bytes(root.to_bytes())
    return signer, root


def _demo_sweep(inputs: Path, fp: Fingerprint, seed: int) -> Path:
    """The synthetic decode sweep; returns its summary's path."""
    _, sweep_out = execute(
        SweepRequest(
            backend="synthetic",
            backend_options=_SWEEP_MODEL,
            world_size=_RANKS,
            k=_K,
            ladder=_LADDER,
            out=inputs / "sweep.parquet",
            thresholds=Thresholds.quick(precision_rel=0.005),
            seed=seed,
            fingerprint=fp,
            clock_policy="synthetic",
            plot=True,
            command=_COMMAND,
        )
    )
    assert sweep_out is not None
    return sweep_out.summary_path


def _demo_fit(traces: Path, out: Path, fp: Fingerprint, seed: int) -> Path:
    """Fit STS temperatures on the synthetic traces into ``out/fit``; returns the calibration's path."""
    _, fit_out, _ = run_fit(
        [traces],
        out / "fit",
        options=FitOptions(method="sts", seed=seed),
        k=_K,
        fingerprint=fp,
        tool_version=__version__,
        command=_COMMAND,
    )
    return fit_out.calibration


def _demo_workload(inputs: Path, fp: Fingerprint, seed: int) -> tuple[Path, Workload]:
    """Synthetic traffic with prefill (mixed) steps, written as the workload; returns both."""
    workload = inputs / "workload.parquet"
    traffic = synthesize_mixed_workload(k=_K, steps=2000, ranks=_RANKS, seed=seed)
    write_workload(
        workload,
        traffic,
        fingerprint=fp,
        provenance=Provenance(
            tool_version=__version__, command=_COMMAND, backend="synthetic", synthetic=True
        ),
    )
    return workload, traffic


def _demo_mixed_sweep(inputs: Path, fp: Fingerprint, traffic: Workload, seed: int) -> Path:
    """The synthetic mixed sweep of the workload's mixed steps; returns its summary's path."""
    route = MixedRoute(_K, _RANKS, TRTLLM_BODY_BUCKETS, MIXED_EXECUTION_MODE)
    _, mixed_out = execute_mixed(
        MixedSweepRequest(
            backend="synthetic",
            plan=plan_from_workload(traffic, route),
            ladder=_LADDER,
            out=inputs / "mixed-sweep.parquet",
            thresholds=Thresholds.quick(precision_rel=0.005, min_rounds=8),
            seed=seed,
            fingerprint=fp,
            clock_policy="synthetic",
            command=_COMMAND,
        )
    )
    assert mixed_out is not None
    return mixed_out.output.summary_path


def _copy_cost_table(bundle: Path, out: Path) -> Path:
    """A top-level copy of the signed cost table, for a quick `dspark-verify DIR/cost-table.parquet`."""
    cost_table = out / "cost-table.parquet"
    shutil.copyfile(bundle / "cost-table.parquet", cost_table)
    shutil.copyfile(detached_envelope_path(bundle / "cost-table.parquet"), detached_envelope_path(cost_table))
    return cost_table


def _demo_export(bundle: Path, root: TrustRoot, out: Path, now: datetime) -> None:
    """Verify the bundle and its mixed evidence, and export the TensorRT-LLM package to ``out/trtllm``."""
    from dspark_calibrate.artifacts import export_trtllm, verify_bundle, verify_mixed

    expected = _expected()
    report = verify_bundle(bundle, root, now=now, expected=expected)
    if not report.ok:  # pragma: no cover - build verified it a moment ago
        raise ConfigError(f"demo bundle does not verify: {report.code}: {report.message}")
    mixed = verify_mixed(bundle, root, now=now, decode=report, expected=expected)
    export_trtllm(
        report,
        out / "trtllm",
        selector_identity=DEMO_SELECTOR_IDENTITY,
        mixed=mixed if mixed.ok else None,
        allow_synthetic=True,
    )


def _demo_admit(
    bundle: Path, root: TrustRoot, fp: Fingerprint, out: Path, now: datetime
) -> AdmissionDecision:
    """The runtime hook's decision on the bundle, written to ``out/admission.json``."""
    decision = admit(
        bundle,
        root,
        live=fp,
        policy=AdmissionPolicy(
            allow_synthetic=True,
            state_path=out / "admission-state.json",
            mixed_live=MixedLive(TRTLLM_BODY_BUCKETS, MIXED_EXECUTION_MODE),
        ),
        now=now,
    )
    mixed_decision = decision.mixed
    (out / "admission.json").write_bytes(
        canonical_json(
            {
                "active": decision.active,
                "reason_code": decision.reason_code,
                "message": decision.message,
                "mixed": mixed_decision.to_dict() if mixed_decision is not None else None,
            }
        )
    )
    return decision
