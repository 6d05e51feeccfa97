"""``build``: turn measurements, a calibration and a workload into a signed, verified bundle.

Inputs: one or more unsigned ``sweep`` summaries (same deployment), an unsigned ``calibration``
table (from ``fit``), a ``workload`` trace, signers and the pinned trust root. Steps:

1. load and cross-check the inputs (one fingerprint, one K, every G with a native cell, the
   calibration fitted for this K and not for another deployment, synthetic input refused unless
   allowed);
2. evaluate every workload step under every measured candidate cell, estimate the drain-guard
   inputs, and select at most 4 compact cells per G (``select_cells``), refusing flat tables and
   tables that never change a decision;
3. replay static K and dynamic verification with the chosen cells (``replay``): goodput, gain,
   bootstrap CI, receipt economics;
4. write ``cost-table.parquet`` (the chosen sweep cells, native included, times as measured),
   ``calibration.parquet`` and ``admission.parquet`` (per-cell replay statistics; the economics in
   the signed summary, keys :data:`ADMISSION_SUMMARY_KEYS`), sign them, verify each with the one
   verification pipeline, write and verify the bundle manifest; plots and ``report/build.json``;
5. publish by renaming the finished temporary directory: nothing is left behind on failure.

With a mixed sweep (``--mixed-sweep``, DESIGN §10), the workload's mixed steps are priced by the
measured mixed cells in the same joint resampling (:mod:`.mixed_build`), and the bundle gains
``mixed/``: the signed mixed cost table, samples and admission, the result files of the mixed
receipt's gates and their own manifest, verified independently of the decode members.

The replay applies the calibration the runtime applies: TensorRT-LLM uses STS temperatures, so by
default the calibration table's ``temperature`` column (the fit's STS temperature or its best STS
approximation) drives the replay; the fitted maps can be used instead for other engines.

``cryptography`` is imported only inside :func:`build_bundle` (signing is build's job; the rest of
``calibrate`` must run without it).
"""

from __future__ import annotations

