"""Stage 1, measurement: time every cell T(G, V) of the graph ladder, to a stated precision.

What lives here (DESIGN §7):

- :mod:`.sweep`: the harness — interleaved, randomized, resumable rounds across ranks — and the
  unsigned ``sweep`` / ``sweep-samples`` artifacts it writes; :mod:`.sweep_plot` its PNG.
- :mod:`.stats`: pure statistics of raw samples (summaries, hierarchical intervals, the
  stopping rules); :mod:`.ladder`: which cells are legal and measured.
- :mod:`.timing`, :mod:`.telemetry`, :mod:`.journal`, :mod:`.distributed`: the injected timer,
  NVML telemetry, the append-only journal and multi-rank lockstep.
- :mod:`.backends`: what turns a cell into a step (``synthetic``, ``reference``, ``module``,
  ``trtllm`` and plugins); :mod:`.sentinel_backend`: the same backends handed to the runtime
  sentinel by its caller.

May import: ``schemas``, ``artifacts`` (unsigned writes only; no ``cryptography``),
``runtime_plugin`` (the sentinel's backend protocol), ``decision``, ``errors`` and
``calibrate._png``; nothing of the other stages. torch only inside the backends, timers and
collectives that need it.

Example:
    >>> from pathlib import Path
    >>> from dspark_calibrate.calibrate.measurement import SweepRequest, Thresholds, execute
    >>> request = SweepRequest(backend="synthetic", k=5, ladder=(8, 16), out=Path("sweep.parquet"),
    ...                        thresholds=Thresholds.quick())
    >>> result, output = execute(request)  # doctest: +SKIP
    >>> result.summary_table().column("step_time_ms")  # doctest: +SKIP
"""

from dspark_calibrate.calibrate.measurement.backends import Backend, BackendBase, load_backend
from dspark_calibrate.calibrate.measurement.distributed import Communicator, SingleProcess, TorchDistributed
from dspark_calibrate.calibrate.measurement.journal import Journal, read_journal
from dspark_calibrate.calibrate.measurement.ladder import (
    CellKind,
    CellSpec,
    candidate_budgets,
    legal_compact_budgets,
    parse_budgets,
    parse_ladder,
    plan_cells,
)
from dspark_calibrate.calibrate.measurement.sentinel_backend import load_sentinel_backend
from dspark_calibrate.calibrate.measurement.stats import (
    CellSamples,
    CellSummary,
    FixedProtocolRule,
    Interval,
    PrecisionRule,
    StoppingRule,
    StopReason,
    Thresholds,
    median_interval,
    sample_interval,
    summarize,
)
from dspark_calibrate.calibrate.measurement.sweep import (
    SweepConfig,
    SweepEvent,
    SweepOutput,
    SweepRequest,
    SweepResult,
    execute,
    run_sweep,
    samples_path,
    write_sweep,
)
from dspark_calibrate.calibrate.measurement.sweep_plot import plot_sweep
from dspark_calibrate.calibrate.measurement.telemetry import Telemetry, open_telemetry
from dspark_calibrate.calibrate.measurement.timing import CudaEventTimer, HostTimer, Step, Timer

__all__ = [
    "Backend",
    "BackendBase",
    "CellKind",
    "CellSamples",
    "CellSpec",
    "CellSummary",
    "Communicator",
    "CudaEventTimer",
    "FixedProtocolRule",
    "HostTimer",
    "Interval",
    "Journal",
    "PrecisionRule",
    "SingleProcess",
    "Step",
    "StopReason",
    "StoppingRule",
    "SweepConfig",
    "SweepEvent",
    "SweepOutput",
    "SweepRequest",
    "SweepResult",
    "Telemetry",
    "Thresholds",
    "Timer",
    "TorchDistributed",
    "candidate_budgets",
    "execute",
    "legal_compact_budgets",
    "load_backend",
    "load_sentinel_backend",
    "median_interval",
    "open_telemetry",
    "parse_budgets",
    "parse_ladder",
    "plan_cells",
    "plot_sweep",
    "read_journal",
    "run_sweep",
    "sample_interval",
    "samples_path",
    "summarize",
    "write_sweep",
]
