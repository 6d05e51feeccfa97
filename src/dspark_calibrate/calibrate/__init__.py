"""The calibration side of dspark-calibrate: one sub-package per pipeline stage.

    measurement/  sweep the graph ladder: T(G, V) per cell, with intervals   (DESIGN §7)
    confidence/   traces → a per-position calibration of the draft's confidence  (DESIGN §8)
    deployment/   workload, replay, cell selection, the signed bundle        (DESIGN §6)
    report/       the release report: verify the bundle, model it, render one page
    demo.py       every stage on CPU, on synthetic data

Arrows between the stages point one way: ``deployment`` may use ``measurement`` and
``confidence``; ``report`` may read every stage below it; ``demo`` composes them all;
``measurement`` and ``confidence`` use neither each other nor the later stages. Below the
stages: ``runtime_plugin`` (its pure planner and economics, which ``build`` and the report replay so
that they cannot disagree with serving), ``artifacts``, ``schemas``, ``decision`` and ``errors``
(``tests/test_layering.py`` checks all of it). Signing is ``build``'s job: importing this package
needs no ``cryptography``. torch is imported only by the backends, collectives and the
recorder-shard reader that need it.

This package re-exports each stage's main entry points; the stage sub-packages list their own.

Example:
    >>> from pathlib import Path
    >>> from dspark_calibrate.calibrate import SweepRequest, Thresholds, execute
    >>> request = SweepRequest(backend="synthetic", k=5, ladder=(8, 16), out=Path("sweep.parquet"),
    ...                        thresholds=Thresholds.quick())
    >>> result, output = execute(request)  # doctest: +SKIP
    >>> result.summary_table().column("step_time_ms")  # doctest: +SKIP
"""

from dspark_calibrate.calibrate.confidence import (
    DriftTolerances,
    FitOptions,
    FitResult,
    FittedCalibration,
    FittedPositionMap,
    Method,
    MetricsReport,
    SynthSpec,
    TraceSet,
    evaluate_drift,
    evaluate_predictions,
    fit_traces,
    parse_sts_document,
    read_traces,
    run_evaluate,
    run_fit,
    sts_document,
    synth_traces,
    write_fit_outputs,
    write_synth_traces,
)
from dspark_calibrate.calibrate.deployment import (
    BootstrapSettings,
    BuildOptions,
    BuildResult,
    CellSelection,
    ReplayReport,
    Workload,
    build_bundle,
    load_build_inputs,
    read_workload,
    replay,
    select_cells,
    synthesize_workload,
    write_workload,
)
from dspark_calibrate.calibrate.measurement import (
    CellKind,
    CellSamples,
    CellSpec,
    CellSummary,
    StopReason,
    SweepConfig,
    SweepOutput,
    SweepRequest,
    SweepResult,
    Thresholds,
    candidate_budgets,
    execute,
    legal_compact_budgets,
    median_interval,
    parse_budgets,
    parse_ladder,
    plan_cells,
    run_sweep,
    sample_interval,
    summarize,
    write_sweep,
)
from dspark_calibrate.calibrate.report import (
    Report,
    ReportThresholds,
    build_report,
    collect_evidence,
    render_html,
    render_markdown,
    write_report,
)
from dspark_calibrate.decision import Decision, Status

#: Earlier names of the fitted calibration types, kept for existing callers. They are not the
#: runtime's ``runtime_plugin.Calibration`` / ``PositionMap`` (the selector's maps).
Calibration = FittedCalibration
PositionMap = FittedPositionMap

__all__ = [
    "BootstrapSettings",
    "BuildOptions",
    "BuildResult",
    "Calibration",
    "CellKind",
    "CellSamples",
    "CellSelection",
    "CellSpec",
    "CellSummary",
    "Decision",
    "DriftTolerances",
    "FitOptions",
    "FitResult",
    "FittedCalibration",
    "FittedPositionMap",
    "Method",
    "MetricsReport",
    "PositionMap",
    "ReplayReport",
    "Report",
    "ReportThresholds",
    "Status",
    "StopReason",
    "SweepConfig",
    "SweepOutput",
    "SweepRequest",
    "SweepResult",
    "SynthSpec",
    "Thresholds",
    "TraceSet",
    "Workload",
    "build_bundle",
    "build_report",
    "candidate_budgets",
    "collect_evidence",
    "evaluate_drift",
    "evaluate_predictions",
    "execute",
    "fit_traces",
    "legal_compact_budgets",
    "load_build_inputs",
    "median_interval",
    "parse_budgets",
    "parse_ladder",
    "parse_sts_document",
    "plan_cells",
    "read_traces",
    "read_workload",
    "render_html",
    "render_markdown",
    "replay",
    "run_evaluate",
    "run_fit",
    "run_sweep",
    "sample_interval",
    "select_cells",
    "sts_document",
    "summarize",
    "synth_traces",
    "synthesize_workload",
    "write_fit_outputs",
    "write_report",
    "write_sweep",
    "write_synth_traces",
    "write_workload",
]
