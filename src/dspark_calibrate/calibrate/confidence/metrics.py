"""Scores of predicted prefix survival against observed accepted lengths, with request-level CIs.

Pure functions of arrays: per-round conditional probabilities ``p`` (n, K) from any calibrator,
the observed ``accepted`` and ``verified`` counts, and each round's request code. Nothing here
reads files, fits maps or splits data; ``fit`` calls :func:`evaluate_predictions` on held-out
requests only (DESIGN §8).

Definitions (S_j = p_1 ⋯ p_j, A = accepted, v = verified, K = draft length):

- **NLL of the accepted length** (nats per round, proper): −log P(A = a) for a round whose
  outcome is fully observed (A < v, or v = K) and −log P(A ≥ v) = −log S_v for a censored round
  (A = v < K). It equals the sum over positions of the Bernoulli NLL on each position's risk set,
  which is exactly what the risk-set fit maximises.
- **Brier** (survival Brier, per round): Σ_{j ≤ v} (S_j − 1[A ≥ j])², over the positions whose
  label is known.
- **ECE per position**: S_j against 1[A ≥ j] on rounds with v ≥ j (the label is known there, and
  which rounds were verified depended only on their logits, so calibration is unbiased on them).
  L1 norm, bins weighted by their round count, 15 equal-width bins on [0, 1] and 15 equal-mass
  bins (quantiles of S_j, edges on a 1/65536 grid); empty bins are counted and reported.
- **E[A] error**: mean over rounds of Σ_{j ≤ v} S_j (the predicted E[min(A, v)], which is E[A] for
  uncensored rounds) minus the mean observed A.
- **Intervals**: percentile bootstrap over *requests* (rounds of one request are correlated), with
  multinomial request weights; never over tokens or rounds.

Probabilities are clipped to [1e-12, 1 − 1e-12] inside logarithms, so one confidently wrong round
costs at most about 27.6 nats instead of infinity.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dspark_calibrate.errors import InvalidValueError

__all__ = [
    "BOOTSTRAP_REPLICATES",
    "CI_CONFIDENCE",
    "ECE_BINS",
    "PROB_EPS",
    "Estimate",
    "MetricsReport",
    "Outcomes",
    "PositionMetrics",
    "Reliability",
    "binned_ece",
    "equal_mass_bins",
    "evaluate_predictions",
    "observe",
    "paired_nll_difference",
    "round_log_likelihood",
]

#: Bins of the reliability diagram and ECE (the issue's choice; 15 is the common default).
ECE_BINS = 15
#: Request-level bootstrap replicates for every interval.
BOOTSTRAP_REPLICATES = 200
#: Two-sided coverage of the percentile intervals.
CI_CONFIDENCE = 0.95
#: Clip for probabilities inside logarithms (bounds one round's NLL at about 27.6 nats).
PROB_EPS = 1e-12
#: Cells of the grid on which equal-mass bin edges are placed (edges exact to 1/65536).
_MASS_GRID = 1 << 16
#: Bootstrap replicates multiplied at once (bounds the weight matrix at chunk × requests floats).
_BOOTSTRAP_CHUNK = 25


@dataclass(frozen=True, slots=True)
class Estimate:
    """A point estimate with an optional bootstrap interval (``None`` where undefined)."""

    value: float | None
    low: float | None = None
    high: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        """JSON-ready form."""
        return {"value": self.value, "low": self.low, "high": self.high}

    @classmethod
    def from_dict(cls, data: Any) -> Estimate:
        """Inverse of :meth:`to_dict` (missing keys become ``None``)."""
        if not isinstance(data, dict):
            return cls(None)
        return cls(_opt_float(data.get("value")), _opt_float(data.get("low")), _opt_float(data.get("high")))


def _opt_float(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and np.isfinite(value):
        return float(value)
    return None


@dataclass(frozen=True, slots=True)
class Reliability:
    """One reliability diagram: per-bin counts, mean predicted survival and observed rate.

    Attributes:
        binning: ``equal_width`` or ``equal_mass``.
        edges: bin edges (n_bins + 1, from 0 to 1).
        counts: rounds per bin.
        mean_confidence: mean S_j per bin (``None`` for empty bins).
        mean_label: observed rate of 1[A ≥ j] per bin (``None`` for empty bins).
        ece: L1 expected calibration error, bins weighted by count (``None`` without rounds).
    """

    binning: str
    edges: tuple[float, ...]
    counts: tuple[int, ...]
    mean_confidence: tuple[float | None, ...]
    mean_label: tuple[float | None, ...]
    ece: float | None

    @property
    def empty_bins(self) -> int:
        """Bins holding no round."""
        return sum(1 for c in self.counts if c == 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "binning": self.binning,
            "edges": list(self.edges),
            "counts": list(self.counts),
            "mean_confidence": list(self.mean_confidence),
            "mean_label": list(self.mean_label),
            "ece": self.ece,
            "empty_bins": self.empty_bins,
        }


@dataclass(frozen=True, slots=True)
class PositionMetrics:
    """Held-out scores of one draft position.

    Attributes:
        position: 1..K.
        risk_set_size: rounds whose first j−1 positions were accepted and position j verified.
        labelled: rounds with v ≥ j (1[A ≥ j] known).
        nll: mean conditional Bernoulli NLL of p_j on the risk set (nats).
        brier: mean (S_j − 1[A ≥ j])² over labelled rounds.
        ece: equal-width ECE of S_j with its interval.
        ece_mass: equal-mass ECE of S_j with its interval.
        mean_survival: mean predicted S_j over labelled rounds.
        observed_survival: observed rate of 1[A ≥ j] over labelled rounds.
        width: the equal-width reliability diagram.
        mass: the equal-mass reliability diagram.
    """

    position: int
    risk_set_size: int
    labelled: int
    nll: float | None
    brier: float | None
    ece: Estimate
    ece_mass: Estimate
    mean_survival: float | None
    observed_survival: float | None
    width: Reliability
    mass: Reliability

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "position": self.position,
            "risk_set_size": self.risk_set_size,
            "labelled": self.labelled,
            "nll": self.nll,
            "brier": self.brier,
            "ece": self.ece.to_dict(),
            "ece_mass": self.ece_mass.to_dict(),
            "mean_survival": self.mean_survival,
            "observed_survival": self.observed_survival,
            "equal_width": self.width.to_dict(),
            "equal_mass": self.mass.to_dict(),
        }


@dataclass(frozen=True, slots=True)
class MetricsReport:
    """Held-out scores of one calibration (or of the raw logits).

    Attributes:
        k: draft length.
        rounds: rounds scored.
        requests: distinct requests among them (the bootstrap unit).
        nll: mean NLL of the accepted length per round.
        brier: mean survival Brier per round.
        ea_predicted: mean predicted E[min(A, v)].
        ea_measured: mean observed A.
        ea_error: predicted minus measured, with interval.
        positions: per-position scores.
        bootstrap: replicates used (0 = no intervals).
        n_bins: bins per reliability diagram.
    """

    k: int
    rounds: int
    requests: int
    nll: Estimate
    brier: Estimate
    ea_predicted: float | None
    ea_measured: float | None
    ea_error: Estimate
    positions: tuple[PositionMetrics, ...]
    bootstrap: int
    n_bins: int = ECE_BINS

    @property
    def max_ece(self) -> float | None:
        """Largest equal-width ECE over the positions that have labelled rounds."""
        values = [p.ece.value for p in self.positions if p.ece.value is not None]
        return max(values) if values else None

    def binning(self) -> dict[str, Any]:
        """How ECE was computed (recorded in the calibration's summary)."""
        return {
            "bins": self.n_bins,
            "kinds": ["equal_width", "equal_mass"],
            "primary": "equal_width",
            "norm": "L1",
            "weights": "rounds per bin",
            "target": "S_j vs 1[A>=j] on held-out rounds with verified>=j",
            "interval": (
                f"{CI_CONFIDENCE:.0%} percentile bootstrap over requests, {self.bootstrap} replicates"
            ),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "k": self.k,
            "rounds": self.rounds,
            "requests": self.requests,
            "nll": self.nll.to_dict(),
            "brier": self.brier.to_dict(),
            "ea_predicted": self.ea_predicted,
            "ea_measured": self.ea_measured,
            "ea_error": self.ea_error.to_dict(),
            "positions": [p.to_dict() for p in self.positions],
            "bootstrap": self.bootstrap,
            "binning": self.binning(),
        }


def _width_bins(conf: np.ndarray, n_bins: int) -> np.ndarray:
    return np.minimum((conf * n_bins).astype(np.intp), n_bins - 1)


def binned_ece(conf: np.ndarray, label: np.ndarray, n_bins: int = ECE_BINS) -> float:
    """Equal-width L1 ECE of confidences against 0/1 labels (bins weighted by count).

    Args:
        conf: predicted probabilities in [0, 1].
        label: observed outcomes (bool or 0/1).
        n_bins: equal-width bins on [0, 1].

    Returns:
        Σ_b |Σ conf_b − Σ label_b| / n; 0.0 for empty input.
    """
    n = conf.shape[0]
    if n == 0:
        return 0.0
    b = _width_bins(conf, n_bins)
    s_conf = np.bincount(b, weights=conf, minlength=n_bins)
    s_label = np.bincount(b, weights=label.astype(np.float64, copy=False), minlength=n_bins)
    return float(np.abs(s_conf - s_label).sum() / n)


def equal_mass_bins(conf: np.ndarray, n_bins: int = ECE_BINS) -> tuple[np.ndarray, np.ndarray]:
    """Equal-mass bins of ``conf``: edges and each value's bin.

    A value of rank r (0-based, ascending) among n goes to bin floor(r·n_bins/n), computed on a
    grid of 2**16 cells on [0, 1]: every value of one cell shares the bin of the cell's first
    rank, so edges are empirical quantiles rounded down to 1/65536 and one pass suffices. Ties
    (or a cell holding more than 1/n_bins of the mass) leave bins empty; they are reported.

    Returns:
        ``(edges, bins)``: n_bins + 1 edges from 0 to 1, and the bin index of each value.
    """
    n = conf.shape[0]
    if n == 0:
        return np.linspace(0.0, 1.0, n_bins + 1), np.zeros(0, np.intp)
    fine = np.minimum((conf * _MASS_GRID).astype(np.intp), _MASS_GRID - 1)
    hist = np.bincount(fine, minlength=_MASS_GRID)
    before = np.cumsum(hist) - hist
    lut = (before * n_bins) // n
    inner = np.searchsorted(lut, np.arange(1, n_bins), side="left") / _MASS_GRID
    edges = np.concatenate(([0.0], inner, [1.0]))
    return edges, lut[fine]


@dataclass(frozen=True, slots=True, eq=False)
class Outcomes:
    """What was observed in a set of rounds, precomputed once and shared by every scoring.

    Attributes:
        k: draft length.
        accepted: accepted counts (int16).
        verified: verified counts (int16).
        request_index: compact request index per round (0..requests−1).
        requests: number of distinct requests.
        labelled: per position, rounds with verified ≥ j (``None`` when every round is).
        label: per position, 1[A ≥ j] as float64.
        risk: per position, rounds in the risk set (A ≥ j−1 and verified ≥ j).
    """

    k: int
    accepted: np.ndarray
    verified: np.ndarray
    request_index: np.ndarray
    requests: int
    labelled: tuple[np.ndarray | None, ...]
    label: tuple[np.ndarray, ...]
    risk: tuple[np.ndarray, ...]

    @property
    def rounds(self) -> int:
        """Rounds observed."""
        return int(self.accepted.shape[0])


def observe(accepted: np.ndarray, verified: np.ndarray, request: np.ndarray, k: int) -> Outcomes:
    """Precompute the per-position masks and the request index of a set of rounds."""
    a = accepted.astype(np.int16, copy=False)
    v = verified.astype(np.int16, copy=False)
    if a.shape[0]:
        _, rr = np.unique(request, return_inverse=True)
        rr = rr.reshape(-1).astype(np.intp, copy=False)
        r = int(rr.max()) + 1
    else:
        rr, r = np.zeros(0, np.intp), 0
    labelled: list[np.ndarray | None] = []
    label: list[np.ndarray] = []
    risk: list[np.ndarray] = []
    for j in range(1, k + 1):
        lab = v >= j
        y = a >= j
        labelled.append(None if lab.all() else lab)
        label.append(y.astype(np.float64))
        risk.append((a >= j - 1) & lab)
    return Outcomes(k, a, v, rr, r, tuple(labelled), tuple(label), tuple(risk))


def _log_likelihood_terms(p: np.ndarray, obs: Outcomes) -> list[np.ndarray]:
    """Per position, log P(observed label) on every round (0 outside the risk set)."""
    out = []
    for j in range(obs.k):
        pc = np.clip(p[:, j], PROB_EPS, 1.0 - PROB_EPS)
        # For p >= 0.5, 1 - p is exact in binary64 (Sterbenz), so log(1 - p) loses nothing
        # against log1p(-p) where it matters.
        q = np.where(obs.label[j] > 0, pc, 1.0 - pc)
        lq = np.log(q)
        lq[~obs.risk[j]] = 0.0
        out.append(lq)
    return out


def round_log_likelihood(p: np.ndarray, accepted: np.ndarray, verified: np.ndarray) -> np.ndarray:
    """Per-round log-likelihood of the observed accepted length (censoring-aware).

    Args:
        p: (n, K) conditional acceptance probabilities.
        accepted: accepted draft tokens per round.
        verified: verified positions per round.

    Returns:
        float64 array of n log-likelihoods (≤ 0).
    """
    n, k = p.shape
    obs = observe(accepted, verified, np.zeros(n, np.int64), k)
    terms = _log_likelihood_terms(p, obs)
    return np.sum(terms, axis=0) if terms else np.zeros(n)


def _bootstrap_totals(features: np.ndarray, replicates: int, seed: int) -> Iterator[np.ndarray]:
    """Yield chunks of request-weighted column totals (replicates × features).

    Each replicate draws R requests with replacement (multinomial weights). The product is
    taken as (features.T · weights.T).T: OpenBLAS runs that shape an order of magnitude faster
    than weights · features when the chunk is short and R is long.
    """
    r = features.shape[0]
    rng = np.random.default_rng(seed)
    features_t = np.ascontiguousarray(features.T)
    done = 0
    while done < replicates:
        b = min(_BOOTSTRAP_CHUNK, replicates - done)
        draws = rng.integers(0, r, size=(b, r))
        weights = np.empty((r, b), dtype=np.float64)
        for i in range(b):
            weights[:, i] = np.bincount(draws[i], minlength=r)
        yield (features_t @ weights).T
        done += b


def _interval(samples: np.ndarray) -> tuple[float | None, float | None]:
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return None, None
    alpha = (1.0 - CI_CONFIDENCE) / 2.0
    lo, hi = np.quantile(finite, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    out = np.full(np.broadcast(num, den).shape, np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def _mean_or_none(values: np.ndarray) -> float | None:
    return float(values.mean()) if values.size else None


def _reliability(
    binning: str, edges: np.ndarray, counts: np.ndarray, s_conf: np.ndarray, s_label: np.ndarray
) -> Reliability:
    total = counts.sum()
    mean_c = tuple(float(s_conf[i] / counts[i]) if counts[i] else None for i in range(len(counts)))
    mean_l = tuple(float(s_label[i] / counts[i]) if counts[i] else None for i in range(len(counts)))
    ece = float(np.abs(s_conf - s_label).sum() / total) if total else None
    return Reliability(
        binning=binning,
        edges=tuple(float(e) for e in edges),
        counts=tuple(int(c) for c in counts),
        mean_confidence=mean_c,
        mean_label=mean_l,
        ece=ece,
    )


def evaluate_predictions(
    p: np.ndarray,
    accepted: np.ndarray,
    verified: np.ndarray,
    request: np.ndarray,
    *,
    n_bins: int = ECE_BINS,
    bootstrap: int = BOOTSTRAP_REPLICATES,
    seed: int = 0,
    outcomes: Outcomes | None = None,
) -> MetricsReport:
    """Score per-round conditional probabilities against observed accepted lengths.

    Args:
        p: (n, K) conditional acceptance probabilities p_j (S_j is their running product).
        accepted: accepted draft tokens per round.
        verified: verified positions per round.
        request: request code per round (the bootstrap unit).
        n_bins: bins of both reliability diagrams.
        bootstrap: request-level bootstrap replicates (0 for point estimates only).
        seed: bootstrap seed.
        outcomes: :func:`observe` of the same rounds, to share it between several scorings.

    Returns:
        The report; fields are ``None`` where no round defines them.
    """
    n, k = p.shape
    obs = outcomes if outcomes is not None else observe(accepted, verified, request, k)
    if obs.rounds != n or obs.k != k:
        raise InvalidValueError(
            f"outcomes describe {obs.rounds} rounds of K={obs.k}, predictions are {p.shape}"
        )
    s = np.cumprod(p, axis=1)
    r = obs.requests
    terms = _log_likelihood_terms(p, obs)
    ll = np.sum(terms, axis=0) if n else np.zeros(0)
    brier_r = np.zeros(n)
    ea_pred = np.zeros(n)
    columns: list[np.ndarray] = []  # per-request features for the bootstrap
    do_boot = bool(bootstrap) and r > 1
    position_parts = [
        _position_part(j, obs, s, terms, n_bins, brier_r, ea_pred, columns if do_boot else None)
        for j in range(1, k + 1)
    ]
    a = obs.accepted
    nll_value = float(-ll.mean()) if n else None
    brier_value = float(brier_r.mean()) if n else None
    ea_p = float(ea_pred.mean()) if n else None
    ea_m = float(a.mean()) if n else None
    ea_err = (ea_p - ea_m) if ea_p is not None and ea_m is not None else None

    intervals: dict[str, tuple[float | None, float | None]] = {}
    ece_intervals: dict[tuple[int, str], tuple[float | None, float | None]] = {}
    used_bootstrap = bootstrap if do_boot else 0
    if used_bootstrap:
        intervals, ece_intervals = _bootstrap_intervals(
            [-ll, brier_r, ea_pred - a], columns, position_parts, obs, n_bins, used_bootstrap, seed
        )

    def est(value: float | None, key: str) -> Estimate:
        lo, hi = intervals.get(key, (None, None))
        return Estimate(value, lo, hi)

    return MetricsReport(
        k=k,
        rounds=n,
        requests=r,
        nll=est(nll_value, "nll"),
        brier=est(brier_value, "brier"),
        ea_predicted=ea_p,
        ea_measured=ea_m,
        ea_error=est(ea_err, "ea_error"),
        positions=tuple(_position_metrics(part, ece_intervals) for part in position_parts),
        bootstrap=used_bootstrap,
        n_bins=n_bins,
    )


def _position_part(
    j: int,
    obs: Outcomes,
    s: np.ndarray,
    terms: Sequence[np.ndarray],
    n_bins: int,
    brier_r: np.ndarray,
    ea_pred: np.ndarray,
    columns: list[np.ndarray] | None,
) -> dict[str, Any]:
    """Position ``j``'s point metrics and both reliability diagrams.

    Adds the position's squared error and survival to the per-round ``brier_r`` and ``ea_pred``
    (in place, position by position), and with ``columns`` appends its per-request bootstrap
    features (bin counts, confidence and label sums), recording where they start in ``cols``.
    """
    lab = obs.labelled[j - 1]
    y = obs.label[j - 1]
    risk = obs.risk[j - 1]
    rr, r = obs.request_index, obs.requests
    sj = np.ascontiguousarray(s[:, j - 1])
    err = (sj - y) ** 2
    if lab is None:
        brier_r += err
        ea_pred += sj
        s_lab, y_lab, rr_lab, err_lab = sj, y, rr, err
    else:
        brier_r += np.where(lab, err, 0.0)
        ea_pred += np.where(lab, sj, 0.0)
        s_lab, y_lab, rr_lab, err_lab = sj[lab], y[lab], rr[lab], err[lab]
    n_risk = int(np.count_nonzero(risk))
    part: dict[str, Any] = {
        "position": j,
        "risk_set_size": n_risk,
        "labelled": int(s_lab.shape[0]),
        "nll": float(-terms[j - 1].sum() / n_risk) if n_risk else None,
        "brier": _mean_or_none(err_lab),
        "mean_survival": _mean_or_none(s_lab),
        "observed_survival": _mean_or_none(y_lab),
        "cols": {},
    }
    for binning in ("equal_width", "equal_mass"):
        if binning == "equal_width":
            edges = np.linspace(0.0, 1.0, n_bins + 1)
            b = _width_bins(s_lab, n_bins)
        else:
            edges, b = equal_mass_bins(s_lab, n_bins)
        counts = np.bincount(b, minlength=n_bins).astype(np.float64)
        s_conf = np.bincount(b, weights=s_lab, minlength=n_bins)
        s_label = np.bincount(b, weights=y_lab, minlength=n_bins)
        part[binning] = _reliability(binning, edges, counts, s_conf, s_label)
        if columns is not None:
            idx = rr_lab * n_bins + b
            start = len(columns)
            for w in (None, s_lab, y_lab):
                grid = np.bincount(idx, weights=w, minlength=r * n_bins).reshape(r, n_bins)
                columns.extend(grid.T.astype(np.float64, copy=False))
            part["cols"][binning] = start
    return part


def _bootstrap_intervals(
    per_round: Sequence[np.ndarray],
    columns: Sequence[np.ndarray],
    position_parts: Sequence[Mapping[str, Any]],
    obs: Outcomes,
    n_bins: int,
    replicates: int,
    seed: int,
) -> tuple[
    dict[str, tuple[float | None, float | None]], dict[tuple[int, str], tuple[float | None, float | None]]
]:
    """Request-bootstrap intervals of NLL, Brier and E[A] error (``per_round``: their per-round
    terms, in that order) and of every position's ECE under both binnings."""
    rr, r = obs.request_index, obs.requests
    base = [None, *per_round]
    head = len(base)
    features = np.empty((r, head + len(columns)))
    for i, values in enumerate(base):
        features[:, i] = np.bincount(rr, weights=values, minlength=r)
    for i, col in enumerate(columns):
        features[:, head + i] = col
    draws: dict[str, list[np.ndarray]] = {"nll": [], "brier": [], "ea_error": []}
    ece_draws: dict[tuple[int, str], list[np.ndarray]] = {}
    for totals in _bootstrap_totals(features, replicates, seed):
        count = totals[:, 0]
        draws["nll"].append(_safe_div(totals[:, 1], count))
        draws["brier"].append(_safe_div(totals[:, 2], count))
        draws["ea_error"].append(_safe_div(totals[:, 3], count))
        for part in position_parts:
            for binning, start in part["cols"].items():
                c0 = head + start
                cnt = totals[:, c0 : c0 + n_bins]
                sc = totals[:, c0 + n_bins : c0 + 2 * n_bins]
                sl = totals[:, c0 + 2 * n_bins : c0 + 3 * n_bins]
                ece_b = _safe_div(np.abs(sc - sl).sum(axis=1), cnt.sum(axis=1))
                ece_draws.setdefault((part["position"], binning), []).append(ece_b)
    intervals = {name: _interval(np.concatenate(d)) for name, d in draws.items()}
    ece_intervals = {key: _interval(np.concatenate(d)) for key, d in ece_draws.items()}
    return intervals, ece_intervals


def _position_metrics(
    part: Mapping[str, Any], ece_intervals: Mapping[tuple[int, str], tuple[float | None, float | None]]
) -> PositionMetrics:
    """One position's metrics, with its ECE intervals where the bootstrap ran."""
    j = part["position"]
    width: Reliability = part["equal_width"]
    mass: Reliability = part["equal_mass"]
    return PositionMetrics(
        position=j,
        risk_set_size=part["risk_set_size"],
        labelled=part["labelled"],
        nll=part["nll"],
        brier=part["brier"],
        ece=Estimate(width.ece, *ece_intervals.get((j, "equal_width"), (None, None))),
        ece_mass=Estimate(mass.ece, *ece_intervals.get((j, "equal_mass"), (None, None))),
        mean_survival=part["mean_survival"],
        observed_survival=part["observed_survival"],
        width=width,
        mass=mass,
    )


def paired_nll_difference(
    p_a: np.ndarray,
    p_b: np.ndarray,
    accepted: np.ndarray,
    verified: np.ndarray,
    request: np.ndarray,
    *,
    bootstrap: int = BOOTSTRAP_REPLICATES,
    seed: int = 0,
) -> Estimate:
    """Mean per-round NLL of ``p_a`` minus that of ``p_b`` on the same rounds, paired by request.

    Returns:
        The difference (nats per round) with a request-level bootstrap interval; ``None`` value
        when there are no rounds.
    """
    n = p_a.shape[0]
    if n == 0:
        return Estimate(None)
    diff = round_log_likelihood(p_b, accepted, verified) - round_log_likelihood(p_a, accepted, verified)
    value = float(diff.mean())
    _, rr = np.unique(request, return_inverse=True)
    rr = rr.reshape(-1)
    r = int(rr.max()) + 1
    if not bootstrap or r < 2:
        return Estimate(value)
    features = np.stack(
        [np.bincount(rr, minlength=r).astype(np.float64), np.bincount(rr, weights=diff, minlength=r)], axis=1
    )
    draws = [_safe_div(t[:, 1], t[:, 0]) for t in _bootstrap_totals(features, bootstrap, seed)]
    lo, hi = _interval(np.concatenate(draws))
    return Estimate(value, lo, hi)
