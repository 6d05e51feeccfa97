"""One uncertainty model behind every number a bundle states (DESIGN §9).

``build`` states a predicted gain, its interval, and the receipt's gross compact value lower bound
and overhead upper bound. All of them come from one joint resampling:

- **the workload**: blocks of consecutive policy steps, or whole requests (the caller resamples
  units and hands their aggregated features here);
- **the cost table**: one draw per replicate of every deployed cell's true serving cost. A common
  level factor ``exp(L)``, ``L ~ N(0, common_mode_rel²)``, moves every cell together; each native
  cell moves by its own ``exp(ε_G)``, ``ε_G ~ N(0, level_rel²)``; each compact cell's saving
  ``s`` is drawn from a split normal whose halves match its paired 95% interval; the compact cost
  is ``T(G,0)·(1 − s)``. The forced-K arm's (negative) saving is drawn the same way and prices the
  confidence path's overhead on every policy step.

Decisions are *not* re-drawn: the runtime decides with the signed medians, whatever the truth
is, so only prices move. Savings of one cell repeat on every step that chose it, so cost
uncertainty does not average out over a long workload: that is why the workload alone is not
enough, and why no per-step worst case is ever combined (it would refuse gains that are real).

Mixed prefill+decode steps (DESIGN §10) join the same draws: each measured group's native arm
moves by the common level and its own ``exp(ε_h)``, each mixed cell's saving is drawn from its
paired interval, and a mixed step pays the overhead of the confidence path like any policy step
(the largest relative forced-K overhead of the draw times the step's native time, or the constant).

Tables without paired savings (schema 1) are priced the pre-pairing way, flagged ``legacy``:
costs exact for the gain's interval, and for the gross value every compact step's saving shrunk to
``ci_low(G,0) − ci_high(G,V)``.

Pure numpy; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from dspark_calibrate.calibrate.deployment.cells import CellGrid, CellTime
from dspark_calibrate.errors import InvalidValueError

__all__ = [
    "JOINT",
    "LEGACY",
    "CostDraws",
    "MixedCosts",
    "OverheadModel",
    "draw_costs",
]

#: Model names recorded in the build's provenance.
JOINT = "joint: workload x cost table (paired savings, common level factor)"
LEGACY = "legacy: unpaired intervals, per-step worst case for the gross value"


@dataclass(frozen=True, slots=True)
class OverheadModel:
    """The fixed confidence-path overhead per policy step.

    Attributes:
        per_g_ms: point overhead per ladder G (ms), in ladder order.
        measured: True when it comes from the sweep's forced-K arms (then it is resampled with the
            costs); False for a user-given or default constant (then it is exact).
        source: where the number came from, in words.
    """

    per_g_ms: tuple[float, ...]
    measured: bool
    source: str


@dataclass(frozen=True, slots=True)
class MixedCosts:
    """The mixed part of the table: measured groups' native arms and the deployed mixed cells.

    Attributes:
        natives: one per group (``step_time_ms``, ``ci_low_ms``, ``level_rel``, ``common_mode_rel``).
        cells: the deployed mixed cells (their paired savings), in the caller's order.
        cell_group: (M,) the group index of each cell.
    """

    natives: tuple[CellTime, ...]
    cells: tuple[CellTime, ...]
    cell_group: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CostDraws:
    """Point costs and ``B`` joint draws of every deployed cell (ms).

    With mixed costs, the G columns are followed by one per mixed group and the C columns by one
    per mixed cell.

    Attributes:
        native_point, overhead_point: (G,) in ladder order.
        compact_point: (C,) in ``compact`` order.
        native, overhead: (B, G); compact: (B, C): the draws that price steps and gains.
        gross_native, gross_compact: the draws that price the gross compact value (the same
            arrays under the joint model; the pessimistic ends under the legacy model).
        model: :data:`JOINT` or :data:`LEGACY`.
        common_level: (B, 1) the common level factor of each replicate (joint model only).
    """

    native_point: np.ndarray
    compact_point: np.ndarray
    overhead_point: np.ndarray
    native: np.ndarray
    compact: np.ndarray
    overhead: np.ndarray
    gross_native: np.ndarray
    gross_compact: np.ndarray
    model: str
    common_level: np.ndarray | None = None


def _split_normal(rng: np.random.Generator, cells: Sequence[CellTime], draws: int, z: float) -> np.ndarray:
    """(B, n) savings whose halves match each cell's [saving_ci_low, saving_ci_high]."""
    if not cells:
        return np.zeros((draws, 0))
    point = np.array([c.saving for c in cells])
    below = np.array([(c.saving - c.saving_ci_low) / z for c in cells])
    above = np.array([(c.saving_ci_high - c.saving) / z for c in cells])
    u = rng.standard_normal((draws, len(cells)))
    out: np.ndarray = point + np.where(u < 0, u * below, u * above)
    # A saving of 1 or more would mean a free step: keep draws inside the interval's own logic.
    capped: np.ndarray = np.minimum(out, 1.0 - 1e-9)
    return capped


