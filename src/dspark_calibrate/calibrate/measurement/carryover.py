"""Carry-over between visits: how much a cell slows after a visit to a larger G, and what re-warm
keeps that from moving a saving.

Pure: plain values in, plain values out; the harness (``sweep.py``) records for every sample the
cell its visit followed and how many re-warm replays preceded it, and asks
:func:`next_rewarm` after each round whether to re-warm longer.

Why
---
Under a power cap a heavy step leaves the GPU hotter and its clocks lower, and a light cell
visited next runs slower until the state settles: on an H200 the visit after a G=256 visit ran
1-3% slower at G ≤ 128, still visible in its second sample. A cell that happens to follow large
cells more often than its native cell does gets a saving that is off by the difference.

The estimate
------------
Per visit, the round log-median less the level every cell shared in that round
(:func:`~.stats.common_round_effects`) is regressed on "the previous visit was a larger G" (one
indicator per re-warm level the sweep used), with a fixed effect per (cell, epoch) so that cells
and epochs do not masquerade as carry-over; the slope, pooled over the cells of one G, is that
G's carry-over effect (:class:`CarryoverEffect`).
A cell's median moves by the effect times the share of its visits that followed a larger G
(:attr:`Carryover.cell_shift`), and a saving by the difference of that shift between the cell and
its native cell (:attr:`Carryover.saving_shift`, in units of the native step).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dspark_calibrate.calibrate.measurement.ladder import CellKind, CellSpec

__all__ = ["Carryover", "CarryoverEffect", "VisitRecord", "estimate_carryover", "next_rewarm"]

#: One-sided z a G's carry-over effect must exceed before the re-warm grows: the rule runs after
#: every round on accumulating data, so a loose bar would lengthen the re-warm on noise alone.
SIGNIFICANCE_Z = 3.0


@dataclass(frozen=True, slots=True)
class VisitRecord:
    """One visit as the carry-over estimate sees it.

    Attributes:
        cell: the visited cell.
        round: its round.
        epoch: its capture epoch (or pass).
        log_median: log of the median of its kept samples (ms).
        previous: the cell visited just before in the same process (None: the first visit of the
            process).
        rewarm: replays discarded before its samples.
    """

    cell: CellSpec
    round: int
    epoch: int
    log_median: float
    previous: CellSpec | None
    rewarm: int

    @property
    def after_larger(self) -> bool:
        """True when the previous visit was to a larger G."""
        return self.previous is not None and self.previous.graph_batch_size > self.cell.graph_batch_size


@dataclass(frozen=True, slots=True)
class CarryoverEffect:
    """The relative slowdown of one G's cells after a visit to a larger G (log scale).

    Attributes:
        graph_batch_size: G.
        effect: the fixed-effects estimate (None: no visit of G followed a larger G, or all did).
        se: its standard error (None with ``effect``).
        after: visits that followed a larger G.
        other: visits that did not.
    """

    graph_batch_size: int
    effect: float | None
    se: float | None
    after: int
    other: int

    @property
    def z(self) -> float:
        """``effect / se`` (0 without an estimate)."""
        if self.effect is None or not self.se:
            return 0.0
        return self.effect / self.se


@dataclass(frozen=True, slots=True)
class Carryover:
    """Carry-over per G and what it does to each cell.

    Attributes:
        per_g: the effect of each G (at the longest re-warm its visits had).
        cell_shift: per cell, the shift of its median (log scale): the effect (at each visit's
            re-warm) × the share of its visits that followed a larger G (0 for a cell that never
            did; None where a needed effect is unknown).
        saving_shift: per non-native cell, how far the carry-over moves its saving (in units of the
            native step; positive: the saving looks larger than it is).
    """

    per_g: Mapping[int, CarryoverEffect]
    cell_shift: Mapping[CellSpec, float | None]
    saving_shift: Mapping[CellSpec, float | None] = field(default_factory=dict)

    def largest_saving_shift(self) -> float:
        """The largest |saving shift| over the cells (0 when none is known)."""
        known = [abs(v) for v in self.saving_shift.values() if v is not None]
        return max(known, default=0.0)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready summary: per G the effect, its standard error and the visit counts."""
        return {
            "per_g": {
                str(g): {"effect_rel": e.effect, "se": e.se, "after_larger": e.after, "other": e.other}
                for g, e in sorted(self.per_g.items())
            },
            "largest_saving_shift": self.largest_saving_shift(),
        }


