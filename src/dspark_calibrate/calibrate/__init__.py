"""Calibration side of dspark-calibrate: sweep, confidence fit, workload replay, build, report.

``sweep`` measures the step time T(G, V) of every native and candidate cell of the graph ladder
(DESIGN §7) and writes unsigned ``sweep`` / ``sweep-samples`` artifacts; ``fit`` turns draft-round
traces into an unsigned ``calibration`` table (DESIGN §8). Signing is ``build``'s job: importing
this package needs no ``cryptography``. torch is imported only by the backends, collectives and the
recorder-shard reader that need it.

Example:
    >>> from pathlib import Path
    >>> from dspark_calibrate.calibrate import SweepRequest, Thresholds, execute
    >>> request = SweepRequest(backend="synthetic", k=5, ladder=(8, 16), out=Path("sweep.parquet"),
    ...                        thresholds=Thresholds.quick())
    >>> result, output = execute(request)  # doctest: +SKIP
    >>> result.summary_table().column("step_time_ms")  # doctest: +SKIP
"""

from dspark_calibrate.calibrate.confidence.fit import (
    DriftTolerances,
    FitOptions,
    FitResult,
    evaluate_drift,
    fit_traces,
    run_evaluate,
    run_fit,
    write_fit_outputs,
)
from dspark_calibrate.calibrate.confidence.maps import (
    Calibration,
    Method,
    PositionMap,
    parse_sts_document,
    sts_document,
)
from dspark_calibrate.calibrate.confidence.metrics import MetricsReport, evaluate_predictions
from dspark_calibrate.calibrate.confidence.synth_traces import SynthSpec, synth_traces, write_synth_traces
from dspark_calibrate.calibrate.confidence.traces import TraceSet, read_traces
from dspark_calibrate.calibrate.deployment.build import (
    BuildOptions,
    BuildResult,
    build_bundle,
    load_build_inputs,
)
from dspark_calibrate.calibrate.deployment.replay import BootstrapSettings, ReplayReport, replay
from dspark_calibrate.calibrate.deployment.select_cells import CellSelection, select_cells
from dspark_calibrate.calibrate.deployment.workload import (
    Workload,
    read_workload,
    synthesize_workload,
    write_workload,
)
from dspark_calibrate.calibrate.measurement.ladder import (
    CellKind,
    CellSpec,
    candidate_budgets,
    legal_compact_budgets,
    parse_budgets,
    parse_ladder,
    plan_cells,
)
from dspark_calibrate.calibrate.measurement.stats import (
    CellSamples,
    CellSummary,
    StopReason,
    Thresholds,
    median_interval,
    sample_interval,
    summarize,
)
from dspark_calibrate.calibrate.measurement.sweep import (
    SweepConfig,
    SweepOutput,
    SweepRequest,
    SweepResult,
    execute,
    run_sweep,
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
