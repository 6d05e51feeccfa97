"""Confidence calibrators: raw draft logits → conditional acceptance p_j and prefix survival S_j.

One interface for every method (DESIGN §2, §8): a :class:`FittedCalibration` holds one
:class:`FittedPositionMap` per draft position, transforms (n, K) logits into p_j, and S_j is always
the running product of p_1..p_j, so survival is non-increasing by construction. Methods:

- ``sts``: p_j = sigmoid(logit_j / T_j), TensorRT-LLM's exact semantics. Fitted by maximum
  likelihood on each position's risk set with a safeguarded Newton solve on 1/T_j (the
  log-likelihood is concave in 1/T_j, so the bounded optimum is unique).
- ``platt``: p_j = sigmoid(a_j·logit_j + b_j), optionally with one slope shared by all positions.
- ``beta``: p_j = sigmoid(a·ln s + b·(−ln(1 − s)) + c) with s = sigmoid(logit_j) and a, b ≥ 0
  (Kull et al.'s beta calibration; a = b = 1, c = 0 is the identity).
- ``isotonic``: a monotone piecewise-linear map through pooled-adjacent-violators blocks (each
  block's rate smoothed as (accepted + ½)/(rounds + 1)); only where the risk set holds at least
  :data:`ISOTONIC_MIN_RISK_SET` rounds, else Platt.
- ``identity``: p_j = sigmoid(logit_j) (T = 1), the neutral map used where a risk set is empty.

The risk set of position j holds rounds whose first j−1 positions were accepted and whose
position j was verified; a censored round (verified < K) contributes only the positions it
observed. Fitting runs on a :class:`RiskSet`, a lossless-to-1e-3-logits compression of the rounds
(logits binned at 1/1024 with the mean logit per bin and label kept), so 10M rounds reduce to a
few tens of thousands of weighted points before any optimiser runs.

Also here: the greedy grid baseline (41 log-spaced temperatures on [0.1, 10], left to right,
minimising the equal-width ECE of the running product), request-grouped cross-validated model
selection. TensorRT-LLM's ``sts.json`` document (its one writer and strict parser) is
``artifacts``'s :class:`StsDocument`, re-exported here. Reading traces, splitting by request and
writing artifacts are left to ``traces`` and ``fit``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import isotonic_regression
from scipy.special import expit, log_expit

from dspark_calibrate.artifacts import (
    STS_MIN_NUM_SAMPLES,
    StsDocument,
    parse_sts_document,
    sts_document,
)
from dspark_calibrate.calibrate.confidence.metrics import ECE_BINS, PROB_EPS, binned_ece
from dspark_calibrate.errors import InvalidValueError

__all__ = [
    "FIT_METHODS",
    "ISOTONIC_MIN_RISK_SET",
    "LOGIT_BIN_WIDTH",
    "METHOD_CHOICES",
    "PARAMETRIC_MIN_RISK_SET",
    "STS_GRID",
    "STS_MIN_NUM_SAMPLES",
    "T_MAX",
    "T_MIN",
    "FittedCalibration",
    "FittedPositionMap",
    "Method",
    "RiskSet",
    "StsDocument",
    "build_risk_sets",
    "compress_risk_set",
    "cross_validated_nll",
    "fit_calibration",
    "fit_position",
    "fit_sts_grid",
    "parse_sts_document",
    "risk_set_nll",
    "select_method",
    "sts_document",
]


class Method(enum.StrEnum):
    """Calibration method of one position (the ``method`` column of a calibration table)."""

    STS = "sts"
    PLATT = "platt"
    BETA = "beta"
    ISOTONIC = "isotonic"
    IDENTITY = "identity"


#: Methods a user can ask ``fit`` for (``auto`` selects among them by cross-validated NLL).
FIT_METHODS: tuple[Method, ...] = (Method.STS, Method.PLATT, Method.BETA, Method.ISOTONIC)
METHOD_CHOICES: tuple[str, ...] = ("auto", *(m.value for m in FIT_METHODS))
#: Temperature bounds. Outside them a position's logits carry (almost) no information or the
#: labels are separable; the fit stops at the bound and says so.
T_MIN = 0.01
T_MAX = 100.0
#: The grid baseline's temperatures: 41 log-spaced values on [0.1, 10].
STS_GRID: tuple[float, ...] = tuple(float(t) for t in np.logspace(-1.0, 1.0, 41))
#: Rounds a risk set needs before a 2–3 parameter map (Platt, beta) is fitted; below, STS (one
#: parameter) is used, because position j's risk set is smaller than position j−1's (DESIGN §8).
PARAMETRIC_MIN_RISK_SET = 200
#: Rounds a risk set needs before an isotonic map is fitted; below, Platt.
ISOTONIC_MIN_RISK_SET = 10_000
#: Logit resolution of the risk-set compression (logit units). Replacing each logit by its bin's
#: mean changes a log-likelihood by O(width²), about 1e-7 here.
LOGIT_BIN_WIDTH = 1.0 / 1024.0
#: Most bins per fold; with wider logit ranges the bin width grows instead.
MAX_LOGIT_BINS = 1 << 18
_ISOTONIC_PRIOR = 0.5  # pseudo-accepted per block; the same again as pseudo-rejected
_PARAM_LIMIT = 1e4  # |parameter| beyond which a parametric fit is declared divergent


# --------------------------------------------------------------------------------------------
# Risk sets


@dataclass(frozen=True, slots=True, eq=False)
class RiskSet:
    """The compressed risk set of one position: weighted (logit, label) points.

    Attributes:
        position: 1..K.
        x: representative logit of each point (mean of the rounds it holds), float64.
        y: label of each point (1.0 accepted, 0.0 rejected).
        w: rounds per point.
        fold: cross-validation fold of each point (all 0 without folds).
        size: rounds in the risk set.
        positives: accepted rounds in the risk set.
    """

    position: int
    x: np.ndarray
    y: np.ndarray
    w: np.ndarray
    fold: np.ndarray
    size: int
    positives: int

    @property
    def negatives(self) -> int:
        """Rejected rounds in the risk set."""
        return self.size - self.positives

    @property
    def degenerate(self) -> bool:
        """True when every round has the same label (a likelihood fit cannot be interior)."""
        return self.positives == 0 or self.negatives == 0

    def part(self, fold: int, *, keep: bool) -> RiskSet:
        """The points of one fold (``keep=True``) or of every other fold (``keep=False``)."""
        mask = (self.fold == fold) if keep else (self.fold != fold)
        w = self.w[mask]
        y = self.y[mask]
        return RiskSet(
            position=self.position,
            x=self.x[mask],
            y=y,
            w=w,
            fold=self.fold[mask],
            size=round(float(w.sum())),
            positives=round(float((w * y).sum())),
        )


def compress_risk_set(
    position: int, x: np.ndarray, y: np.ndarray, fold: np.ndarray | None = None, n_folds: int = 1
) -> RiskSet:
    """Compress one position's risk-set rounds into weighted points.

    Args:
        position: 1..K.
        x: logits of the risk-set rounds at this position.
        y: their labels (accepted at this position).
        fold: optional fold index per round (0..n_folds−1).
        n_folds: number of folds.

    Returns:
        Points keyed by (fold, logit bin, label), each with its mean logit and round count.
    """
    n = int(x.shape[0])
    if n == 0:
        empty = np.zeros(0)
        return RiskSet(position, empty, empty, empty, np.zeros(0, np.int8), 0, 0)
    lo = float(x.min())
    hi = float(x.max())
    width = max(LOGIT_BIN_WIDTH, (hi - lo) / MAX_LOGIT_BINS)
    nb = int((hi - lo) / width) + 1
    key = ((x - lo) * (1.0 / width)).astype(np.int64)
    np.minimum(key, nb - 1, out=key)
    key <<= 1
    key += y
    if fold is not None and n_folds > 1:
        key += fold.astype(np.int64) * (2 * nb)
    size = max(n_folds, 1) * 2 * nb
    counts = np.bincount(key, minlength=size)
    sums = np.bincount(key, weights=x, minlength=size)
    nz = np.flatnonzero(counts)
    w = counts[nz].astype(np.float64)
    labels = (nz & 1).astype(np.float64)
    return RiskSet(
        position=position,
        x=sums[nz] / w,
        y=labels,
        w=w,
        fold=(nz // (2 * nb)).astype(np.int8),
        size=n,
        positives=round(float((w * labels).sum())),
    )


def build_risk_sets(
    logits: np.ndarray,
    accepted: np.ndarray,
    verified: np.ndarray,
    *,
    folds: np.ndarray | None = None,
    n_folds: int = 1,
) -> tuple[RiskSet, ...]:
    """Build the K compressed risk sets of a set of rounds.

    Position j's risk set holds rounds with accepted ≥ j−1 and verified ≥ j; its label is
    accepted ≥ j. Censored positions (beyond ``verified``) are left out, never counted as
    rejections.
    """
    k = logits.shape[1]
    out = []
    for j in range(1, k + 1):
        risk = (accepted >= j - 1) & (verified >= j)
        x = logits[risk, j - 1]
        y = (accepted[risk] >= j).astype(np.int64)
        f = folds[risk] if folds is not None else None
        out.append(compress_risk_set(j, x, y, f, n_folds))
    return tuple(out)


# --------------------------------------------------------------------------------------------
# Position maps and calibrations


def _softplus(x: np.ndarray) -> np.ndarray:
    """ln(1 + e^x), stably (max(x, 0) + ln(1 + e^-|x|) is about 5x faster than np.logaddexp)."""
    return np.asarray(np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x))))


def _beta_features(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ln s and −ln(1 − s) of s = sigmoid(x), computed stably."""
    return log_expit(x), _softplus(x)


