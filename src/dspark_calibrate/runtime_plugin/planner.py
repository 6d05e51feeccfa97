"""Reference selector and allocator of DSpark confidence-guided dynamic verification (DESIGN §6).

Given the exact measured cost table T(G, V), a confidence calibration and one decode step's rows
(per rank: real rows with their K confidence logits), this module decides what TensorRT-LLM's
exact-SPS policy decides:

1. the common graph batch size G: the smallest captured G that holds every rank's real rows;
2. per rank, the survivals S_j = prod_{i<=j} p_i of every row, the native yield
   ``n + sum S`` and, for every measured compact V of G that the rank's geometry can carry, the
   compact yield ``n + sum of the floor survivals + the top-`extra` remaining survivals``;
3. per cell, the aggregate score ``yield / T(G, V)``, the margin test against native and the
   iteration drain guard; native wins ties, cells below the margin, and every step when the table
   has no drain guard;
4. the allocation of the chosen V: every (request, position) above the floor is ranked by survival
   with the value-independent tie-break (position, then request), so each request receives a
   prefix, and the rank's total is padded exactly to V.

Pure numpy: no torch, no ``dspark_calibrate.calibrate``, no file or clock access. ``replay`` in
``dspark_calibrate.calibrate`` reuses :func:`cell_geometry`, :func:`choose_cells` and
:func:`sorted_prefix_sums`, so the offline replay and this reference cannot drift apart.

Semantic choices (also in ``docs/build.md``): sums are sequential float64 sums in canonical row
order (TensorRT-LLM sums float32 survivals in float64 and ships per-rank yields as scaled
integers; the two agree except when a score lies within ~1e-6 of a threshold); "request" order
for the tie-break is the canonical order of request keys on the rank, so the plan does not depend
on the order rows are passed in.

Example:
    >>> import numpy as np
    >>> table = CostTable.from_cells(
    ...     2, {(2, 0): 10.0, (2, 4): 6.0},
    ...     drain_guard=DrainGuard(1.0, 2.0, 0.0, 2))
    >>> rows = StepRows.single_rank(np.array([[4.0, -4.0], [4.0, -4.0]]))
    >>> p = plan(table, Calibration.identity(2), rows)
    >>> (p.graph_batch_size, p.verifier_budget, p.windows.tolist())
    (2, 4, [1, 1])
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

# The cost table, its drain guard, the calibration and the cell markers are signed documents,
# defined once in ``artifacts`` and re-exported here under the planner's names.
from dspark_calibrate.artifacts import (
    CALIBRATION_METHODS,
    DEFAULT_MINIMUM_PREDICTED_GAIN,
    NATIVE_BUDGET,
    Calibration,
    CostTable,
    DrainGuard,
    PositionMap,
)
from dspark_calibrate.errors import ConfigError

# Engine limits on deployed compact cells (TensorRT-LLM's exact SPS table refuses more); defined
# once in ``schemas`` and re-exported here under the planner's names.
from dspark_calibrate.schemas import MAX_COMPACT_CELLS_PER_G, MAX_COMPACT_CELLS_TOTAL

__all__ = [
    "CALIBRATION_METHODS",
    "DEFAULT_MINIMUM_PREDICTED_GAIN",
    "DEFAULT_MIN_VERIFY_LEN",
    "MAX_COMPACT_CELLS_PER_G",
    "MAX_COMPACT_CELLS_TOTAL",
    "NATIVE_BUDGET",
    "Calibration",
    "CellChoice",
    "CellEvaluation",
    "CostTable",
    "DrainGuard",
    "Geometry",
    "Plan",
    "PositionMap",
    "RankLayout",
    "SelectReason",
    "Selection",
    "StepRows",
    "allocate",
    "cell_geometry",
    "choose_cells",
    "plan",
    "select",
    "sorted_prefix_sums",
    "top_candidates",
]

#: Every request verifies at least this many draft positions (the engine's default floor).
DEFAULT_MIN_VERIFY_LEN = 1


# ---------------------------------------------------------------------------------------------
# Step rows
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class StepRows:
    """The real rows of one decode step across ranks.

    Attributes:
        logits: (n, K) raw confidence logits.
        rank: (n,) rank of each row, in [0, num_ranks).
        request: (n,) request keys (ints or strings), unique per rank; they define the tie-break
            order between requests.
        num_ranks: ranks in the deployment (ranks without rows are idle this step).
    """

    logits: np.ndarray
    rank: np.ndarray
    request: np.ndarray
    num_ranks: int = 1
    order: np.ndarray = field(init=False, repr=False)
    canonical: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        logits = np.array(self.logits, dtype=np.float64)
        if logits.ndim != 2 or logits.shape[1] < 1:
            raise ConfigError(f"logits must be a (rows, K) array, got shape {logits.shape}")
        n = logits.shape[0]
        rank = np.array(self.rank, dtype=np.int64).reshape(-1)
        request = np.array(self.request).reshape(-1)
        if rank.shape[0] != n or request.shape[0] != n:
            raise ConfigError(f"rank ({rank.shape[0]}) and request ({request.shape[0]}) need {n} entries")
        nr = self.num_ranks
        if isinstance(nr, bool) or not isinstance(nr, int | np.integer) or nr < 1:
            raise ConfigError(f"num_ranks must be an integer >= 1, got {nr!r}")
        nr = int(nr)
        # Canonical = sorted by rank, then strictly increasing (so unique) keys per rank. The
        # common serving case (ranks non-decreasing, keys increasing overall) is decided with two
        # comparisons; the rank range check then needs only the first and last rank.
        # (np.count_nonzero is used for all/any: it is several times cheaper per call.)
        keys_increase = n <= 1 or np.count_nonzero(request[1:] > request[:-1]) == n - 1
        if nr == 1:
            if n and np.count_nonzero(rank):
                raise ConfigError(f"row ranks must lie in [0, 1), got [{rank.min()}, {rank.max()}]")
            canonical = keys_increase
        else:
            ranks_sorted = n <= 1 or np.count_nonzero(rank[1:] >= rank[:-1]) == n - 1
            if ranks_sorted and n and (rank.item(0) < 0 or rank.item(n - 1) >= nr):
                raise ConfigError(f"row ranks must lie in [0, {nr}), got [{rank.min()}, {rank.max()}]")
            if not ranks_sorted and (rank.min() < 0 or rank.max() >= nr):
                raise ConfigError(f"row ranks must lie in [0, {nr}), got [{rank.min()}, {rank.max()}]")
            # With sorted ranks, a key may only fail to increase where the rank changes.
            canonical = ranks_sorted and (
                keys_increase or bool(((rank[1:] > rank[:-1]) | (request[1:] > request[:-1])).all())
            )
        if not math.isfinite(np.add.reduce(logits, axis=None)) and not np.isfinite(logits).all():
            raise ConfigError("confidence logits must be finite")
        if canonical:
            order = np.arange(n)
        else:
            one_rank = nr == 1 or bool((rank[1:] == rank[:-1]).all())
            order = np.argsort(request, kind="stable") if one_rank else np.lexsort((request, rank))
            r_s, q_s = rank[order], request[order]
            if n > 1 and np.any((r_s[1:] == r_s[:-1]) & (q_s[1:] == q_s[:-1])):
                raise ConfigError("a request appears twice on one rank in the same step")
        for name, value in (("logits", logits), ("rank", rank), ("request", request), ("order", order)):
            value.setflags(write=False)
            object.__setattr__(self, name, value)
        object.__setattr__(self, "num_ranks", nr)
        object.__setattr__(self, "canonical", canonical)

    @classmethod
    def single_rank(cls, logits: np.ndarray, request: np.ndarray | Sequence[Any] | None = None) -> StepRows:
        """Rows of a one-rank step; requests default to 0..n-1 in the given order."""
        lg = np.asarray(logits, dtype=np.float64)
        req = np.arange(lg.shape[0]) if request is None else np.asarray(request)
        return cls(lg, np.zeros(lg.shape[0], dtype=np.int64), req, 1)

    @property
    def k(self) -> int:
        """The draft length K of the logits."""
        return int(self.logits.shape[1])

    def __len__(self) -> int:
        return int(self.logits.shape[0])


# ---------------------------------------------------------------------------------------------
# Shared pure pieces (used by calibrate.replay as well)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Geometry:
    """How one rank carries V tokens in G rows.

    Attributes:
        pad_len: tokens of every pad row (real rows present), or the low dummy length q of an idle
            rank; 0 when there are no pad rows.
        pad_high_rows: idle rank only: rows of length q + 1 (V = G*q + r gives r of them).
        real_tokens: tokens of the real rows together.
        extra: real-row tokens above the floor n*(min_verify_len+1), spent by the allocation.
    """

    pad_len: int
    pad_high_rows: int
    real_tokens: int
    extra: int


def cell_geometry(
    num_real: int, graph_batch_size: int, verifier_budget: int, *, min_verify_len: int, max_draft_len: int
) -> Geometry | None:
    """The rank geometry of cell (G, V) with ``num_real`` real rows, or None when infeasible.

    Real rows take between min_verify_len+1 and K+1 tokens; all G-n pad rows share one length in
    [1, K+1], the smallest that fits, so that the real rows get the most tokens. An idle rank
    (n = 0) splits V over two dummy lengths: V = G*q + r with q >= 1 and q + (r > 0) <= K+1.
    """
    return _geometry(
        int(num_real), int(graph_batch_size), int(verifier_budget), int(min_verify_len), int(max_draft_len)
    )


@functools.lru_cache(maxsize=1 << 16)
def _geometry(n: int, g: int, v: int, min_verify_len: int, k: int) -> Geometry | None:
    if g <= 0 or n < 0 or n > g:
        return None
    if n == 0:
        q, r = divmod(v, g)
        if q < 1 or q + (1 if r > 0 else 0) > k + 1:
            return None
        return Geometry(q, r, 0, 0)
    num_pad = g - n
    floor_tokens = n * (int(min_verify_len) + 1)
    capacity = n * (k + 1)
    if num_pad == 0:
        if not floor_tokens <= v <= capacity:
            return None
        return Geometry(0, 0, v, v - floor_tokens)
    pad_lo = max(1, -(-(v - capacity) // num_pad))
    pad_hi = min(k + 1, (v - floor_tokens) // num_pad)
    if pad_lo > pad_hi:
        return None
    real = v - num_pad * pad_lo
    if not floor_tokens <= real <= capacity:
        return None
    return Geometry(pad_lo, 0, real, real - floor_tokens)


def sorted_prefix_sums(candidates: np.ndarray) -> np.ndarray:
    """Prefix sums of each group's candidate survivals, best first.

    Args:
        candidates: (m, L) survivals of each group's (request, position) pairs; entries < 0 are
            padding and rank last.

    Returns:
        (m, L+1) float64: column e is the sequential sum of the e largest values. Equal values
        are interchangeable in a sum, so the tie-break does not affect it.
    """
    return _ranked_prefix(np.asarray(candidates, dtype=np.float64))[1]


def _ranked_prefix(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ranked = np.sort(c, axis=1)  # ascending; the best are at the end
    prefix = np.zeros((c.shape[0], c.shape[1] + 1), dtype=np.float64)
    np.cumsum(ranked[:, ::-1], axis=1, out=prefix[:, 1:])
    return ranked, prefix


def top_candidates(
    candidates: np.ndarray, extra: np.ndarray, *, ranked: np.ndarray | None = None
) -> np.ndarray:
    """Mask of each group's ``extra`` best candidates, ties broken by the lower index.

    With candidates in position-major order (index = position * rows + request), the lower index
    is the earlier position, then the earlier request: the engine's value-independent tie-break.
    Because survivals do not increase along a request's positions, the mask of every request is a
    prefix of its positions.

    Args:
        candidates: (m, L) survivals (padding < 0).
        extra: (m,) how many to take per group (0..number of real candidates).
        ranked: the candidates sorted ascending along axis 1, when already at hand.

    Returns:
        (m, L) bool.
    """
    c = np.asarray(candidates, dtype=np.float64)
    m, length = c.shape
    if m == 1 and ranked is not None:  # one group (a one-rank step): scalars, fewest array ops
        e1 = int(np.asarray(extra).reshape(-1)[0])
        if e1 <= 0:
            return np.zeros((1, length), dtype=bool)
        at_or_above: np.ndarray = c >= ranked[0, length - e1]
        if int(np.count_nonzero(at_or_above)) == e1:
            return at_or_above
    e = np.asarray(extra, dtype=np.int64)
    live = e > 0
    if not live.all():
        mask = np.zeros((m, length), dtype=bool)
        if live.any():
            mask[live] = top_candidates(c[live], e[live])
        return mask
    # Threshold = the e-th largest value; take everything at or above it when that is exactly e
    # candidates (no tie crosses the cut), else everything above it plus the earliest ties.
    srt = np.sort(c, axis=1) if ranked is None else ranked
    threshold = srt[np.arange(m), length - e][:, None]
    out: np.ndarray = c >= threshold
    if np.array_equal(np.count_nonzero(out, axis=1), e):
        return out
    above = c > threshold
    at = c == threshold
    need = e - above.sum(axis=1)
    out = above | (at & (np.cumsum(at, axis=1) <= need[:, None]))
    return out


class SelectReason(str, enum.Enum):
    """Why a step ran the cell it ran (stable values, used in replay statistics)."""

    COMPACT = "compact"
    NO_ROWS = "no_rows"
    NO_GRAPH = "no_graph"  # more rows than the largest captured G
    NO_COMPACT_CELLS = "no_compact_cells"
    NO_FEASIBLE_CELL = "no_feasible_cell"
    BELOW_MARGIN = "below_margin"
    NO_DRAIN_GUARD = "no_drain_guard"
    DRAIN_GUARD = "drain_guard"
    # The device planner only: a real row's confidence logit was NaN or infinite, so the step's
    # decision is native. The reference refuses such rows (``StepRows`` raises ConfigError).
    NON_FINITE = "non_finite"


#: Integer codes of :class:`SelectReason`, as returned by :func:`choose_cells`.
REASON_CODES: tuple[SelectReason, ...] = tuple(SelectReason)


@dataclass(frozen=True, slots=True, eq=False)
class CellChoice:
    """Vectorised outcome of :func:`choose_cells` for S steps and C candidate columns.

    Attributes:
        column: (S,) chosen column, -1 for native.
        reason: (S,) index into :data:`REASON_CODES`.
        score: (S, C) yield / T(G, V) (-inf where infeasible).
        native_score: (S,) native yield / T(G, 0).
        passes_margin: (S, C).
        group_value_ms: (S, C) the drain guard's group value (NaN without a guard or a margin pass).
        passes_guard: (S, C).
    """

    column: np.ndarray
    reason: np.ndarray
    score: np.ndarray
    native_score: np.ndarray
    passes_margin: np.ndarray
    group_value_ms: np.ndarray
    passes_guard: np.ndarray


def choose_cells(
    *,
    native_yield: np.ndarray,
    native_ms: np.ndarray,
    compact_yield: np.ndarray,
    compact_ms: np.ndarray,
    max_loss: np.ndarray,
    feasible: np.ndarray,
    budgets: np.ndarray,
    minimum_predicted_gain: float,
    drain_guard: DrainGuard | None,
    tail_native_ms: float | None,
) -> CellChoice:
    """The exact-SPS selection rule over S steps (rows) and C candidate cells (columns).

    A column passes the margin when its score beats native's strictly and by at least
    ``minimum_predicted_gain``; without a drain guard nothing compact is chosen; with one, the
    group value must exceed ``minimum_group_value_ms`` strictly; the winner maximises (group value,
    score, V). Columns that are not cells of the step (padding) must be marked infeasible.
    """
    ny = np.asarray(native_yield, dtype=np.float64)
    s_count = ny.shape[0]
    cy = np.asarray(compact_yield, dtype=np.float64).reshape(s_count, -1)
    feas = np.asarray(feasible, dtype=bool).reshape(s_count, -1)
    cms = np.asarray(compact_ms, dtype=np.float64).reshape(s_count, -1)
    c_count = cy.shape[1]
    native_score = ny / np.asarray(native_ms, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.where(feas, cy / np.where(feas, cms, 1.0), -np.inf)
    required = native_score * (1.0 + float(minimum_predicted_gain))
    passes = feas & (score > native_score[:, None]) & (score >= required[:, None])
    any_cell = np.zeros(s_count, dtype=bool) if c_count == 0 else np.ones(s_count, dtype=bool)
    reason = np.full(s_count, REASON_CODES.index(SelectReason.BELOW_MARGIN), dtype=np.int8)
    has_feasible = feas.any(axis=1)
    reason[~has_feasible] = REASON_CODES.index(SelectReason.NO_FEASIBLE_CELL)
    reason[~any_cell] = REASON_CODES.index(SelectReason.NO_COMPACT_CELLS)
    column = np.full(s_count, -1, dtype=np.int64)
    group_value = np.full((s_count, c_count), np.nan)
    guard_ok = np.zeros((s_count, c_count), dtype=bool)
    margin_any = passes.any(axis=1)
    if drain_guard is None or tail_native_ms is None:
        reason[margin_any] = REASON_CODES.index(SelectReason.NO_DRAIN_GUARD)
        return CellChoice(column, reason, score, native_score, passes, group_value, guard_ok)
    loss_ms = (
        drain_guard.loss_multiplier
        * np.asarray(max_loss, dtype=np.float64).reshape(s_count, -1)
        * float(tail_native_ms)
        / drain_guard.mean_output_tokens_per_request_iteration
    )
    gv = np.asarray(native_ms, dtype=np.float64)[:, None] - cms - loss_ms
    group_value = np.where(passes, gv, np.nan)
    guard_ok = passes & (gv > drain_guard.minimum_group_value_ms)
    ok_any = guard_ok.any(axis=1)
    reason[margin_any & ~ok_any] = REASON_CODES.index(SelectReason.DRAIN_GUARD)
    if ok_any.any():
        key1 = np.where(guard_ok, gv, -np.inf)
        best1 = key1.max(axis=1, keepdims=True)
        tie1 = guard_ok & (key1 == best1)
        key2 = np.where(tie1, score, -np.inf)
        best2 = key2.max(axis=1, keepdims=True)
        tie2 = tie1 & (key2 == best2)
        key3 = np.where(tie2, np.asarray(budgets, dtype=np.int64).reshape(s_count, -1), -1)
        pick = key3.argmax(axis=1)
        column = np.where(ok_any, pick, -1)
        reason[ok_any] = REASON_CODES.index(SelectReason.COMPACT)
    return CellChoice(column, reason, score, native_score, passes, group_value, guard_ok)


# ---------------------------------------------------------------------------------------------
# One step: select and allocate
# ---------------------------------------------------------------------------------------------


class CellEvaluation(NamedTuple):
    """One compact cell of the step's G, as the selector saw it.

    An immutable ``NamedTuple`` rather than a frozen dataclass: the selector builds several per
    step on the serving path, and a tuple is several times cheaper to create.
    """

    verifier_budget: int
    step_time_ms: float
    feasible: bool
    expected_yield: float
    score: float
    max_yield_loss_per_request: float
    passes_margin: bool
    group_value_ms: float | None
    passes_drain_guard: bool


@dataclass(frozen=True, slots=True)
class Selection:
    """The cell chosen for one step and why.

    Attributes:
        graph_batch_size: the common G (0 when no rank has a row or the rows exceed the ladder).
        verifier_budget: the chosen V (0 = native).
        reason: why.
        native_yield: expected tokens of the native step.
        native_score: native yield / T(G, 0) (0 when G is 0).
        cells: the evaluation of every compact cell of G, in V order.
    """

    graph_batch_size: int
    verifier_budget: int
    reason: SelectReason
    native_yield: float
    native_score: float
    cells: tuple[CellEvaluation, ...]

    @property
    def compact(self) -> bool:
        """True when a compact cell was chosen."""
        return self.verifier_budget != NATIVE_BUDGET


class RankLayout(NamedTuple):
    """The token layout of one rank under the chosen cell (a ``NamedTuple``, built per rank per step).

    Attributes:
        rank: the rank.
        real_rows: rows carrying requests.
        pad_rows: rows carrying padding (G - real_rows).
        pad_len: tokens per pad row (idle rank: the low dummy length q).
        pad_high_rows: idle rank: rows of length q + 1.
        tokens: tokens the rank submits; V for a compact cell, G*(K+1) for native.
    """

    rank: int
    real_rows: int
    pad_rows: int
    pad_len: int
    pad_high_rows: int
    tokens: int


@dataclass(frozen=True, slots=True, eq=False)
class Plan:
    """A step's selection plus its allocation.

    Attributes:
        selection: the chosen cell and its evaluation.
        windows: (n,) verify length (draft positions checked, 1..K) of each input row, in the
            order the rows were given.
        ranks: one layout per rank (idle ranks included) when a graph runs, else empty.
    """

    selection: Selection
    windows: np.ndarray
    ranks: tuple[RankLayout, ...]

    @property
    def graph_batch_size(self) -> int:
        """The chosen G."""
        return self.selection.graph_batch_size

    @property
    def verifier_budget(self) -> int:
        """The chosen V (0 = native)."""
        return self.selection.verifier_budget


class _Prepared(NamedTuple):
    """One step's survivals, grouped by rank and ranked once, shared by selection and allocation.

    A ``NamedTuple`` (not a dataclass): it is built on every step and tuples are cheap to create.
    """

    graph_batch_size: int  # the smallest captured G holding the busiest rank (0: none)
    active: tuple[int, ...]  # ranks with rows, increasing
    counts: tuple[int, ...]  # rows per active rank
    base: list[float]  # per active rank: n + sequential sum of the floor survivals
    cand: np.ndarray  # (R, cols, W) survivals above the floor, position-major per rank; -1 pads
    ranked: np.ndarray  # (R, L) the candidates of each rank sorted ascending, L = cols * W
    prefix: np.ndarray  # (R, L+1) column e: sequential sum of the rank's e largest candidates
    row_rank_index: np.ndarray | None  # canonical row -> rank index (None: uniform layout)
    row_local: np.ndarray | None  # canonical row -> slot within its rank (None: uniform layout)


_EMPTY_F = np.zeros((0, 0, 0))
_EMPTY_R = np.zeros((0, 0))
_EMPTY_P = np.zeros((0, 1))
#: Bound on a table's memo of per-step-shape data (distinct (G, floor, counts, idle) keys).
_MEMO_LIMIT = 4096


def _survivals(calibration: Calibration, rows: StepRows, k: int) -> np.ndarray:
    """(K, n) C-contiguous survivals of the rows in canonical order (position-major).

    The STS branch performs exactly :meth:`Calibration.survival_t`'s operations (the negation
    is folded into the division by -T, which is bit-identical), with fewer numpy calls.
    """
    x = rows.logits if rows.canonical else rows.logits[rows.order]
    neg = calibration.negated_sts_column
    if neg is None:
        return calibration.survival_t(x.T)
    out: np.ndarray = np.divide(x.T, neg, order="C")  # -(x / T)
    with np.errstate(over="ignore"):  # exp overflows to inf and the sigmoid is then exactly 0.0
        np.exp(out, out=out)
    out += 1.0
    np.reciprocal(out, out=out)
    for j in range(1, k):  # left-to-right products, the engine's order
        np.multiply(out[j - 1], out[j], out=out[j])
    return out


def _prepare(table: CostTable, calibration: Calibration, rows: StepRows, min_verify_len: int) -> _Prepared:
    k = table.max_draft_len
    if calibration.k != k or rows.k != k:
        raise ConfigError(f"K mismatch: cost table K={k}, calibration K={calibration.k}, logits K={rows.k}")
    floor = int(min_verify_len)
    if not 1 <= floor <= k:
        raise ConfigError(f"min_verify_len must be in [1, K={k}], got {floor}")
    n = len(rows)
    if n == 0:
        return _Prepared(0, (), (), [], _EMPTY_F, _EMPTY_R, _EMPTY_P, None, None)
    surv = _survivals(calibration, rows, k)
    cols = k - floor
    if rows.num_ranks == 1:
        active: tuple[int, ...] = (0,)
        counts: tuple[int, ...] = (n,)
    else:
        # Canonical rows are sorted by rank, so each active rank is one contiguous block.
        ranks = rows.rank if rows.canonical else rows.rank[rows.order]
        per_rank = np.bincount(ranks, minlength=rows.num_ranks).tolist()
        active = tuple(r for r, c in enumerate(per_rank) if c)
        counts = tuple(per_rank[r] for r in active)
    r_count = len(counts)
    width = max(counts)
    if r_count * width == n:
        # Uniform layout (every active rank has the same rows; always so for one rank): the
        # per-rank position-major grid is a view of the survivals, no scatter and no padding.
        by_rank = surv.reshape(k, r_count, width)
        cand = by_rank[floor:].transpose(1, 0, 2)
        base_terms = by_rank[0] if floor == 1 else by_rank[:floor].transpose(1, 0, 2).reshape(r_count, -1)
        row_rank_index = row_local = None
    else:
        starts = np.cumsum((0, *counts[:-1]))
        row_rank_index = np.repeat(np.arange(r_count), counts)
        row_local = np.arange(n) - starts[row_rank_index]
        grid = np.full((r_count, cols, width), -1.0)
        grid[row_rank_index, :, row_local] = surv[floor:].T
        cand = grid
        bgrid = np.zeros((r_count, floor, width))
        bgrid[row_rank_index, :, row_local] = surv[:floor].T
        base_terms = bgrid.reshape(r_count, floor * width)
    # Sequential (accumulate) sums in position-major order: zero padding never changes a
    # rounding, and replay sums in the same order.
    base_sums = np.add.accumulate(base_terms, axis=1)[:, -1].tolist()
    base = [c + s for c, s in zip(counts, base_sums, strict=True)]
    length = cols * width
    grid_copy = np.empty((r_count, cols, width))
    grid_copy[...] = cand
    ranked = grid_copy.reshape(r_count, length)
    ranked.sort(axis=1)  # ascending; the best are at the end
    prefix = np.zeros((r_count, length + 1))
    np.add.accumulate(ranked[:, ::-1], axis=1, out=prefix[:, 1:])
    g = table.graph_batch_size_for(width)
    return _Prepared(
        0 if g is None else g, active, counts, base, cand, ranked, prefix, row_rank_index, row_local
    )


class _StepCells(NamedTuple):
    """What the compact cells of one G look like for one shape of step (memoised per table)."""

    budgets: tuple[int, ...]
    times: tuple[float, ...]
    native_ms: float
    geometry: tuple[tuple[Geometry, ...] | None, ...]  # per cell: per active rank, None = infeasible
    idle_geometry: tuple[Geometry | None, ...]  # per cell: an idle rank's geometry
    gather: np.ndarray  # flat indices into prefix: R fulls, then R per feasible cell
    extras: tuple[np.ndarray | None, ...]  # per cell: (R,) extra tokens per rank


def _step_cells(table: CostTable, g: int, floor: int, counts: tuple[int, ...], idle: bool) -> _StepCells:
    key = (g, floor, counts, idle)
    memo = table.serving_memo
    hit: _StepCells | None = memo.get(key)
    if hit is not None:
        return hit
    k = table.max_draft_len
    budgets, times, native_ms = table.serving_cells(g)
    cols = k - floor
    stride = cols * max(counts) + 1 if counts else 1
    gather = [r * stride + c * cols for r, c in enumerate(counts)]
    geometry: list[tuple[Geometry, ...] | None] = []
    idle_geometry: list[Geometry | None] = []
    extras: list[np.ndarray | None] = []
    for v in budgets:
        geo = [_geometry(c, g, v, floor, k) for c in counts]
        idle_geo = _geometry(0, g, v, floor, k)
        idle_geometry.append(idle_geo)
        if all(x is not None for x in geo) and (not idle or idle_geo is not None):
            ok = tuple(x for x in geo if x is not None)
            geometry.append(ok)
            extras.append(np.array([x.extra for x in ok], dtype=np.int64))
            gather.extend(r * stride + x.extra for r, x in enumerate(ok))
        else:
            geometry.append(None)
            extras.append(None)
    out = _StepCells(
        budgets,
        times,
        native_ms,
        tuple(geometry),
        tuple(idle_geometry),
        np.array(gather, dtype=np.int64),
        tuple(extras),
    )
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[key] = out
    return out


def _seq_sum(values: Iterable[float]) -> float:
    # Left-to-right float64 sum, the order np.cumsum uses in replay.
    total = 0.0
    for x in values:
        total += x
    return total


def _choose_one(
    *,
    native_yield: float,
    native_ms: float,
    cells: Sequence[tuple[int, float, bool, float, float]],
    minimum_predicted_gain: float,
    drain_guard: DrainGuard | None,
    tail_native_ms: float | None,
) -> tuple[int, SelectReason, list[tuple[float, bool, float, bool]]]:
    """Scalar twin of :func:`choose_cells` for one step (cells: V, T, feasible, yield, max loss).

    Same operations in the same order, so both give bit-identical scores and group values.
    """
    native_score = native_yield / native_ms
    required = native_score * (1.0 + float(minimum_predicted_gain))
    out: list[tuple[float, bool, float, bool]] = []
    for _, t, feasible, y, _ in cells:
        score = y / t if feasible else -math.inf
        out.append((score, feasible and score > native_score and score >= required, math.nan, False))
    if not cells:
        return -1, SelectReason.NO_COMPACT_CELLS, out
    reason = SelectReason.BELOW_MARGIN if any(c[2] for c in cells) else SelectReason.NO_FEASIBLE_CELL
    margin_any = any(o[1] for o in out)
    if drain_guard is None or tail_native_ms is None:
        return -1, (SelectReason.NO_DRAIN_GUARD if margin_any else reason), out
    best, best_key = -1, (-math.inf, -math.inf, -1)
    for i, (v, t, _, _, loss) in enumerate(cells):
        score, passes = out[i][0], out[i][1]
        if not passes:
            continue
        loss_ms = (
            drain_guard.loss_multiplier
            * loss
            * float(tail_native_ms)
            / drain_guard.mean_output_tokens_per_request_iteration
        )
        gv = native_ms - t - loss_ms
        ok = gv > drain_guard.minimum_group_value_ms
        out[i] = (score, passes, gv, ok)
        if ok and (gv, score, v) > best_key:
            best, best_key = i, (gv, score, v)
    if best >= 0:
        return best, SelectReason.COMPACT, out
    return -1, (SelectReason.DRAIN_GUARD if margin_any else reason), out


def _select_prepared(
    table: CostTable, prep: _Prepared, rows: StepRows, min_verify_len: int
) -> tuple[Selection, _StepCells | None, int]:
    """The step's selection, its memoised cells (None without a graph) and the chosen column."""
    counts = prep.counts
    if not counts:
        return Selection(0, NATIVE_BUDGET, SelectReason.NO_ROWS, 0.0, 0.0, ()), None, -1
    g = prep.graph_batch_size
    r_count = len(counts)
    if g == 0:
        # Above the ladder: only the native yield is reported (full of every rank, in rank order).
        cols = table.max_draft_len - int(min_verify_len)
        stride = prep.prefix.shape[1]
        fulls = prep.prefix.take([r * stride + c * cols for r, c in enumerate(counts)]).tolist()
        native_yield = _seq_sum(b + f for b, f in zip(prep.base, fulls, strict=True))
        return Selection(0, NATIVE_BUDGET, SelectReason.NO_GRAPH, native_yield, 0.0, ()), None, -1
    sc = _step_cells(table, g, int(min_verify_len), counts, rows.num_ranks > r_count)
    # One gather and one tolist for every prefix value the rule needs; the rest is scalar
    # float arithmetic in exactly the order of the vectorised replay.
    vals = prep.prefix.take(sc.gather).tolist()
    base = prep.base
    full = [b + f for b, f in zip(base, vals[:r_count], strict=True)]
    native_yield = _seq_sum(full)
    cells: list[tuple[int, float, bool, float, float]] = []
    at = r_count
    for v, t, geo in zip(sc.budgets, sc.times, sc.geometry, strict=True):
        if geo is None:
            cells.append((v, t, False, 0.0, 0.0))
            continue
        if r_count == 1:
            y = base[0] + vals[at]
            loss = (full[0] - y) / counts[0]
        else:
            # Sequential sum over ranks (0.0 + x is exactly x) and the worst per-request loss,
            # in one plain loop: cheaper than numpy for a handful of ranks, same arithmetic.
            y, loss = 0.0, -math.inf
            for b, p, f, c in zip(base, vals[at : at + r_count], full, counts, strict=True):
                per_rank = b + p
                y += per_rank
                rank_loss = (f - per_rank) / c
                if rank_loss > loss:
                    loss = rank_loss
        at += r_count
        cells.append((v, t, True, y, loss))
    native_ms = sc.native_ms
    col, reason, evals = _choose_one(
        native_yield=native_yield,
        native_ms=native_ms,
        cells=cells,
        minimum_predicted_gain=table.minimum_predicted_gain,
        drain_guard=table.drain_guard,
        tail_native_ms=table.tail_native_ms,
    )
    evaluations = tuple(
        CellEvaluation(v, t, ok, y, e[0], loss, e[1], None if math.isnan(e[2]) else e[2], e[3])
        for (v, t, ok, y, loss), e in zip(cells, evals, strict=True)
    )
    selection = Selection(
        graph_batch_size=g,
        verifier_budget=NATIVE_BUDGET if col < 0 else sc.budgets[col],
        reason=reason,
        native_yield=native_yield,
        native_score=native_yield / native_ms,
        cells=evaluations,
    )
    return selection, sc, col