import math
import secrets
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from dspark_calibrate import __version__
from dspark_calibrate.artifacts import (
    LEGACY_UNPAIRED_COSTS,
    TRTLLM_FINGERPRINT_FIELDS,
    ArtifactReadError,
    CostCell,
    CostTable,
    Fingerprint,
    JsonError,
    LoadedArtifact,
    Provenance,
    atomic_write_bytes,
    canonical_json,
    fingerprint_flag,
    loads_strict,
    logical_sha256,
    publish_directory,
    read_artifact,
)
from dspark_calibrate.calibrate._png import new_figure, png_bytes
from dspark_calibrate.calibrate.deployment.cells import CHECK_COLUMNS, control_notes
from dspark_calibrate.calibrate.deployment.mixed import MixedEvidence, MixedGrid, histories_follow_tokens
from dspark_calibrate.calibrate.deployment.mixed_build import (
    MIXED_MINIMUM_GAIN,
    MixedInputs,
    MixedOutputs,
    deploy_mixed,
    load_mixed_inputs,
    mixed_outputs,
)
from dspark_calibrate.calibrate.deployment.regime import RegimeFinding, infer_regime
from dspark_calibrate.calibrate.deployment.replay import (
    BootstrapSettings,
    CellGrid,
    ReplayReport,
    StepEvidence,
    choose_steps,
    deployed_evidence,
    estimate_drain_guard,
    first_losses,
    prepare_evidence,
    replay,
)
from dspark_calibrate.calibrate.deployment.select_cells import CellSelection, require_cells, select_cells
from dspark_calibrate.calibrate.deployment.uncertainty import OverheadEvidence, shift_model
from dspark_calibrate.calibrate.deployment.workload import Workload, read_workload
from dspark_calibrate.calibrate.measurement.dwell import describe_dwell, dwell_from_json, dwell_option
from dspark_calibrate.errors import ArtifactRejected, ConfigError, InvalidValueError
from dspark_calibrate.runtime_plugin.planner import (
    DEFAULT_MIN_VERIFY_LEN,
    DEFAULT_MINIMUM_PREDICTED_GAIN,
    Calibration,
    DrainGuard,
)
from dspark_calibrate.schemas import (
    ADMISSION_PREDICTION_KEYS,
    ADMISSION_SUMMARY_KEYS,
    DRAIN_GUARD_SUMMARY_KEYS,
    MIXED_RESULT_FILES,
    PER_BUCKET_KEYS,
    SchemaMismatch,
    arrow_schema,
    conform_table,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from securesystemslib.signer import Signer

    from dspark_calibrate.artifacts import (
        BundleLayout,
        BundleReport,
        Expectation,
        TrustRoot,
        VerifiedArtifact,
    )

__all__ = [
    "ADMISSION_SUMMARY_KEYS",
    "BUNDLE_FILES",
    "DRAIN_GUARD_SUMMARY_KEYS",
    "PER_BUCKET_KEYS",
    "BuildInputs",
    "BuildOptions",
    "BuildResult",
    "admission_summary",
    "build_bundle",
    "load_build_inputs",
    "load_overhead_evidence",
]

#: Member file names inside a bundle directory.
BUNDLE_FILES: Mapping[str, str] = {
    "cost-table": "cost-table.parquet",
    "calibration": "calibration.parquet",
    "admission": "admission.parquet",
}


@dataclass(frozen=True, slots=True)
class BuildOptions:
    """How to build (all recorded in the artifacts' provenance).

    Attributes:
        version: version of every artifact and of the manifest in their series.
        issued_at, expires_at: the signed validity window.
        minimum_predicted_gain: the runtime margin written into the export (>= 0).
        min_verify_len: the runtime's verify floor.
        overhead_ms: fixed confidence-path overhead per policy step, taken as an upper bound (None:
            the sweep's forced-K arms when measured, else a conservative default).
        overhead_source: where ``overhead_ms`` came from, in words (recorded in the signed
            provenance and the economics; default "user-supplied").
        safety_margin_ms: the receipt's safety margin (None: default).
        minimum_group_value_ms: the drain guard's threshold.
        loss_multiplier: the drain guard's loss multiplier (None: estimated from the workload).
        bootstrap: resampling settings.
        calibration_use: ``sts`` (what TensorRT-LLM applies) or ``native`` (the fitted maps).
        allow_synthetic: accept synthetic inputs (demos, tests).
        mixed_minimum_predicted_gain: the mixed cost file's margin (None: the decode margin, at
            least 0.01; the consumer refuses less).
        plots: write PNG plots (needs matplotlib).
        force: replace an existing output directory.
        command: the command line, for provenance.
    """

    version: int
    issued_at: datetime
    expires_at: datetime
    minimum_predicted_gain: float = DEFAULT_MINIMUM_PREDICTED_GAIN
    min_verify_len: int = DEFAULT_MIN_VERIFY_LEN
    overhead_ms: float | None = None
    overhead_source: str | None = None
    safety_margin_ms: float | None = None
    minimum_group_value_ms: float = 0.0
    loss_multiplier: float | None = None
    bootstrap: BootstrapSettings = field(default_factory=BootstrapSettings)
    calibration_use: str = "sts"
    allow_synthetic: bool = False
    mixed_minimum_predicted_gain: float | None = None
    plots: bool = True
    force: bool = False
    command: tuple[str, ...] = ()
    objective: str | None = None
    regime: str | None = None
    planner: str | None = None
    overhead_evidence: OverheadEvidence | None = None
    saving_shift_sd: float | None = None
    saving_shift_source: str | None = None

    def __post_init__(self) -> None:
        # Names and the planner first: they are cheap to check and a wrong one wastes a whole build.
        infer_regime(np.zeros(0), declared=self.regime, objective=self.objective)
        if self.overhead_evidence is not None and self.overhead_ms is not None:
            raise ConfigError(
                "give the confidence path's cost once: --overhead (measured runs of the planner) or --overhead-ms"
            )
        measured = self.overhead_evidence.planner if self.overhead_evidence is not None else None
        if self.planner is not None and measured is not None and measured != self.planner:
            raise ConfigError(
                f"--overhead was measured for planner {measured!r}, but the deployment runs {self.planner!r}; "
                f"measure the planner you deploy (its forced-K arm against static K in the serving loop) and pass "
                "that file"
            )
        shift = self.saving_shift_sd
        if shift is not None and not (math.isfinite(shift) and 0 <= shift < 0.5):
            raise ConfigError(f"--saving-shift-sd must be a fraction in [0, 0.5), got {shift}")
        for name in ("minimum_predicted_gain", "minimum_group_value_ms"):
            x = getattr(self, name)
            if not math.isfinite(x) or x < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be finite and >= 0, got {x}")
        for name in ("overhead_ms", "safety_margin_ms"):
            x = getattr(self, name)
            if x is not None and (not math.isfinite(x) or x < 0):
                raise ConfigError(f"--{name.replace('_', '-')} must be finite and >= 0, got {x}")
        if self.loss_multiplier is not None and (
            not math.isfinite(self.loss_multiplier) or self.loss_multiplier <= 0
        ):
            raise ConfigError(f"--loss-multiplier must be finite and > 0, got {self.loss_multiplier}")
        if self.calibration_use not in ("sts", "native"):
            raise ConfigError(f"--calibration-use must be sts or native, got {self.calibration_use!r}")
        if self.expires_at <= self.issued_at:
            raise ConfigError("--expires must be later than the issue time")
        gain = self.mixed_minimum_predicted_gain
        if gain is not None and (not math.isfinite(gain) or gain < MIXED_MINIMUM_GAIN):
            raise ConfigError(f"--mixed-min-gain must be >= {MIXED_MINIMUM_GAIN}, got {gain}")

    @property
    def mixed_gain(self) -> float:
        """The mixed cost file's ``minimum_predicted_gain``."""
        if self.mixed_minimum_predicted_gain is not None:
            return self.mixed_minimum_predicted_gain
        return max(MIXED_MINIMUM_GAIN, self.minimum_predicted_gain)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for provenance)."""
        return {
            "minimum_predicted_gain": self.minimum_predicted_gain,
            "min_verify_len": self.min_verify_len,
            "overhead_ms": self.overhead_ms,
            "overhead_source": self.overhead_source,
            "safety_margin_ms": self.safety_margin_ms,
            "minimum_group_value_ms": self.minimum_group_value_ms,
            "loss_multiplier": self.loss_multiplier,
            "bootstrap": self.bootstrap.to_dict(),
            "calibration_use": self.calibration_use,
            "allow_synthetic": self.allow_synthetic,
            "mixed_minimum_predicted_gain": self.mixed_gain,
            "objective": self.objective,
            "regime": self.regime,
            "planner": self.deployed_planner,
            "overhead_evidence": None if self.overhead_evidence is None else self.overhead_evidence.to_dict(),
            "saving_shift_sd": self.saving_shift_sd,
            "saving_shift_source": self.saving_shift_source,
        }

    @property
    def deployed_planner(self) -> str | None:
        """The serving planner whose confidence path is charged (``--planner``, else the measured one)."""
        if self.planner is not None:
            return self.planner
        return self.overhead_evidence.planner if self.overhead_evidence is not None else None


@dataclass(frozen=True, eq=False)
class BuildInputs:
    """The loaded, cross-checked inputs of a build."""

    fingerprint: Fingerprint
    sweep_rows: tuple[Mapping[str, Any], ...]
    sweep_provenance: Provenance
    sweep_sources: tuple[Mapping[str, Any], ...]
    calibration_table: pa.Table
    calibration_source: Mapping[str, Any]
    workload: Workload
    synthetic: bool
    synthetic_inputs: tuple[str, ...]
    notes: tuple[str, ...]
    calibration_summary: Mapping[str, Any] = field(default_factory=dict)
    mixed: MixedInputs | None = None

    @property
    def k(self) -> int:
        """The draft length K."""
        assert self.fingerprint.max_draft_len is not None
        return self.fingerprint.max_draft_len


@dataclass(frozen=True, eq=False)
class BuildResult:
    """What :func:`build_bundle` produced (the bundle is already verified)."""

    out_dir: Path
    fingerprint: Fingerprint
    selection: CellSelection
    report: ReplayReport
    summary: Mapping[str, Any]
    files: tuple[Path, ...]
    plots: tuple[Path, ...]
    bundle: BundleReport
    notes: tuple[str, ...]
    mixed_summary: Mapping[str, Any] | None = None
    mixed_valid: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for ``--json`` and ``report/build.json``)."""
        out: dict[str, Any] = _json_safe(
            {
                "out_dir": str(self.out_dir),
                "valid": self.bundle.ok,
                "bundle": self.bundle.to_dict(),
                "fingerprint_digest": self.fingerprint.digest(),
                "summary": dict(self.summary),
                "selection": self.selection.to_dict(),
                "replay": self.report.to_dict(),
                "files": [str(p) for p in self.files],
                "plots": [str(p) for p in self.plots],
                "notes": list(self.notes),
                "mixed": None
                if self.mixed_summary is None
                else {"valid": self.mixed_valid, "summary": dict(self.mixed_summary)},
            }
        )
        return out


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    return obj


def _read(path: Path, kind: str, what: str) -> LoadedArtifact:
    try:
        loaded = read_artifact(path)
    except ArtifactReadError as exc:
        raise ConfigError(f"{what} {exc}") from exc
    if loaded.kind != kind:
        raise ConfigError(f"{path}: is a {loaded.kind!r} artifact, expected {kind!r} ({what})")
    return loaded