def _fixed_effects(x: np.ndarray, y: np.ndarray, groups: np.ndarray) -> list[tuple[float, float] | None]:
    """OLS coefficients of ``y`` on the columns of ``x`` with a fixed effect per group, each with
    its standard error (None for a column the groups leave without variation)."""
    xc, yc = x.astype(np.float64).copy(), y.astype(np.float64).copy()
    for g in np.unique(groups):
        members = groups == g
        xc[members] -= xc[members].mean(axis=0)
        yc[members] -= yc[members].mean()
    usable = [j for j in range(xc.shape[1]) if float(np.sum(xc[:, j] ** 2)) > 1e-12]
    dof = y.size - np.unique(groups).size - len(usable)
    out: list[tuple[float, float] | None] = [None] * xc.shape[1]
    if not usable or dof < 1:
        return out
    a = xc[:, usable]
    coef, *_ = np.linalg.lstsq(a, yc, rcond=None)
    sigma2 = float(np.sum((yc - a @ coef) ** 2)) / dof
    cov = sigma2 * np.linalg.pinv(a.T @ a)
    for i, j in enumerate(usable):
        out[j] = (float(coef[i]), math.sqrt(max(float(cov[i, i]), 0.0)))
    return out


def _effects_of_g(
    group: Sequence[VisitRecord], shared: Mapping[int, float]
) -> dict[int, tuple[float, float] | None]:
    """Per re-warm level, the carry-over effect of one G's visits (fixed effect per cell and epoch)."""
    levels = sorted({v.rewarm for v in group})
    x = np.array(
        [[v.after_larger and v.rewarm == level for level in levels] for v in group], dtype=np.float64
    )
    y = np.array([v.log_median - shared.get(v.round, 0.0) for v in group])
    index: dict[tuple[CellSpec, int], int] = {}
    keys = np.array([index.setdefault((v.cell, v.epoch), len(index)) for v in group])
    return dict(zip(levels, _fixed_effects(x, y, keys), strict=True))


def _cell_shift(
    visits: Sequence[VisitRecord], effects: Mapping[int, tuple[float, float] | None]
) -> float | None:
    """The shift of one cell's median: the effect at each visit's re-warm level, summed over its
    visits that followed a larger G, over all its visits (None where a needed effect is unknown)."""
    total = 0.0
    for v in visits:
        if v.after_larger:
            fit = effects.get(v.rewarm)
            if fit is None:
                return None
            total += fit[0]
    return total / len(visits)


def estimate_carryover(visits: Sequence[VisitRecord], shared: Mapping[int, float]) -> Carryover:
    """Estimate the carry-over of every G and its shift on each cell and saving (module docstring).

    The effect is estimated per re-warm level (the re-warm grows during a sweep); a cell's shift
    weighs each of its visits with its own level's effect, and :attr:`Carryover.per_g` states the
    effect at the last (longest) re-warm.

    Args:
        visits: one record per visit with kept samples.
        shared: the level every cell shared in each round (:func:`~.stats.common_round_effects`).
    """
    per_g: dict[int, CarryoverEffect] = {}
    cell_shift: dict[CellSpec, float | None] = {}
    by_g: dict[int, list[VisitRecord]] = {}
    for v in visits:
        if v.previous is not None:
            by_g.setdefault(v.cell.graph_batch_size, []).append(v)
    for g, group in sorted(by_g.items()):
        effects = _effects_of_g(group, shared)
        last = max(effects)
        at_last = [v for v in group if v.rewarm == last]
        after = sum(v.after_larger for v in at_last)
        fit = effects[last]
        per_g[g] = CarryoverEffect(
            g, None if fit is None else fit[0], None if fit is None else fit[1], after, len(at_last) - after
        )
        for cell in sorted({v.cell for v in group}):
            cell_shift[cell] = _cell_shift([v for v in group if v.cell == cell], effects)
    saving_shift: dict[CellSpec, float | None] = {}
    for cell, shift in cell_shift.items():
        if cell.kind is CellKind.NATIVE or cell.native not in cell_shift:
            continue
        native = cell_shift[cell.native]
        # A larger log-ratio is a smaller saving; to first order the saving moves by −Δlog.
        saving_shift[cell] = None if shift is None or native is None else -(shift - native)
    return Carryover(per_g, cell_shift, saving_shift)


def next_rewarm(carry: Carryover, *, current: int, limit: float, maximum: int) -> int | None:
    """The re-warm to use from now on, or None to keep ``current``.

    The re-warm doubles (at least +2 replays, at most ``maximum``) while some G's carry-over is
    a significant slowdown (z > :data:`SIGNIFICANCE_Z`) that moves one of its savings by more than
    ``limit`` (in units of the native step).
    """
    if current >= maximum:
        return None
    for cell, shift in carry.saving_shift.items():
        effect = carry.per_g[cell.graph_batch_size]
        if shift is not None and abs(shift) > limit and effect.z > SIGNIFICANCE_Z:
            return min(max(2 * current, current + 2), maximum)
    return None
