"""Calibration side of dspark-calibrate: the sweep harness, its backends and statistics.

``sweep`` measures the step time T(G, V) of every native and candidate cell of the graph ladder
(DESIGN §7) and writes unsigned ``sweep`` / ``sweep-samples`` artifacts; signing is ``build``'s job,
so nothing here imports ``cryptography`` or ``runtime_plugin``. torch is imported only by the
backends and collectives that need it.

Example:
    >>> from pathlib import Path
    >>> from dspark_calibrate.calibrate import SweepRequest, Thresholds, execute
    >>> request = SweepRequest(backend="synthetic", k=5, ladder=(8, 16), out=Path("sweep.parquet"),
    ...                        thresholds=Thresholds.quick())
    >>> result, output = execute(request)  # doctest: +SKIP
    >>> result.summary_table().column("step_time_ms")  # doctest: +SKIP
"""

from dspark_calibrate.calibrate.ladder import (
    CellKind,
    CellSpec,
    candidate_budgets,
    legal_compact_budgets,
    parse_budgets,
    parse_ladder,
    plan_cells,
)
from dspark_calibrate.calibrate.stats import (
    CellSamples,
    CellSummary,
    Decision,
    Status,
    StopReason,
    Thresholds,
    median_interval,
    sample_interval,
    summarize,
)
from dspark_calibrate.calibrate.sweep import (
    SweepConfig,
    SweepOutput,
    SweepRequest,
    SweepResult,
    execute,
    run_sweep,
    write_sweep,
)

__all__ = [
    "CellKind",
    "CellSamples",
    "CellSpec",
    "CellSummary",
    "Decision",
    "Status",
    "StopReason",
    "SweepConfig",
    "SweepOutput",
    "SweepRequest",
    "SweepResult",
    "Thresholds",
    "candidate_budgets",
    "execute",
    "legal_compact_budgets",
    "median_interval",
    "parse_budgets",
    "parse_ladder",
    "plan_cells",
    "run_sweep",
    "sample_interval",
    "summarize",
    "write_sweep",
]