_PARAM_COUNT: Mapping[Method, int | None] = {
    Method.IDENTITY: 0,
    Method.STS: 1,
    Method.PLATT: 2,
    Method.BETA: 3,
    Method.ISOTONIC: None,
}


@dataclass(frozen=True, slots=True)
class FittedPositionMap:
    """The fitted calibration map of one draft position, with what the fit saw.

    The runtime's map (``runtime_plugin.planner.PositionMap``) is the ``method`` and ``params``
    alone; this one also carries the risk-set size, the STS approximation and any fallback note.

    Attributes:
        position: 1..K.
        method: the map's family.
        params: ``()`` identity; ``(T,)`` sts; ``(a, b)`` platt; ``(a, b, c)`` beta;
            ``(x_1..x_m, p_1..p_m)`` isotonic knots (x strictly increasing, p non-decreasing).
        temperature: the STS temperature, or for other methods the best STS approximation (the
            T whose sigmoid(x/T) is closest in cross-entropy to this map on the fit risk set).
        risk_set_size: rounds in the fit risk set.
        note: why a fallback was used (empty when none).
    """

    position: int
    method: Method
    params: tuple[float, ...]
    temperature: float | None
    risk_set_size: int
    note: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(float(p) for p in self.params))
        where = f"position {self.position}"
        if self.position < 1:
            raise InvalidValueError(f"{where}: position must be >= 1")
        if not all(math.isfinite(p) for p in self.params):
            raise InvalidValueError(f"{where}: params must be finite, got {list(self.params)}")
        expected = _PARAM_COUNT[self.method]
        if expected is not None and len(self.params) != expected:
            raise InvalidValueError(
                f"{where}: {self.method.value} takes {expected} params, got {len(self.params)}"
            )
        if self.method is Method.STS and not self.params[0] > 0:
            raise InvalidValueError(f"{where}: STS temperature must be > 0, got {self.params[0]}")
        if self.method is Method.BETA and (self.params[0] < 0 or self.params[1] < 0):
            raise InvalidValueError(f"{where}: beta map needs a, b >= 0 (monotone), got {list(self.params)}")
        if self.method is Method.ISOTONIC:
            m = len(self.params) // 2
            if len(self.params) % 2 or m == 0:
                raise InvalidValueError(
                    f"{where}: isotonic params are x_1..x_m then p_1..p_m, got {len(self.params)} values"
                )
            kx, kp = np.array(self.params[:m]), np.array(self.params[m:])
            if (np.diff(kx) <= 0).any() or (np.diff(kp) < 0).any() or (kp < 0).any() or (kp > 1).any():
                raise InvalidValueError(
                    f"{where}: isotonic knots must have increasing x and non-decreasing p in [0, 1]"
                )
        if self.temperature is not None and not (math.isfinite(self.temperature) and self.temperature > 0):
            raise InvalidValueError(f"{where}: temperature must be finite and > 0, got {self.temperature}")
        if self.risk_set_size < 0:
            raise InvalidValueError(f"{where}: risk_set_size must be >= 0")

    def conditional(self, x: np.ndarray) -> np.ndarray:
        """p_j for logits ``x`` of this position (float64)."""
        z = np.asarray(x, dtype=np.float64)
        m = self.method
        if m is Method.IDENTITY:
            return np.asarray(expit(z))
        if m is Method.STS:
            return np.asarray(expit(z / self.params[0]))
        if m is Method.PLATT:
            a, b = self.params
            return np.asarray(expit(a * z + b))
        if m is Method.BETA:
            a, b, c = self.params
            f1, f2 = _beta_features(z)
            return np.asarray(expit(a * f1 + b * f2 + c))
        half = len(self.params) // 2
        return np.asarray(np.interp(z, np.asarray(self.params[:half]), np.asarray(self.params[half:])))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "position": self.position,
            "method": self.method.value,
            "params": list(self.params),
            "temperature": self.temperature,
            "risk_set_size": self.risk_set_size,
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FittedPositionMap:
        """Inverse of :meth:`to_dict`.

        Raises:
            InvalidValueError: unknown method or invalid params.
        """
        return cls(
            position=int(data["position"]),
            method=Method(data["method"]),
            params=tuple(data.get("params") or ()),
            temperature=data.get("temperature"),
            risk_set_size=int(data.get("risk_set_size", 0)),
            note=str(data.get("note", "")),
        )