def draw_costs(
    grid: CellGrid,
    compact: Sequence[tuple[int, int]],
    overhead: OverheadModel,
    *,
    draws: int,
    rng: np.random.Generator,
    confidence: float = 0.95,
    mixed: MixedCosts | None = None,
) -> CostDraws:
    """Joint draws of the deployed cells' serving costs (see the module docstring).

    Args:
        grid: the measured cells.
        compact: the deployed compact cells (G, V), in the order the caller indexes them.
        overhead: the per-step overhead model.
        draws: replicates B.
        rng: the generator (shared with the workload resampling of the same build).
        confidence: the level the stored intervals were formed at.
        mixed: the mixed groups and cells priced in the same draws (appended columns).
    """
    costs = _draw_decode(
        grid,
        compact,
        overhead,
        draws=draws,
        rng=rng,
        confidence=confidence,
        common=_common_sd(grid, compact, mixed),
    )
    if mixed is None:
        return costs
    return _with_mixed(costs, grid, overhead, mixed, draws=draws, rng=rng, confidence=confidence)


def _common_sd(grid: CellGrid, compact: Sequence[tuple[int, int]], mixed: MixedCosts | None) -> float:
    """The common level's SD: the largest any deployed cell states (decode and mixed)."""
    by_key = {(c.graph_batch_size, c.verifier_budget): c for g in grid.ladder for c in grid.compact(g)}
    cells = [grid.native(g) for g in grid.ladder] + [by_key[k] for k in compact]
    if mixed is not None:
        cells += list(mixed.natives) + list(mixed.cells)
    return max((c.common_mode_rel for c in cells), default=0.0)


def _with_mixed(
    costs: CostDraws,
    grid: CellGrid,
    overhead: OverheadModel,
    mixed: MixedCosts,
    *,
    draws: int,
    rng: np.random.Generator,
    confidence: float,
) -> CostDraws:
    """Append the mixed groups and cells to decode draws (same common level, same overhead model)."""
    h = len(mixed.natives)
    col = np.array(mixed.cell_group, dtype=np.int64)
    native_point = np.array([c.step_time_ms for c in mixed.natives])
    saving_point = np.array([c.saving for c in mixed.cells])
    compact_point = native_point[col] * (1.0 - saving_point) if col.size else np.zeros(0)
    ladder_native = costs.native_point
    # Overhead of a mixed step: the confidence path's relative cost (the largest of the forced-K arms)
    # times the step's native time, or the constant per-step amount.
    if overhead.measured:
        rel_point = float(np.max(costs.overhead_point / ladder_native)) if ladder_native.size else 0.0
        rel_draws = (
            np.max(costs.overhead / costs.native, axis=1, keepdims=True)
            if ladder_native.size
            else np.zeros((draws, 1))
        )
    else:
        rel_point, rel_draws = 0.0, np.zeros((draws, 1))
    constant = float(overhead.per_g_ms[0]) if not overhead.measured and overhead.per_g_ms else 0.0
    over_point = native_point * rel_point + constant
    if costs.model == LEGACY:
        native = np.broadcast_to(native_point, (draws, h))
        compact = np.broadcast_to(compact_point, (draws, col.size))
        gross_native = np.broadcast_to(np.array([c.ci_low_ms for c in mixed.natives]), (draws, h))
        gross_compact = np.broadcast_to(np.array([c.ci_high_ms for c in mixed.cells]), (draws, col.size))
        over = np.broadcast_to(over_point, (draws, h))
    else:
        z = float(ndtri(0.5 + confidence / 2))
        # The common level of this replicate, recovered from the decode natives' draws.
        level = costs.common_level if costs.common_level is not None else np.zeros((draws, 1))
        own = rng.standard_normal((draws, h)) * np.array([c.level_rel for c in mixed.natives])
        native = native_point * np.exp(level + own)
        saving = _split_normal(rng, mixed.cells, draws, z)
        compact = native[:, col] * (1.0 - saving) if col.size else np.zeros((draws, 0))
        gross_native, gross_compact = native, compact
        over = native * rel_draws + constant
    return CostDraws(
        np.concatenate([costs.native_point, native_point]),
        np.concatenate([costs.compact_point, compact_point]),
        np.concatenate([costs.overhead_point, over_point]),
        np.concatenate([costs.native, native], axis=1),
        np.concatenate([costs.compact, compact], axis=1),
        np.concatenate([costs.overhead, over], axis=1),
        np.concatenate([costs.gross_native, gross_native], axis=1),
        np.concatenate([costs.gross_compact, gross_compact], axis=1),
        costs.model,
    )


