"""Stage 2, confidence: draft-round traces → a calibration of the draft's confidence (DESIGN §8).

What lives here:

- :mod:`.traces`: one internal form of draft-round traces and its readers (Parquet, JSONL,
  TensorRT-LLM recorder shards) and writers; :mod:`.synth_traces`: traces from a known truth.
- :mod:`.maps`: the calibrators (``sts``, ``platt``, ``beta``, ``isotonic``, ``identity``), fitted
  per position on censored risk sets, and TensorRT-LLM's ``sts.json``.
- :mod:`.metrics`: proper scores of predicted survival with request-level intervals.
- :mod:`.fit`: the orchestration — split by request, fit, score held out, write the unsigned
  ``calibration`` table — and drift checks; :mod:`.fit_plot` its PNGs.

May import: ``schemas``, ``artifacts`` (unsigned writes only; no ``cryptography``),
``decision``, ``errors`` and ``calibrate._png``; nothing of the other stages and nothing of
``runtime_plugin`` (the runtime reads the signed table, not these types). torch only inside the
recorder-shard reader.

Example:
    >>> import numpy as np
    >>> from dspark_calibrate.calibrate.confidence import FittedCalibration
    >>> cal = FittedCalibration.from_temperatures([1.0, 2.0])
    >>> cal.k
    2
"""

from dspark_calibrate.calibrate.confidence.fit import (
    DriftTolerances,
    FitOptions,
    FitResult,
    evaluate_drift,
    fit_traces,
    load_calibration,
    run_evaluate,
    run_fit,
    write_fit_outputs,
)
from dspark_calibrate.calibrate.confidence.maps import (
    FittedCalibration,
    FittedPositionMap,
    Method,
    fit_calibration,
    parse_sts_document,
    sts_document,
)
from dspark_calibrate.calibrate.confidence.metrics import MetricsReport, evaluate_predictions
from dspark_calibrate.calibrate.confidence.synth_traces import SynthSpec, synth_traces, write_synth_traces
from dspark_calibrate.calibrate.confidence.traces import (
    TraceSet,
    read_traces,
    write_trace_jsonl,
    write_trace_parquet,
)

__all__ = [
    "DriftTolerances",
    "FitOptions",
    "FitResult",
    "FittedCalibration",
    "FittedPositionMap",
    "Method",
    "MetricsReport",
    "SynthSpec",
    "TraceSet",
    "evaluate_drift",
    "evaluate_predictions",
    "fit_calibration",
    "fit_traces",
    "load_calibration",
    "parse_sts_document",
    "read_traces",
    "run_evaluate",
    "run_fit",
    "sts_document",
    "synth_traces",
    "write_fit_outputs",
    "write_synth_traces",
    "write_trace_jsonl",
    "write_trace_parquet",
]