def load_build_inputs(
    sweeps: Sequence[Path], calibration: Path, workload: Path, *, mixed_sweep: Path | None = None
) -> BuildInputs:
    """Read and cross-check the inputs of a build (``mixed_sweep``: a ``sweep --mixed`` summary).

    Raises:
        ConfigError: unreadable files, another kind, fingerprints or K that disagree, a G without
            a native cell, a calibration for another deployment, a workload from another K.
    """
    loaded, fp = _read_sweeps(sweeps)
    k = fp.max_draft_len
    assert k is not None
    rows = _sweep_rows(loaded, fp)
    cal, cal_table = _read_calibration(Path(calibration), fp, k)
    wl = read_workload(workload, k=k)
    synthetic_inputs = [
        f"sweep {x.path.name} (backend {x.provenance_untrusted().backend})"
        for x in loaded
        if x.provenance_untrusted().synthetic
    ]
    if cal.provenance_untrusted().synthetic:
        synthetic_inputs.append(f"calibration {cal.path.name} (fitted on synthetic traces)")
    if wl.synthetic:
        synthetic_inputs.append(f"workload {Path(workload).name}")
    mixed = load_mixed_inputs(Path(mixed_sweep), fp) if mixed_sweep is not None else None
    if mixed is not None and mixed.synthetic:
        synthetic_inputs.append(f"mixed sweep {mixed.path.name} (backend {mixed.provenance.backend})")
    return BuildInputs(
        fingerprint=fp,
        sweep_rows=tuple(rows),
        sweep_provenance=loaded[0].provenance_untrusted(),
        sweep_sources=tuple(
            {"path": str(x.path), "logical_sha256": logical_sha256(x.table, "sweep")} for x in loaded
        ),
        calibration_table=cal_table,
        # fit's held-out metrics, reliability bins and survival curves travel into the signed
        # calibration so a reviewer can judge it from the bundle alone.
        calibration_summary=dict(cal.metadata.get("summary") or {}),
        calibration_source={
            "path": str(cal.path),
            "logical_sha256": logical_sha256(cal_table, "calibration"),
        },
        workload=wl,
        synthetic=bool(synthetic_inputs),
        synthetic_inputs=tuple(synthetic_inputs),
        notes=tuple(_input_notes(wl, mixed, cal_table)),
        mixed=mixed,
    )


#: Largest overhead-evidence file read (bytes): a list of per-run numbers and two short strings.
MAX_OVERHEAD_FILE_BYTES = 1 << 16


def load_overhead_evidence(path: Path) -> OverheadEvidence:
    """Read ``--overhead FILE``: ``{"planner", "per_step_ms": [one mean per run], "source"}``.

    Raises:
        ConfigError: unreadable, too large, not strict JSON, or not that shape; the message names
            the file and the fix.
    """
    path = Path(path)
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_OVERHEAD_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the overhead evidence ({exc.strerror or exc})") from exc
    if len(data) > MAX_OVERHEAD_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_OVERHEAD_FILE_BYTES} bytes; not an overhead evidence file")
    try:
        return OverheadEvidence.from_dict(loads_strict(data, what=str(path)), where=str(path))
    except (JsonError, InvalidValueError) as exc:
        raise ConfigError(
            f"{exc}; write it as {{\"planner\": \"fused\", \"per_step_ms\": [0.101, 0.097, ...], "
            "\"source\": \"...\"}} from runs of the planner you deploy"
        ) from exc


def _read_sweeps(sweeps: Sequence[Path]) -> tuple[list[LoadedArtifact], Fingerprint]:
    """The sweep summaries and their one fingerprint, which must establish every engine field.

    Raises:
        ConfigError: no sweep, an unreadable one, or sweeps of different deployments.
    """
    if not sweeps:
        raise ConfigError("give at least one sweep summary (--sweep)")
    loaded = [_read(Path(p), "sweep", "--sweep") for p in sweeps]
    fps = [x.fingerprint_untrusted() for x in loaded]
    fp = fps[0]
    for x, other in zip(loaded[1:], fps[1:], strict=True):
        diff = fp.diff(other)
        if diff:
            names = ", ".join(f"{n}: {a!r} vs {b!r}" for n, a, b in diff)
            raise ConfigError(f"{x.path}: sweep of another deployment than {loaded[0].path} ({names})")
    missing = fp.missing(TRTLLM_FINGERPRINT_FIELDS)
    if missing:
        flags = " ".join(sorted({fingerprint_flag(n) for n in missing}))
        raise ConfigError(
            f"{loaded[0].path}: fingerprint lacks {', '.join(missing)}; TensorRT-LLM binds all ten engine "
            f"fields; re-run the sweep with {flags} (or --fingerprint FILE; docs/fingerprint.md)"
        )
    return loaded, fp


def _sweep_rows(loaded: Sequence[LoadedArtifact], fp: Fingerprint) -> list[Mapping[str, Any]]:
    """Every sweep's cells, on the fingerprint's ladder, with a native cell for every G.

    Raises:
        ConfigError: a table that does not conform, a G off the ladder, or a G without a native cell.
    """
    assert fp.rank_local_graph_batch_sizes is not None
    rows: list[Mapping[str, Any]] = []
    for x in loaded:
        try:
            rows.extend(conform_table("sweep", x.table, version=x.schema_version).to_pylist())
        except SchemaMismatch as exc:
            raise ConfigError(f"{x.path}: {exc}") from exc
    ladder = set(fp.rank_local_graph_batch_sizes)
    have_native = {int(r["graph_batch_size"]) for r in rows if int(r["verifier_budget"]) == 0}
    outside = sorted({int(r["graph_batch_size"]) for r in rows} - ladder)
    if outside:
        raise ConfigError(f"sweep cells use G {outside} outside the fingerprint ladder {sorted(ladder)}")
    no_native = sorted(ladder - have_native)
    if no_native:
        raise ConfigError(f"G {no_native} has no measured native cell (V=0); re-run the sweep for those G")
    return rows


def _read_calibration(path: Path, fp: Fingerprint, k: int) -> tuple[LoadedArtifact, pa.Table]:
    """The calibration and its conformed table, fitted for positions 1..K of this deployment.

    Raises:
        ConfigError: unreadable, another K, or fitted for another deployment.
    """
    cal = _read(path, "calibration", "--calibration")
    try:
        cal_table = conform_table("calibration", cal.table)
    except SchemaMismatch as exc:
        raise ConfigError(f"{cal.path}: {exc}") from exc
    positions = sorted(int(p) for p in cal_table.column("position").to_pylist())
    if positions != list(range(1, k + 1)):
        raise ConfigError(
            f"{cal.path}: calibration covers positions {positions}, the deployment has K={k}; "
            "fit it for this drafter"
        )
    clash = [(n, a, b) for n, a, b in fp.diff(cal.fingerprint_untrusted()) if a is not None and b is not None]
    if clash:
        names = ", ".join(f"{n}: {b!r} (deployment {a!r})" for n, a, b in clash)
        raise ConfigError(
            f"{cal.path}: calibration was fitted for another deployment ({names}); fit it for this one"
        )
    return cal, cal_table


