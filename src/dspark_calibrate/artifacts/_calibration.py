"""The calibration document: per-position maps from a confidence logit to an acceptance probability.

One :class:`PositionMap` per draft position 1..K and their :class:`Calibration`, read from the
rows of a verified ``calibration`` table (:meth:`Calibration.from_rows`) or built from STS
temperatures (:meth:`Calibration.sts`). The selector applies it to every step's logits; the STS
branch is the division TensorRT-LLM applies. Validates itself on construction.

Pure numpy: no file, clock or GPU access.

Example:
    >>> Calibration.sts([2.0, 1.0]).sts_temperatures()
    (2.0, 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dspark_calibrate.errors import ConfigError

__all__ = ["CALIBRATION_METHODS", "Calibration", "PositionMap"]

#: Calibration maps understood here (the ``method`` column of a ``calibration`` table).
CALIBRATION_METHODS: tuple[str, ...] = ("sts", "platt", "beta", "isotonic", "identity")


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return _sigmoid_inplace(np.array(z, dtype=np.float64))


def _sigmoid_inplace(out: np.ndarray) -> np.ndarray:
    # 1 / (1 + exp(-z)), overwriting ``out``; exp overflows to inf for z < -709 and the result is
    # then exactly 0.0, the correctly rounded value.
    np.negative(out, out=out)
    with np.errstate(over="ignore"):
        np.exp(out, out=out)
    out += 1.0
    np.reciprocal(out, out=out)
    return out


def _log_sigmoid(z: np.ndarray) -> np.ndarray:
    # log(sigmoid(z)) = -softplus(-z), computed without overflow.
    out: np.ndarray = -np.logaddexp(0.0, -z)
    return out


@dataclass(frozen=True, slots=True)
class PositionMap:
    """The calibration map of one draft position: raw confidence logit -> acceptance probability.

    Methods and their ``params`` (the layout ``fit`` writes in the ``calibration`` table):

    - ``sts``: ``[T]``; p = sigmoid(x / T) (TensorRT-LLM's runtime map).
    - ``platt``: ``[a, b]``; p = sigmoid(a * x + b).
    - ``beta``: ``[a, b, c]``; with s = sigmoid(x), p = sigmoid(a * ln s - b * ln(1 - s) + c).
    - ``isotonic``: ``[x_1..x_m, y_1..y_m]``; piecewise-linear in x through the m knots, constant
      outside them, y non-decreasing in [0, 1].
    - ``identity``: ``[]``; p = sigmoid(x).
    """

    method: str
    params: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        params = tuple(float(p) for p in self.params)
        object.__setattr__(self, "params", params)
        m = self.method
        if m not in CALIBRATION_METHODS:
            raise ConfigError(f"calibration method {m!r} is unknown; known: {', '.join(CALIBRATION_METHODS)}")
        if not all(math.isfinite(p) for p in params):
            raise ConfigError(f"calibration {m} params must be finite, got {list(params)}")
        want = {"sts": 1, "platt": 2, "beta": 3, "identity": 0}
        if m in want and len(params) != want[m]:
            raise ConfigError(f"calibration {m} needs {want[m]} param(s), got {len(params)}")
        if m == "sts" and params[0] <= 0:
            raise ConfigError(f"STS temperature must be > 0, got {params[0]}")
        if m == "isotonic":
            if len(params) < 2 or len(params) % 2:
                raise ConfigError("isotonic params must be [x_1..x_m, y_1..y_m] with m >= 1")
            half = len(params) // 2
            xs, ys = np.asarray(params[:half]), np.asarray(params[half:])
            if np.any(np.diff(xs) <= 0) or np.any(np.diff(ys) < 0) or ys.min() < 0 or ys.max() > 1:
                raise ConfigError("isotonic knots need increasing x and non-decreasing y in [0, 1]")

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """Acceptance probabilities (float64) for an array of raw logits."""
        x = np.asarray(logits, dtype=np.float64)
        m, p = self.method, self.params
        if m == "sts":
            return _sigmoid(x / p[0])
        if m == "platt":
            return _sigmoid(p[0] * x + p[1])
        if m == "beta":
            z = p[0] * _log_sigmoid(x) - p[1] * _log_sigmoid(-x) + p[2]
            return _sigmoid(z)
        if m == "isotonic":
            half = len(p) // 2
            out: np.ndarray = np.interp(x, np.asarray(p[:half]), np.asarray(p[half:]))
            return out
        return _sigmoid(x)


@dataclass(frozen=True, slots=True)
class Calibration:
    """Per-position maps for positions 1..K; survivals are their cumulative products."""

    maps: tuple[PositionMap, ...]
    _sts: np.ndarray | None = field(init=False, repr=False, compare=False, hash=False)
    # (K, 1) of -T: x / (-T) is exactly -(x / T) (IEEE division is sign-symmetric), so the
    # serving path folds sigmoid's negation into the division and saves one numpy call.
    _neg_sts: np.ndarray | None = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.maps:
            raise ConfigError("calibration needs one map per draft position")
        object.__setattr__(self, "maps", tuple(self.maps))
        if all(m.method == "sts" for m in self.maps):
            # (K, 1) temperatures: p = sigmoid(logit / T), the division TensorRT-LLM applies.
            temperatures = np.array([[m.params[0]] for m in self.maps])
            negated = -temperatures
            negated.flags.writeable = False
            object.__setattr__(self, "_sts", temperatures)
            object.__setattr__(self, "_neg_sts", negated)
        else:
            object.__setattr__(self, "_sts", None)
            object.__setattr__(self, "_neg_sts", None)

    @property
    def negated_sts_column(self) -> np.ndarray | None:
        """(K, 1) read-only array of −T when every position is STS, else None.

        ``x / (−T)`` is exactly ``−(x / T)`` (IEEE division is sign-symmetric), so a hot path can
        fold sigmoid's negation into the division (the host planner does).
        """
        return self._neg_sts

    @property
    def k(self) -> int:
        """The number of positions (K)."""
        return len(self.maps)

    @classmethod
    def sts(cls, temperatures: Sequence[float]) -> Calibration:
        """STS with one temperature per position (what TensorRT-LLM applies)."""
        return cls(tuple(PositionMap("sts", (float(t),)) for t in temperatures))

    @classmethod
    def identity(cls, k: int) -> Calibration:
        """Plain sigmoid at every position."""
        return cls(tuple(PositionMap("identity") for _ in range(k)))

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], *, use: str = "native") -> Calibration:
        """From ``calibration`` table rows (``position``, ``method``, ``temperature``, ``params``).

        Args:
            rows: one row per position 1..K.
            use: ``native`` applies each position's fitted map; ``sts`` applies the ``temperature``
                column (the STS fit, or the fit's best STS approximation), which is what
                TensorRT-LLM's runtime applies.

        Raises:
            ConfigError: positions do not cover 1..K, or a map is invalid.
        """
        if use not in ("native", "sts"):
            raise ConfigError(f"calibration use must be 'native' or 'sts', got {use!r}")
        by_pos = {int(r["position"]): r for r in rows}
        k = len(by_pos)
        if sorted(by_pos) != list(range(1, k + 1)) or k == 0:
            raise ConfigError(f"calibration positions {sorted(by_pos)} do not cover 1..K")
        maps = []
        for j in range(1, k + 1):
            r = by_pos[j]
            if use == "sts":
                t = r.get("temperature")
                if t is None and r.get("method") == "identity":
                    t = 1.0
                if t is None or not math.isfinite(float(t)):
                    raise ConfigError(
                        f"calibration position {j} ({r.get('method')}) has no STS temperature; re-run fit, "
                        "which records the best STS approximation of every method"
                    )
                maps.append(PositionMap("sts", (float(t),)))
            else:
                maps.append(PositionMap(str(r["method"]), tuple(r.get("params") or ())))
        return cls(tuple(maps))

    def sts_temperatures(self) -> tuple[float, ...] | None:
        """The temperatures when every position is STS, else None."""
        if self._sts is None:
            return None
        return tuple(m.params[0] for m in self.maps)

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """Acceptance probabilities (n, K) float64 from raw logits (n, K)."""
        x = np.asarray(logits, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.k:
            raise ConfigError(f"logits must have shape (rows, K={self.k}), got {x.shape}")
        if self._sts is not None:
            return _sigmoid_inplace(x / self._sts[:, 0])
        return np.stack([m.apply(x[:, j]) for j, m in enumerate(self.maps)], axis=1)

    def survival(self, logits: np.ndarray) -> np.ndarray:
        """Survivals S_j = prod_{i<=j} p_i, shape (n, K), non-increasing along j."""
        x = np.asarray(logits, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.k:
            raise ConfigError(f"logits must have shape (rows, K={self.k}), got {x.shape}")
        return self.survival_t(np.ascontiguousarray(x.T)).T

    def survival_t(self, logits_t: np.ndarray) -> np.ndarray:
        """Survivals in position-major layout: (K, n) logits in, (K, n) float64 survivals out.

        The product is taken position by position (left to right), the order the engine uses.
        """
        x = np.asarray(logits_t, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] != self.k:
            raise ConfigError(f"position-major logits must have shape (K={self.k}, rows), got {x.shape}")
        if self._sts is not None:
            out = _sigmoid_inplace(np.divide(x, self._sts, order="C"))
        else:
            out = np.stack([m.apply(x[j]) for j, m in enumerate(self.maps)], axis=0)
        for j in range(1, self.k):
            np.multiply(out[j - 1], out[j], out=out[j])
        return out