def _layouts(
    table: CostTable,
    active: tuple[int, ...],
    counts: tuple[int, ...],
    num_ranks: int,
    g: int,
    v: int,
    floor: int,
    geometry: tuple[Geometry, ...],
    idle_geometry: Geometry | None,
) -> tuple[RankLayout, ...]:
    """Every rank's layout under (G, V), memoised per table (it depends on the step's shape only).

    A compact cell's real rows take exactly ``geometry.real_tokens`` (the allocation grants
    exactly ``extra`` above the floor), so every rank submits V tokens.
    """
    # The geometry is a function of (G, V, floor, counts) and the table, so the floor stands in
    # for it in the key (cheaper to hash than Geometry objects).
    key = ("layout", g, v, floor, active, counts, num_ranks)
    memo = table.serving_memo
    hit: tuple[RankLayout, ...] | None = memo.get(key)
    if hit is not None:
        return hit
    k = table.max_draft_len
    geos: Sequence[Geometry | None] = geometry or (None,) * len(counts)
    by_rank = dict(zip(active, zip(counts, geos, strict=True), strict=True))
    layouts: list[RankLayout] = []
    for r in range(num_ranks):
        c, geo = by_rank.get(r, (0, None))
        if v == NATIVE_BUDGET:
            layouts.append(RankLayout(r, c, g - c, k + 1 if c < g else 0, 0, g * (k + 1)))
        elif c:
            assert geo is not None
            layouts.append(RankLayout(r, c, g - c, geo.pad_len, 0, geo.real_tokens + (g - c) * geo.pad_len))
        else:
            assert idle_geometry is not None
            q, high = idle_geometry.pad_len, idle_geometry.pad_high_rows
            layouts.append(RankLayout(r, 0, g, q, high, g * q + high))
    out = tuple(layouts)
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[key] = out
    return out