def _draw_decode(
    grid: CellGrid,
    compact: Sequence[tuple[int, int]],
    overhead: OverheadModel,
    *,
    draws: int,
    rng: np.random.Generator,
    confidence: float,
    common: float,
) -> CostDraws:
    """The decode cells' draws (the model of the module docstring)."""
    ladder = grid.ladder
    natives = [grid.native(g) for g in ladder]
    by_key = {(c.graph_batch_size, c.verifier_budget): c for g in ladder for c in grid.compact(g)}
    cells = [by_key[k] for k in compact]
    g_index = {g: i for i, g in enumerate(ladder)}
    col = np.array([g_index[g] for g, _ in compact], dtype=np.int64)
    native_point = np.array([c.step_time_ms for c in natives])
    compact_point = np.array([c.step_time_ms for c in cells])
    overhead_point = np.array(overhead.per_g_ms, dtype=np.float64)
    z = float(ndtri(0.5 + confidence / 2))
    if not grid.paired:
        native = np.broadcast_to(native_point, (draws, len(ladder)))
        compact_draws = np.broadcast_to(compact_point, (draws, len(cells)))
        low = np.array([c.ci_low_ms for c in natives])
        high = np.array([c.ci_high_ms for c in cells])
        return CostDraws(
            native_point,
            compact_point,
            overhead_point,
            native,
            compact_draws,
            np.broadcast_to(overhead_point, (draws, len(ladder))),
            np.broadcast_to(low, (draws, len(ladder))),
            np.broadcast_to(high, (draws, len(cells))),
            LEGACY,
        )
    # The best estimate of a compact cell's cost is its native cell's times the paired saving:
    # the pairing removed what the two medians' rounds did not share.
    compact_point = native_point[col] * (1.0 - np.array([c.saving for c in cells]))
    level = rng.standard_normal((draws, 1)) * common
    own = rng.standard_normal((draws, len(ladder))) * np.array([c.level_rel for c in natives])
    native = native_point * np.exp(level + own)
    saving = _split_normal(rng, cells, draws, z)
    compact_draws = native[:, col] * (1.0 - saving)
    if overhead.measured:
        arms = [grid.forced_k(g) for g in ladder]
        present = [a for a in arms if a is not None]
        drawn = _split_normal(rng, present, draws, z)
        over = np.broadcast_to(overhead_point, (draws, len(ladder))).copy()
        j = 0
        for i, arm in enumerate(arms):
            if arm is not None:
                # The arm's saving is negative: its cost over the native step, on the same level.
                over[:, i] = -drawn[:, j] * native[:, i]
                j += 1
    else:
        over = np.broadcast_to(overhead_point, (draws, len(ladder)))
    return CostDraws(
        native_point,
        compact_point,
        overhead_point,
        native,
        compact_draws,
        over,
        native,
        compact_draws,
        JOINT,
        common_level=level,
    )


def measured_overhead(grid: CellGrid) -> OverheadModel | None:
    """The overhead per G from the sweep's forced-K arms, or None when no G has one.

    A G without an arm takes the largest relative overhead of the measured ones (conservative: the
    confidence path's cost does not shrink with the step).
    """
    arms = {g: grid.forced_k(g) for g in grid.ladder}
    measured = {g: a for g, a in arms.items() if a is not None}
    if not measured:
        return None
    worst = max(-a.saving for a in measured.values())
    per_g = []
    for g in grid.ladder:
        native = grid.native(g).step_time_ms
        arm = arms[g]
        per_g.append(max(-arm.saving, 0.0) * native if arm is not None else max(worst, 0.0) * native)
    missing = sorted(set(grid.ladder) - set(measured))
    source = "measured: forced-K arms of the sweep (confidence path on, windows forced to K)"
    if missing:
        source += f"; G={missing} without an arm take the largest relative overhead"
    return OverheadModel(tuple(per_g), True, source)


def constant_overhead(ms: float, ladder_size: int, source: str) -> OverheadModel:
    """A fixed overhead per policy step (user-given or default), exact in every draw."""
    if not math.isfinite(ms) or ms < 0:
        raise InvalidValueError(f"overhead must be finite and >= 0, got {ms}")
    return OverheadModel((float(ms),) * ladder_size, False, source)