def _input_notes(wl: Workload, mixed: MixedInputs | None, cal_table: pa.Table) -> list[str]:
    """What a reviewer should know about the inputs: the workload's notes, unpriced mixed steps,
    and calibration methods the replay approximates by STS."""
    notes = list(wl.notes)
    n_mixed = len(wl.mixed_step_rows())
    if n_mixed and mixed is None:
        notes.append(
            f"{n_mixed} of the workload's steps are mixed (prefill + decode) and no mixed sweep was given: they run "
            "native under this bundle, pay the confidence path, and are priced at their recorded step time (or, "
            "where none was recorded, an estimate from the decode table); measure them with `sweep --mixed` and "
            "pass --mixed-sweep to deploy mixed cells"
        )
    methods = sorted(set(cal_table.column("method").to_pylist()) - {"sts"})
    if methods:
        notes.append(
            f"calibration methods {methods}: TensorRT-LLM applies STS, so the replay and the export use each "
            "position's best STS approximation (the temperature column)"
        )
    return notes


def admission_summary(
    report: ReplayReport,
    workload: Workload,
    regime: RegimeFinding | None = None,
    planner: str | None = None,
) -> dict[str, Any]:
    """The signed summary of the admission artifact: exactly :data:`ADMISSION_SUMMARY_KEYS` (what
    the runtime reads) followed by :data:`ADMISSION_PREDICTION_KEYS` (what the prediction assumes:
    objective, regime, planner, mixed share, both objectives' gains)."""
    e = report.economics
    values = workload.step_values()
    finding = regime or infer_regime(values.waiting, drain=values.drain, objective=report.objective)
    summary = {
        "predicted_gain": report.predicted_gain,
        "predicted_gain_ci_low": report.predicted_gain_ci_low,
        "predicted_gain_ci_high": report.predicted_gain_ci_high,
        "static_goodput_tok_per_ms": report.static_goodput_tok_per_ms,
        "dynamic_goodput_tok_per_ms": report.dynamic_goodput_tok_per_ms,
        "compact_step_share": report.compact_step_share,
        "policy_steps": e.policy_steps,
        "compact_choices": e.compact_choices,
        "gross_compact_value_ms_lower_bound": e.gross_compact_value_ms_lower_bound,
        "fixed_confidence_path_overhead_ms_upper_bound": e.fixed_confidence_path_overhead_ms_upper_bound,
        "safety_margin_ms": e.safety_margin_ms,
        "net_value_ms": e.net_value_ms,
        "admitted": e.admitted,
        "minimum_predicted_gain": report.minimum_predicted_gain,
        "drain_guard": report.drain_guard.to_dict(),
        "workload_identity_sha256": workload.identity_sha256,
        "selector_replay_sha256": report.selector_replay_sha256,
        "workload_approximate": workload.approximate,
        "per_bucket": [{k: b[k] for k in PER_BUCKET_KEYS} for b in report.per_bucket],
        "objective": report.objective,
        "regime": finding.regime.value,
        "regime_source": finding.source,
        "planner": planner,
        "mixed_share": float(report.mixed_steps.get("share", 0.0)),
        "predictions": {k: dict(v) for k, v in report.predictions.items()},
        "tpot_gain": report.tpot_gain,
    }
    bad = [k for k, v in summary.items() if isinstance(v, float) and not math.isfinite(v)]
    bad += [
        f"predictions.{o}.{k}"
        for o, p in report.predictions.items()
        for k, v in p.items()
        if not math.isfinite(v)
    ]
    if bad:
        raise ConfigError(f"the replay produced non-finite {bad}; the workload is too small to estimate them")
    assert tuple(summary) == ADMISSION_SUMMARY_KEYS + ADMISSION_PREDICTION_KEYS
    return summary


def _cost_table(inputs: BuildInputs, grid: CellGrid) -> pa.Table:
    """The deployed cells (native + chosen compact) as measured; the paired columns come from the
    grid, so a schema-1 sweep yields its derived, unpaired savings (paired_rounds 0)."""
    deployed = {(c.graph_batch_size, c.verifier_budget): c for c in grid.cells}
    rows = []
    for r in inputs.sweep_rows:
        cell = deployed.get((int(r["graph_batch_size"]), int(r["verifier_budget"])))
        if cell is None:
            continue
        rows.append(
            CostCell(
                **{n: r[n] for n in _MEASURED_COLUMNS},
                saving=cell.saving,
                saving_ci_low=cell.saving_ci_low,
                saving_ci_high=cell.saving_ci_high,
                paired_rounds=cell.paired_rounds,
                common_mode_rel=cell.common_mode_rel,
                level_rel=cell.level_rel,
                **{n: getattr(cell, n) for n in CHECK_COLUMNS},
            )
        )
    # The model orders the rows by (G, V) and refuses an undeployable or incomplete cell.
    return CostTable.from_cost_cells(grid.k, rows).to_arrow()


#: Cost-table columns copied from the sweep as measured (the rest describe the paired saving).
_MEASURED_COLUMNS = (
    "graph_batch_size",
    "verifier_budget",
    "step_time_ms",
    "ci_low_ms",
    "ci_high_ms",
    "p10_ms",
    "p90_ms",
    "samples",
    "stop_reason",
    "source_result_sha256",
)


