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

Errors the sweep's own intervals cannot see are terms of the same draws, at their measured size
(:class:`ShiftModel`): a saving shift common to every compact cell, one per G, and a per-cell
between-process term where the table's interval does not carry one. The confidence path's per-step
cost of the planner the deployment runs is drawn from its measured runs (:class:`OverheadEvidence`:
the mean, the spread of the mean, and a between-process term), never charged at a bound.

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
    "COMMON_SHIFT_FLOOR",
    "JOINT",
    "LEGACY",
    "OVERHEAD_PROCESS_REL",
    "PAIRED_SHIFT_FLOOR",
    "PER_G_SHIFT_FLOOR",
    "CostDraws",
    "MixedCosts",
    "OverheadEvidence",
    "OverheadModel",
    "ShiftModel",
    "constant_overhead",
    "draw_costs",
    "measured_overhead",
    "overhead_from_runs",
    "shift_model",
]

#: Model names recorded in the build's provenance.
JOINT = "joint: workload x cost table (paired savings, common level factor, saving shifts)"
LEGACY = "legacy: unpaired intervals, per-step worst case for the gross value"

#: SD floor of a saving shift common to every compact cell (0.005: 0.5 pp of the native step).
#: An independent harness on an H200 found the sweep's savings 0.45-0.78 pp (median over cells)
#: and up to 1.1-1.6 pp (G=128) above its own; a common bias of 1 pp then sits at two SDs, so the
#: gain's 2.5% lower bound moves down by about as much as such a bias moves the point.
COMMON_SHIFT_FLOOR = 0.005
#: SD floor of a saving shift shared by the compact cells of one G, beyond the common one (0.5 pp;
#: with the common floor a single G's savings may be off by 1.4 pp at two SDs, the G=128 bias
#: above). A measured control-cell bias of the G adds in quadrature.
PER_G_SHIFT_FLOOR = 0.005
#: SD floor of a compact cell's own between-process paired shift (0.4%: the likelihood estimate
#: of σ_d on the H200 heavy step), added where the table's saving interval does not carry one.
PAIRED_SHIFT_FLOOR = 0.004
#: Relative SD of the confidence path's per-step cost between the process that measured it and
#: the serving process (the runs' own spread cannot see a process-level shift). On the December
#: H200 mixed run the same planner cost 94 µs on decode steps and 106 µs on mixed steps (±6%
#: around their mean); 10% covers that spread with room for another process.
OVERHEAD_PROCESS_REL = 0.10


@dataclass(frozen=True, slots=True)
class OverheadModel:
    """The fixed confidence-path overhead per policy step.

    Attributes:
        per_g_ms: point overhead per ladder G (ms), in ladder order.
        measured: True when it comes from measurement (the sweep's forced-K arms, or ``runs``):
            then it is drawn with the costs; False for a user-given or default constant (exact).
        source: where the number came from, in words.
        runs: per-run estimates of the mean per-step cost of one planner (ms); when present every
            draw takes one overhead for every step (:func:`overhead_from_runs`).
        planner: the serving planner the measurement ran (None: not stated).
    """

    per_g_ms: tuple[float, ...]
    measured: bool
    source: str
    runs: tuple[float, ...] = ()
    planner: str | None = None