@dataclass(frozen=True, slots=True)
class FittedCalibration:
    """The result of fitting a K-position draft block: one fitted map per position.

    The runtime's selector takes ``runtime_plugin.planner.Calibration`` (maps only), built from
    the signed ``calibration`` table this result is written to.

    Attributes:
        method: the method that was asked for or selected (a row may have fallen back).
        positions: one map per position, in order 1..K.
    """

    method: str
    positions: tuple[FittedPositionMap, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.positions:
            raise InvalidValueError("a calibration needs at least one position")
        if [p.position for p in self.positions] != list(range(1, len(self.positions) + 1)):
            raise InvalidValueError("calibration positions must be 1..K in order")

    @property
    def k(self) -> int:
        """Draft length."""
        return len(self.positions)

    def conditional(self, logits: np.ndarray) -> np.ndarray:
        """(n, K) conditional acceptance probabilities p_j.

        Raises:
            InvalidValueError: ``logits`` does not have K columns.
        """
        if logits.ndim != 2 or logits.shape[1] != self.k:
            raise InvalidValueError(f"logits have shape {logits.shape}; this calibration needs (n, {self.k})")
        out = np.empty(logits.shape, dtype=np.float64)
        for pm in self.positions:
            out[:, pm.position - 1] = pm.conditional(logits[:, pm.position - 1])
        return out

    def survival(self, logits: np.ndarray) -> np.ndarray:
        """(n, K) prefix survival S_j = p_1 ⋯ p_j (non-increasing along each row)."""
        return np.cumprod(self.conditional(logits), axis=1)

    @property
    def is_sts(self) -> bool:
        """True when every position is an STS map (identity counts: it is T = 1)."""
        return all(p.method in (Method.STS, Method.IDENTITY) for p in self.positions)

    def sts_temperatures(self) -> tuple[float, ...]:
        """T_1..T_K: exact for STS positions, the best STS approximation elsewhere.

        Raises:
            InvalidValueError: a position has no temperature.
        """
        temps = []
        for p in self.positions:
            if p.method is Method.STS:
                temps.append(p.params[0])
            elif p.method is Method.IDENTITY:
                temps.append(p.temperature if p.temperature is not None else 1.0)
            elif p.temperature is None:
                raise InvalidValueError(f"position {p.position}: no STS approximation was computed")
            else:
                temps.append(p.temperature)
        return tuple(temps)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"method": self.method, "k": self.k, "positions": [p.to_dict() for p in self.positions]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FittedCalibration:
        """Inverse of :meth:`to_dict`.

        Raises:
            InvalidValueError: invalid positions.
        """
        return cls(
            method=str(data["method"]),
            positions=tuple(FittedPositionMap.from_dict(p) for p in data["positions"]),
        )

    @classmethod
    def from_temperatures(cls, temperatures: Sequence[float], *, method: str = "sts") -> FittedCalibration:
        """An STS calibration from T_1..T_K (e.g. from an ``sts.json``)."""
        return cls(
            method=method,
            positions=tuple(
                FittedPositionMap(j, Method.STS, (float(t),), float(t), 0)
                for j, t in enumerate(temperatures, start=1)
            ),
        )


# --------------------------------------------------------------------------------------------
# Solvers


def _sts_slope(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, str]:
    """Maximum-likelihood a = 1/T in [1/T_MAX, 1/T_MIN] for p = sigmoid(a·x) (labels may be soft).

    The score Σ w (sigmoid(a x) − y) x increases with a, so the bounded root is found by Newton
    steps kept inside a shrinking bracket (bisection when a step leaves it).
    """
    lo, hi = 1.0 / T_MAX, 1.0 / T_MIN
    if float((w * x * x).sum()) == 0.0:
        return 1.0, "logits are all zero; identity temperature T=1"

    def score(a: float) -> float:
        return float((w * (expit(a * x) - y) * x).sum())

    if score(lo) >= 0.0:
        return lo, f"temperature at its upper bound T={T_MAX:g}; logits carry almost no information here"
    if score(hi) <= 0.0:
        return hi, f"temperature at its lower bound T={T_MIN:g}; labels are (nearly) separable by the logits"
    a, b_lo, b_hi = 1.0, lo, hi
    scale = float((w * np.abs(x)).sum())
    for _ in range(200):
        s = expit(a * x)
        g = float((w * (s - y) * x).sum())
        if abs(g) <= 1e-13 * scale:
            break
        if g > 0:
            b_hi = a
        else:
            b_lo = a
        h = float((w * s * (1.0 - s) * x * x).sum())
        nxt = a - g / h if h > 0 else 0.5 * (b_lo + b_hi)
        if not b_lo < nxt < b_hi:
            nxt = 0.5 * (b_lo + b_hi)
        if abs(nxt - a) <= 1e-14 * a:
            a = nxt
            break
        a = nxt
    return a, ""


def _objective(F: np.ndarray, theta: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    z = F @ theta
    return float((w * (_softplus(z) - y * z)).sum())


def _newton_logistic(
    F: np.ndarray, y: np.ndarray, w: np.ndarray, theta0: np.ndarray
) -> tuple[np.ndarray, bool]:
    """Minimise the weighted logistic loss of z = F·θ by damped Newton steps.

    Returns:
        θ and whether it converged (gradient below tolerance, parameters finite and bounded).
    """
    total = float(w.sum())
    theta = theta0.astype(np.float64).copy()
    f = _objective(F, theta, y, w)
    d = F.shape[1]
    for _ in range(100):
        s = expit(F @ theta)
        g = F.T @ (w * (s - y)) / total
        if float(np.abs(g).max()) < 1e-10:
            return theta, True
        h = (F.T * (w * s * (1.0 - s))) @ F / total + 1e-12 * np.eye(d)
        try:
            step = np.linalg.solve(h, g)
        except np.linalg.LinAlgError:
            return theta, False
        t = 1.0
        decrease = float(g @ step) * total
        while t > 1e-12:
            cand = theta - t * step
            fc = _objective(F, cand, y, w)
            if fc <= f - 1e-4 * t * decrease:
                break
            t *= 0.5
        else:
            return theta, float(np.abs(g).max()) < 1e-6
        theta, f = cand, fc
        if not np.all(np.isfinite(theta)) or float(np.abs(theta).max()) > _PARAM_LIMIT:
            return theta, False
    s = expit(F @ theta)
    g = F.T @ (w * (s - y)) / total
    return theta, float(np.abs(g).max()) < 1e-6


def _fit_sts(rs: RiskSet, note: str = "") -> FittedPositionMap:
    a, bound_note = _sts_slope(rs.x, rs.y, rs.w)
    t = 1.0 / a
    return FittedPositionMap(rs.position, Method.STS, (t,), t, rs.size, _join(note, bound_note))


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def _fit_platt(rs: RiskSet, note: str = "") -> FittedPositionMap:
    F = np.column_stack([rs.x, np.ones_like(rs.x)])
    theta, ok = _newton_logistic(F, rs.y, rs.w, np.array([1.0, 0.0]))
    if not ok:
        return _fit_sts(rs, _join(note, "platt fit did not converge; STS used"))
    return FittedPositionMap(
        rs.position, Method.PLATT, (float(theta[0]), float(theta[1])), None, rs.size, note
    )


def _fit_beta(rs: RiskSet, note: str = "") -> FittedPositionMap:
    f1, f2 = _beta_features(rs.x)
    one = np.ones_like(rs.x)
    theta, ok = _newton_logistic(np.column_stack([f1, f2, one]), rs.y, rs.w, np.array([1.0, 1.0, 0.0]))
    if ok and theta[0] >= 0 and theta[1] >= 0:
        return FittedPositionMap(
            rs.position, Method.BETA, tuple(float(t) for t in theta), None, rs.size, note
        )
    if ok:
        # Kull et al.: a negative shape coefficient is set to zero and the rest refitted, which
        # keeps the map monotone in the logit.
        drop = 0 if theta[0] < theta[1] else 1
        keep_feature = f2 if drop == 0 else f1
        sub, ok2 = _newton_logistic(np.column_stack([keep_feature, one]), rs.y, rs.w, np.array([1.0, 0.0]))
        if ok2 and sub[0] >= 0:
            params = (0.0, float(sub[0]), float(sub[1])) if drop == 0 else (float(sub[0]), 0.0, float(sub[1]))
            return FittedPositionMap(rs.position, Method.BETA, params, None, rs.size, note)
    return _fit_sts(rs, _join(note, "beta fit did not converge to a monotone map; STS used"))


def _fit_isotonic(rs: RiskSet, note: str = "") -> FittedPositionMap:
    ux, inv = np.unique(rs.x, return_inverse=True)
    inv = inv.reshape(-1)
    weights = np.bincount(inv, weights=rs.w)
    accepted = np.bincount(inv, weights=rs.w * rs.y)
    res = isotonic_regression(accepted / weights, weights=weights, increasing=True)
    starts = np.asarray(res.blocks[:-1])
    ends = np.asarray(res.blocks[1:]) - 1
    block_w = np.add.reduceat(weights, starts)
    block_a = np.add.reduceat(accepted, starts)
    rate = (block_a + _ISOTONIC_PRIOR) / (block_w + 2.0 * _ISOTONIC_PRIOR)
    rate = np.maximum.accumulate(rate)  # smoothing can break ties between pooled blocks
    kx = np.column_stack([ux[starts], ux[ends]]).reshape(-1)
    kp = np.repeat(rate, 2)
    keep = np.r_[True, np.diff(kx) > 0]
    kx, kp = kx[keep], kp[keep]
    return FittedPositionMap(rs.position, Method.ISOTONIC, (*kx.tolist(), *kp.tolist()), None, rs.size, note)


def _with_sts_approximation(pm: FittedPositionMap, rs: RiskSet) -> FittedPositionMap:
    if pm.method in (Method.STS, Method.IDENTITY) or rs.size == 0:
        return pm
    q = pm.conditional(rs.x)
    a, _ = _sts_slope(rs.x, q, rs.w)
    return FittedPositionMap(pm.position, pm.method, pm.params, 1.0 / a, pm.risk_set_size, pm.note)


def fit_position(rs: RiskSet, method: Method, *, sts_approx: bool = True) -> FittedPositionMap:
    """Fit one position's map, falling back to simpler maps where the data cannot carry it.

    Fallbacks (each recorded in ``note``): empty risk set → identity (T = 1); isotonic below
    :data:`ISOTONIC_MIN_RISK_SET` rounds or with one label → Platt; Platt/beta below
    :data:`PARAMETRIC_MIN_RISK_SET` rounds, with one label, or not converging → STS.

    Args:
        rs: the position's risk set.
        method: the family to fit (not ``identity``).
        sts_approx: also compute the best STS approximation of non-STS maps.
    """
    if rs.size == 0:
        return FittedPositionMap(
            rs.position,
            Method.IDENTITY,
            (),
            1.0,
            0,
            "empty risk set: no round reached this position; identity map (T=1)",
        )
    note = ""
    if method is Method.ISOTONIC and (rs.size < ISOTONIC_MIN_RISK_SET or rs.degenerate):
        note = (
            f"risk set of {rs.size} rounds is too small for isotonic (needs {ISOTONIC_MIN_RISK_SET}); "
            "Platt used"
        )
        method = Method.PLATT
    if method in (Method.PLATT, Method.BETA) and (rs.size < PARAMETRIC_MIN_RISK_SET or rs.degenerate):
        why = (
            "all rounds have one label"
            if rs.degenerate
            else f"risk set of {rs.size} rounds is below {PARAMETRIC_MIN_RISK_SET}"
        )
        note = _join(note, f"{why}; STS (one parameter) used instead of {method.value}")
        method = Method.STS
    if method is Method.STS:
        pm = _fit_sts(rs, note)
    elif method is Method.PLATT:
        pm = _fit_platt(rs, note)
    elif method is Method.BETA:
        pm = _fit_beta(rs, note)
    elif method is Method.ISOTONIC:
        pm = _fit_isotonic(rs, note)
    else:
        raise InvalidValueError(f"cannot fit method {method.value!r}")
    return _with_sts_approximation(pm, rs) if sts_approx else pm


def _fit_platt_shared(risk_sets: Sequence[RiskSet], sts_approx: bool) -> tuple[FittedPositionMap, ...]:
    """Platt maps with one slope shared by the eligible positions and an intercept each."""
    eligible = [rs for rs in risk_sets if rs.size >= PARAMETRIC_MIN_RISK_SET and not rs.degenerate]
    maps: dict[int, FittedPositionMap] = {}
    if eligible:
        m = len(eligible)
        x = np.concatenate([rs.x for rs in eligible])
        y = np.concatenate([rs.y for rs in eligible])
        w = np.concatenate([rs.w for rs in eligible])
        onehot = np.zeros((x.shape[0], m))
        row = 0
        for i, rs in enumerate(eligible):
            onehot[row : row + rs.x.shape[0], i] = 1.0
            row += rs.x.shape[0]
        theta, ok = _newton_logistic(np.column_stack([x, onehot]), y, w, np.r_[1.0, np.zeros(m)])
        for i, rs in enumerate(eligible):
            if ok:
                maps[rs.position] = FittedPositionMap(
                    rs.position,
                    Method.PLATT,
                    (float(theta[0]), float(theta[1 + i])),
                    None,
                    rs.size,
                    "shared slope",
                )
            else:
                maps[rs.position] = _fit_sts(rs, "shared-slope Platt did not converge; STS used")
    out = []
    for rs in risk_sets:
        pm = maps.get(rs.position) or fit_position(rs, Method.PLATT, sts_approx=False)
        out.append(_with_sts_approximation(pm, rs) if sts_approx else pm)
    return tuple(out)


def fit_calibration(
    risk_sets: Sequence[RiskSet], method: Method, *, shared_slope: bool = False, sts_approx: bool = True
) -> FittedCalibration:
    """Fit one map per position.

    Args:
        risk_sets: the K compressed risk sets (position order).
        method: the family (``sts``, ``platt``, ``beta``, ``isotonic``).
        shared_slope: Platt only: one slope for every position.
        sts_approx: compute the best STS approximation of non-STS maps.
    """
    if method is Method.PLATT and shared_slope:
        return FittedCalibration(method.value, _fit_platt_shared(risk_sets, sts_approx))
    return FittedCalibration(
        method.value, tuple(fit_position(rs, method, sts_approx=sts_approx) for rs in risk_sets)
    )


def risk_set_nll(pm: FittedPositionMap, rs: RiskSet) -> float:
    """Summed Bernoulli NLL (nats) of a map on a risk set's points."""
    if rs.size == 0:
        return 0.0
    p = np.clip(pm.conditional(rs.x), PROB_EPS, 1.0 - PROB_EPS)
    return float(-(rs.w * (rs.y * np.log(p) + (1.0 - rs.y) * np.log1p(-p))).sum())


def cross_validated_nll(
    risk_sets: Sequence[RiskSet], method: Method, n_folds: int, rounds: int, *, shared_slope: bool = False
) -> float:
    """Mean held-out NLL of the accepted length per round, by request-grouped folds.

    The risk sets must carry folds assigned by request. For each fold, the maps are fitted on the
    other folds and scored on it; the accepted-length NLL is the sum of the positions' NLLs.
    """
    total = 0.0
    for f in range(n_folds):
        train = [rs.part(f, keep=False) for rs in risk_sets]
        test = [rs.part(f, keep=True) for rs in risk_sets]
        cal = fit_calibration(train, method, shared_slope=shared_slope, sts_approx=False)
        total += sum(risk_set_nll(pm, rs) for pm, rs in zip(cal.positions, test, strict=True))
    return total / max(rounds, 1)


def select_method(
    risk_sets: Sequence[RiskSet],
    n_folds: int,
    rounds: int,
    *,
    candidates: Sequence[Method] = FIT_METHODS,
    shared_slope: bool = False,
) -> tuple[Method, dict[str, float]]:
    """Choose the method with the lowest cross-validated NLL (ties go to the simpler, earlier one).

    Returns:
        The method and every candidate's mean held-out NLL per round.
    """
    scores = {
        m.value: cross_validated_nll(risk_sets, m, n_folds, rounds, shared_slope=shared_slope)
        for m in candidates
    }
    best = min(candidates, key=lambda m: (round(scores[m.value], 12), candidates.index(m)))
    return best, scores


def fit_sts_grid(
    logits: np.ndarray,
    accepted: np.ndarray,
    verified: np.ndarray,
    *,
    grid: Sequence[float] = STS_GRID,
    n_bins: int = ECE_BINS,
) -> FittedCalibration:
    """The grid baseline: per position, left to right, the grid temperature minimising the
    equal-width ECE of the running product S_j against 1[A ≥ j] (rounds with verified ≥ j).

    Kept for comparison with the maximum-likelihood fit; it needs one pass over the rounds per
    grid point and position.
    """
    n, k = logits.shape
    s_prev = np.ones(n, dtype=np.float32)
    maps = []
    for j in range(1, k + 1):
        lab = verified >= j
        risk = int(((accepted >= j - 1) & lab).sum())
        if not lab.any():
            maps.append(
                FittedPositionMap(j, Method.IDENTITY, (), 1.0, 0, "no labelled rounds; identity map (T=1)")
            )
            continue
        x = logits[lab, j - 1].astype(np.float32, copy=False)
        sp = s_prev[lab]
        y = (accepted[lab] >= j).astype(np.float64)
        best_t, best_e = 1.0, math.inf
        for t in grid:
            e = binned_ece(sp * expit(x * np.float32(1.0 / t)), y, n_bins)
            if e < best_e:
                best_t, best_e = float(t), e
        maps.append(FittedPositionMap(j, Method.STS, (best_t,), best_t, risk, "grid baseline"))
        s_prev *= expit(logits[:, j - 1] * np.float32(1.0 / best_t))
    return FittedCalibration("sts-grid", tuple(maps))