def _allocate_prepared(
    table: CostTable,
    prep: _Prepared,
    rows: StepRows,
    selection: Selection,
    geometry: tuple[Geometry, ...],
    idle_geometry: Geometry | None,
    extras: np.ndarray | None,
    min_verify_len: int,
) -> Plan:
    k = table.max_draft_len
    n = len(rows)
    g, v = selection.graph_batch_size, selection.verifier_budget
    if g == 0 or v == NATIVE_BUDGET:
        windows = np.full(n, k, dtype=np.int64)
        windows.setflags(write=False)
        layouts = (
            () if g == 0 else _layouts(table, prep.active, prep.counts, rows.num_ranks, g, v, 0, (), None)
        )
        return Plan(selection, windows, layouts)
    floor = int(min_verify_len)
    r_count = len(prep.counts)
    if r_count:
        assert extras is not None
        ranked = prep.ranked
        length = ranked.shape[1]
        # Threshold = each rank's e-th largest candidate. When no tie crosses the cut (the
        # next smaller candidate is strictly below it) "at or above the threshold" is exactly
        # the e best, the mask the tie-break gives; else fall back to the exact tie-break.
        exact = True
        thresholds = []
        for r, e in enumerate(extras.tolist()):
            if e <= 0:
                thresholds.append(math.inf)
                continue
            t = ranked.item(r, length - e)
            thresholds.append(t)
            if e < length and not ranked.item(r, length - e - 1) < t:
                exact = False
        cand = prep.cand
        if exact:
            # One rank: compare with the Python float (no threshold array to build).
            cut = thresholds[0] if r_count == 1 else np.array(thresholds).reshape(r_count, 1, 1)
            mask = cand >= cut
        else:
            flat = cand.reshape(r_count, length)
            mask = top_candidates(flat, extras, ranked=ranked).reshape(cand.shape)
        granted = np.add.reduce(mask, axis=1, dtype=np.int64)  # (R, W) positions above the floor
        granted += floor
        if prep.row_rank_index is None:
            canonical = granted.reshape(n)
        else:
            canonical = granted[prep.row_rank_index, prep.row_local]
        if rows.canonical:
            windows = canonical
        else:
            windows = np.empty(n, dtype=np.int64)
            windows[rows.order] = canonical
    else:
        windows = np.zeros(0, dtype=np.int64)
    windows.setflags(write=False)
    return Plan(
        selection,
        windows,
        _layouts(table, prep.active, prep.counts, rows.num_ranks, g, v, floor, geometry, idle_geometry),
    )