@dataclass(frozen=True, slots=True)
class OverheadEvidence:
    """The measured per-step cost of one serving planner's confidence path.

    Each run is one measurement of the mean per-step cost (ms) of the planner with every window
    forced to K against static K, in the serving loop (the release bracket's forced-K arm).

    Attributes:
        planner: the planner measured (``fused``, ``device``, ``host`` or an engine's own name).
        per_step_ms: one estimate per run, at least two.
        source: how it was measured, in words.
    """

    planner: str
    per_step_ms: tuple[float, ...]
    source: str

    def __post_init__(self) -> None:
        if not self.planner or not self.planner.isprintable() or len(self.planner) > 64:
            raise InvalidValueError(f"overhead planner must be a short printable name, got {self.planner!r}")
        runs = self.per_step_ms
        if len(runs) < 2:
            raise InvalidValueError(
                f"overhead evidence for planner {self.planner!r} has {len(runs)} run(s); at least 2 are needed "
                "to state its spread (measure the planner in several runs)"
            )
        if not all(isinstance(x, float) and math.isfinite(x) for x in runs):
            raise InvalidValueError(f"overhead runs must be finite numbers (ms), got {list(runs)!r}")

    @classmethod
    def from_dict(cls, data: object, where: str = "overhead evidence") -> OverheadEvidence:
        """From ``{"planner", "per_step_ms": [...], "source"}`` (exactly these keys).

        Raises:
            InvalidValueError: missing or unknown keys, or bad values (the message names ``where``).
        """
        keys = {"planner", "per_step_ms", "source"}
        if not isinstance(data, dict) or set(data) != keys:
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise InvalidValueError(f"{where}: expected an object with keys {sorted(keys)}, got {got}")
        runs = data["per_step_ms"]
        if not isinstance(runs, list) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in runs
        ):
            raise InvalidValueError(f"{where}: per_step_ms must be a list of numbers (ms per step, one per run)")
        planner, source = data["planner"], data["source"]
        if not isinstance(planner, str) or not isinstance(source, str):
            raise InvalidValueError(f"{where}: planner and source must be strings")
        try:
            return cls(planner, tuple(float(x) for x in runs), source)
        except InvalidValueError as exc:
            raise InvalidValueError(f"{where}: {exc}") from exc

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the input of :meth:`from_dict`)."""
        return {"planner": self.planner, "per_step_ms": list(self.per_step_ms), "source": self.source}

    @property
    def mean_ms(self) -> float:
        """The point estimate: the mean over runs."""
        return float(np.mean(self.per_step_ms))

    @property
    def standard_error_ms(self) -> float:
        """The standard error of the mean over runs."""
        runs = np.asarray(self.per_step_ms)
        return float(np.std(runs, ddof=1) / math.sqrt(runs.size))


@dataclass(frozen=True, slots=True)
class ShiftModel:
    """Saving shifts the sweep's own intervals cannot see, drawn jointly (relative SDs).

    A drawn shift ``δ`` lowers or raises a compact cell's saving: ``s_b = s_drawn + δ_common +
    δ_G + δ_cell`` (a positive δ means the table understated the saving).

    Attributes:
        common_sd: SD of one shift shared by every compact cell (decode and mixed).
        per_g: (G, SD) of the shift shared by the compact cells of one G, in ladder order.
        paired_sd: SD of each compact cell's own between-process shift (the floor).
        source: where each size came from, in words.
        carried: (G, V, u) of cells whose saving interval already carries a between-run paired
            term of SD ``u`` (the sweep's ``paired_rel_upper``); their own shift only tops it up
            to ``paired_sd``: ``sqrt(max(0, paired_sd² − u²))``.
    """

    common_sd: float
    per_g: tuple[tuple[int, float], ...]
    paired_sd: float
    source: str
    carried: tuple[tuple[int, int, float], ...] = ()

    def own_sd(self, cell: tuple[int, int]) -> float:
        """The SD of one compact cell's own between-process shift."""
        for g, v, u in self.carried:
            if (g, v) == cell:
                return math.sqrt(max(0.0, self.paired_sd**2 - u**2))
        return self.paired_sd

    def __post_init__(self) -> None:
        sds = (self.common_sd, self.paired_sd, *(sd for _, sd in self.per_g))
        if not all(math.isfinite(x) and 0 <= x < 0.5 for x in sds):
            raise InvalidValueError(f"saving shift SDs must be finite and in [0, 0.5), got {sds}")

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "common_sd": self.common_sd,
            "per_g_sd": {str(g): sd for g, sd in self.per_g},
            "paired_sd": self.paired_sd,
            "carried": {f"{g}/{v}": u for g, v, u in self.carried},
            "source": self.source,
        }


