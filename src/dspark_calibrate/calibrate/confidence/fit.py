"""``fit``: traces → request split → calibration → held-out metrics → unsigned outputs.

The orchestration of DESIGN §8. :func:`fit_traces` is pure (arrays in, a :class:`FitResult`
out): it checks that the data can carry a fit, splits rounds by *request* into a fit set and a
held-out set, builds the risk sets, selects a method by request-grouped cross-validated NLL when
asked (``auto``), fits, and scores raw and calibrated survival on held-out requests only.
:func:`write_fit_outputs` is the edge that writes the unsigned ``calibration`` table (for
``build`` to sign), TensorRT-LLM's ``sts.json``, a JSON report and PNG plots.
:func:`evaluate_drift` re-scores an existing calibration on fresh traces and returns a
:class:`~dspark_calibrate.calibrate.measurement.stats.Decision`.

Signing is left to ``build``; this module never imports ``cryptography`` (DESIGN §3).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dspark_calibrate.artifacts import (
    NON_PRINTABLE_ASCII,
    STS_FILE,
    ArtifactReadError,
    Fingerprint,
    Provenance,
    atomic_write_bytes,
    canonical_json,
    read_artifact,
    read_fingerprint,
    write_unsigned_artifact,
)
from dspark_calibrate.calibrate.confidence.fit_plot import reliability_png, survival_png
from dspark_calibrate.calibrate.confidence.maps import (
    METHOD_CHOICES,
    STS_MIN_NUM_SAMPLES,
    FittedCalibration,
    FittedPositionMap,
    Method,
    StsDocument,
    build_risk_sets,
    fit_calibration,
    fit_sts_grid,
    parse_sts_document,
    select_method,
    sts_document,
)
from dspark_calibrate.calibrate.confidence.metrics import (
    BOOTSTRAP_REPLICATES,
    ECE_BINS,
    Estimate,
    MetricsReport,
    Outcomes,
    evaluate_predictions,
    observe,
    paired_nll_difference,
)
from dspark_calibrate.calibrate.confidence.traces import Notice, TraceSet, read_traces
from dspark_calibrate.decision import Decision, Status
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.schemas import arrow_schema

__all__ = [
    "CALIBRATION_FILE",
    "DOMINANT_REQUEST_SHARE",
    "MIN_ROUNDS_FLOOR",
    "MIN_ROUNDS_WARN",
    "REPORT_FILE",
    "STS_FILE",
    "BaselineResult",
    "DriftCheck",
    "DriftReport",
    "DriftTolerances",
    "FitOptions",
    "FitOutputs",
    "FitResult",
    "LoadedCalibration",
    "Split",
    "check_sufficiency",
    "evaluate_drift",
    "fit_traces",
    "load_calibration",
    "load_fingerprint",
    "run_evaluate",
    "run_fit",
    "split_by_request",
    "write_fit_outputs",
]

#: Below this many rounds a fit is noisy (and TensorRT-LLM's ``num_samples`` floor is 1,000): warn.
MIN_ROUNDS_WARN = STS_MIN_NUM_SAMPLES
#: Below this many rounds the fit is refused unless forced: with a 20% holdout, fewer than 40
#: held-out rounds cannot score 15-bin reliability at all.
MIN_ROUNDS_FLOOR = 200
#: One request holding more than this share of the rounds dominates the fit and the bootstrap.
DOMINANT_REQUEST_SHARE = 0.25
#: Fewer requests than this make request-level intervals and folds unreliable.
MIN_REQUESTS_WARN = 20
#: Output file names inside ``--out``.
CALIBRATION_FILE = "calibration.parquet"
REPORT_FILE = "fit-report.json"
RELIABILITY_PNG = "reliability.png"
SURVIVAL_PNG = "survival.png"


@dataclass(frozen=True, slots=True)
class FitOptions:
    """Choices of one fit (recorded in the calibration's provenance).

    Attributes:
        method: ``auto``, ``sts``, ``platt``, ``beta`` or ``isotonic``.
        holdout: fraction of requests held out for evaluation, in (0, 0.9].
        seed: seed of the request split and the bootstrap.
        folds: cross-validation folds for ``auto`` (by request).
        bootstrap: request-level bootstrap replicates (0 = no intervals).
        shared_slope: Platt with one slope for every position.
        force: fit even below :data:`MIN_ROUNDS_FLOOR` rounds.
        grid_baseline: also fit and score the grid baseline.
        n_bins: reliability bins.
    """

    method: str = "auto"
    holdout: float = 0.2
    seed: int = 0
    folds: int = 5
    bootstrap: int = BOOTSTRAP_REPLICATES
    shared_slope: bool = False
    force: bool = False
    grid_baseline: bool = False
    n_bins: int = ECE_BINS

    def __post_init__(self) -> None:
        if self.method not in METHOD_CHOICES:
            raise ConfigError(
                f"--method {self.method!r} is unknown; choose one of {', '.join(METHOD_CHOICES)}"
            )
        if not (isinstance(self.holdout, int | float) and 0.0 < self.holdout <= 0.9):
            raise ConfigError(
                f"--holdout {self.holdout!r} must be in (0, 0.9]; metrics are computed on held-out "
                "requests only"
            )
        if not 2 <= self.folds <= 20:
            raise ConfigError(f"--folds {self.folds} must be in 2..20")
        if not 0 <= self.bootstrap <= 10_000:
            raise ConfigError(f"--bootstrap {self.bootstrap} must be in 0..10000")
        if not 2 <= self.n_bins <= 100:
            raise ConfigError(f"FitOptions.n_bins {self.n_bins} must be in 2..100")
        if self.seed < 0:
            raise ConfigError(f"--seed {self.seed} must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "method": self.method,
            "holdout": float(self.holdout),
            "seed": self.seed,
            "folds": self.folds,
            "bootstrap": self.bootstrap,
            "shared_slope": self.shared_slope,
            "force": self.force,
            "grid_baseline": self.grid_baseline,
            "bins": self.n_bins,
        }


# --------------------------------------------------------------------------------------------
# Data checks and the request split


def check_sufficiency(traces: TraceSet, *, force: bool = False) -> tuple[Decision, tuple[Notice, ...]]:
    """Decide whether the traces can carry a fit, and collect warnings about them.

    Returns:
        ``REJECT`` (too few rounds without ``force``, or fewer than two requests) or ``ACCEPT``,
        plus notices: ``FEW_ROUNDS``, ``DOMINANT_REQUEST``, ``FEW_REQUESTS``, ``MIXED_SAMPLING``
        and any reader notices.
    """
    notices = list(traces.notices)
    n = traces.rounds
    if n < MIN_ROUNDS_FLOOR and not force:
        return (
            Decision(
                Status.REJECT,
                "too_few_rounds",
                f"{n} rounds is below the floor of {MIN_ROUNDS_FLOOR}; record more traces (or pass --force "
                f"to fit anyway; {MIN_ROUNDS_WARN}+ recommended)",
            ),
            tuple(notices),
        )
    if traces.requests < 2:
        return (
            Decision(
                Status.REJECT,
                "too_few_requests",
                f"{traces.requests} request(s): evaluation holds out whole requests, so at least two "
                "are needed",
            ),
            tuple(notices),
        )
    if n < MIN_ROUNDS_WARN:
        notices.append(
            Notice(
                "FEW_ROUNDS", f"only {n} rounds (< {MIN_ROUNDS_WARN}); temperatures and metrics will be noisy"
            )
        )
    per_request = traces.rounds_per_request()
    top = int(per_request.argmax())
    share = float(per_request[top]) / n
    if share > DOMINANT_REQUEST_SHARE:
        notices.append(
            Notice(
                "DOMINANT_REQUEST",
                f"request {traces.request_names[top]!r} holds {share:.0%} of the rounds (> "
                f"{DOMINANT_REQUEST_SHARE:.0%}); the calibration mostly reflects that one request",
            )
        )
    if traces.requests < MIN_REQUESTS_WARN:
        notices.append(
            Notice(
                "FEW_REQUESTS",
                f"only {traces.requests} requests (< {MIN_REQUESTS_WARN}); request-level intervals "
                "are unreliable",
            )
        )
    tags = [t for t, c in traces.sampling_tags if c > 0]
    if len(tags) > 1:
        notices.append(
            Notice(
                "MIXED_SAMPLING",
                f"rounds mix sampling tags {tags}; acceptance differs by mode, fit each with --sampling TAG",
            )
        )
    return Decision(Status.ACCEPT, "sufficient", f"{n} rounds, {traces.requests} requests"), tuple(notices)


@dataclass(frozen=True, slots=True, eq=False)
class Split:
    """A split of rounds by request.

    Attributes:
        holdout: per-round mask of held-out rounds.
        folds: per-round cross-validation fold (0..folds−1), by request.
        holdout_requests: number of held-out requests.
        fit_requests: number of fit requests.
    """

    holdout: np.ndarray
    folds: np.ndarray
    holdout_requests: int
    fit_requests: int


def _request_hashes(names: Sequence[str], seed: int) -> np.ndarray:
    out = np.empty(len(names), dtype=np.uint64)
    salt = f"dspark-fit-split:{seed}:".encode()
    for i, name in enumerate(names):
        out[i] = int.from_bytes(
            hashlib.blake2b(salt + name.encode("utf-8"), digest_size=8).digest(), "little"
        )
    return out


def split_by_request(traces: TraceSet, *, holdout: float, seed: int, folds: int) -> Split:
    """Hold out a fraction of *requests* (never rounds of a request on both sides).

    Each request id is hashed with the seed, so the split does not depend on file order. At
    least one request lands on each side.
    """
    h = _request_hashes(traces.request_names, seed)
    unit = (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    held = unit < holdout
    present = traces.rounds_per_request() > 0
    if not (held & present).any():
        held[int(np.where(present, unit, np.inf).argmin())] = True
    if not (~held & present).any():
        held[int(np.where(present, unit, -np.inf).argmax())] = False
    fold_of = (h % np.uint64(folds)).astype(np.int8)
    return Split(
        holdout=held[traces.request],
        folds=fold_of[traces.request],
        holdout_requests=int((held & present).sum()),
        fit_requests=int((~held & present).sum()),
    )


# --------------------------------------------------------------------------------------------
# The fit


@dataclass(frozen=True, slots=True)
class BaselineResult:
    """The grid baseline fitted on the same fit set and scored on the same held-out requests."""

    calibration: FittedCalibration
    metrics: MetricsReport
    seconds: float


@dataclass(frozen=True, slots=True)
class FitResult:
    """Everything a fit produced (pure data; written by :func:`write_fit_outputs`).

    Attributes:
        calibration: the fitted maps.
        options: the options used.
        before: held-out metrics of the raw logits (identity map, T = 1).
        after: held-out metrics of the calibration.
        fit_rounds, holdout_rounds, fit_requests, holdout_requests: split sizes.
        cv_nll: ``auto`` only: each candidate's cross-validated NLL per round.
        grid: the grid baseline, when asked for.
        notices: warnings and fallbacks.
        timings: seconds per stage (``split``, ``risk_sets``, ``select``, ``fit``, ``metrics``).
        traces: the input files (as recorded in provenance).
        synthetic: True when any input was generated.
    """

    calibration: FittedCalibration
    options: FitOptions
    before: MetricsReport
    after: MetricsReport
    fit_rounds: int
    holdout_rounds: int
    fit_requests: int
    holdout_requests: int
    cv_nll: Mapping[str, float] | None
    grid: BaselineResult | None
    notices: tuple[Notice, ...]
    timings: Mapping[str, float]
    traces: tuple[Mapping[str, Any], ...] = ()
    synthetic: bool = False

    @property
    def k(self) -> int:
        """Draft length."""
        return self.calibration.k

    @property
    def seconds(self) -> float:
        """Total fit time (reading excluded)."""
        return float(sum(self.timings.values()))

    def table(self) -> pa.Table:
        """The ``calibration`` table: one row per position, parameters and before/after metrics."""
        rows: dict[str, list[Any]] = {
            name: []
            for name in (
                "position", "method", "temperature", "params", "risk_set_size", "holdout_risk_set_size",
                "nll_before", "nll_after", "brier_before", "brier_after", "ece_before", "ece_after",
            )
        }  # fmt: skip
        for pm, b, a in zip(
            self.calibration.positions, self.before.positions, self.after.positions, strict=True
        ):
            rows["position"].append(pm.position)
            rows["method"].append(pm.method.value)
            rows["temperature"].append(pm.temperature)
            rows["params"].append(list(pm.params))
            rows["risk_set_size"].append(pm.risk_set_size)
            rows["holdout_risk_set_size"].append(a.risk_set_size)
            rows["nll_before"].append(b.nll)
            rows["nll_after"].append(a.nll)
            rows["brier_before"].append(b.brier)
            rows["brier_after"].append(a.brier)
            rows["ece_before"].append(b.ece.value)
            rows["ece_after"].append(a.ece.value)
        return pa.Table.from_pydict(rows, schema=arrow_schema("calibration"))

    def sts(self, *, dataset: str | None = None) -> StsDocument:
        """The ``sts.json`` document: exact temperatures for STS, the best approximation otherwise."""
        before = [p.ece.value for p in self.before.positions if p.ece.value is not None]
        after = [p.ece.value for p in self.after.positions if p.ece.value is not None]
        return sts_document(
            self.calibration.sts_temperatures(),
            ece_before=float(np.mean(before)) if before else None,
            ece_after=float(np.mean(after)) if after else None,
            dataset=dataset,
            num_samples=self.fit_rounds if self.fit_rounds >= STS_MIN_NUM_SAMPLES else None,
            max_draft_len=self.k,
        )

    def summary(self) -> dict[str, Any]:
        """Method-level metrics for the artifact's ``summary`` (NLL, Brier, E[A] error, CIs, ECE binning)."""

        def pair(name: str) -> dict[str, Any]:
            return {
                "before": getattr(self.before, name).to_dict(),
                "after": getattr(self.after, name).to_dict(),
            }

        out: dict[str, Any] = {
            "method": self.calibration.method,
            "requested_method": self.options.method,
            "k": self.k,
            "fit_rounds": self.fit_rounds,
            "holdout_rounds": self.holdout_rounds,
            "fit_requests": self.fit_requests,
            "holdout_requests": self.holdout_requests,
            "nll_accepted_length": pair("nll"),
            "brier_survival": pair("brier"),
            "ea_error": pair("ea_error"),
            "ea_predicted": {"before": self.before.ea_predicted, "after": self.after.ea_predicted},
            "ea_measured": self.after.ea_measured,
            "ece": {
                "binning": self.after.binning(),
                "per_position": [
                    {
                        "position": a.position,
                        "equal_width": {"before": b.ece.to_dict(), "after": a.ece.to_dict()},
                        "equal_mass": {"before": b.ece_mass.to_dict(), "after": a.ece_mass.to_dict()},
                        "empty_bins": {
                            "equal_width": a.width.empty_bins,
                            "equal_mass": a.mass.empty_bins,
                        },
                        # Reliability diagrams with bin counts, and the survival curve, so a
                        # reviewer can see the calibration from the signed artifact alone.
                        "reliability": {"before": b.width.to_dict(), "after": a.width.to_dict()},
                        "mean_survival": {"before": b.mean_survival, "after": a.mean_survival},
                        "observed_survival": a.observed_survival,
                        "labelled": a.labelled,
                    }
                    for b, a in zip(self.before.positions, self.after.positions, strict=True)
                ],
            },
            "bootstrap": {"replicates": self.after.bootstrap, "unit": "request", "confidence": 0.95},
            "cv_nll": dict(self.cv_nll) if self.cv_nll is not None else None,
            "sts_temperatures": list(self.calibration.sts_temperatures()),
            "fallbacks": [
                {"position": p.position, "note": p.note} for p in self.calibration.positions if p.note
            ],
            "warnings": [n.to_dict() for n in self.notices],
        }
        if self.grid is not None:
            out["grid_baseline"] = {
                "temperatures": list(self.grid.calibration.sts_temperatures()),
                "nll_accepted_length": self.grid.metrics.nll.to_dict(),
                "ece": [p.ece.value for p in self.grid.metrics.positions],
            }
        return out

    def to_dict(self) -> dict[str, Any]:
        """The full JSON report (``fit-report.json`` and ``--json``)."""
        return {
            "calibration": self.calibration.to_dict(),
            "options": self.options.to_dict(),
            "summary": self.summary(),
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
            "grid_baseline": (
                {
                    "calibration": self.grid.calibration.to_dict(),
                    "metrics": self.grid.metrics.to_dict(),
                    "seconds": self.grid.seconds,
                }
                if self.grid is not None
                else None
            ),
            "timings": dict(self.timings),
            "traces": [dict(t) for t in self.traces],
            "synthetic": self.synthetic,
        }


def _identity(k: int) -> FittedCalibration:
    return FittedCalibration(
        "identity", tuple(FittedPositionMap(j, Method.IDENTITY, (), 1.0, 0) for j in range(1, k + 1))
    )


def _position_notices(calibration: FittedCalibration) -> list[Notice]:
    """Positions fitted by a fallback, left at identity, or fitted on a small risk set."""
    notices = []
    for pm in calibration.positions:
        if pm.note:
            code = "EMPTY_RISK_SET" if pm.method is Method.IDENTITY else "FALLBACK"
            notices.append(Notice(code, f"position {pm.position}: {pm.note}"))
        elif 0 < pm.risk_set_size < MIN_ROUNDS_FLOOR:
            notices.append(
                Notice(
                    "SMALL_RISK_SET",
                    f"position {pm.position}: only {pm.risk_set_size} rounds in its risk set",
                )
            )
    return notices


def _holdout_notices(after: MetricsReport) -> list[Notice]:
    """Positions no held-out round verified (they get no ECE)."""
    return [
        Notice("EMPTY_HOLDOUT_POSITION", f"position {pos.position}: no held-out round verified it; no ECE")
        for pos in after.positions
        if pos.labelled == 0
    ]


@dataclass(frozen=True, eq=False)
class _Holdout:
    """The held-out rounds, and how a calibration is scored on them."""

    logits: np.ndarray
    accepted: np.ndarray
    verified: np.ndarray
    request: np.ndarray
    outcomes: Outcomes
    options: FitOptions

    @classmethod
    def of(cls, traces: TraceSet, hold: np.ndarray, options: FitOptions) -> _Holdout:
        acc, ver, req = traces.accepted[hold], traces.verified[hold], traces.request[hold]
        return cls(traces.logits[hold], acc, ver, req, observe(acc, ver, req, traces.k), options)

    def score(self, cal: FittedCalibration) -> MetricsReport:
        opts = self.options
        return evaluate_predictions(
            cal.conditional(self.logits), self.accepted, self.verified, self.request,
            n_bins=opts.n_bins, bootstrap=opts.bootstrap, seed=opts.seed, outcomes=self.outcomes,
        )  # fmt: skip


def fit_traces(traces: TraceSet, options: FitOptions | None = None) -> FitResult:
    """Fit a calibration to traces and score it on held-out requests.

    Args:
        traces: validated rounds (see :func:`~dspark_calibrate.calibrate.confidence.traces.read_traces`).
        options: fit options (defaults: ``auto``, 20% holdout, 200 bootstrap replicates).

    Returns:
        The result; reading is not included in its timings.

    Raises:
        ConfigError: the traces cannot carry a fit (see :func:`check_sufficiency`).
    """
    opts = options or FitOptions()
    decision, notices_t = check_sufficiency(traces, force=opts.force)
    if decision.status is not Status.ACCEPT:
        where = ", ".join(Path(s.path).name for s in traces.sources) or "traces"
        raise ConfigError(f"{where}: {decision.detail}")
    notices = list(notices_t)
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    split = split_by_request(traces, holdout=opts.holdout, seed=opts.seed, folds=opts.folds)
    fit_mask = ~split.holdout
    logits_f = traces.logits[fit_mask]
    acc_f = traces.accepted[fit_mask]
    ver_f = traces.verified[fit_mask]
    hold = split.holdout
    timings["split"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    auto = opts.method == "auto"
    folds = split.folds[fit_mask] if auto else None
    risk_sets = build_risk_sets(logits_f, acc_f, ver_f, folds=folds, n_folds=opts.folds if auto else 1)
    timings["risk_sets"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    cv: dict[str, float] | None = None
    if auto:
        method, cv = select_method(risk_sets, opts.folds, int(fit_mask.sum()), shared_slope=opts.shared_slope)
    else:
        method = Method(opts.method)
    timings["select"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    calibration = fit_calibration(risk_sets, method, shared_slope=opts.shared_slope)
    timings["fit"] = time.perf_counter() - t0
    notices += _position_notices(calibration)

    t0 = time.perf_counter()
    held = _Holdout.of(traces, hold, opts)
    before = held.score(_identity(traces.k))
    after = held.score(calibration)
    timings["metrics"] = time.perf_counter() - t0
    notices += _holdout_notices(after)

    grid = None
    if opts.grid_baseline:
        t0 = time.perf_counter()
        grid_cal = fit_sts_grid(logits_f, acc_f, ver_f, n_bins=opts.n_bins)
        grid_seconds = time.perf_counter() - t0
        grid = BaselineResult(grid_cal, held.score(grid_cal), grid_seconds)

    return FitResult(
        calibration=calibration,
        options=opts,
        before=before,
        after=after,
        fit_rounds=int(fit_mask.sum()),
        holdout_rounds=int(hold.sum()),
        fit_requests=split.fit_requests,
        holdout_requests=split.holdout_requests,
        cv_nll=cv,
        grid=grid,
        notices=tuple(notices),
        timings=timings,
        traces=tuple(s.to_dict() for s in traces.sources),
        synthetic=traces.synthetic,
    )


# --------------------------------------------------------------------------------------------
# Outputs


@dataclass(frozen=True, slots=True)
class FitOutputs:
    """Files written by :func:`write_fit_outputs`.

    Attributes:
        calibration: the unsigned calibration table.
        logical_sha256: its logical hash.
        sts: the ``sts.json`` path, or ``None`` with ``sts_reason`` saying why it was not written.
        report: the JSON report.
        plots: PNG paths.
    """

    calibration: Path
    logical_sha256: str
    sts: Path | None
    sts_reason: str
    report: Path
    plots: tuple[Path, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "calibration": str(self.calibration),
            "logical_sha256": self.logical_sha256,
            "sts": str(self.sts) if self.sts is not None else None,
            "sts_reason": self.sts_reason,
            "report": str(self.report),
            "plots": [str(p) for p in self.plots],
        }


#: The package's one fingerprint-file reader (``artifacts.read_fingerprint``), under the name ``fit``
#: has always exported.
load_fingerprint = read_fingerprint


def _bind_fingerprint(fingerprint: Fingerprint | None, k: int) -> Fingerprint:
    if fingerprint is None:
        return Fingerprint(max_draft_len=k)
    if fingerprint.max_draft_len is None:
        return fingerprint.replace(max_draft_len=k)
    if fingerprint.max_draft_len != k:
        raise ConfigError(
            f"fingerprint.max_draft_len is {fingerprint.max_draft_len} but the traces have K={k}; the "
            "calibration must be fitted on traces from the fingerprinted deployment"
        )
    return fingerprint


def _dataset_name(traces: Sequence[Mapping[str, Any]]) -> str:
    names = ",".join(Path(str(t["path"])).name for t in traces) or "traces"
    return NON_PRINTABLE_ASCII.sub("?", names)[:200]


def write_fit_outputs(
    result: FitResult,
    out_dir: Path | str,
    *,
    fingerprint: Fingerprint | None = None,
    provenance: Provenance,
    sts_approx: bool = False,
    plots: bool = True,
) -> FitOutputs:
    """Write the unsigned calibration table, ``sts.json``, the JSON report and the plots.

    ``sts.json`` is written when every position is an STS map, or when ``sts_approx`` asks for the
    best STS approximation of another method.

    Raises:
        ConfigError: the fingerprint disagrees with K, or the table does not fit its schema.
        OSError: a file cannot be written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fp = _bind_fingerprint(fingerprint, result.k)
    cal_path = out / CALIBRATION_FILE
    digest = write_unsigned_artifact(
        cal_path,
        result.table(),
        kind="calibration",
        fingerprint=fp,
        provenance=provenance,
        summary=result.summary(),
    )
    sts_path: Path | None = None
    if result.calibration.is_sts or sts_approx:
        sts_path = out / STS_FILE
        doc = result.sts(dataset=_dataset_name(result.traces))
        atomic_write_bytes(sts_path, doc.to_bytes())
        reason = "exact STS" if result.calibration.is_sts else "best STS approximation (--sts-approx)"
    else:
        reason = (
            f"method {result.calibration.method} is not STS; pass --sts-approx for the best STS approximation"
        )
    report = {**result.to_dict(), "outputs": {"calibration": str(cal_path), "logical_sha256": digest}}
    report_path = out / REPORT_FILE
    atomic_write_bytes(report_path, canonical_json(report))
    plot_paths: tuple[Path, ...] = ()
    if plots:
        title = f"{result.calibration.method} · {result.holdout_rounds} held-out rounds"
        rel = out / RELIABILITY_PNG
        atomic_write_bytes(rel, reliability_png(result.before, result.after, title=title))
        surv = out / SURVIVAL_PNG
        atomic_write_bytes(surv, survival_png(result.before, result.after, title=title))
        plot_paths = (rel, surv)
    return FitOutputs(cal_path, digest, sts_path, reason, report_path, plot_paths)


def run_fit(
    trace_paths: Sequence[Path | str],
    out_dir: Path | str,
    *,
    options: FitOptions | None = None,
    k: int | None = None,
    sampling: str | None = None,
    fingerprint: Fingerprint | None = None,
    tool_version: str = "0",
    command: Sequence[str] = (),
    sts_approx: bool = False,
    plots: bool = True,
    created_at: str | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> tuple[FitResult, FitOutputs, float]:
    """Read traces, fit, and write every output (the ``fit`` command's one library call).

    ``on_stage`` is told each stage as it starts (reading, fitting, writing), so a display can
    say what a fit on millions of rounds is doing.

    Returns:
        The result, the outputs, and the reading time in seconds.

    Raises:
        ConfigError: bad traces, options or fingerprint.
        OSError: an output cannot be written.
    """
    stage = on_stage or (lambda _name: None)
    stage("reading traces")
    t0 = time.perf_counter()
    traces = read_traces(trace_paths, k=k, sampling=sampling)
    read_seconds = time.perf_counter() - t0
    opts = options or FitOptions()
    stage(f"fitting {traces.rounds:,} rounds and scoring the held-out requests")
    result = fit_traces(traces, opts)
    provenance = Provenance(
        tool_version=tool_version,
        command=tuple(command),
        synthetic=result.synthetic,
        created_at=created_at,
        extra={
            "traces": [dict(t) for t in result.traces],
            "fit_options": opts.to_dict(),
            "sampling": sampling,
        },
    )
    stage("writing the calibration, its report" + (" and plots" if plots else ""))
    outputs = write_fit_outputs(
        result, out_dir, fingerprint=fingerprint, provenance=provenance, sts_approx=sts_approx, plots=plots
    )
    return result, outputs, read_seconds


# --------------------------------------------------------------------------------------------
# Drift check


@dataclass(frozen=True, slots=True)
class LoadedCalibration:
    """A calibration read back for re-scoring (untrusted: verification is ``dspark-verify``'s job).

    Attributes:
        calibration: the maps.
        reference_ece: per-position held-out ECE recorded at fit time (``None`` where unknown).
        reference_nll: recorded held-out NLL of the accepted length, if any.
        path: where it was read from.
    """

    calibration: FittedCalibration
    reference_ece: tuple[float | None, ...]
    reference_nll: float | None
    path: str


def load_calibration(path: Path | str) -> LoadedCalibration:
    """Read a calibration table (``calibration.parquet``) or an ``sts.json`` for re-scoring.

    Raises:
        ConfigError: unreadable file, wrong kind, or invalid rows.
    """
    p = Path(path)
    if p.suffix.lower() == ".json":
        try:
            doc = parse_sts_document(p.read_bytes(), where=str(p))
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read ({exc.strerror or exc})") from exc
        cal = FittedCalibration.from_temperatures(doc.temperatures)
        return LoadedCalibration(cal, (doc.ece_after,) * cal.k, None, str(p))
    try:
        loaded = read_artifact(p)
    except ArtifactReadError as exc:
        raise ConfigError(f"{exc} (expected a calibration.parquet written by fit, or an sts.json)") from exc
    if loaded.kind != "calibration":
        raise ConfigError(
            f"{p}: footer kind is {loaded.kind!r}, expected 'calibration'; pass the table fit wrote"
        )
    try:
        rows = sorted(loaded.table.to_pylist(), key=lambda r: int(r["position"]))
        maps = tuple(
            FittedPositionMap(
                position=int(r["position"]),
                method=Method(r["method"]),
                params=tuple(r["params"] or ()),
                temperature=r["temperature"],
                risk_set_size=int(r["risk_set_size"]),
            )
            for r in rows
        )
        summary = loaded.metadata.get("summary") or {}
        cal = FittedCalibration(str(summary.get("method", maps[0].method.value if maps else "unknown")), maps)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{p}: calibration rows are invalid ({exc}); re-run fit") from exc
    ref_ece = tuple(
        float(r["ece_after"]) if isinstance(r.get("ece_after"), int | float) else None for r in rows
    )
    nll = summary.get("nll_accepted_length", {}) if isinstance(summary, dict) else {}
    ref_nll = Estimate.from_dict(nll.get("after") if isinstance(nll, dict) else None).value
    return LoadedCalibration(cal, ref_ece, ref_nll, str(p))


@dataclass(frozen=True, slots=True)
class DriftTolerances:
    """How much worse fresh traces may score before a calibration is called stale.

    Attributes:
        ece: allowed increase of each position's equal-width ECE over the value recorded at fit
            time (absolute; the recorded value counts as 0 where unknown).
        nll: allowed NLL regret (nats per round): the calibration's NLL on the fresh traces minus
            that of an STS map refitted on them.
    """

    ece: float = 0.02
    nll: float = 0.02

    def __post_init__(self) -> None:
        for name in ("ece", "nll"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"--{name}-tolerance {value!r} must be a finite number >= 0")


@dataclass(frozen=True, slots=True)
class DriftCheck:
    """One criterion of the drift check."""

    name: str
    value: Estimate
    threshold: float
    decision: Decision

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "value": self.value.to_dict(),
            "threshold": self.threshold,
            "status": self.decision.status.value,
            "reason": self.decision.reason,
            "detail": self.decision.detail,
        }


@dataclass(frozen=True, slots=True)
class DriftReport:
    """The outcome of re-scoring a calibration on fresh traces.

    ``decision`` is ``REJECT`` when any criterion's point estimate is worse than its threshold,
    ``UNDECIDED`` when none is but some interval reaches past its threshold (or a position has no
    labelled rounds), and ``ACCEPT`` otherwise. The caller decides what ``UNDECIDED`` means.
    """

    decision: Decision
    checks: tuple[DriftCheck, ...]
    metrics: MetricsReport
    refit_temperatures: tuple[float, ...]
    calibration_path: str
    tolerances: DriftTolerances
    notices: tuple[Notice, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "status": self.decision.status.value,
            "reason": self.decision.reason,
            "detail": self.decision.detail,
            "calibration": self.calibration_path,
            "tolerances": {"ece": self.tolerances.ece, "nll": self.tolerances.nll},
            "checks": [c.to_dict() for c in self.checks],
            "refit_temperatures": list(self.refit_temperatures),
            "metrics": self.metrics.to_dict(),
            "warnings": [n.to_dict() for n in self.notices],
        }


def _judge(name: str, value: Estimate, threshold: float) -> DriftCheck:
    if value.value is None:
        return DriftCheck(
            name, value, threshold, Decision(Status.UNKNOWN, "no_data", f"{name}: no labelled rounds")
        )
    if value.value > threshold:
        return DriftCheck(
            name, value, threshold,
            Decision(Status.REJECT, "worse_than_tolerance", f"{name} {value.value:.4f} > {threshold:.4f}"),
        )  # fmt: skip
    if value.high is not None and value.high > threshold:
        return DriftCheck(
            name, value, threshold,
            Decision(
                Status.UNDECIDED,
                "interval_crosses_tolerance",
                f"{name} {value.value:.4f} <= {threshold:.4f} but its interval reaches {value.high:.4f}",
            ),
        )  # fmt: skip
    return DriftCheck(
        name, value, threshold, Decision(Status.ACCEPT, "within_tolerance", f"{name} {value.value:.4f}")
    )


def evaluate_drift(
    loaded: LoadedCalibration,
    traces: TraceSet,
    *,
    tolerances: DriftTolerances | None = None,
    bootstrap: int = BOOTSTRAP_REPLICATES,
    seed: int = 0,
    n_bins: int = ECE_BINS,
) -> DriftReport:
    """Re-score a calibration on fresh traces (all of them: none were used to fit it).

    Raises:
        ConfigError: the calibration's K differs from the traces'.
    """
    tol = tolerances or DriftTolerances()
    cal = loaded.calibration
    if cal.k != traces.k:
        raise ConfigError(
            f"{loaded.path}: calibration has K={cal.k} positions but the traces have K={traces.k}; "
            "re-score with traces of the same draft length"
        )
    p = cal.conditional(traces.logits)
    metrics = evaluate_predictions(
        p, traces.accepted, traces.verified, traces.request, bootstrap=bootstrap, seed=seed, n_bins=n_bins
    )
    checks = []
    for pos, ref in zip(metrics.positions, loaded.reference_ece, strict=True):
        checks.append(_judge(f"ece[{pos.position}]", pos.ece, (ref or 0.0) + tol.ece))
    refit = fit_calibration(build_risk_sets(traces.logits, traces.accepted, traces.verified), Method.STS)
    regret = paired_nll_difference(
        p, refit.conditional(traces.logits), traces.accepted, traces.verified, traces.request,
        bootstrap=bootstrap, seed=seed,
    )  # fmt: skip
    checks.append(_judge("nll_regret", regret, tol.nll))
    statuses = [c.decision.status for c in checks]
    if Status.REJECT in statuses:
        bad = [c.name for c in checks if c.decision.status is Status.REJECT]
        decision = Decision(Status.REJECT, "drift", f"worse than tolerance: {', '.join(bad)}; re-run fit")
    elif Status.UNDECIDED in statuses or Status.UNKNOWN in statuses:
        open_ = [c.name for c in checks if c.decision.status in (Status.UNDECIDED, Status.UNKNOWN)]
        decision = Decision(
            Status.UNDECIDED, "inconclusive", f"within tolerance but not established: {', '.join(open_)}"
        )
    else:
        decision = Decision(Status.ACCEPT, "no_drift", "every criterion within tolerance")
    return DriftReport(
        decision=decision,
        checks=tuple(checks),
        metrics=metrics,
        refit_temperatures=refit.sts_temperatures(),
        calibration_path=loaded.path,
        tolerances=tol,
        notices=traces.notices,
    )


def run_evaluate(
    calibration_path: Path | str,
    trace_paths: Sequence[Path | str],
    *,
    tolerances: DriftTolerances | None = None,
    sampling: str | None = None,
    force: bool = False,
    bootstrap: int = BOOTSTRAP_REPLICATES,
    seed: int = 0,
) -> DriftReport:
    """Load a calibration and fresh traces and run :func:`evaluate_drift` (``fit --evaluate``).

    Raises:
        ConfigError: unreadable inputs, K mismatch, or too few rounds without ``force``.
    """
    loaded = load_calibration(calibration_path)
    traces = read_traces(trace_paths, k=loaded.calibration.k, sampling=sampling)
    decision, notices = check_sufficiency(traces, force=force)
    if decision.status is Status.REJECT and decision.reason == "too_few_rounds":
        raise ConfigError(f"{', '.join(Path(s.path).name for s in traces.sources)}: {decision.detail}")
    report = evaluate_drift(loaded, traces, tolerances=tolerances, bootstrap=bootstrap, seed=seed)
    return DriftReport(
        decision=report.decision,
        checks=report.checks,
        metrics=report.metrics,
        refit_temperatures=report.refit_temperatures,
        calibration_path=report.calibration_path,
        tolerances=report.tolerances,
        notices=notices,
    )
