"""A between-epoch variance component by restricted maximum likelihood, with its profile interval.

Pure: numpy and scipy over plain numbers; no clock, no I/O.

The model
---------
Several *series* (one per cell, or one per cell's log-ratio to its native cell) are observed in
*epochs* (capture epochs or passes) of a few rounds each::

    y[s, e, i] = μ_s + δ[s, e] + ε[s, e, i],   δ ~ N(0, σ²) for every series,   ε ~ N(0, τ_s²)

σ is what a new epoch (a capture again, a new process) shifts a series by; τ_s is each series' own
round-to-round noise. σ is shared by the series (it is pooled over them), τ_s is not: a cell at a
small G is noisier than one at a large G.

Why not the method of moments
-----------------------------
Subtracting the epoch means' sampling noise from their spread and flooring the difference at 0
returns exactly 0 whenever the noise is the larger of the two: with about three rounds per epoch
an epoch mean carries 2-3% of noise on an H200 at its power cap, so every sweep reported 0. A 0
floored that way is not "no variation"; it is "this design cannot see it". The restricted
likelihood uses the within-epoch rounds for τ_s and the epoch means for σ² + τ_s²/n at once, so it
weighs each epoch by what it knows; its profile-likelihood interval says how large σ may still be
(:attr:`VarianceComponent.upper`), and :attr:`VarianceComponent.resolvable` states the smallest σ
the design resolves at all.

The restricted log-likelihood, up to a constant, for one series with epoch means ȳ_e over n_e
rounds, within-epoch sum of squares W and N − E within degrees of freedom (v_e = σ² + τ²/n_e,
w_e = 1/v_e, μ̂ the w-weighted mean)::

    −2ℓ = (N − E)·log τ² + W/τ² + Σ_e log v_e + log Σ_e w_e + Σ_e w_e (ȳ_e − μ̂)²

summed over series. Given σ² the series are independent, so each τ_s is fitted by its own Newton
iteration on the analytic gradient (:func:`_profile`); a bounded search over σ² ≥ 0 minimises the
resulting profile, and the interval is where the profile stays within the χ²₁ quantile of its
minimum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq, minimize_scalar
from scipy.stats import chi2

__all__ = ["CLIP_SDS", "MAX_EPOCHS_FACTOR", "VarianceComponent", "design_effect", "reml_component"]

#: Bounds of log(τ²/c) (c: the pooled within variance) and of σ²/c for the optimiser.
_LOG_TAU_BOUNDS = (-25.0, 25.0)
_MAX_SIGMA2 = 1e6


@dataclass(frozen=True, slots=True)
class VarianceComponent:
    """σ, the between-epoch SD shared by the series (units of the values: log scale in a sweep).

    Attributes:
        estimate: the REML estimate (it may be 0: the likelihood's maximum on the boundary, not a
            floored difference; ``low`` = 0 then says the design did not resolve it).
        low, high: the profile-likelihood interval at ``confidence`` (``low`` = 0 when σ = 0 lies
            inside it; NaN for an end not asked for).
        resolvable: the smallest σ the design resolves: with it, the interval excludes 0 in a
            fifth to two fifths of sweeps, with twice it in most (:func:`_resolvable`).
        series: series that contributed (two or more epochs and at least one within degree of
            freedom).
        between_df: Σ (epochs − 1) over those series.
        within_df: Σ (rounds − epochs) over those series.
        confidence: the interval's level.
        epochs_factor: with a ``target`` σ, how many times its epochs the design needs (each as
            many rounds and as noisy as its own) to resolve it: 1 where it already does, None
            without a target or a series, or past :data:`MAX_EPOCHS_FACTOR` (:func:`_epochs_factor`).
    """

    estimate: float
    low: float
    high: float
    resolvable: float
    series: int
    between_df: int
    within_df: int
    confidence: float
    epochs_factor: int | None = None

    @property
    def resolvable_or_none(self) -> float | None:
        """:attr:`resolvable` where the design resolves some σ; None without a series, or where no
        σ the optimiser reaches would be (never a non-finite number in a sweep's JSON)."""
        return self.resolvable if self.series and math.isfinite(self.resolvable) else None

    @property
    def resolved(self) -> bool:
        """True when σ = 0 lies outside the interval: a shift was measured, not only bounded."""
        return self.low > 0.0


#: What nothing to estimate from gives: no series, no interval.
EMPTY = VarianceComponent(0.0, 0.0, 0.0, math.inf, 0, 0, 0, 0.95)


@dataclass(frozen=True, slots=True)
class _Design:
    """The series as padded (S, E) arrays, scaled by the pooled within variance ``scale``."""

    means: np.ndarray  # epoch means / sqrt(scale)
    counts: np.ndarray  # rounds per epoch (1 where padded)
    mask: np.ndarray  # True where an epoch exists
    within: np.ndarray  # (S,) within-epoch sums of squares / scale
    within_df: np.ndarray  # (S,)
    scale: float


#: Rounds further than this many robust SDs (1.4826 × MAD) from their series' median are pulled in
#: to that distance before the fit: a round hit by one wild sample (a stray interrupt, a clock dip)
#: would otherwise weigh in a Gaussian likelihood like dozens of ordinary rounds.
CLIP_SDS = 4.0
_MAD_TO_SD = 1.482602218505602


def _clipped(values: Mapping[int, float]) -> dict[int, float]:
    """``values`` with the rounds beyond :data:`CLIP_SDS` robust SDs of the median pulled in."""
    v = np.array(list(values.values()), dtype=np.float64)
    centre = float(np.median(v))
    spread = CLIP_SDS * _MAD_TO_SD * float(np.median(np.abs(v - centre)))
    if spread <= 0.0:
        return dict(values)
    return dict(zip(values, np.clip(v, centre - spread, centre + spread).tolist(), strict=True))


def _series_stats(
    values: Mapping[int, float], epoch_of: Mapping[int, int]
) -> tuple[list[float], list[int], float]:
    """(epoch means, rounds per epoch, within-epoch sum of squares) of one series, wild rounds
    pulled in (:data:`CLIP_SDS`)."""
    groups: dict[int, list[float]] = {}
    for r, v in _clipped(values).items():
        groups.setdefault(epoch_of[r], []).append(v)
    means, counts, within = [], [], 0.0
    for e in sorted(groups):
        g = np.asarray(groups[e], dtype=np.float64)
        means.append(float(g.mean()))
        counts.append(int(g.size))
        within += float(np.sum(np.square(g - g.mean())))
    return means, counts, within


def _design(series: Sequence[tuple[Mapping[int, float], Mapping[int, int]]]) -> _Design | None:
    stats = [_series_stats(v, e) for v, e in series]
    keep = [(m, n, w) for m, n, w in stats if len(m) >= 2 and sum(n) - len(n) >= 1]
    if not keep:
        return None
    width = max(len(m) for m, _, _ in keep)
    means = np.zeros((len(keep), width))
    counts = np.ones((len(keep), width))
    mask = np.zeros((len(keep), width), dtype=bool)
    within = np.array([w for _, _, w in keep])
    within_df = np.array([sum(n) - len(n) for _, n, _ in keep], dtype=np.float64)
    for i, (m, n, _) in enumerate(keep):
        means[i, : len(m)] = m
        counts[i, : len(n)] = n
        mask[i, : len(m)] = True
    scale = float(within.sum() / within_df.sum())
    if not scale > 0.0:
        # Every round of an epoch equal (a noiseless simulation): scale by the epoch means' spread.
        centred = np.where(
            mask, means - (means * mask).sum(1, keepdims=True) / mask.sum(1, keepdims=True), 0.0
        )
        scale = float(np.sum(centred**2)) / max(int(mask.sum()) - len(keep), 1) or 1.0
    # Values in units of sqrt(scale), so that σ²/c and τ²/c are of order 1 for the optimiser.
    return _Design(means / math.sqrt(scale), counts, mask, within / scale, within_df, scale)


def _objective(x: float, t: np.ndarray, d: _Design) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per series, −2 × the restricted log-likelihood (up to a constant) at σ²/c = ``x`` and
    log(τ_s²/c) = ``t``, with its derivatives in ``x`` and in ``t``."""
    tau2 = np.exp(t)
    v = np.where(d.mask, x + tau2[:, None] / d.counts, 1.0)
    w = np.where(d.mask, 1.0 / v, 0.0)
    sw = w.sum(1)
    mu = (w * d.means).sum(1) / sw
    r2 = np.where(d.mask, (d.means - mu[:, None]) ** 2, 0.0)
    value = (
        d.within_df * t
        + d.within / tau2
        + np.sum(np.where(d.mask, np.log(v), 0.0), axis=1)
        + np.log(sw)
        + np.sum(w * r2, axis=1)
    )
    # d(−2ℓ)/dv_e; μ̂ is the optimum of the quadratic term, so its own change does not count.
    g = w - w**2 / sw[:, None] - w**2 * r2
    grad_x = g.sum(1)
    grad_t = d.within_df - d.within / tau2 + tau2 * np.sum(g / d.counts, axis=1)
    return value, grad_x, grad_t


#: Newton iterations of the per-series τ fit, and the step that estimates its curvature.
_NEWTON_STEPS = 40
_CURVATURE_STEP = 1e-4


def _profile(x: float, t0: np.ndarray, d: _Design) -> tuple[float, np.ndarray]:
    """min over log τ_s² of −2ℓ at σ²/c = ``x``: the series are independent given σ², so each
    τ_s is fitted by its own safeguarded Newton iteration, all series at once."""
    t = np.clip(t0, *_LOG_TAU_BOUNDS)
    value, _, grad = _objective(x, t, d)
    for _ in range(_NEWTON_STEPS):
        curvature = (_objective(x, t + _CURVATURE_STEP, d)[2] - grad) / _CURVATURE_STEP
        step = np.where(curvature > 0, -grad / np.where(curvature > 0, curvature, 1.0), -np.sign(grad))
        step = np.clip(step, -2.0, 2.0)
        for _ in range(20):  # halve the steps that do not lower their series' value
            trial = np.clip(t + step, *_LOG_TAU_BOUNDS)
            v_trial, _, g_trial = _objective(x, trial, d)
            worse = v_trial > value + 1e-12
            if not worse.any():
                break
            step = np.where(worse, step / 2.0, step)
        t, value, grad = trial, np.where(worse, value, v_trial), np.where(worse, grad, g_trial)
        if float(np.max(np.abs(step))) < 1e-5:
            break
    return float(value.sum()), t


def _fit(d: _Design, x0: float, t0: np.ndarray) -> tuple[float, float, np.ndarray]:
    """The joint minimum (value, σ²/c, log τ²/c): a bounded 1-D search of the profile over
    σ/sqrt(c) (so its tolerance is relative to σ, not σ²), with σ = 0 as a candidate of its own
    (the bounded search never evaluates its end point)."""
    cache: dict[str, np.ndarray] = {"t": t0}

    def prof(u: float) -> float:
        value, t = _profile(u * u, cache["t"], d)
        cache["t"] = t
        return value

    upper = math.sqrt(max(10.0 * x0, 10.0))
    while prof(upper) < prof(upper / 2.0) and upper * upper < _MAX_SIGMA2:
        upper *= 2.0
    res = minimize_scalar(prof, bounds=(0.0, upper), method="bounded", options={"xatol": 1e-3 * upper})
    at_zero, t_zero = _profile(0.0, t0, d)
    if at_zero <= float(res.fun):
        return at_zero, 0.0, t_zero
    x = float(res.x) ** 2
    value, t = _profile(x, cache["t"], d)
    return value, x, t


def _start(d: _Design) -> tuple[float, np.ndarray]:
    t0 = np.log(np.maximum(d.within / np.maximum(d.within_df, 1.0), 1e-10))
    n = int(d.mask.sum())
    centred = np.where(
        d.mask, d.means - (d.means * d.mask).sum(1, keepdims=True) / d.mask.sum(1, keepdims=True), 0.0
    )
    between = float(np.sum(centred**2)) / max(n - d.means.shape[0], 1)
    noise = float(np.mean(np.exp(t0)[:, None].repeat(d.means.shape[1], 1)[d.mask] / d.counts[d.mask]))
    return max(between - noise, 0.1 * between, 1e-6), t0


def _expected_lr(x: float, d: _Design) -> np.ndarray:
    """Per series, the likelihood ratio of σ²/c = ``x`` against σ = 0 on the *expected data* of a
    design whose truth is σ²/c = ``x`` with each series' own τ_s (its within-epoch estimate): every
    sum of squares at its expectation (Cowan et al.'s Asimov data set, whose ratio is the median
    one's). At the truth the restricted likelihood's expected score is 0, so the alternative's
    value is the truth's; at σ = 0 each τ_s has a closed-form optimum."""
    tau2 = np.maximum(d.within / d.within_df, 1e-12)  # a noiseless series: σ is all it has
    n = np.where(d.mask, d.counts, 0.0)
    total = n.sum(1)
    epochs = d.mask.sum(1)
    v = np.where(d.mask, x + tau2[:, None] / d.counts, 1.0)
    log_n = np.sum(np.where(d.mask, np.log(d.counts), 0.0), axis=1)
    # σ = 0: v'_e = τ'²/n_e, so −2ℓ = k·log τ'² + (W + Q)/τ'² − Σ log n_e + log N, with W the
    # expected within sum of squares and Q = E[Σ n_e (ȳ_e − ȳ)²] under the truth.
    q = np.sum(n * np.where(d.mask, v, 0.0), axis=1) - np.sum(n**2 * np.where(d.mask, v, 0.0), axis=1) / total
    k = d.within_df + epochs - 1.0
    at_zero = k * (np.log((d.within_df * tau2 + q) / k) + 1.0) - log_n + np.log(total)
    w = np.where(d.mask, 1.0 / v, 0.0)
    at_truth = (
        d.within_df * (np.log(tau2) + 1.0)
        + np.sum(np.where(d.mask, np.log(v), 0.0), axis=1)
        + np.log(w.sum(1))
        + (epochs - 1.0)
    )
    return np.asarray(at_zero - at_truth)


def _resolvable(d: _Design, cut: float) -> float:
    """The σ whose expected-data likelihood ratio (:func:`_expected_lr`, summed over the series)
    reaches ``cut``, the ratio at which the interval leaves 0. The expected data's ratio is the
    median data set's for many epochs; with a few, and with τ_s estimated, a design with that σ
    resolves it in 21-40% of sweeps, with twice it in 82-96%, with a quarter of it in ≤ 6%
    (test_reml.py, on three designs). Series weigh by what they know: a quiet series tells more
    about a shared σ than a noisy one."""

    def short(x: float) -> float:
        return float(np.sum(_expected_lr(x, d))) - cut

    hi = 1.0
    while short(hi) < 0.0:
        if hi > _MAX_SIGMA2:
            return math.inf
        hi *= 4.0
    return math.sqrt(float(brentq(short, 0.0, hi, xtol=1e-6 * hi)) * d.scale)


#: The most times its epochs :func:`_epochs_factor` projects a design to (beyond it, None).
MAX_EPOCHS_FACTOR = 64


def _tiled(d: _Design, k: int) -> _Design:
    """``d`` with every series' epochs ``k`` times over: as many rounds per epoch, the same round
    noise (so the within sums of squares and their degrees of freedom ``k`` times)."""
    return _Design(
        means=np.tile(d.means, (1, k)),
        counts=np.tile(d.counts, (1, k)),
        mask=np.tile(d.mask, (1, k)),
        within=d.within * k,
        within_df=d.within_df * k,
        scale=d.scale,
    )


def _epochs_factor(d: _Design, target: float, cut: float) -> int | None:
    """The fewest times its epochs (:func:`_tiled`) at which ``d`` resolves σ = ``target`` (its
    expected-data ratio reaches ``cut``, as :func:`_resolvable` asks); None past
    :data:`MAX_EPOCHS_FACTOR`. The ratio grows with the epochs, so a bisection finds it."""
    x = target**2 / d.scale

    def resolves(k: int) -> bool:
        return float(np.sum(_expected_lr(x, _tiled(d, k)))) >= cut

    if not resolves(MAX_EPOCHS_FACTOR):
        return None
    low, high = 0, MAX_EPOCHS_FACTOR  # resolves(high); not known at low
    while high - low > 1:
        mid = (low + high) // 2
        if resolves(mid):
            high = mid
        else:
            low = mid
    return high


def design_effect(cluster_sizes: Sequence[int], correlation: float) -> float:
    """The variance inflation of a pooled sum of squares over series that come in clusters whose
    members are equicorrelated: ``1 + (m − 1)·ρ²`` per series of a cluster of m, averaged."""
    total = sum(cluster_sizes)
    if total == 0:
        return 1.0
    return sum(m * (1.0 + (m - 1) * correlation**2) for m in cluster_sizes) / total


def reml_component(
    series: Sequence[tuple[Mapping[int, float], Mapping[int, int]]],
    *,
    confidence: float = 0.95,
    design: float = 1.0,
    bounds: tuple[bool, bool] = (True, True),
    target: float | None = None,
) -> VarianceComponent:
    """Estimate the between-epoch SD σ shared by ``series``, with its profile-likelihood interval.

    Args:
        series: per series, ``({round: value}, {round: epoch})``; a series needs two epochs and
            one within-epoch degree of freedom (two rounds in one epoch) to count.
        confidence: level of the interval (the χ²₁ quantile bounds the likelihood ratio).
        design: the design effect of correlated series (:func:`design_effect`): the likelihood
            treats the series as independent, so its ratio is divided by this before the χ²₁
            quantile bounds it (a Rao-Scott correction); the estimate itself is unaffected.
        bounds: which ends of the interval to find (lower, upper); an end not asked for is NaN
            (each end costs a root search over the profile).
        target: a σ to project the design to (``epochs_factor``); None: no projection.

    Returns:
        The component; :data:`EMPTY` when no series counts.
    """
    d = _design(series)
    if d is None:
        return EMPTY
    x0, t0 = _start(d)
    best, x_hat, t_hat = _fit(d, x0, t0)
    cut = float(chi2.ppf(confidence, 1)) * max(design, 1.0)

    def excess(x: float) -> float:
        return _profile(x, t_hat, d)[0] - best - cut

    # The ends to 0.1% of the bracket: far below what a few epochs can say about σ.
    low = high = math.nan
    if bounds[0]:
        low = 0.0
        if x_hat > 0.0 and excess(0.0) > 0.0:
            low = float(brentq(excess, 0.0, x_hat, xtol=1e-3 * x_hat))
    if bounds[1]:
        hi = max(2.0 * x_hat, x_hat + 1.0)
        while excess(hi) < 0.0 and hi < _MAX_SIGMA2:
            hi *= 4.0
        high = float(brentq(excess, x_hat, hi, xtol=1e-3 * hi)) if hi < _MAX_SIGMA2 else _MAX_SIGMA2
    epochs = d.mask.sum(1)
    return VarianceComponent(
        estimate=math.sqrt(x_hat * d.scale),
        low=math.sqrt(low * d.scale),
        high=math.sqrt(high * d.scale),
        resolvable=_resolvable(d, cut),
        series=int(d.means.shape[0]),
        between_df=int(np.sum(epochs - 1)),
        within_df=int(d.within_df.sum()),
        confidence=confidence,
        epochs_factor=None if target is None else _epochs_factor(d, target, cut),
    )