def shift_model(
    grid: CellGrid, *, common_sd: float | None = None, common_source: str | None = None
) -> ShiftModel:
    """The saving shifts for a table: documented floors, raised by what was measured.

    Args:
        grid: the measured cells.
        common_sd: a measured SD of the common shift (between-process passes or an independent
            harness); below the floor it is raised to it.
        common_source: where ``common_sd`` came from.

    Raises:
        InvalidValueError: ``common_sd`` out of range.
    """
    if common_sd is not None and not (math.isfinite(common_sd) and 0 <= common_sd < 0.5):
        raise InvalidValueError(f"the common saving shift SD must be in [0, 0.5), got {common_sd!r}")
    common = max(COMMON_SHIFT_FLOOR, common_sd or 0.0)
    parts = [
        f"common {common:.2%}"
        + (f" ({common_source or 'given'})" if common_sd is not None and common_sd >= COMMON_SHIFT_FLOOR else " (floor)")
    ]
    per_g, raised = [], []
    for g in grid.ladder:
        bias = _control_bias(grid, g)
        sd = math.hypot(PER_G_SHIFT_FLOOR, bias) if bias is not None else PER_G_SHIFT_FLOOR
        per_g.append((g, sd))
        if bias:
            raised.append(f"G={g} {sd:.2%} (control bias {bias:+.2%})")
    parts.append(f"per G {PER_G_SHIFT_FLOOR:.2%} (floor)" + (f", raised: {', '.join(raised)}" if raised else ""))
    carried = tuple(
        (c.graph_batch_size, c.verifier_budget, float(c.paired_rel_upper))
        for g in grid.ladder
        for c in grid.compact(g)
        if c.paired_rel_upper is not None
    )
    if carried:
        parts.append(
            f"per cell between-process {PAIRED_SHIFT_FLOOR:.2%} (floor), less what {len(carried)} cells' intervals "
            f"carry from the sweep's between-run estimate (up to {max(u for *_, u in carried):.2%})"
        )
    else:
        parts.append(f"per cell between-process {PAIRED_SHIFT_FLOOR:.2%} (floor; the table's intervals carry none)")
    return ShiftModel(common, tuple(per_g), PAIRED_SHIFT_FLOOR, "; ".join(parts), carried)


def _control_bias(grid: CellGrid, g: int) -> float | None:
    """The control-cell bias of G that the saving intervals do not already carry (None: none
    measured, or the sweep widened that G's intervals by it)."""
    for c in (grid.native(g), *grid.compact(g)):
        if c.control_bias is not None:
            return None if c.control_widened else float(c.control_bias)
    return None


def _shift_draws(
    rng: np.random.Generator,
    shifts: ShiftModel | None,
    draws: int,
    cell_g: np.ndarray,
    ladder: Sequence[int],
    keys: Sequence[tuple[int, int]],
) -> tuple[np.ndarray, np.ndarray]:
    """(B, 1) common shift and (B, C) total shift of each compact cell (common + G + own)."""
    if shifts is None:
        return np.zeros((draws, 1)), np.zeros((draws, cell_g.size))
    common = rng.standard_normal((draws, 1)) * shifts.common_sd
    sd_g = dict(shifts.per_g)
    per_g = rng.standard_normal((draws, len(ladder))) * np.array([sd_g.get(g, 0.0) for g in ladder])
    own = rng.standard_normal((draws, cell_g.size)) * np.array([shifts.own_sd(k) for k in keys])
    total: np.ndarray = common + per_g[:, cell_g] + own
    return common, total


def overhead_from_runs(evidence: OverheadEvidence, ladder_size: int) -> OverheadModel:
    """The overhead of the planner ``evidence`` measured: the same per-step cost at every G."""
    mean = max(evidence.mean_ms, 0.0)
    return OverheadModel(
        (mean,) * ladder_size,
        True,
        f"measured: {evidence.source} (planner {evidence.planner}, {len(evidence.per_step_ms)} runs, "
        f"mean {evidence.mean_ms:.4g} ms, standard error {evidence.standard_error_ms:.3g} ms)",
        runs=evidence.per_step_ms,
        planner=evidence.planner,
    )