def select(
    table: CostTable,
    calibration: Calibration,
    rows: StepRows,
    *,
    min_verify_len: int = DEFAULT_MIN_VERIFY_LEN,
) -> Selection:
    """Choose the cell of one step (see the module docstring for the rule).

    Raises:
        ConfigError: K differs between table, calibration and logits, or min_verify_len is out
            of range.
    """
    prep = _prepare(table, calibration, rows, min_verify_len)
    return _select_prepared(table, prep, rows, min_verify_len)[0]


def allocate(
    table: CostTable,
    calibration: Calibration,
    rows: StepRows,
    *,
    graph_batch_size: int,
    verifier_budget: int,
    min_verify_len: int = DEFAULT_MIN_VERIFY_LEN,
) -> Plan:
    """Allocate a given cell (G, V) over the step's rows.

    Every (request, position) above the floor is ranked by survival, ties by (position, request);
    the rank's ``extra`` best are granted, so each request verifies a prefix and the rank's tokens
    (real rows + pad rows) equal V exactly. V = 0 gives every row the full K.

    Raises:
        ConfigError: the cell is not measured, G does not hold the rows, or some rank cannot
            carry V.
    """
    prep = _prepare(table, calibration, rows, min_verify_len)
    g, v = int(graph_batch_size), int(verifier_budget)
    table.time(g, v)
    if prep.counts and max(prep.counts) > g:
        raise ConfigError(f"G={g} cannot hold {max(prep.counts)} rows on one rank")
    geometry: tuple[Geometry, ...] = ()
    idle_geometry: Geometry | None = None
    extras: np.ndarray | None = None
    if v != NATIVE_BUDGET:
        budgets = table.compact_budgets(g)
        if v not in budgets:
            raise ConfigError(f"(G={g}, V={v}) is not a compact cell of the table")
        sc = _step_cells(table, g, int(min_verify_len), prep.counts, rows.num_ranks > len(prep.counts))
        col = budgets.index(v)
        found = sc.geometry[col]
        if found is None:
            raise ConfigError(
                f"(G={g}, V={v}) cannot carry rows {list(prep.counts)} with floor {min_verify_len}"
            )
        geometry, idle_geometry, extras = found, sc.idle_geometry[col], sc.extras[col]
    selection = Selection(g, v, SelectReason.COMPACT if v else SelectReason.BELOW_MARGIN, 0.0, 0.0, ())
    return _allocate_prepared(table, prep, rows, selection, geometry, idle_geometry, extras, min_verify_len)


def plan(
    table: CostTable,
    calibration: Calibration,
    rows: StepRows,
    *,
    min_verify_len: int = DEFAULT_MIN_VERIFY_LEN,
) -> Plan:
    """Select the step's cell and allocate it (one pass over the survivals).

    Raises:
        ConfigError: as :func:`select`.
    """
    prep = _prepare(table, calibration, rows, min_verify_len)
    selection, sc, col = _select_prepared(table, prep, rows, min_verify_len)
    if sc is None or col < 0:
        return _allocate_prepared(table, prep, rows, selection, (), None, None, min_verify_len)
    geometry = sc.geometry[col]
    assert geometry is not None
    return _allocate_prepared(
        table, prep, rows, selection, geometry, sc.idle_geometry[col], sc.extras[col], min_verify_len
    )