def _undeployed(inputs: BuildInputs, cells: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
    """Measured compact cells that were not deployed (shown beside the deployed ones in reports)."""
    keep = set(cells)
    return [
        {n: r[n] for n in ("graph_batch_size", "verifier_budget", "step_time_ms", "ci_low_ms", "ci_high_ms")}
        for r in sorted(
            inputs.sweep_rows, key=lambda r: (int(r["graph_batch_size"]), int(r["verifier_budget"]))
        )
        if int(r["verifier_budget"]) > 0
        and (int(r["graph_batch_size"]), int(r["verifier_budget"])) not in keep
    ]


def _admission_table(report: ReplayReport, cells: Sequence[tuple[int, int]]) -> pa.Table:
    keep = set(cells)
    rows = [
        {
            k: c[k]
            for k in (
                "graph_batch_size",
                "verifier_budget",
                "chosen_steps",
                "value_ms",
                "value_ms_lower_bound",
            )
        }
        for c in report.per_cell
        if c["verifier_budget"] == 0 or (c["graph_batch_size"], c["verifier_budget"]) in keep
    ]
    return pa.Table.from_pylist(rows, schema=arrow_schema("admission"))


def _plots(directory: Path, report: ReplayReport) -> tuple[list[Path], list[str]]:
    cells = [c for c in report.per_cell if c["verifier_budget"]]
    try:
        fig = _figure(max(4.0, 0.6 * len(cells) + 2), 3.2)
    except ConfigError as exc:
        return [], [f"plots skipped: {exc}"]
    out = []
    ax = fig.add_subplot()
    labels = [f"{c['graph_batch_size']}/{c['verifier_budget']}" for c in cells]
    values = [c["value_ms"] for c in cells]
    lows = [c["value_ms_lower_bound"] for c in cells]
    ax.bar(labels, values, color="#4C78A8", label="replayed value")
    ax.scatter(labels, lows, color="#E45756", marker="_", s=200, label="95% lower bound", zorder=3)
    ax.set_xlabel("cell G/V")
    ax.set_ylabel("value over the workload (ms)")
    ax.set_title("value per deployed compact cell")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.append(_write_png(fig, directory / "value_per_cell.png"))
    fig = _figure(5.5, 3.2)
    ax = fig.add_subplot()
    names = ["all"] + [str(b["graph_batch_size"]) for b in report.per_bucket]
    mids = [report.predicted_gain] + [b["predicted_gain"] for b in report.per_bucket]
    los = [report.predicted_gain_ci_low] + [b["ci_low"] for b in report.per_bucket]
    his = [report.predicted_gain_ci_high] + [b["ci_high"] for b in report.per_bucket]
    err = [
        [100 * max(0.0, m - lo) for m, lo in zip(mids, los, strict=True)],
        [100 * max(0.0, hi - m) for m, hi in zip(mids, his, strict=True)],
    ]
    ax.errorbar(names, [100 * m for m in mids], yerr=err, fmt="o", capsize=4, color="#54A24B")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.axhline(100 * report.minimum_predicted_gain, color="#E45756", lw=0.8, ls="--", label="minimum gain")
    ax.set_xlabel("graph batch size")
    ax.set_ylabel("predicted goodput gain (%)")
    ax.set_title("predicted gain with 95% CI")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.append(_write_png(fig, directory / "predicted_gain.png"))
    return out, []


def _figure(width: float, height: float) -> Figure:
    return new_figure(width, height, dpi=110, what="build plots", skip_flag="--no-plots")


def _write_png(fig: Figure, path: Path) -> Path:
    atomic_write_bytes(path, png_bytes(fig))
    return path


def build_bundle(
    inputs: BuildInputs,
    out_dir: Path,
    *,
    signers: Sequence[Signer],
    trust_root: TrustRoot,
    options: BuildOptions,
    on_stage: Callable[[str], None] | None = None,
) -> BuildResult:
    """Select, replay, sign, verify and publish a bundle (see the module docstring).

    ``on_stage(name)`` is called as each stage starts (``select``, ``replay``, ``sign``,
    ``verify``, ``publish``), for progress displays.

    Raises:
        ConfigError: bad inputs, a refused selection, synthetic input without permission, an
            existing output without ``force``, or a bundle that does not verify (nothing is left
            behind).
    """
    out_dir = Path(out_dir)
    _refuse_request(inputs, out_dir, signers, options)
    stage = on_stage if on_stage is not None else _no_stage
    stage("select")
    # (2) candidates, drain guard, selection
    grid = CellGrid.from_rows(inputs.k, inputs.sweep_rows)
    calibration = Calibration.from_rows(inputs.calibration_table.to_pylist(), use=options.calibration_use)
    chosen, candidates = _select(inputs, grid, calibration, options)
    stage("replay")
    # (3) replay the deployed table, from the candidates' evidence (the rows are decoded once)
    final = grid.restrict(chosen.cells)
    evidence = deployed_evidence(candidates, final)
    del candidates  # its (steps, candidate cells) arrays are not needed past this point
    replayed = _replay_deployed(inputs, final, calibration, evidence, chosen, options)
    report = replayed.report
    summary = admission_summary(report, inputs.workload, replayed.regime, options.deployed_planner)
    notes = _build_notes(inputs, grid, final, replayed)
    prov = _provenance(inputs, options, chosen, final, replayed, notes)
    tables = _member_tables(inputs, final, report, chosen.cells, summary, options)
    written = _write_bundle_dir(
        out_dir, tables, inputs, replayed, prov, signers, trust_root, options, notes, stage
    )
    return _finish(out_dir, inputs, chosen, report, summary, notes, written, trust_root, options)


def _no_stage(name: str) -> None:
    """The progress callback when the caller gives none."""


def _refuse_request(
    inputs: BuildInputs, out_dir: Path, signers: Sequence[Signer], options: BuildOptions
) -> None:
    """Refuse a build that cannot or must not start (before any work is done)."""
    if inputs.synthetic and not options.allow_synthetic:
        raise ConfigError(
            f"synthetic inputs: {', '.join(inputs.synthetic_inputs)}; use recorded ones (fit on "
            "recorder traces, `workload import-trtllm`), or pass --allow-synthetic for demos and CPU trials"
        )
    if out_dir.exists() and not options.force:
        raise ConfigError(f"{out_dir} exists; choose another --out or pass --force to replace it")
    if not signers:
        raise ConfigError("no signing key given: pass --key")


@dataclass(frozen=True, eq=False)
class _Chosen:
    """The selection stage's result: the drain guard, how it was estimated, and the chosen cells."""

    guard: DrainGuard
    estimate: Mapping[str, Any]
    selection: CellSelection
    cells: tuple[tuple[int, int], ...]


def _select(
    inputs: BuildInputs, grid: CellGrid, calibration: Calibration, options: BuildOptions
) -> tuple[_Chosen, StepEvidence]:
    """Evaluate every candidate cell over the workload, estimate the drain guard, choose the cells
    (and return the candidates' evidence, which the replay restricts to the deployed cells)."""
    evidence = prepare_evidence(inputs.workload, grid, calibration, min_verify_len=options.min_verify_len)
    guard, estimate = estimate_drain_guard(
        evidence,
        minimum_predicted_gain=options.minimum_predicted_gain,
        minimum_group_value_ms=options.minimum_group_value_ms,
        loss_multiplier=options.loss_multiplier,
    )
    selection = select_cells(
        evidence, minimum_predicted_gain=options.minimum_predicted_gain, drain_guard=guard
    )
    return _Chosen(guard, estimate, selection, require_cells(selection)), evidence


@dataclass(frozen=True, eq=False)
class _Replayed:
    """The replay of the deployed table, and the mixed cells it priced (None without a mixed sweep)."""

    report: ReplayReport
    mixed_grid: MixedGrid | None
    mixed_evidence: MixedEvidence | None
    mixed_left: tuple[tuple[str, str], ...]
    regime: RegimeFinding


def _replay_deployed(
    inputs: BuildInputs,
    final: CellGrid,
    calibration: Calibration,
    evidence: StepEvidence,
    chosen: _Chosen,
    options: BuildOptions,
) -> _Replayed:
    """Replay static K and dynamic verification with the deployed cells (and mixed cells, if any);
    ``evidence`` is the deployed cells' (:func:`deployed_evidence`, with per-row tokens)."""
    header = {
        "cells": [[c.graph_batch_size, c.verifier_budget, c.step_time_ms] for c in final.cells],
        "calibration": {
            "use": options.calibration_use,
            "maps": [[m.method, list(m.params)] for m in calibration.maps],
        },
        "workload_identity_sha256": inputs.workload.identity_sha256,
    }
    mixed_evidence: MixedEvidence | None = None
    mixed_grid: MixedGrid | None = None
    mixed_left: tuple[tuple[str, str], ...] = ()
    if inputs.mixed is not None:
        mixed_grid = MixedGrid.from_rows(inputs.mixed.rows, inputs.mixed.route, inputs.mixed.protocol_sha256)
        # Where recorded histories follow emitted tokens, a mixed step whose request the decode
        # policy cut short earlier has a geometry the runtime will not find (docs/mixed.md §6).
        diverged = None
        if histories_follow_tokens(inputs.workload):
            decode = choose_steps(
                evidence, minimum_predicted_gain=options.minimum_predicted_gain, drain_guard=chosen.guard
            )
            diverged = first_losses(evidence, decode.column)
        _, mixed_left, mixed_evidence = deploy_mixed(
            inputs.workload,
            mixed_grid,
            calibration,
            minimum_predicted_gain=options.mixed_gain,
            diverged=diverged,
        )
    values = inputs.workload.step_values()
    regime = infer_regime(
        values.waiting, drain=values.drain, declared=options.regime, objective=options.objective
    )
    report = replay(
        evidence,
        minimum_predicted_gain=options.minimum_predicted_gain,
        drain_guard=chosen.guard,
        drain_guard_estimate=chosen.estimate,
        overhead_ms=options.overhead_ms,
        overhead_source=options.overhead_source,
        overhead_evidence=options.overhead_evidence,
        shifts=shift_model(
            final, common_sd=options.saving_shift_sd, common_source=options.saving_shift_source
        ),
        objective=regime.objective,
        safety_margin_ms=options.safety_margin_ms,
        bootstrap=options.bootstrap,
        header=header,
        mixed=mixed_evidence,
        mixed_header={
            "calibration": header["calibration"],
            "minimum_predicted_gain": options.mixed_gain,
            "workload_identity_sha256": inputs.workload.identity_sha256,
        },
    )
    return _Replayed(report, mixed_grid, mixed_evidence, mixed_left, regime)


#: How far the replayed policy's dwell may sit from the sweep's before the build says so (25%).
DWELL_TOLERANCE = 1.25


def _near(a: float, b: float) -> bool:
    return max(a / b, b / a) <= DWELL_TOLERANCE


def _off_dwell(policy: Mapping[int, float], swept: Any) -> list[int]:
    """The G whose policy dwell the sweep's (one value or one per G) missed by more than the
    tolerance, or did not time at all."""
    off = []
    for g, d in sorted(policy.items()):
        at = swept.get(g) if isinstance(swept, Mapping) else swept
        if at is None or not _near(d, float(at)):
            off.append(g)
    return off


def dwell_note(dwell: Mapping[str, Any], sweep_extra: Mapping[str, Any]) -> str | None:
    """A note when the sweep did not time its cells at the replayed policy's dwell (pure; ``dwell``
    from :func:`~.replay.policy_dwell`, ``sweep_extra`` the sweep's provenance ``extra``): at a
    power cap a compact saving moves with how long a policy stays on a cell (docs/sweep.md "The
    policy's dwell"). Each G the policy ran is compared with the sweep's dwell at that G (one for
    every G, or its own). None when every G was measured within :data:`DWELL_TOLERANCE` of the
    policy's, or the replay chose no step, or the sweep neither interleaved its cells nor ran at a
    power cap (most of its samples carrying that throttle reason: off the cap the clock does not
    follow the mix). The note names the ``--dwell`` to sweep at: the policy's overall dwell, and
    each G's own where it is outside the tolerance of that."""
    steps = dwell.get("steps")
    if steps is None:
        return None
    mix = sweep_extra.get("mix_term") or {}
    capped = float((sweep_extra.get("throttle") or {}).get("power_capped_share") or 0.0)
    if not mix.get("measured") and mix.get("dwell") is None and capped < 0.5:
        return None
    policy = {int(g): float(d) for g, d in (dwell.get("per_g") or {}).items()}
    swept = dwell_from_json(mix.get("dwell"))
    if swept is not None:
        off = _off_dwell(policy, swept)
        if not off:
            return None
        how = (
            f"the sweep timed its cells in runs of {describe_dwell(mix['dwell'])} (--dwell), "
            f"more than {DWELL_TOLERANCE - 1:.0%} off at G={off}"
        )
    elif mix.get("measured"):
        how = (
            "the sweep timed half its rounds switching cells every step and half in runs of four "
            "(intervals hold both)"
        )
    else:
        how = "the sweep timed each cell alone, at its own clock"
    per_g = ", ".join(f"G{g} {d:.2g}" for g, d in sorted(policy.items()))
    flag = dwell_option(steps, {g: d for g, d in policy.items() if not _near(d, steps)})
    return (
        f"policy dwell: the replayed policy stays {steps:.2g} steps on a cell ({per_g}); {how}. At a "
        f"power cap a compact saving moves with the dwell (docs/sweep.md): sweep --interleave --dwell "
        f"{flag} measures at it"
    )


def _build_notes(inputs: BuildInputs, grid: CellGrid, final: CellGrid, replayed: _Replayed) -> list[str]:
    """What a reviewer should know about this build, beyond the inputs' own notes."""
    report = replayed.report
    notes = list(inputs.notes)
    if replayed.mixed_evidence is not None:
        notes += _mixed_notes(report, replayed.mixed_evidence.deployed, replayed.mixed_left)
    if grid.dropped:
        notes.append(
            f"never deployed (V=G cannot carry a real row; V=G*(K+1) is the control): {list(grid.dropped)}"
        )
    if not final.paired:
        notes.append(
            f"{LEGACY_UNPAIRED_COSTS}: the sweep predates paired savings, so the economics are priced the "
            "pre-pairing way (per-step worst case of two unpaired intervals), which refuses gains that are "
            "real; re-run the sweep with this version"
        )
    finding = replayed.regime
    notes.append(f"load regime {finding.regime.value}, objective {finding.objective.value}: {finding.source}")
    mixed = report.mixed_steps
    if mixed.get("steps"):
        notes.append(
            f"mixed steps: {mixed['steps']} ({mixed['share']:.0%} of the workload) priced with every step: "
            f"{mixed['measured']} by a measured native arm, {mixed['recorded']} by their recorded time, "
            f"{mixed['estimated']} by the decode table's estimate"
        )
    notes.append(f"fixed confidence-path overhead: {report.economics.overhead_source}")
    dwell = dwell_note(report.dwell(), inputs.sweep_provenance.extra)
    if dwell:
        notes.append(dwell)
    if report.shifts is not None:
        notes.append(f"saving shifts drawn with the savings: {report.shifts['source']}")
    notes += control_notes(final)
    return notes


def _provenance(
    inputs: BuildInputs,
    options: BuildOptions,
    chosen: _Chosen,
    final: CellGrid,
    replayed: _Replayed,
    notes: Sequence[str],
) -> Provenance:
    """The provenance every decode member carries: the inputs, options and how the evidence was priced."""
    report, replayed_regime = replayed.report, replayed.regime
    return Provenance(
        tool_version=__version__,
        command=tuple(options.command),
        backend=inputs.sweep_provenance.backend,
        synthetic=inputs.synthetic,
        clock_policy=inputs.sweep_provenance.clock_policy,
        stopping_rule=inputs.sweep_provenance.stopping_rule,
        created_at=options.issued_at.isoformat(timespec="seconds"),
        extra=_json_safe(
            {
                "build_options": options.to_dict(),
                "synthetic_inputs": list(inputs.synthetic_inputs),
                "inputs": {
                    "sweeps": list(inputs.sweep_sources),
                    "calibration": dict(inputs.calibration_source),
                    "workload": {
                        "source": inputs.workload.source,
                        "workload_identity_sha256": inputs.workload.identity_sha256,
                        "approximate": inputs.workload.approximate,
                        "synthetic": inputs.workload.synthetic,
                    },
                },
                "selection": chosen.selection.to_dict(),
                "drain_guard_estimate": dict(chosen.estimate),
                "economics_sources": {
                    "overhead": report.economics.overhead_source,
                    "safety_margin": report.economics.safety_margin_source,
                },
                "prediction": {
                    "objective": report.objective,
                    "regime": replayed_regime.to_dict(),
                    "planner": options.deployed_planner,
                    "overhead": dict(report.overhead),
                    "shifts": None if report.shifts is None else dict(report.shifts),
                    "mixed_steps": dict(report.mixed_steps),
                    "predictions": {k: dict(v) for k, v in report.predictions.items()},
                    "tpot_gain": report.tpot_gain,
                },
                "pessimistic_gain": report.pessimistic_gain,
                "uncertainty_model": report.uncertainty_model,
                "forced_k_arms": [
                    {
                        "graph_batch_size": c.graph_batch_size,
                        "overhead_ms": -c.saving * final.native(c.graph_batch_size).step_time_ms,
                        "overhead_rel": [-c.saving_ci_high, -c.saving, -c.saving_ci_low],
                        "paired_rounds": c.paired_rounds,
                    }
                    for c in final.forced
                ],
                "reasons": dict(report.reasons),
                "bootstrap": dict(report.bootstrap),
                "notes": list(notes),
            }
        ),
    )


def _member_tables(
    inputs: BuildInputs,
    final: CellGrid,
    report: ReplayReport,
    cells: Sequence[tuple[int, int]],
    summary: Mapping[str, Any],
    options: BuildOptions,
) -> dict[str, tuple[pa.Table, Mapping[str, Any]]]:
    """Each decode member's table and signed summary, by kind."""
    k = inputs.k
    return {
        "cost-table": (
            _cost_table(inputs, final),
            {"cells": len(cells) + len(final.ladder), "k": k, "candidates": _undeployed(inputs, cells)},
        ),
        "calibration": (
            inputs.calibration_table,
            {**inputs.calibration_summary, "k": k, "use": options.calibration_use},
        ),
        "admission": (_admission_table(report, cells), summary),
    }


def _sign_members(
    directory: Path,
    tables: Mapping[str, tuple[pa.Table, Mapping[str, Any]]],
    files: Mapping[str, str],
    *,
    fingerprint: Fingerprint,
    provenance: Provenance,
    signers: Sequence[Signer],
    trust_root: TrustRoot,
    options: BuildOptions,
    expected: Expectation,
    refusal: str,
    layout: BundleLayout,
) -> dict[str, VerifiedArtifact]:
    """Write each member (``tables``: kind -> table and summary) into ``directory``, sign it and
    verify it with the one verification pipeline, then write and sign the manifest of ``layout``.

    Raises:
        ConfigError: a signed member does not verify (``refusal`` names it: ``{file}``, ``{exc}``).
    """
    from dspark_calibrate.artifacts import require_valid, sign_table, verify_path, write_bundle, write_signed

    members = {}
    for kind, (table, summary) in tables.items():
        path = directory / files[kind]
        # Signed in memory, written once; the self-check then reads what was written.
        signed = sign_table(
            table,
            list(signers),
            kind=kind,
            fingerprint=fingerprint,
            provenance=provenance,
            summary=summary,
            version=options.version,
            issued_at=options.issued_at,
            expires_at=options.expires_at,
            where=path,
        )
        write_signed(signed, path)
        checked = verify_path(path, trust_root, now=options.issued_at, expected=replace(expected, kind=kind))
        try:
            members[kind] = require_valid(checked)
        except ArtifactRejected as exc:
            raise ConfigError(refusal.format(file=files[kind], exc=exc)) from exc
    write_bundle(
        directory,
        members,
        list(signers),
        version=options.version,
        issued_at=options.issued_at,
        expires_at=options.expires_at,
        layout=layout,
    )
    return members


@dataclass(frozen=True, eq=False)
class _Written:
    """What the published directory holds beyond the decode members."""

    plot_paths: tuple[Path, ...]
    mixed_summary: Mapping[str, Any] | None


def _write_bundle_dir(
    out_dir: Path,
    tables: Mapping[str, tuple[pa.Table, Mapping[str, Any]]],
    inputs: BuildInputs,
    replayed: _Replayed,
    prov: Provenance,
    signers: Sequence[Signer],
    trust_root: TrustRoot,
    options: BuildOptions,
    notes: list[str],
    stage: Callable[[str], None],
) -> _Written:
    """Write, sign and verify every member into a temporary directory, then publish it as ``out_dir``.

    Nothing is left behind on failure. Notes of the mixed members and the plots are appended to
    ``notes``.

    Raises:
        ConfigError: a member or the bundle does not verify, or the directory cannot be written.
    """
    from dspark_calibrate.artifacts import DECODE_LAYOUT, Expectation, verify_bundle

    fp = inputs.fingerprint
    tmp = out_dir.parent / f".{out_dir.name}.build-{secrets.token_hex(6)}"
    published = False
    try:
        tmp.mkdir(parents=True)
        stage("sign")
        # (4) write, sign and verify each member, then the manifest
        expected = Expectation(fingerprint=fp, allow_synthetic=options.allow_synthetic)
        members = _sign_members(
            tmp,
            tables,
            BUNDLE_FILES,
            fingerprint=fp,
            provenance=prov,
            signers=signers,
            trust_root=trust_root,
            options=options,
            expected=expected,
            refusal="self-check failed for {file}: {exc}; is the signing key in the trust root?",
            layout=DECODE_LAYOUT,
        )
        check = verify_bundle(tmp, trust_root, now=options.issued_at, expected=expected)
        if not check.ok:
            raise ConfigError(f"self-check of the bundle failed: {check.code}: {check.message}")
        mixed_summary = _mixed_members(
            tmp, members, check, inputs, replayed, prov, signers, trust_root, options, notes
        )
        report_dir = tmp / "report"
        report_dir.mkdir()
        plot_paths: list[Path] = []
        if options.plots:
            plot_paths, plot_notes = _plots(report_dir, replayed.report)
            notes.extend(plot_notes)
        stage("publish")
        # (5) publish
        publish_directory(tmp, out_dir)
        published = True
    except OSError as exc:
        raise ConfigError(f"{out_dir}: cannot write the bundle ({exc.strerror or exc})") from exc
    finally:
        if not published:
            shutil.rmtree(tmp, ignore_errors=True)
    return _Written(tuple(plot_paths), mixed_summary)


def _mixed_members(
    tmp: Path,
    members: Mapping[str, VerifiedArtifact],
    check: BundleReport,
    inputs: BuildInputs,
    replayed: _Replayed,
    prov: Provenance,
    signers: Sequence[Signer],
    trust_root: TrustRoot,
    options: BuildOptions,
    notes: list[str],
) -> Mapping[str, Any] | None:
    """Write the mixed evidence beside the verified decode members (None: no mixed cell deployed).

    Its notes are appended to ``notes``.
    """
    mx = replayed.mixed_evidence
    if inputs.mixed is None or mx is None or replayed.mixed_grid is None or not mx.deployed:
        return None
    outputs = mixed_outputs(
        inputs.mixed,
        replayed.mixed_grid,
        mx,
        replayed.report,
        workload=inputs.workload,
        fingerprint=inputs.fingerprint,
        decode_members={k2: a.logical_sha256 for k2, a in members.items()},
        minimum_predicted_gain=options.mixed_gain,
        allow_synthetic=options.allow_synthetic,
    )
    _write_mixed(tmp, outputs, inputs, prov, signers, options, check, trust_root)
    notes.extend(outputs.notes)
    return outputs.admission_summary


def _finish(
    out_dir: Path,
    inputs: BuildInputs,
    chosen: _Chosen,
    report: ReplayReport,
    summary: Mapping[str, Any],
    notes: Sequence[str],
    written: _Written,
    trust_root: TrustRoot,
    options: BuildOptions,
) -> BuildResult:
    """Verify the published bundle (and its mixed evidence) again and write ``report/build.json``."""
    from dspark_calibrate.artifacts import Expectation, verify_bundle, verify_mixed

    expected_kw = {"fingerprint": inputs.fingerprint, "allow_synthetic": options.allow_synthetic}
    final_check = verify_bundle(
        out_dir, trust_root, now=options.issued_at, expected=Expectation(**expected_kw)
    )
    mixed_valid = None
    if written.mixed_summary is not None:
        mixed_valid = verify_mixed(
            out_dir,
            trust_root,
            now=options.issued_at,
            decode=final_check,
            expected=Expectation(**expected_kw),
        ).ok
    result = BuildResult(
        out_dir=out_dir,
        fingerprint=inputs.fingerprint,
        selection=chosen.selection,
        report=report,
        summary=summary,
        files=tuple(out_dir / f for f in (*BUNDLE_FILES.values(), "bundle.dsse.json")),
        plots=tuple(out_dir / "report" / p.name for p in written.plot_paths),
        bundle=final_check,
        notes=tuple(notes),
        mixed_summary=written.mixed_summary,
        mixed_valid=mixed_valid,
    )
    atomic_write_bytes(out_dir / "report" / "build.json", canonical_json(result.to_dict()))
    return result


def _mixed_notes(report: ReplayReport, deployed: Sequence[Any], left: Sequence[tuple[str, str]]) -> list[str]:
    mixed = report.mixed
    assert mixed is not None
    notes = [
        f"mixed steps: {mixed.mixed_steps} of {mixed.workload_steps} ({mixed.mixed_steps / max(1, mixed.workload_steps):.0%}); "
        f"{mixed.mixed_part['priced_steps']} priced by a measured native arm, {mixed.mixed_part['covered_steps']} "
        f"covered by a deployed cell, {mixed.economics.compact_choices} compact; {len(deployed)} mixed cells deployed"
    ]
    diverged = int(mixed.reasons.get("diverged", 0))
    if diverged:
        notes.append(
            f"{diverged} mixed steps hold a request the decode policy cut short earlier: their recorded geometry "
            "(generation histories included) does not recur under the policy, so they are priced native"
        )
    if mixed.unpriced_steps:
        notes.append(
            f"{mixed.unpriced_steps} mixed steps have no measured native arm: the gains leave them out; measure "
            "more of the workload's steps (sweep --mixed --mixed-max-cells)"
        )
    if not deployed:
        notes.append(
            "no mixed cell is deployed (none saves for sure and wins a step): mixed steps stay native"
        )
    reasons: dict[str, int] = {}
    for _, why in left:
        key = why.split(":", 1)[0]
        reasons[key] = reasons.get(key, 0) + 1
    if reasons:
        notes.append(f"mixed cells not deployed: {dict(sorted(reasons.items()))}")
    return notes


def _write_mixed(
    tmp: Path,
    outputs: MixedOutputs,
    inputs: BuildInputs,
    prov: Provenance,
    signers: Sequence[Signer],
    options: BuildOptions,
    decode: BundleReport,
    trust_root: TrustRoot,
) -> None:
    """Write, sign and verify the mixed members, result files and manifest into ``tmp/mixed``.

    Raises:
        ConfigError: a member or the mixed evidence does not verify.
    """
    from dspark_calibrate.artifacts import (
        MIXED_DIR,
        MIXED_FILES,
        MIXED_LAYOUT,
        Expectation,
        verify_mixed,
    )

    assert inputs.mixed is not None
    mdir = tmp / MIXED_DIR
    (mdir / "results").mkdir(parents=True)
    for name, rel in MIXED_RESULT_FILES.items():
        atomic_write_bytes(mdir / rel, outputs.results[name])
    mixed_prov = Provenance(
        tool_version=__version__,
        command=tuple(options.command),
        backend=inputs.mixed.provenance.backend,
        synthetic=inputs.mixed.synthetic,
        clock_policy=inputs.mixed.provenance.clock_policy,
        stopping_rule=inputs.mixed.provenance.stopping_rule,
        created_at=options.issued_at.isoformat(timespec="seconds"),
        extra={
            "mixed_sweep": str(inputs.mixed.path),
            "mixed_sweep_logical_sha256": inputs.mixed.sweep_logical_sha256,
            "decode_build": dict(prov.extra).get("inputs", {}),
        },
    )
    tables = {
        "mixed-cost-table": (outputs.cost_table, outputs.cost_summary),
        "mixed-sweep-samples": (outputs.samples, outputs.samples_summary),
        "mixed-admission": (outputs.admission_table, outputs.admission_summary),
    }
    expected = Expectation(fingerprint=inputs.fingerprint, allow_synthetic=options.allow_synthetic)
    _sign_members(
        mdir,
        tables,
        MIXED_FILES,
        fingerprint=inputs.fingerprint,
        provenance=mixed_prov,
        signers=signers,
        trust_root=trust_root,
        options=options,
        expected=expected,
        refusal="self-check failed for mixed/{file}: {exc}",
        layout=MIXED_LAYOUT,
    )
    report = verify_mixed(tmp, trust_root, now=options.issued_at, decode=decode, expected=expected)
    if not report.ok:
        raise ConfigError(f"self-check of the mixed evidence failed: {report.code}: {report.message}")