def _draw_runs(rng: np.random.Generator, overhead: OverheadModel, draws: int) -> np.ndarray:
    """(B, 1) per-step overhead: the runs' mean, its Student-t spread and a between-process term."""
    runs = np.asarray(overhead.runs, dtype=np.float64)
    mean = float(runs.mean())
    se = float(runs.std(ddof=1) / math.sqrt(runs.size))
    t = rng.standard_t(runs.size - 1, size=(draws, 1))
    process = rng.standard_normal((draws, 1)) * OVERHEAD_PROCESS_REL * abs(mean)
    out: np.ndarray = np.maximum(mean + se * t + process, 0.0)
    return out


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
    common_shift: np.ndarray | None = None


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
    shifts: ShiftModel | None = None,
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
        shifts: the saving shifts drawn with the savings (None: none).
    """
    costs = _draw_decode(
        grid,
        compact,
        overhead,
        draws=draws,
        rng=rng,
        confidence=confidence,
        common=_common_sd(grid, compact, mixed),
        shifts=shifts,
    )
    if mixed is None:
        return costs
    return _with_mixed(
        costs, grid, overhead, mixed, draws=draws, rng=rng, confidence=confidence, shifts=shifts
    )


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
    shifts: ShiftModel | None = None,
) -> CostDraws:
    """Append the mixed groups and cells to decode draws (same common level, same overhead model,
    the same common saving shift)."""
    h = len(mixed.natives)
    col = np.array(mixed.cell_group, dtype=np.int64)
    native_point = np.array([c.step_time_ms for c in mixed.natives])
    saving_point = np.array([c.saving for c in mixed.cells])
    compact_point = native_point[col] * (1.0 - saving_point) if col.size else np.zeros(0)
    ladder_native = costs.native_point
    # Overhead of a mixed step: a planner's measured per-step cost (the same draw as the decode
    # steps'), or the confidence path's relative cost (the largest of the forced-K arms) times the
    # step's native time, or the constant per-step amount.
    if overhead.runs:
        rel_point, rel_draws = 0.0, np.zeros((draws, 1))
    elif overhead.measured:
        rel_point = float(np.max(costs.overhead_point / ladder_native)) if ladder_native.size else 0.0
        rel_draws = (
            np.max(costs.overhead / costs.native, axis=1, keepdims=True)
            if ladder_native.size
            else np.zeros((draws, 1))
        )
    else:
        rel_point, rel_draws = 0.0, np.zeros((draws, 1))
    fixed = overhead.runs or not overhead.measured
    constant = float(overhead.per_g_ms[0]) if fixed and overhead.per_g_ms else 0.0
    over_point = native_point * rel_point + constant
    if costs.model == LEGACY:
        native = np.broadcast_to(native_point, (draws, h))
        compact = np.broadcast_to(compact_point, (draws, col.size))
        gross_native = np.broadcast_to(np.array([c.ci_low_ms for c in mixed.natives]), (draws, h))
        gross_compact = np.broadcast_to(np.array([c.ci_high_ms for c in mixed.cells]), (draws, col.size))
        over = np.broadcast_to(costs.overhead[:, :1] if overhead.runs else over_point, (draws, h))
    else:
        z = float(ndtri(0.5 + confidence / 2))
        # The common level of this replicate, recovered from the decode natives' draws.
        level = costs.common_level if costs.common_level is not None else np.zeros((draws, 1))
        own = rng.standard_normal((draws, h)) * np.array([c.level_rel for c in mixed.natives])
        native = native_point * np.exp(level + own)
        saving = _split_normal(rng, mixed.cells, draws, z)
        if shifts is not None and col.size:
            # The common shift of this replicate, and each mixed cell's own between-process term.
            common = costs.common_shift if costs.common_shift is not None else np.zeros((draws, 1))
            saving = np.minimum(
                saving + common + rng.standard_normal((draws, col.size)) * shifts.paired_sd, 1.0 - 1e-9
            )
        compact = native[:, col] * (1.0 - saving) if col.size else np.zeros((draws, 0))
        gross_native, gross_compact = native, compact
        if overhead.runs:
            over = np.broadcast_to(costs.overhead[:, :1], (draws, h))
        else:
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
        costs.common_level,
        costs.common_shift,
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
    shifts: ShiftModel | None = None,
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
            np.broadcast_to(
                _draw_runs(rng, overhead, draws) if overhead.runs else overhead_point, (draws, len(ladder))
            ),
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
    common_shift, shift = _shift_draws(rng, shifts, draws, col, ladder, compact)
    saving = np.minimum(saving + shift, 1.0 - 1e-9)
    compact_draws = native[:, col] * (1.0 - saving)
    if overhead.runs:
        over = np.broadcast_to(_draw_runs(rng, overhead, draws), (draws, len(ladder)))
    elif overhead.measured:
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
        common_shift=common_shift,
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
