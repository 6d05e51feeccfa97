"""Replay static K and dynamic verification over a recorded workload, with honest uncertainty.

For every recorded step the replay decides what the runtime's exact-SPS selector would have
chosen (the same pure pieces as ``runtime_plugin.planner``: cell geometry, ranking, selection rule)
and prices both policies with the measured cost table, exact cells only:

- tokens: static K emits ``A + 1`` per row (A = accepted length under full verification); a verify
  window w emits ``min(A, w) + 1``;
- time: the step's measured T(G, 0) or T(G, V) (median); a pessimistic variant shrinks every
  compact saving to ``ci_low(G, 0) - ci_high(G, V)``;
- goodput: tokens / ms for both, the gain, a 95% interval from two bootstraps (blocks of
  consecutive steps; whole requests) of which the wider bounds are reported;
- receipt economics: policy steps, compact choices, a lower bound on the gross compact value, the
  fixed confidence-path overhead, a safety margin, the net value and the admitted decision
  (TensorRT-LLM's rule, recomputed by :func:`admission_rule`);
- drain-guard inputs estimated from the workload (:func:`estimate_drain_guard`).

Value of a compact step (ms): ``T(G,0) - T(G,V) - lost_tokens * static_ms_per_token``, i.e. the
time the step saved minus the time static K would need for the tokens it did not emit. Summed
over all steps it equals the workload's wall-time saving at equal output.

Vectorised over steps (groups of equal row count are ranked together); pure: the workload, the
cells and the calibration come in as values, nothing is read or written here.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dspark_calibrate.artifacts import ModelError, ReceiptEconomics, canonical_json
from dspark_calibrate.calibrate.deployment.cells import CellGrid, CellTime
from dspark_calibrate.calibrate.deployment.mixed import MixedEvidence
from dspark_calibrate.calibrate.deployment.regime import Objective
from dspark_calibrate.calibrate.deployment.uncertainty import (
    LEGACY,
    CostDraws,
    MixedCosts,
    OverheadEvidence,
    OverheadModel,
    ShiftModel,
    constant_overhead,
    draw_costs,
    measured_overhead,
    overhead_from_runs,
    shift_model,
)
from dspark_calibrate.calibrate.deployment.workload import Workload, WorkloadArrays
from dspark_calibrate.decision import Decision
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.economics import classify_gain
from dspark_calibrate.runtime_plugin.planner import (
    DEFAULT_MIN_VERIFY_LEN,
    DEFAULT_MINIMUM_PREDICTED_GAIN,
    NATIVE_BUDGET,
    REASON_CODES,
    Calibration,
    CellChoice,
    DrainGuard,
    SelectReason,
    cell_geometry,
    choose_cells,
)

__all__ = [
    "DEFAULT_OVERHEAD_FRACTION",
    "DEFAULT_SAFETY_MARGIN_FRACTION",
    "TAIL_QUANTILE",
    "BootstrapSettings",
    "CellGrid",
    "CellTime",
    "Economics",
    "MixedReplay",
    "ReplayReport",
    "StepEvidence",
    "admission_rule",
    "choose_steps",
    "deployed_evidence",
    "estimate_drain_guard",
    "first_losses",
    "gain_decision",
    "policy_dwell",
    "prepare_evidence",
    "replay",
    "selector_replay_sha256",
]

#: Default fixed confidence-path overhead per policy step, as a fraction of the workload's mean
#: native step time (1%): the runtime pays curve preparation and a wider policy allgather on every
#: step, native or compact. Conservative for whole steps of tens of ms; replace it with a measured
#: upper bound (``--overhead-ms``) when you have one.
DEFAULT_OVERHEAD_FRACTION = 0.01
#: Default safety margin, as a fraction of the replayed static wall time (0.5%).
DEFAULT_SAFETY_MARGIN_FRACTION = 0.005
#: Quantile of finished requests' final graph sizes used as the drain tail G (conservative: a
#: larger G has a slower native step, so the guard charges more for a lost token).
TAIL_QUANTILE = 0.9
#: Format tag of the selector-replay digest (documented in docs/build.md).
REPLAY_DIGEST_FORMAT = "dspark-calibrate/selector-replay/v1"


# ---------------------------------------------------------------------------------------------
# Evidence: per step, per candidate cell
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class StepEvidence:
    """What every policy step would yield and emit under native and each candidate cell.

    Steps whose rows exceed the largest G are left out (``skipped_steps``): they run without a
    graph and no measured cost applies. Columns are the candidate V of the step's G, by V.

    Attributes:
        grid: the candidate cells.
        min_verify_len: the verify floor.
        num_ranks: ranks of the deployment.
        step_id, graph_batch_size, rows, static_tokens, native_yield: (S,).
        columns: (S, J) V of each column (-1: no cell).
        compact_yield, max_loss: (S, J) float64 (aggregated over ranks like the runtime).
        feasible: (S, J) every rank (idle ones included) can carry the cell.
        tokens: (S, J) realized tokens under the cell.
        skipped_steps: steps above the ladder.
        finished_graph_batch_size: final-step G of every request that finished inside the trace.
        row_step, row_request, row_static_tokens, row_tokens: per row (only with ``per_row``);
            row_step is -1 for rows of skipped steps.
        source: the grouped rows and the calibration this was evaluated from (lets
            :func:`deployed_evidence` reuse them).
    """

    grid: CellGrid
    min_verify_len: int
    num_ranks: int
    step_id: np.ndarray
    graph_batch_size: np.ndarray
    rows: np.ndarray
    static_tokens: np.ndarray
    native_yield: np.ndarray
    columns: np.ndarray
    compact_yield: np.ndarray
    max_loss: np.ndarray
    feasible: np.ndarray
    tokens: np.ndarray
    skipped_steps: int
    finished_graph_batch_size: np.ndarray
    row_step: np.ndarray | None = None
    row_request: np.ndarray | None = None
    row_static_tokens: np.ndarray | None = None
    row_tokens: np.ndarray | None = None
    mixed_native: RecordedMixed | None = None
    source: _Source | None = field(default=None, repr=False)

    @property
    def steps(self) -> int:
        """Policy steps (steps with a captured graph)."""
        return int(self.step_id.shape[0])

    def times(self, which: str = "median") -> tuple[np.ndarray, np.ndarray]:
        """(native_ms (S,), compact_ms (S, J)) for ``median``, ``low`` or ``high`` cell times."""
        attr = {"median": "step_time_ms", "low": "ci_low_ms", "high": "ci_high_ms"}[which]
        ladder = self.grid.ladder
        nat = np.array([getattr(self.grid.native(g), attr) for g in ladder])
        idx = np.searchsorted(np.array(ladder), self.graph_batch_size)
        native = nat[idx]
        j = self.columns.shape[1]
        table = np.full((len(ladder), max(j, 1)), np.inf)
        for i, g in enumerate(ladder):
            for c, cell in enumerate(self.grid.compact(g)):
                table[i, c] = getattr(cell, attr)
        return native, table[idx][:, :j]


#: Relative SD of a recorded mixed step's time as a price for a serving process: the recording
#: is one run of the engine, not a paired measurement (a run-to-run level difference; the sweep's
#: common level moves it too).
RECORDED_TIME_REL = 0.02
#: Relative SD of a mixed step's time estimated from the decode table (its native step plus the
#: context tokens at the ladder's marginal cost per verified token): a model, not a measurement.
ESTIMATED_TIME_REL = 0.25


@dataclass(frozen=True, eq=False)
class RecordedMixed:
    """Every mixed step of a workload, priced native from what was recorded (DESIGN §9, §10).

    A workload that holds mixed steps is never priced as if it did not: without mixed evidence
    they run native under the policy but pay the confidence path. Their native time is the
    recorded wall time of the step where the workload has it (schema v2 ``step_time_ms``), else an
    estimate from the decode table: the native step of the G that holds its generation rows plus
    its largest rank's context tokens at the ladder's marginal cost per verified token.

    Attributes:
        step_id: (M,) the mixed steps, increasing.
        time_ms: (M,) the native time each is priced at.
        estimated: (M,) True where ``time_ms`` is the table estimate, False where recorded.
        static_tokens: (M,) tokens static K emits in the step.
        row_step, row_request, row_static: per generation row (``row_step`` indexes the steps).
    """

    step_id: np.ndarray
    time_ms: np.ndarray
    estimated: np.ndarray
    static_tokens: np.ndarray
    row_step: np.ndarray
    row_request: np.ndarray
    row_static: np.ndarray

    @property
    def steps(self) -> int:
        """Mixed steps of the workload."""
        return int(self.step_id.shape[0])


def _marginal_token_ms(grid: CellGrid) -> tuple[float, float]:
    """(intercept ms, ms per verified token) of the native ladder, least squares, slope >= 0."""
    ladder = np.array(grid.ladder, dtype=np.float64)
    tokens = ladder * (grid.k + 1)
    ms = np.array([grid.native(int(g)).step_time_ms for g in grid.ladder])
    if ladder.size < 2:
        return 0.0, float(ms[0] / tokens[0])
    slope, intercept = np.polyfit(tokens, ms, 1)
    if slope <= 0:
        return float(ms.min()), 0.0
    return float(intercept), float(slope)


def _recorded_mixed(workload: Workload, grid: CellGrid) -> RecordedMixed | None:
    """The workload's mixed steps with their native prices (None without mixed steps)."""
    steps = workload.mixed_step_rows()
    if not steps:
        return None
    a = workload.arrays()
    values = workload.step_values()
    ids = np.array([m.step for m in steps], dtype=np.int64)
    recorded = values.step_time_ms[np.searchsorted(values.step, ids)]
    ladder = np.array(grid.ladder, dtype=np.int64)
    natives = np.array([grid.native(int(g)).step_time_ms for g in grid.ladder])
    _, per_token = _marginal_token_ms(grid)
    estimate = np.empty(ids.size)
    static = np.empty(ids.size, dtype=np.int64)
    row_step, row_request, row_static = [], [], []
    for i, m in enumerate(steps):
        ranks = m.description.ranks
        gen_rows = max((len(r.generations) for r in ranks), default=0)
        context = max((sum(c.size for c in r.context) for r in ranks), default=0)
        g = min(int(np.searchsorted(ladder, max(gen_rows, 1))), ladder.size - 1)
        estimate[i] = natives[g] * max(1.0, gen_rows / ladder[g]) + context * per_token
        rows = np.arange(m.start, m.stop)
        acc = a.accepted[rows] + 1
        static[i] = int(acc.sum())
        row_step.append(np.full(rows.size, i, dtype=np.int64))
        row_request.append(a.request[rows])
        row_static.append(acc)
    have = np.isfinite(recorded)
    cat = np.concatenate
    return RecordedMixed(
        step_id=ids,
        time_ms=np.where(have, recorded, estimate),
        estimated=~have,
        static_tokens=static,
        row_step=cat(row_step),
        row_request=cat(row_request),
        row_static=cat(row_static),
    )


def _chunks(index: np.ndarray, size: int) -> Iterable[np.ndarray]:
    for i in range(0, index.shape[0], size):
        yield index[i : i + size]


def _decode_rows(workload: Workload) -> WorkloadArrays:
    """The workload's rows without its mixed steps (the mixed path prices those, DESIGN §10)."""
    a = workload.arrays()
    mixed = workload.mixed_step_ids()
    if mixed.size == 0:
        return a
    keep = ~np.isin(a.step, mixed)
    if not keep.any():
        raise ConfigError(
            "every workload step is mixed; the decode table prices decode steps only (record decode traffic too)"
        )
    return WorkloadArrays(
        a.step[keep], a.rank[keep], a.request[keep], a.logits[keep], a.accepted[keep], a.output_len[keep]
    )


def prepare_evidence(
    workload: Workload,
    grid: CellGrid,
    calibration: Calibration,
    *,
    min_verify_len: int = DEFAULT_MIN_VERIFY_LEN,
    per_row: bool = False,
    chunk_rows: int = 1 << 21,
) -> StepEvidence:
    """Evaluate every policy step under native and under every candidate cell of its G.

    Args:
        workload: the recorded steps.
        grid: candidate cells (native per G plus compact candidates).
        calibration: the map the runtime applies to the logits.
        min_verify_len: the runtime's verify floor.
        per_row: also keep per-row tokens per column (for the request bootstrap); use with a
            deployed table (few columns), not with a sweep's candidate set.
        chunk_rows: rows processed at once (bounds memory).

    Raises:
        ConfigError: K differs between workload, grid and calibration, or no step fits the ladder.
    """
    k = grid.k
    if workload.k != k or calibration.k != k:
        raise ConfigError(
            f"K mismatch: cost cells K={k}, calibration K={calibration.k}, workload K={workload.k}; "
            "all three must come from the same deployment"
        )
    floor = int(min_verify_len)
    if not 1 <= floor <= k:
        raise ConfigError(f"min_verify_len must be in [1, K={k}], got {floor}")
    rows = _prepare_rows(workload, grid)
    a, groups = rows.arrays, rows.groups
    budgets = {int(g): [c.verifier_budget for c in grid.compact(int(g))] for g in grid.ladder}
    yields = _group_yields(
        a, groups, calibration, budgets, floor=floor, k=k, per_row=per_row, chunk_rows=chunk_rows
    )
    cells = _step_cells(groups, yields, budgets, num_ranks=workload.num_ranks, floor=floor, k=k)
    keep = ~groups.above
    row_step = row_request = row_static = None
    if per_row:
        step_of_row = np.repeat(groups.step_of_group, groups.count)
        policy_index = np.cumsum(keep) - 1
        row_step = np.where(keep[step_of_row], policy_index[step_of_row], -1)
        row_request = a.request
        row_static = a.accepted + 1
    return StepEvidence(
        grid=grid,
        min_verify_len=floor,
        num_ranks=workload.num_ranks,
        step_id=groups.step[groups.first][keep],
        graph_batch_size=groups.graph[keep],
        rows=np.add.reduceat(groups.count, groups.first)[keep],
        static_tokens=np.add.reduceat(yields.static, groups.first)[keep],
        native_yield=_sequential_sum(yields.full, groups)[keep],
        columns=cells.columns[keep],
        compact_yield=cells.compact_yield[keep],
        max_loss=cells.max_loss[keep],
        feasible=cells.feasible[keep],
        tokens=cells.tokens[keep],
        skipped_steps=int(groups.above.sum()),
        finished_graph_batch_size=_finished_graph_batch_sizes(a, groups),
        row_step=row_step,
        row_request=row_request,
        row_static_tokens=row_static,
        row_tokens=yields.row_tokens,
        mixed_native=_recorded_mixed(workload, grid),
        source=_Source(rows, calibration, chunk_rows),
    )


def deployed_evidence(candidates: StepEvidence, deployed: CellGrid) -> StepEvidence:
    """The candidate evidence restricted to a deployed grid, with per-row tokens.

    Equal, field by field, to ``prepare_evidence(workload, deployed, calibration, per_row=True)``
    with the candidates' workload, calibration and verify floor, without decoding and grouping
    the rows again: the step-level arrays are the candidates' columns of the deployed cells (a
    cell's yields and tokens depend only on its (G, V), the rows and the calibration); only the
    per-row tokens are computed, for the G that have a deployed compact cell. Cell times are the
    deployed grid's.

    Raises:
        ConfigError: the evidence does not come from :func:`prepare_evidence`, or the deployed
            grid has another K or ladder, or a compact cell that is not a candidate.
    """
    src = candidates.source
    if src is None:
        raise ConfigError("deployed_evidence needs evidence from prepare_evidence")
    grid = candidates.grid
    if deployed.k != grid.k or deployed.ladder != grid.ladder:
        raise ConfigError(
            f"the deployed grid (K={deployed.k}, ladder {deployed.ladder}) must keep the candidates' "
            f"K={grid.k} and ladder {grid.ladder}"
        )
    budgets = {int(g): [c.verifier_budget for c in deployed.compact(int(g))] for g in deployed.ladder}
    j_max = max((len(v) for v in budgets.values()), default=0)
    # take[i, j]: the candidate column of the j-th deployed cell of the i-th G (-1: none).
    take = np.full((len(deployed.ladder), j_max), -1, dtype=np.int64)
    for i, (g, vs) in enumerate(budgets.items()):
        offered = [c.verifier_budget for c in grid.compact(g)]
        missing = sorted(set(vs) - set(offered))
        if missing:
            raise ConfigError(f"deployed cells of G={g} with V={missing} are not candidate cells")
        take[i, : len(vs)] = [offered.index(v) for v in vs]
    col = take[np.searchsorted(np.array(deployed.ladder), candidates.graph_batch_size)]
    have = col >= 0
    idx = np.maximum(col, 0)

    def pick(values: np.ndarray, empty: float | int | bool) -> np.ndarray:
        return np.where(have, np.take_along_axis(values, idx, axis=1), empty).astype(values.dtype)

    rows, floor = src.rows, candidates.min_verify_len
    yields = _group_yields(
        rows.arrays,
        rows.groups,
        src.calibration,
        budgets,
        floor=floor,
        k=grid.k,
        per_row=True,
        chunk_rows=src.chunk_rows,
        graphs=[g for g, vs in budgets.items() if vs],
    )
    keep = ~rows.groups.above
    step_of_row = np.repeat(rows.groups.step_of_group, rows.groups.count)
    policy_index = np.cumsum(keep) - 1
    same_natives = all(deployed.native(g) == grid.native(g) for g in grid.ladder)
    return StepEvidence(
        grid=deployed,
        min_verify_len=floor,
        num_ranks=candidates.num_ranks,
        step_id=candidates.step_id,
        graph_batch_size=candidates.graph_batch_size,
        rows=candidates.rows,
        static_tokens=candidates.static_tokens,
        native_yield=candidates.native_yield,
        columns=pick(candidates.columns, -1),
        compact_yield=pick(candidates.compact_yield, 0.0),
        max_loss=pick(candidates.max_loss, 0.0),
        feasible=pick(candidates.feasible, False),
        tokens=pick(candidates.tokens, 0),
        skipped_steps=candidates.skipped_steps,
        finished_graph_batch_size=candidates.finished_graph_batch_size,
        row_step=np.where(keep[step_of_row], policy_index[step_of_row], -1),
        row_request=rows.arrays.request,
        row_static_tokens=rows.arrays.accepted + 1,
        row_tokens=yields.row_tokens,
        mixed_native=candidates.mixed_native if same_natives else _recorded_mixed(rows.workload, deployed),
        source=src,
    )


@dataclass(frozen=True, eq=False)
class _Rows:
    """The workload's decode rows grouped by (step, rank) for one ladder: what every evaluation
    of the workload on that ladder starts from (:func:`_prepare_rows`)."""

    workload: Workload
    arrays: WorkloadArrays
    groups: _Groups


@dataclass(frozen=True, eq=False)
class _Source:
    """What a :class:`StepEvidence` was evaluated from: the grouped rows, the calibration, the chunk size."""

    rows: _Rows
    calibration: Calibration
    chunk_rows: int


def _prepare_rows(workload: Workload, grid: CellGrid) -> _Rows:
    """Decode the workload's rows and group them per step on the grid's ladder (the expensive
    stage that depends only on the workload and the ladder)."""
    a = _decode_rows(workload)
    return _Rows(workload, a, _group_rows(a, grid))


@dataclass(frozen=True, eq=False)
class _Groups:
    """The workload's rows grouped by (step, rank), and the steps the groups form.

    Attributes:
        start, count, step: per group (rank of a step), its first row, rows and step id.
        first: per step, its first group; ranks: per step, its groups.
        step_of_group: per group, its step's index.
        graph: per step, the G its largest group runs at (0 above the ladder); above: per step,
            it exceeds the largest G.
        group_graph: per group, its step's G.
    """

    start: np.ndarray
    count: np.ndarray
    step: np.ndarray
    first: np.ndarray
    ranks: np.ndarray
    step_of_group: np.ndarray
    graph: np.ndarray
    above: np.ndarray
    group_graph: np.ndarray

    @property
    def n_groups(self) -> int:
        return int(self.start.shape[0])

    @property
    def n_steps(self) -> int:
        return int(self.first.shape[0])


def _group_rows(a: WorkloadArrays, grid: CellGrid) -> _Groups:
    """Group the rows by (step, rank) and give each step the smallest G that carries its largest rank.

    Raises:
        ConfigError: no step fits the ladder.
    """
    n = a.step.shape[0]
    new_group = np.r_[True, (a.step[1:] != a.step[:-1]) | (a.rank[1:] != a.rank[:-1])]
    g_start = np.flatnonzero(new_group)
    g_count = np.diff(np.r_[g_start, n])
    g_step = a.step[g_start]
    n_groups = g_start.shape[0]
    new_step = np.r_[True, g_step[1:] != g_step[:-1]]
    s_first = np.flatnonzero(new_step)
    s_groups = np.diff(np.r_[s_first, n_groups])
    step_of_group = np.cumsum(new_step) - 1
    s_max = np.maximum.reduceat(g_count, s_first)
    ladder = np.array(grid.ladder, dtype=np.int64)
    pos = np.searchsorted(ladder, s_max, side="left")
    over = pos >= ladder.shape[0]
    s_g = np.where(over, 0, ladder[np.minimum(pos, ladder.shape[0] - 1)])
    if not np.any(~over):
        raise ConfigError(
            f"no workload step fits the graph ladder {grid.ladder} (largest step has "
            f"{int(s_max.max())} rows on a "
            "rank); record the workload on this deployment"
        )
    return _Groups(g_start, g_count, g_step, s_first, s_groups, step_of_group, s_g, over, s_g[step_of_group])


@dataclass(frozen=True, eq=False)
class _GroupYields:
    """Per group (filled chunk by chunk): expected yield and tokens under native and each column.

    Attributes:
        full: (N,) expected yield with every position verified (native).
        static: (N,) tokens static K emits.
        compact, tokens, feasible: (N, J) expected yield, realized tokens, and whether the
            group's rows fit the column's cell.
        row_tokens: (rows, J) realized tokens per row (only with ``per_row``).
    """

    full: np.ndarray
    static: np.ndarray
    compact: np.ndarray
    tokens: np.ndarray
    feasible: np.ndarray
    row_tokens: np.ndarray | None


def _group_yields(
    a: WorkloadArrays,
    groups: _Groups,
    calibration: Calibration,
    budgets: Mapping[int, Sequence[int]],
    *,
    floor: int,
    k: int,
    per_row: bool,
    chunk_rows: int,
    graphs: Sequence[int] | None = None,
) -> _GroupYields:
    """Every group of a step under the ladder, evaluated in chunks of groups with equal row counts
    (with ``graphs``, only the groups of steps at those G)."""
    n_groups = groups.n_groups
    j_max = max((len(v) for v in budgets.values()), default=0)
    out = _GroupYields(
        full=np.zeros(n_groups),
        static=np.zeros(n_groups, dtype=np.int64),
        compact=np.zeros((n_groups, j_max)),
        tokens=np.zeros((n_groups, j_max), dtype=np.int64),
        feasible=np.zeros((n_groups, j_max), dtype=bool),
        row_tokens=np.zeros((a.step.shape[0], j_max), dtype=np.int16) if per_row else None,
    )
    evaluated = groups.group_graph > 0 if graphs is None else np.isin(groups.group_graph, graphs)
    for c in np.unique(groups.count[evaluated]):
        c = int(c)
        members = np.flatnonzero((groups.count == c) & evaluated)
        for chunk in _chunks(members, max(1, chunk_rows // c)):
            ranked = _rank_chunk(a, groups.start[chunk], c, calibration, floor=floor, k=k)
            out.full[chunk] = ranked.base + ranked.prefix[:, (k - floor) * c]
            out.static[chunk] = c + ranked.accepted.sum(axis=1)
            _fill_cells(out, ranked, chunk, groups.group_graph[chunk], budgets, floor=floor, k=k)
    return out


@dataclass(frozen=True, eq=False)
class _Ranked:
    """A chunk of ``m`` groups of ``c`` rows each, with their candidate positions ranked.

    Attributes:
        rows: (m, c) row indices, in canonical order.
        accepted: (m, c) accepted draft tokens of each row.
        base, base_tokens: (m,) expected yield and realized tokens of the verify floor alone.
        order: (m, (K - floor) * c) candidate positions, best survival first (stable).
        prefix, accepted_prefix: (m, (K - floor) * c + 1) the expected yield and the realized
            tokens of the first ``e`` ranked positions.
    """

    rows: np.ndarray
    accepted: np.ndarray
    base: np.ndarray
    base_tokens: np.ndarray
    order: np.ndarray
    prefix: np.ndarray
    accepted_prefix: np.ndarray


def _rank_chunk(
    a: WorkloadArrays, start: np.ndarray, c: int, calibration: Calibration, *, floor: int, k: int
) -> _Ranked:
    """Survivals of a chunk's rows, and the ranking the runtime grants extra positions in."""
    m = start.shape[0]
    cols = k - floor
    idx = start[:, None] + np.arange(c)[None, :]  # (m, c) rows, canonical order
    lg = a.logits[idx.reshape(-1)]  # (m*c, K)
    surv = calibration.survival_t(np.ascontiguousarray(lg.T, dtype=np.float64)).reshape(k, m, c)
    cand = np.ascontiguousarray(surv[floor:].transpose(1, 0, 2)).reshape(m, cols * c)
    base_terms = np.ascontiguousarray(surv[:floor].transpose(1, 0, 2)).reshape(m, floor * c)
    base = c + np.cumsum(base_terms, axis=1)[:, -1]
    order = np.argsort(-cand, axis=1, kind="stable")
    ranked = np.take_along_axis(cand, order, axis=1)
    prefix = np.zeros((m, cols * c + 1))
    np.cumsum(ranked, axis=1, out=prefix[:, 1:])
    acc = a.accepted[idx]  # (m, c)
    positions = np.arange(floor + 1, k + 1)
    ind = (acc[:, None, :] >= positions[None, :, None]).reshape(m, cols * c)
    aprefix = np.zeros((m, cols * c + 1), dtype=np.int64)
    np.cumsum(np.take_along_axis(ind, order, axis=1), axis=1, out=aprefix[:, 1:])
    base_tok = c + np.minimum(acc, floor).sum(axis=1)
    return _Ranked(idx, acc, base, base_tok, order, prefix, aprefix)


def _fill_cells(
    out: _GroupYields,
    ranked: _Ranked,
    chunk: np.ndarray,
    graph: np.ndarray,
    budgets: Mapping[int, Sequence[int]],
    *,
    floor: int,
    k: int,
) -> None:
    """Write each chunk group's yield and tokens under every cell of its G that can carry it."""
    c = ranked.rows.shape[1]
    for g in np.unique(graph):
        sel = np.flatnonzero(graph == g)
        for j, v in enumerate(budgets[int(g)]):
            geo = cell_geometry(c, int(g), v, min_verify_len=floor, max_draft_len=k)
            if geo is None:
                continue
            e = geo.extra
            rows_sel = chunk[sel]
            out.compact[rows_sel, j] = ranked.base[sel] + ranked.prefix[sel, e]
            out.tokens[rows_sel, j] = ranked.base_tokens[sel] + ranked.accepted_prefix[sel, e]
            out.feasible[rows_sel, j] = True
            if out.row_tokens is not None:
                granted = np.zeros((sel.shape[0], c), dtype=np.int64)
                if e > 0:
                    picked = ranked.order[sel, :e] % c
                    flat = (np.arange(sel.shape[0])[:, None] * c + picked).reshape(-1)
                    granted = np.bincount(flat, minlength=sel.shape[0] * c).reshape(sel.shape[0], c)
                w = floor + granted
                out.row_tokens[ranked.rows[sel].reshape(-1), j] = (
                    1 + np.minimum(ranked.accepted[sel], w)
                ).reshape(-1)


def _sequential_sum(values: np.ndarray, groups: _Groups) -> np.ndarray:
    """Per step, the sum of its groups' ``values`` added sequentially in rank order (like the runtime)."""
    r_max = int(groups.ranks.max())
    if r_max == 1:
        return values.copy()
    local = np.arange(groups.n_groups) - groups.first[groups.step_of_group]
    mat = np.zeros((groups.n_steps, r_max, *values.shape[1:]))
    mat[groups.step_of_group, local] = values
    out: np.ndarray = np.cumsum(mat, axis=1)[:, -1]
    return out


@dataclass(frozen=True, eq=False)
class _StepCells:
    """Per step and column (all steps, above the ladder included): see :class:`StepEvidence`."""

    columns: np.ndarray
    compact_yield: np.ndarray
    max_loss: np.ndarray
    feasible: np.ndarray
    tokens: np.ndarray


def _step_cells(
    groups: _Groups,
    yields: _GroupYields,
    budgets: Mapping[int, Sequence[int]],
    *,
    num_ranks: int,
    floor: int,
    k: int,
) -> _StepCells:
    """Aggregate the groups (ranks) into steps: a column is feasible when every rank, idle ones
    included, can carry its cell."""
    n_steps = groups.n_steps
    first = groups.first
    j_max = yields.compact.shape[1]
    compact_yield = _sequential_sum(yields.compact, groups)
    if j_max:
        feasible = np.logical_and.reduceat(yields.feasible, first, axis=0)
        with np.errstate(invalid="ignore"):
            loss = (yields.full[:, None] - yields.compact) / groups.count[:, None]
        max_loss = np.maximum.reduceat(loss, first, axis=0)
        tokens = np.add.reduceat(yields.tokens, first, axis=0)
    else:
        feasible = np.zeros((n_steps, 0), dtype=bool)
        max_loss = np.zeros((n_steps, 0))
        tokens = np.zeros((n_steps, 0), dtype=np.int64)
    columns = np.full((n_steps, j_max), -1, dtype=np.int64)
    idle = groups.ranks < num_ranks
    for g, vs in budgets.items():
        in_g = groups.graph == g
        for j, v in enumerate(vs):
            columns[in_g, j] = v
            idle_ok = cell_geometry(0, g, v, min_verify_len=floor, max_draft_len=k) is not None
            if not idle_ok:
                feasible[in_g & idle, j] = False
    feasible &= columns >= 0
    return _StepCells(
        columns=columns,
        compact_yield=np.where(feasible, compact_yield, 0.0),
        max_loss=np.where(feasible, max_loss, 0.0),
        feasible=feasible,
        tokens=tokens,
    )


def _finished_graph_batch_sizes(a: WorkloadArrays, groups: _Groups) -> np.ndarray:
    """The drain tail: the final step's G of every request that finished before the trace ended."""
    last_step = int(a.step.max())
    order_r = np.lexsort((a.step, a.request))
    req_sorted = a.request[order_r]
    is_last = np.r_[req_sorted[1:] != req_sorted[:-1], True]
    last_rows = order_r[is_last]
    finished = a.step[last_rows] < last_step
    step_index = np.searchsorted(groups.step[groups.first], a.step[last_rows[finished]])
    finished_g = groups.graph[step_index]
    out: np.ndarray = finished_g[finished_g > 0]
    return out


def choose_steps(
    evidence: StepEvidence,
    *,
    minimum_predicted_gain: float,
    drain_guard: DrainGuard | None,
    allowed: np.ndarray | None = None,
) -> CellChoice:
    """The runtime's choice on every policy step.

    Args:
        evidence: from :func:`prepare_evidence`.
        minimum_predicted_gain: the table's margin.
        drain_guard: the table's guard (None: native everywhere).
        allowed: optional (S, J) or (J_all,)-style mask of columns that are deployed.
    """
    native_ms, compact_ms = evidence.times("median")
    feasible = evidence.feasible if allowed is None else evidence.feasible & allowed
    tail = None
    if drain_guard is not None:
        tail = evidence.grid.native(drain_guard.tail_graph_batch_size).step_time_ms
    choice = choose_cells(
        native_yield=evidence.native_yield,
        native_ms=native_ms,
        compact_yield=evidence.compact_yield,
        compact_ms=compact_ms,
        max_loss=evidence.max_loss,
        feasible=feasible,
        budgets=evidence.columns,
        minimum_predicted_gain=minimum_predicted_gain,
        drain_guard=drain_guard,
        tail_native_ms=tail,
    )
    no_cells = (
        (evidence.columns < 0).all(axis=1) if evidence.columns.shape[1] else np.ones(evidence.steps, bool)
    )
    if allowed is not None and evidence.columns.shape[1]:
        no_cells |= ~(allowed & (evidence.columns >= 0)).any(axis=1)
    choice.reason[no_cells] = REASON_CODES.index(SelectReason.NO_COMPACT_CELLS)
    return choice


def first_losses(evidence: StepEvidence, column: np.ndarray) -> dict[int, int]:
    """Per request (its workload code), the first recorded step at which the policy that chose
    ``column`` ((S,) evidence column per policy step, -1: native) emits fewer tokens for it than
    static K.

    From the next step on, that request's KV history is shorter than the recorded one, so a
    recorded geometry keyed by history (a mixed cell's ``generation_history_sum``) that holds the
    request does not recur under the policy.

    Raises:
        ConfigError: the evidence has no per-row tokens (``prepare_evidence(per_row=True)``).
    """
    ev = evidence
    if ev.row_step is None or ev.row_tokens is None or ev.row_static_tokens is None or ev.row_request is None:
        raise ConfigError("first_losses needs per-row evidence: prepare_evidence(..., per_row=True)")
    if column.shape != (ev.steps,):
        raise ConfigError(f"first_losses needs one column per policy step ({ev.steps}), got {column.shape}")
    rows = np.flatnonzero(ev.row_step >= 0)
    col = column[ev.row_step[rows]]
    rows, col = rows[col >= 0], col[col >= 0]
    lost = ev.row_tokens[rows, col] < ev.row_static_tokens[rows]
    requests = ev.row_request[rows[lost]]
    steps = ev.step_id[ev.row_step[rows[lost]]]
    order = np.lexsort((steps, requests))  # by request, then step
    _, first = np.unique(requests[order], return_index=True)
    return dict(zip(requests[order][first].tolist(), steps[order][first].tolist(), strict=True))


# ---------------------------------------------------------------------------------------------
# Drain guard, admission rule, digests
# ---------------------------------------------------------------------------------------------


def estimate_drain_guard(
    evidence: StepEvidence,
    *,
    minimum_predicted_gain: float,
    minimum_group_value_ms: float = 0.0,
    loss_multiplier: float | None = None,
) -> tuple[DrainGuard, dict[str, Any]]:
    """Estimate the drain guard's inputs from the workload.

    - ``mean_output_tokens_per_request_iteration``: static-K tokens per request per step.
    - ``tail_graph_batch_size``: the 90% quantile (nearest rank, on the ladder) of the graph size
      at the final step of requests that finished inside the trace (all policy steps if none did).
    - ``loss_multiplier`` (unless given): realized lost tokens / predicted yield loss over every
      (step, candidate) that passes the margin, floored at 1 so the guard is never looser than
      the calibration's own prediction.

    Returns:
        The guard and a JSON-ready account of the estimate.
    """
    mean_out = float(evidence.static_tokens.sum()) / float(evidence.rows.sum())
    source = evidence.finished_graph_batch_size
    basis = "finished requests"
    if source.size == 0:
        source, basis = evidence.graph_batch_size, "all policy steps (no request finished inside the trace)"
    tail = int(np.sort(source)[max(0, math.ceil(TAIL_QUANTILE * source.size) - 1)])
    ratio = None
    if loss_multiplier is None:
        native_ms, compact_ms = evidence.times("median")
        with np.errstate(divide="ignore", invalid="ignore"):
            score = np.where(evidence.feasible, evidence.compact_yield / compact_ms, -np.inf)
        nscore = evidence.native_yield / native_ms
        passes = (
            evidence.feasible
            & (score > nscore[:, None])
            & (score >= nscore[:, None] * (1.0 + minimum_predicted_gain))
        )
        predicted = np.where(passes, evidence.native_yield[:, None] - evidence.compact_yield, 0.0).sum()
        realized = np.where(passes, evidence.static_tokens[:, None] - evidence.tokens, 0).sum()
        ratio = float(realized / predicted) if predicted > 0 else None
        loss_multiplier = max(1.0, ratio) if ratio is not None else 1.0
    guard = DrainGuard(
        loss_multiplier=float(loss_multiplier),
        mean_output_tokens_per_request_iteration=mean_out,
        minimum_group_value_ms=float(minimum_group_value_ms),
        tail_graph_batch_size=tail,
    )
    account = {
        "mean_output_tokens_per_request_iteration": mean_out,
        "tail_graph_batch_size": tail,
        "tail_basis": basis,
        "tail_quantile": TAIL_QUANTILE,
        "realized_to_predicted_loss_ratio": ratio,
        "loss_multiplier": guard.loss_multiplier,
        "minimum_group_value_ms": guard.minimum_group_value_ms,
    }
    return guard, account


def admission_rule(
    *,
    policy_steps: int,
    compact_choices: int,
    gross_compact_value_ms_lower_bound: float,
    fixed_confidence_path_overhead_ms_upper_bound: float,
    safety_margin_ms: float,
) -> tuple[bool, float]:
    """The consumer's admission rule: (admitted, net value in ms), from the one receipt rule
    (``artifacts.ReceiptEconomics``).

    ``net = gross - policy_steps * overhead - margin``; admitted when compact_choices > 0 and
    net > 0. Every policy step pays the overhead, native ones included.

    Raises:
        ConfigError: counts or amounts out of range (the consumer refuses them too).
    """
    try:
        receipt = ReceiptEconomics(
            policy_steps=policy_steps,
            compact_choices=compact_choices,
            gross_compact_value_ms_lower_bound=gross_compact_value_ms_lower_bound,
            fixed_confidence_path_overhead_ms_upper_bound=fixed_confidence_path_overhead_ms_upper_bound,
            safety_margin_ms=safety_margin_ms,
        )
    except ModelError as exc:
        raise ConfigError(str(exc)) from exc
    return receipt.admitted, receipt.net_value_ms


def selector_replay_sha256(
    *,
    step_id: np.ndarray,
    graph_batch_size: np.ndarray,
    verifier_budget: np.ndarray,
    header: Mapping[str, Any],
) -> str:
    """SHA-256 of a replay's decisions: canonical JSON header, a newline, then the step ids, Gs and
    Vs as int64 little-endian arrays (in that order)."""
    h = hashlib.sha256()
    h.update(canonical_json({"format": REPLAY_DIGEST_FORMAT, **dict(header)}))
    h.update(b"\n")
    for arr in (step_id, graph_batch_size, verifier_budget):
        h.update(np.ascontiguousarray(arr, dtype="<i8").tobytes())
    return h.hexdigest()


def gain_decision(gain: float, ci_low: float, ci_high: float, *, admitted: bool) -> Decision:
    """Classify the predicted gain (STYLE rule 11): the caller decides what UNDECIDED means.

    ACCEPT: admitted and the interval lies above 0. REJECT: the interval lies at or below 0, or
    the receipt rule does not admit. UNDECIDED: admitted but the interval straddles 0.
    UNKNOWN: no finite estimate. The runtime's own classifier (``economics.classify_gain``).
    """
    return classify_gain(gain, ci_low, ci_high, admitted=admitted)


# ---------------------------------------------------------------------------------------------
# Bootstrap
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BootstrapSettings:
    """Resampling settings (recorded in the build's provenance).

    Attributes:
        resamples: bootstrap replicates.
        block_steps: steps per block (default: round(S ** (1/3)), at least 1).
        seed: the generator seed.
        confidence: the interval's level.
        chunk: replicates drawn at once (bounds memory).
    """

    resamples: int = 1000
    block_steps: int | None = None
    seed: int = 0
    confidence: float = 0.95
    chunk: int = 100

    def __post_init__(self) -> None:
        if self.resamples < 10:
            raise ConfigError(f"bootstrap resamples must be >= 10, got {self.resamples}")
        if self.block_steps is not None and self.block_steps < 1:
            raise ConfigError(f"bootstrap block_steps must be >= 1, got {self.block_steps}")
        if not 0.5 < self.confidence < 1:
            raise ConfigError(f"bootstrap confidence must be in (0.5, 1), got {self.confidence}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "resamples": self.resamples,
            "block_steps": self.block_steps,
            "seed": self.seed,
            "confidence": self.confidence,
        }


def _resample_sums(rng: np.random.Generator, items: np.ndarray, settings: BootstrapSettings) -> np.ndarray:
    """(resamples, q) sums of ``items`` (n, q) under multinomial resampling of the n items."""
    n = items.shape[0]
    out = np.empty((settings.resamples, items.shape[1]))
    for start in range(0, settings.resamples, settings.chunk):
        size = min(settings.chunk, settings.resamples - start)
        draws = rng.integers(0, n, size=(size, n))
        offsets = (np.arange(size) * n)[:, None]
        counts = np.bincount((draws + offsets).reshape(-1), minlength=size * n).reshape(size, n)
        out[start : start + size] = counts @ items
    return out


# ---------------------------------------------------------------------------------------------
# The replay
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Economics:
    """The receipt's economics (TensorRT-LLM's admission inputs) and their outcome."""

    policy_steps: int
    compact_choices: int
    gross_compact_value_ms: float
    gross_compact_value_ms_lower_bound: float
    fixed_confidence_path_overhead_ms_upper_bound: float
    overhead_source: str
    safety_margin_ms: float
    safety_margin_source: str
    net_value_ms: float
    admitted: bool
    gross_compact_value_ms_marginal_lower_bound: float = 0.0


def policy_dwell(
    step_id: np.ndarray, graph_batch_size: np.ndarray, verifier_budget: np.ndarray
) -> dict[str, Any]:
    """The mean run, in steps, a policy stays on one cell (G, V), in step order: ``steps`` is the
    steps over the runs, a run ending where the next step runs another cell (another V or another
    G); ``per_g`` the same for each G's steps and runs. At a power cap a compact saving moves with
    it (docs/sweep.md "The policy's dwell"): ``sweep --interleave --dwell`` measures at it. Pure.

    Returns:
        ``{"steps": float | None, "per_g": {G: float}}`` (None for no step).
    """
    order = np.argsort(np.asarray(step_id), kind="stable")
    g = np.asarray(graph_batch_size, dtype=np.int64)[order]
    v = np.asarray(verifier_budget, dtype=np.int64)[order]
    if g.size == 0:
        return {"steps": None, "per_g": {}}
    ends = np.ones(g.size, dtype=bool)  # a step that ends its run
    ends[:-1] = (g[1:] != g[:-1]) | (v[1:] != v[:-1])
    per_g = {str(int(x)): float(np.sum(g == x) / np.sum(ends & (g == x))) for x in np.unique(g)}
    return {"steps": float(g.size / np.sum(ends)), "per_g": per_g}


@dataclass(frozen=True, eq=False)
class ReplayReport:
    """Everything a replay found. Per-step arrays have one entry per policy step."""

    policy_steps: int
    skipped_steps: int
    static_goodput_tok_per_ms: float
    dynamic_goodput_tok_per_ms: float
    predicted_gain: float
    predicted_gain_ci_low: float
    predicted_gain_ci_high: float
    pessimistic_gain: float
    compact_step_share: float
    economics: Economics
    drain_guard: DrainGuard
    drain_guard_estimate: Mapping[str, Any]
    minimum_predicted_gain: float
    per_bucket: tuple[Mapping[str, Any], ...]
    per_cell: tuple[Mapping[str, Any], ...]
    reasons: Mapping[str, int]
    selector_replay_sha256: str
    bootstrap: Mapping[str, Any]
    decision: Decision
    step_id: np.ndarray
    graph_batch_size: np.ndarray
    verifier_budget: np.ndarray
    uncertainty_model: str = ""
    mixed: MixedReplay | None = None
    objective: str = Objective.THROUGHPUT.value
    predictions: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    tpot_gain: float = 0.0
    mixed_steps: Mapping[str, Any] = field(default_factory=dict)
    shifts: Mapping[str, Any] | None = None
    overhead: Mapping[str, Any] = field(default_factory=dict)

    def dwell(self) -> dict[str, Any]:
        """How long the replayed policy stays on one cell (:func:`policy_dwell`): overall and per G."""
        return policy_dwell(self.step_id, self.graph_batch_size, self.verifier_budget)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (without the per-step arrays)."""
        e = self.economics
        return {
            "dwell": self.dwell(),
            "objective": self.objective,
            "predictions": {k: dict(v) for k, v in self.predictions.items()},
            "tpot_gain": self.tpot_gain,
            "mixed_steps": dict(self.mixed_steps),
            "shifts": None if self.shifts is None else dict(self.shifts),
            "overhead": dict(self.overhead),
            "mixed": self.mixed.to_dict() if self.mixed is not None else None,
            "policy_steps": self.policy_steps,
            "skipped_steps": self.skipped_steps,
            "static_goodput_tok_per_ms": self.static_goodput_tok_per_ms,
            "dynamic_goodput_tok_per_ms": self.dynamic_goodput_tok_per_ms,
            "predicted_gain": self.predicted_gain,
            "predicted_gain_ci_low": self.predicted_gain_ci_low,
            "predicted_gain_ci_high": self.predicted_gain_ci_high,
            "pessimistic_gain": self.pessimistic_gain,
            "uncertainty_model": self.uncertainty_model,
            "compact_step_share": self.compact_step_share,
            "economics": _economics_dict(e),
            "drain_guard": self.drain_guard.to_dict(),
            "drain_guard_estimate": dict(self.drain_guard_estimate),
            "minimum_predicted_gain": self.minimum_predicted_gain,
            "per_bucket": [dict(b) for b in self.per_bucket],
            "per_cell": [dict(c) for c in self.per_cell],
            "reasons": dict(self.reasons),
            "selector_replay_sha256": self.selector_replay_sha256,
            "bootstrap": dict(self.bootstrap),
            "decision": {
                "status": self.decision.status.value,
                "reason": self.decision.reason,
                "detail": self.decision.detail,
            },
        }


def _economics_dict(e: Economics) -> dict[str, Any]:
    return {
        "policy_steps": e.policy_steps,
        "compact_choices": e.compact_choices,
        "gross_compact_value_ms": e.gross_compact_value_ms,
        "gross_compact_value_ms_lower_bound": e.gross_compact_value_ms_lower_bound,
        "fixed_confidence_path_overhead_ms_upper_bound": e.fixed_confidence_path_overhead_ms_upper_bound,
        "overhead_source": e.overhead_source,
        "safety_margin_ms": e.safety_margin_ms,
        "safety_margin_source": e.safety_margin_source,
        "net_value_ms": e.net_value_ms,
        "admitted": e.admitted,
        "gross_compact_value_ms_marginal_lower_bound": e.gross_compact_value_ms_marginal_lower_bound,
    }


#: Format tag of the mixed selector-replay record (documented in docs/mixed.md).
MIXED_REPLAY_FORMAT = "dspark-calibrate/mixed-selector-replay/v1"


def mixed_selector_replay(*, step_id: np.ndarray, capacity: np.ndarray, header: Mapping[str, Any]) -> bytes:
    """The mixed replay's decisions as bytes: canonical JSON header, a newline, then the step ids
    and the chosen capacities (0: native) as int64 little-endian arrays. Its SHA-256 is the
    receipt's ``selector_replay_sha256``."""
    return b"".join(
        [
            canonical_json({"format": MIXED_REPLAY_FORMAT, **dict(header)}),
            b"\n",
            np.ascontiguousarray(step_id, dtype="<i8").tobytes(),
            np.ascontiguousarray(capacity, dtype="<i8").tobytes(),
        ]
    )


@dataclass(frozen=True, eq=False)
class MixedReplay:
    """What the replay found for mixed steps, priced in the same draws as the decode steps.

    Attributes:
        predicted_gain, predicted_gain_ci_low, predicted_gain_ci_high: decode + mixed policy over
            every priced step, against static K.
        decode_part, mixed_part: the same policy's gain over decode steps only and mixed steps only
            (``steps``, ``predicted_gain``, ``ci_low``, ``ci_high``; the mixed part also
            ``priced_steps``, ``covered_steps``, ``diverged_steps``, ``compact_choices``).
        workload_steps, mixed_steps, unpriced_steps: steps of the workload, mixed ones, and mixed
            ones without a measured native arm (left out of every gain; charged the overhead).
        economics: the mixed receipt's (its own compact choices and gross value, the same
            policy steps, overhead and margin as the decode receipt).
        per_cell: per deployed mixed cell: geometry hash, chosen steps, value and its lower bound.
        reasons: the mixed selector's reasons, counted.
        replay_bytes: :func:`mixed_selector_replay` of the decisions; ``selector_replay_sha256``
            its SHA-256.
        static_goodput_tok_per_ms, dynamic_goodput_tok_per_ms: of the decode + mixed policy.
    """

    predicted_gain: float
    predicted_gain_ci_low: float
    predicted_gain_ci_high: float
    decode_part: Mapping[str, Any]
    mixed_part: Mapping[str, Any]
    workload_steps: int
    mixed_steps: int
    unpriced_steps: int
    economics: Economics
    per_cell: tuple[Mapping[str, Any], ...]
    reasons: Mapping[str, int]
    replay_bytes: bytes
    selector_replay_sha256: str
    static_goodput_tok_per_ms: float
    dynamic_goodput_tok_per_ms: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "predicted_gain": self.predicted_gain,
            "predicted_gain_ci_low": self.predicted_gain_ci_low,
            "predicted_gain_ci_high": self.predicted_gain_ci_high,
            "decode_part": dict(self.decode_part),
            "mixed_part": dict(self.mixed_part),
            "workload_steps": self.workload_steps,
            "mixed_steps": self.mixed_steps,
            "unpriced_steps": self.unpriced_steps,
            "economics": _economics_dict(self.economics),
            "per_cell": [dict(c) for c in self.per_cell],
            "reasons": dict(self.reasons),
            "selector_replay_sha256": self.selector_replay_sha256,
            "static_goodput_tok_per_ms": self.static_goodput_tok_per_ms,
            "dynamic_goodput_tok_per_ms": self.dynamic_goodput_tok_per_ms,
        }


def _mixed_report(
    mx: MixedEvidence,
    lay: _Layout,
    steps: _PolicySteps,
    point: Mapping[str, np.ndarray],
    results: Mapping[str, Mapping[str, np.ndarray]],
    totals: np.ndarray,
    *,
    alpha: float,
    decode: Economics,
    overhead: OverheadModel,
    header: Mapping[str, Any] | None,
) -> MixedReplay:
    """The mixed half of a replay (see :class:`MixedReplay`); ``decode`` is the decode policy's
    receipt, whose policy steps, overhead bound and safety margin the mixed receipt shares."""
    lo, hi = _interval(results, "gain", alpha)
    d_lo, d_hi = _interval(results, "gain_decode", alpha)
    m_lo, m_hi = _interval(results, "gain_mixed", alpha)
    priced = mx.priced
    choices = int((mx.cell[priced] >= 0).sum())
    marginal = max(0.0, min(_quantile(r["gross_mixed"], alpha) for r in results.values()))
    joint = (
        _joint_gross(
            results, "gross_mixed", alpha, decode.policy_steps, decode.fixed_confidence_path_overhead_ms_upper_bound
        )
        if overhead.measured and "overhead_total" in next(iter(results.values()))
        else marginal
    )
    economics = _receipt(
        policy_steps=decode.policy_steps,
        compact_choices=choices,
        gross_ms=float(point["gross_mixed"]),
        gross_lb=max(0.0, joint),
        marginal=marginal,
        overhead_ub=decode.fixed_confidence_path_overhead_ms_upper_bound,
        overhead_source=decode.overhead_source,
        margin=decode.safety_margin_ms,
        margin_source=decode.safety_margin_source,
    )
    record = _mixed_record(mx, header)
    reasons: dict[str, int] = {}
    for r in mx.reason:
        reasons[r] = reasons.get(r, 0) + 1
    n_decode = steps.evidence.steps
    return MixedReplay(
        predicted_gain=float(point["gain"]),
        predicted_gain_ci_low=lo,
        predicted_gain_ci_high=hi,
        decode_part={
            "steps": n_decode,
            "predicted_gain": float(point["gain_decode"]),
            "ci_low": d_lo,
            "ci_high": d_hi,
        },
        mixed_part={
            "steps": mx.steps,
            "priced_steps": int(priced.sum()),
            "covered_steps": int(mx.covered.sum()),
            "diverged_steps": int(mx.diverged.sum()),
            "compact_choices": choices,
            "predicted_gain": float(point["gain_mixed"]),
            "ci_low": m_lo,
            "ci_high": m_hi,
        },
        workload_steps=n_decode + steps.evidence.skipped_steps + mx.steps,
        mixed_steps=mx.steps,
        unpriced_steps=int((~priced).sum()),
        economics=economics,
        per_cell=_mixed_per_cell(mx, lay, point, results["blocks of steps"], totals, alpha),
        reasons=reasons,
        replay_bytes=record,
        selector_replay_sha256=hashlib.sha256(record).hexdigest(),
        static_goodput_tok_per_ms=float(point["static_tok"] / point["static_ms"]),
        dynamic_goodput_tok_per_ms=float(point["dyn_tok"] / point["dyn_ms"]),
    )


def _mixed_per_cell(
    mx: MixedEvidence,
    lay: _Layout,
    point: Mapping[str, np.ndarray],
    blocks: Mapping[str, np.ndarray],
    totals: np.ndarray,
    alpha: float,
) -> tuple[dict[str, Any], ...]:
    """Per deployed mixed cell: the steps that chose it, its value and the value's lower bound."""
    per_cell = []
    for j, c in enumerate(mx.deployed):
        col = lay.n_dc + j
        chosen = int(totals[4 * lay.n_g + col])
        per_cell.append(
            {
                "geometry_sha256": c.sha256,
                "chosen_steps": chosen,
                "value_ms": float(point["value_c"][col]),
                "value_ms_lower_bound": _quantile(blocks["value_c"][:, col], alpha) if chosen else 0.0,
            }
        )
    return tuple(per_cell)


def _mixed_record(mx: MixedEvidence, header: Mapping[str, Any] | None) -> bytes:
    """The mixed selector-replay record: every mixed step's chosen capacity (0: native)."""
    capacity = np.array(
        [mx.deployed[c].geometry.capacity if c >= 0 else 0 for c in mx.cell.tolist()], dtype=np.int64
    )
    return mixed_selector_replay(
        step_id=mx.step_id,
        capacity=capacity,
        header={
            "route": mx.grid.route.to_dict(),
            "protocol_sha256": mx.grid.protocol_sha256,
            "cells": [[c.sha256, c.native_lower_ms, c.candidate_upper_ms] for c in mx.deployed],
            **dict(header or {}),
        },
    )


def _overhead_model(
    evidence: StepEvidence,
    overhead_ms: float | None,
    source: str | None = None,
    runs: OverheadEvidence | None = None,
) -> OverheadModel:
    """The per-step overhead: user-given (exact), else the deployed planner's measured runs, else
    the sweep's forced-K arms, else the default."""
    size = len(evidence.grid.ladder)
    if overhead_ms is not None and runs is not None:
        raise ConfigError("give the confidence path's cost once: --overhead-ms or measured runs, not both")
    if runs is not None:
        return overhead_from_runs(runs, size)
    if overhead_ms is not None:
        return constant_overhead(float(overhead_ms), size, source or "user-supplied")
    measured = measured_overhead(evidence.grid)
    if measured is not None:
        return measured
    native_ms, _ = evidence.times("median")
    mean_native = float(native_ms.mean()) if evidence.steps else 0.0
    return constant_overhead(
        DEFAULT_OVERHEAD_FRACTION * mean_native,
        size,
        f"default: {DEFAULT_OVERHEAD_FRACTION:.0%} of the mean native step ({mean_native:.4g} ms); "
        "measure the forced-K arm in the sweep or pass --overhead-ms",
    )


@dataclass(frozen=True, slots=True)
class _Layout:
    """Column layout of the per-unit workload features (see :func:`_features`).

    Groups are the ladder's G, then the mixed groups; cells the decode compact cells, then the
    deployed mixed cells (``n_dg``/``n_dc`` say where the decode part ends).
    """

    n_g: int
    n_c: int
    cell_g: np.ndarray  # (C,) group index of each compact cell
    n_dg: int = -1
    n_dc: int = -1

    def __post_init__(self) -> None:
        if self.n_dg < 0:
            object.__setattr__(self, "n_dg", self.n_g)
        if self.n_dc < 0:
            object.__setattr__(self, "n_dc", self.n_c)

    @property
    def width(self) -> int:
        return 4 * self.n_g + 2 * self.n_c


def _features(
    lay: _Layout,
    unit: np.ndarray,
    n_units: int,
    g_index: np.ndarray,
    c_index: np.ndarray,
    weight: np.ndarray,
    static_tokens: np.ndarray,
    dynamic_tokens: np.ndarray,
) -> np.ndarray:
    """(U, F) workload features per resampling unit: per G the policy steps, the steps left native,
    static and dynamic tokens; per compact cell the steps that chose it and the tokens they lost.
    ``weight`` is each entry's share of a step (1 per step; 1/rows per row of a step)."""
    f = lay.width
    flat = unit * f
    out = np.bincount(flat + g_index, weights=weight, minlength=n_units * f)
    native = c_index < 0
    out += np.bincount(
        flat[native] + lay.n_g + g_index[native], weights=weight[native], minlength=n_units * f
    )
    out += np.bincount(flat + 2 * lay.n_g + g_index, weights=static_tokens, minlength=n_units * f)
    out += np.bincount(flat + 3 * lay.n_g + g_index, weights=dynamic_tokens, minlength=n_units * f)
    comp = ~native
    if np.any(comp):
        base = flat[comp] + 4 * lay.n_g + c_index[comp]
        out += np.bincount(base, weights=weight[comp], minlength=n_units * f)
        lost = (static_tokens - dynamic_tokens)[comp]
        out += np.bincount(base + lay.n_c, weights=lost, minlength=n_units * f)
    features: np.ndarray = out.reshape(n_units, f)
    return features


def _evaluate(
    lay: _Layout,
    agg: np.ndarray,
    native: np.ndarray,
    compact: np.ndarray,
    overhead: np.ndarray,
    gross_native: np.ndarray,
    gross_compact: np.ndarray,
) -> dict[str, np.ndarray]:
    """Gain, gross value, mean overhead, per-G gains and per-cell values of aggregated features,
    for both objectives.

    ``agg`` is (..., F); the cost arrays broadcast against it ((G,) and (C,) for a point, (B, G)
    and (B, C) for draws). Throughput (saturated): goodput ratio; value of a compact step is the
    time it saved minus the time static K needs for the tokens it did not emit. Latency
    (arrival-bound, keys ending ``_latency``): the recorded steps' time ratio; a compact step's
    value is the time it saved (the tokens it did not emit are emitted in steps that run anyway).
    ``overhead_total`` is the overhead charged over the steps, for the joint net value.
    """
    g, c = lay.n_g, lay.n_c
    steps_g, native_g = agg[..., :g], agg[..., g : 2 * g]
    static_tok_g, dyn_tok_g = agg[..., 2 * g : 3 * g], agg[..., 3 * g : 4 * g]
    steps_c, lost_c = agg[..., 4 * g : 4 * g + c], agg[..., 4 * g + c :]
    onehot = np.zeros((c, g))
    onehot[np.arange(c), lay.cell_g] = 1.0
    static_ms_g = steps_g * native
    dyn_ms_g = native_g * native + (steps_c * compact) @ onehot + steps_g * overhead
    with np.errstate(divide="ignore", invalid="ignore"):
        static_ms, dyn_ms = static_ms_g.sum(-1), dyn_ms_g.sum(-1)
        static_tok, dyn_tok = static_tok_g.sum(-1), dyn_tok_g.sum(-1)
        gain = (dyn_tok / dyn_ms) / (static_tok / static_ms) - 1.0
        gain_g = (dyn_tok_g / dyn_ms_g) / (static_tok_g / static_ms_g) - 1.0
        ms_per_token = (steps_g * gross_native).sum(-1) / static_tok
        saved = gross_native[..., lay.cell_g] - gross_compact
        value_lat = steps_c * saved
        value_c = value_lat - lost_c * ms_per_token[..., None]
        overhead_total = (steps_g * overhead).sum(-1)
        overhead_mean = overhead_total / steps_g.sum(-1)
        gain_lat = static_ms / dyn_ms - 1.0
        gain_g_lat = static_ms_g / dyn_ms_g - 1.0
        parts = {}
        for name, cols in (("decode", slice(0, lay.n_dg)), ("mixed", slice(lay.n_dg, g))):
            s_ms, d_ms = static_ms_g[..., cols].sum(-1), dyn_ms_g[..., cols].sum(-1)
            parts[f"gain_{name}"] = (dyn_tok_g[..., cols].sum(-1) / d_ms) / (
                static_tok_g[..., cols].sum(-1) / s_ms
            ) - 1.0
            parts[f"gain_{name}_latency"] = s_ms / d_ms - 1.0
    return {
        "gain": gain,
        "gain_g": gain_g,
        "gross": value_c[..., : lay.n_dc].sum(-1),
        "gross_mixed": value_c[..., lay.n_dc :].sum(-1),
        "value_c": value_c,
        "gain_latency": gain_lat,
        "gain_g_latency": gain_g_lat,
        "gross_latency": value_lat[..., : lay.n_dc].sum(-1),
        "gross_mixed_latency": value_lat[..., lay.n_dc :].sum(-1),
        "value_c_latency": value_lat,
        **parts,
        "overhead": overhead_mean,
        "overhead_total": overhead_total,
        "static_ms": static_ms,
        "dyn_ms": dyn_ms,
        "static_tok": static_tok,
        "dyn_tok": dyn_tok,
    }


#: The keys of :func:`_evaluate` that differ by objective (the latency ones end in ``_latency``).
_OBJECTIVE_KEYS = ("gain", "gain_g", "gross", "gross_mixed", "value_c", "gain_decode", "gain_mixed")


def _for_objective(values: Mapping[str, np.ndarray], objective: Objective) -> dict[str, np.ndarray]:
    """``values`` with the objective's numbers under the plain keys (throughput's are the plain ones)."""
    out = dict(values)
    if objective is Objective.LATENCY:
        for key in _OBJECTIVE_KEYS:
            out[key] = values[f"{key}_latency"]
    return out


@dataclass(frozen=True, eq=False)
class _Choice:
    """The runtime's choice on every policy step, in the shapes the pricing needs."""

    reason: np.ndarray
    compact: np.ndarray  # (S,) bool
    column: np.ndarray  # (S,) evidence column (0 where native)
    verifier_budget: np.ndarray  # (S,)
    tokens: np.ndarray  # (S,) tokens emitted under the choice
    g_index: np.ndarray  # (S,) ladder index
    c_index: np.ndarray  # (S,) deployed compact cell index, -1 native
    cells: tuple[tuple[int, int], ...]  # deployed compact cells, indexed by c_index


def _choose(evidence: StepEvidence, choice: CellChoice) -> _Choice:
    ev = evidence
    compact = choice.column >= 0
    col = np.where(compact, choice.column, 0)
    ar = np.arange(ev.steps)
    if ev.columns.shape[1]:
        v = np.where(compact, ev.columns[ar, col], NATIVE_BUDGET)
        tokens = np.where(compact, ev.tokens[ar, col], ev.static_tokens)
    else:
        v, tokens = np.zeros(ev.steps, dtype=np.int64), ev.static_tokens.copy()
    ladder = np.array(ev.grid.ladder)
    g_index = np.searchsorted(ladder, ev.graph_batch_size)
    cells = ev.grid.compact_keys()
    lookup = {cell: i for i, cell in enumerate(cells)}
    c_index = np.array(
        [lookup[(int(g), int(b))] if b else -1 for g, b in zip(ev.graph_batch_size, v, strict=True)],
        dtype=np.int64,
    )
    return _Choice(choice.reason, compact, col, v, tokens, g_index, c_index, cells)


def _quantile(values: np.ndarray, q: float) -> float:
    return float(np.nanquantile(values, q))


def _pessimistic_gain(
    lay: _Layout,
    totals: np.ndarray,
    grid: CellGrid,
    cells: tuple[tuple[int, int], ...],
    overhead: np.ndarray,
    mixed: _MixedPricing | None,
    objective: Objective,
) -> float:
    """Gain with every deployed saving at the low end of its interval (a stress case, not a bound)."""
    ladder = grid.ladder
    native = np.array([grid.native(g).step_time_ms for g in ladder])
    by_key = {(c.graph_batch_size, c.verifier_budget): c for g in ladder for c in grid.compact(g)}
    low = np.array([1.0 - by_key[k].saving_ci_low for k in cells])
    if mixed is not None:
        native = np.r_[native, [g.step_time_ms for g in mixed.natives]]
        low = np.r_[low, [1.0 - c.saving_ci_low for c in mixed.cells]]
    compact = native[lay.cell_g] * low
    values = _evaluate(lay, totals, native, compact, overhead, native, compact)
    return float(_for_objective(values, objective)["gain"])


def replay(
    evidence: StepEvidence,
    *,
    minimum_predicted_gain: float = DEFAULT_MINIMUM_PREDICTED_GAIN,
    drain_guard: DrainGuard,
    drain_guard_estimate: Mapping[str, Any] | None = None,
    allowed: np.ndarray | None = None,
    overhead_ms: float | None = None,
    overhead_source: str | None = None,
    overhead_evidence: OverheadEvidence | None = None,
    shifts: ShiftModel | None = None,
    objective: Objective | str = Objective.THROUGHPUT,
    safety_margin_ms: float | None = None,
    bootstrap: BootstrapSettings = BootstrapSettings(),
    header: Mapping[str, Any] | None = None,
    mixed: MixedEvidence | None = None,
    mixed_header: Mapping[str, Any] | None = None,
) -> ReplayReport:
    """Replay both policies over the evidence and state gain, interval and economics jointly.

    Decisions come from the runtime's own rule on the signed medians; prices come from one joint
    resampling of the workload (blocks of steps, and whole requests when the evidence has rows)
    and of the cost table (:mod:`~dspark_calibrate.calibrate.deployment.uncertainty`): savings,
    levels, the saving shifts and the planner's overhead. The gain's interval, the per-bucket
    intervals, each cell's value bound, the receipt's amounts are quantiles of the same
    replicates; the wider of the two workload schemes is reported. Every mixed step of the
    workload is priced (measured, recorded or estimated: :class:`RecordedMixed`) and pays the
    overhead; without mixed evidence it runs native.

    Args:
        evidence: from :func:`prepare_evidence` (``per_row=True`` adds the request bootstrap).
        minimum_predicted_gain: the table's margin.
        drain_guard: the table's drain guard.
        drain_guard_estimate: how the guard was estimated (reported as is).
        allowed: columns deployed (default all of the evidence's grid).
        overhead_ms: fixed confidence-path overhead per policy step, exact (default: the
            measured runs of ``overhead_evidence``, else the sweep's forced-K arms when measured,
            else 1% of the mean native step time).
        overhead_source: where ``overhead_ms`` came from (default "user-supplied").
        overhead_evidence: measured runs of the deployed planner's confidence path, drawn in the
            replicates (takes precedence over the sweep's forced-K arms).
        shifts: the saving shifts (default: :func:`shift_model` of the grid, the floors).
        objective: the gain stated and tested: throughput (lost tokens priced) or latency
            (per-step time at the recorded arrivals, no token-loss price).
        safety_margin_ms: the receipt's safety margin (default: 0.5% of the static wall time).
        bootstrap: resampling settings.
        header: extra fields of the selector-replay digest header (calibration, cells, ...).
        mixed: the workload's mixed steps under the deployed mixed cells (:mod:`.mixed`): priced
            in the same draws, reported in ``report.mixed``. The report's own gain is the decode
            policy's with mixed steps native (what runs without mixed evidence), over every step.
        mixed_header: extra fields of the mixed selector-replay header.
    """
    ev = evidence
    goal = Objective(objective)
    choice = choose_steps(
        ev, minimum_predicted_gain=minimum_predicted_gain, drain_guard=drain_guard, allowed=allowed
    )
    ch = _choose(ev, choice)
    pricing = _mixed_pricing(ev, mixed)
    lay = _layout(ev, ch, pricing)
    overhead = _overhead_model(ev, overhead_ms, overhead_source, overhead_evidence)
    shift = shifts if shifts is not None else shift_model(ev.grid)
    # One generator, drawn in a fixed order: the cost table first, then each workload scheme.
    rng = np.random.default_rng(bootstrap.seed)
    costs = draw_costs(
        ev.grid,
        ch.cells,
        overhead,
        draws=bootstrap.resamples,
        rng=rng,
        confidence=bootstrap.confidence,
        mixed=_mixed_costs(pricing),
        shifts=shift if ev.grid.paired else None,
    )
    steps = _PolicySteps.of(ev, ch, pricing, lay)
    raw = _price(lay, steps, costs, rng, bootstrap, with_mixed=mixed is not None)
    priced = raw.view(goal)
    alpha = (1.0 - bootstrap.confidence) / 2.0
    compact_choices = int(ch.compact.sum())
    # Every step the engine runs with confidence scheduling on pays the overhead, mixed steps
    # included.
    policy_steps = max(1, steps.count + steps.unpriced)
    economics = _decode_economics(
        lay,
        priced,
        costs,
        overhead,
        alpha=alpha,
        policy_steps=policy_steps,
        compact_choices=compact_choices,
        safety_margin_ms=safety_margin_ms,
    )
    return _replay_report(
        _ReplayState(ev, choice, ch, lay, pricing, costs, steps, raw, priced, economics, goal, shift, overhead),
        drain_guard=drain_guard,
        drain_guard_estimate=drain_guard_estimate,
        minimum_predicted_gain=minimum_predicted_gain,
        bootstrap=bootstrap,
        header=header,
        mixed=mixed,
        mixed_header=mixed_header,
    )


@dataclass(frozen=True, eq=False)
class _ReplayState:
    """Everything one replay computed, for :func:`_replay_report`."""

    ev: StepEvidence
    choice: CellChoice
    ch: _Choice
    lay: _Layout
    pricing: _MixedPricing | None
    costs: CostDraws
    steps: _PolicySteps
    raw: _Priced
    priced: _Priced
    economics: Economics
    goal: Objective
    shift: ShiftModel
    overhead: OverheadModel


def _replay_report(
    r: _ReplayState,
    *,
    drain_guard: DrainGuard,
    drain_guard_estimate: Mapping[str, Any] | None,
    minimum_predicted_gain: float,
    bootstrap: BootstrapSettings,
    header: Mapping[str, Any] | None,
    mixed: MixedEvidence | None,
    mixed_header: Mapping[str, Any] | None,
) -> ReplayReport:
    """The report of one replay (see :class:`ReplayReport`)."""
    ev, ch, lay, priced, costs, economics = r.ev, r.ch, r.lay, r.priced, r.costs, r.economics
    alpha = (1.0 - bootstrap.confidence) / 2.0
    ci_low, ci_high = _interval(priced.results, "gain", alpha)
    compact_choices = economics.compact_choices
    point = priced.point
    gain = float(point["gain"])
    return ReplayReport(
        policy_steps=economics.policy_steps,
        skipped_steps=ev.skipped_steps,
        static_goodput_tok_per_ms=float(point["static_tok"] / point["static_ms"]),
        dynamic_goodput_tok_per_ms=float(point["dyn_tok"] / point["dyn_ms"]),
        predicted_gain=gain,
        predicted_gain_ci_low=ci_low,
        predicted_gain_ci_high=ci_high,
        pessimistic_gain=_pessimistic_gain(
            lay, priced.totals, ev.grid, ch.cells, costs.overhead_point, r.pricing, r.goal
        ),
        compact_step_share=compact_choices / ev.steps if ev.steps else 0.0,
        economics=economics,
        drain_guard=drain_guard,
        drain_guard_estimate=dict(drain_guard_estimate or {}),
        minimum_predicted_gain=float(minimum_predicted_gain),
        per_bucket=_per_bucket(ev.grid.ladder, lay, priced, alpha),
        per_cell=_per_cell(ev.grid.ladder, lay, ch.cells, priced, alpha),
        reasons=_reason_counts(r.choice.reason),
        selector_replay_sha256=_decode_digest(ev, ch, drain_guard, minimum_predicted_gain, header),
        bootstrap={
            **bootstrap.to_dict(),
            "block_steps": priced.block,
            "methods": list(priced.results),
            "uncertainty_model": costs.model,
        },
        decision=gain_decision(gain, ci_low, ci_high, admitted=economics.admitted),
        step_id=ev.step_id,
        graph_batch_size=ev.graph_batch_size,
        verifier_budget=ch.verifier_budget,
        uncertainty_model=costs.model,
        mixed=None
        if mixed is None
        else _mixed_report(
            mixed,
            lay,
            r.steps,
            priced.point_full,
            priced.results_full,
            priced.totals_full,
            alpha=alpha,
            decode=economics,
            overhead=r.overhead,
            header=mixed_header,
        ),
        objective=r.goal.value,
        predictions={
            o.value: _prediction(r.raw.view(o), alpha) for o in (Objective.THROUGHPUT, Objective.LATENCY)
        },
        tpot_gain=_tpot_gain(r.steps, costs),
        mixed_steps=_mixed_account(ev, r.pricing),
        shifts=r.shift.to_dict() if ev.grid.paired else None,
        overhead=_overhead_account(r.overhead),
    )


def _decode_digest(
    ev: StepEvidence,
    ch: _Choice,
    drain_guard: DrainGuard,
    minimum_predicted_gain: float,
    header: Mapping[str, Any] | None,
) -> str:
    """The decode replay's ``selector_replay_sha256`` (see :func:`selector_replay_sha256`)."""
    return selector_replay_sha256(
        step_id=ev.step_id,
        graph_batch_size=ev.graph_batch_size,
        verifier_budget=ch.verifier_budget,
        header={
            "k": ev.grid.k,
            "min_verify_len": ev.min_verify_len,
            "minimum_predicted_gain": minimum_predicted_gain,
            "drain_guard": drain_guard.to_dict(),
            **dict(header or {}),
        },
    )


def _prediction(priced: _Priced, alpha: float) -> dict[str, float]:
    """One objective's gain and interval."""
    lo, hi = _interval(priced.results, "gain", alpha)
    return {"gain": float(priced.point["gain"]), "ci_low": lo, "ci_high": hi}


def _tpot_gain(steps: _PolicySteps, costs: CostDraws) -> float:
    """Time per output token at the recorded arrivals, at the point costs: each step's time
    weighted by the requests it serves (a request finishes within the steps it was recorded in,
    the arrival-bound assumption), relative to static K."""
    ev = steps.evidence
    native = costs.native_point[steps.g_index]
    compact = np.where(
        steps.c_decode >= 0, costs.compact_point[np.maximum(steps.c_decode, 0)], native
    ) if costs.compact_point.size else native
    dynamic = compact + costs.overhead_point[steps.g_index]
    rows = ev.rows.astype(np.float64)
    mp = steps.mixed
    if mp is not None:
        rows = np.r_[rows, np.maximum(np.bincount(mp.row_step, minlength=mp.steps), 1)]
    with np.errstate(divide="ignore", invalid="ignore"):
        return float((rows * native).sum() / (rows * dynamic).sum() - 1.0)


def _mixed_account(ev: StepEvidence, mp: _MixedPricing | None) -> dict[str, Any]:
    """How the workload's mixed steps were priced (all zeros for a decode-only workload)."""
    total = ev.steps + ev.skipped_steps + (mp.steps if mp is not None else 0)
    if mp is None:
        return {"steps": 0, "share": 0.0, "measured": 0, "recorded": 0, "estimated": 0}
    measured = mp.steps - mp.recorded_steps - mp.estimated_steps
    return {
        "steps": mp.steps,
        "share": mp.steps / total if total else 0.0,
        "measured": measured,
        "recorded": mp.recorded_steps,
        "estimated": mp.estimated_steps,
    }


def _overhead_account(overhead: OverheadModel) -> dict[str, Any]:
    """What the confidence path was charged, for the report."""
    runs = np.asarray(overhead.runs, dtype=np.float64)
    return {
        "planner": overhead.planner,
        "source": overhead.source,
        "mean_ms": float(np.mean(overhead.per_g_ms)) if overhead.per_g_ms else 0.0,
        "runs": len(overhead.runs),
        "standard_error_ms": float(runs.std(ddof=1) / math.sqrt(runs.size)) if runs.size > 1 else None,
        "drawn": overhead.measured,
    }


#: Most price buckets the recorded (or estimated) mixed steps are grouped into, per source.
MIXED_PRICE_BUCKETS = 16


@dataclass(frozen=True, eq=False)
class _MixedPricing:
    """Every mixed step of the workload as the replay prices it.

    Groups are the mixed evidence's measured native arms (``measured`` of them), then buckets of
    steps priced by their recorded time, then buckets priced by the table estimate; cells are the
    deployed mixed cells. Every mixed step has a group.
    """

    natives: tuple[CellTime, ...]
    cells: tuple[CellTime, ...]
    cell_group: tuple[int, ...]
    step_id: np.ndarray
    group: np.ndarray
    cell: np.ndarray
    static_tokens: np.ndarray
    tokens: np.ndarray
    row_step: np.ndarray
    row_request: np.ndarray
    row_static: np.ndarray
    row_tokens: np.ndarray
    measured: int
    recorded_steps: int
    estimated_steps: int

    @property
    def steps(self) -> int:
        return int(self.step_id.shape[0])


def _price_buckets(time_ms: np.ndarray, rel: float, first: int) -> tuple[np.ndarray, list[CellTime]]:
    """Group steps into at most :data:`MIXED_PRICE_BUCKETS` buckets of similar time (quantiles);
    each bucket is priced at its mean, so every total stays exact."""
    if time_ms.size == 0:
        return np.zeros(0, dtype=np.int64), []
    n = min(MIXED_PRICE_BUCKETS, time_ms.size)
    order = np.argsort(time_ms, kind="stable")
    bucket = np.empty(time_ms.size, dtype=np.int64)
    bucket[order] = (np.arange(time_ms.size) * n) // time_ms.size
    cells = []
    for b in range(n):
        t = float(time_ms[bucket == b].mean())
        cells.append(CellTime(0, 0, t, t, t, "", level_rel=rel))
    return bucket + first, cells


def _mixed_pricing(ev: StepEvidence, mx: MixedEvidence | None) -> _MixedPricing | None:
    """Price every mixed step: by the mixed evidence's measured native arm where it has one, else
    by its recorded time, else by the table estimate (:class:`RecordedMixed`)."""
    rec = ev.mixed_native
    if rec is None:
        return None
    natives: list[CellTime] = []
    group = np.full(rec.steps, -1, dtype=np.int64)
    cell = np.full(rec.steps, -1, dtype=np.int64)
    tokens = rec.static_tokens.copy()
    row = (rec.row_step, rec.row_request, rec.row_static, rec.row_static)
    cells: tuple[CellTime, ...] = ()
    cell_group: tuple[int, ...] = ()
    if mx is not None:
        if not np.array_equal(mx.step_id, rec.step_id):
            raise ConfigError("the mixed evidence was prepared from another workload than the decode evidence")
        natives = [g.time for g in mx.grid.groups]
        group = mx.group.copy()
        cell = mx.cell.copy()
        tokens = mx.tokens.copy()
        row = (mx.row_step, mx.row_request, mx.row_static, mx.row_tokens)
        cells = tuple(c.time for c in mx.deployed)
        cell_group = tuple(c.group for c in mx.deployed)
    measured = len(natives)
    rest = group < 0
    recorded = rest & ~rec.estimated
    estimated = rest & rec.estimated
    for mask, rel in ((recorded, RECORDED_TIME_REL), (estimated, ESTIMATED_TIME_REL)):
        buckets, made = _price_buckets(rec.time_ms[mask], rel, len(natives))
        group[mask] = buckets
        natives += made
    return _MixedPricing(
        natives=tuple(natives),
        cells=cells,
        cell_group=cell_group,
        step_id=rec.step_id,
        group=group,
        cell=cell,
        static_tokens=rec.static_tokens,
        tokens=tokens,
        row_step=row[0],
        row_request=row[1],
        row_static=row[2],
        row_tokens=row[3],
        measured=measured,
        recorded_steps=int(recorded.sum()),
        estimated_steps=int(estimated.sum()),
    )


def _layout(ev: StepEvidence, ch: _Choice, mp: _MixedPricing | None) -> _Layout:
    """The feature layout: the ladder's G then the mixed groups; the decode cells then the mixed ones."""
    ladder = ev.grid.ladder
    n_h = len(mp.natives) if mp is not None else 0
    n_m = len(mp.cells) if mp is not None else 0
    cell_g = [ladder.index(g) for g, _ in ch.cells]
    if mp is not None:
        cell_g += [len(ladder) + g for g in mp.cell_group]
    return _Layout(
        len(ladder) + n_h, len(ch.cells) + n_m, np.array(cell_g, dtype=np.int64), len(ladder), len(ch.cells)
    )


def _mixed_costs(mp: _MixedPricing | None) -> MixedCosts | None:
    """The mixed part of the cost table the draws cover (None without mixed steps)."""
    if mp is None:
        return None
    return MixedCosts(mp.natives, mp.cells, mp.cell_group)


@dataclass(frozen=True, eq=False)
class _Priced:
    """Both policies priced at the point costs and in every workload scheme's replicates.

    ``*_full`` are the decode + mixed policy's (the same as the decode policy's without mixed
    evidence); ``results`` is keyed by resampling scheme, in the order the draws were taken.
    """

    block: int
    totals: np.ndarray
    totals_full: np.ndarray
    point: dict[str, np.ndarray]
    point_full: dict[str, np.ndarray]
    results: dict[str, dict[str, np.ndarray]]
    results_full: dict[str, dict[str, np.ndarray]]

    def view(self, objective: Objective) -> _Priced:
        """The same prices with the objective's gains and values under the plain keys."""

        def each(r: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, dict[str, np.ndarray]]:
            return {name: _for_objective(v, objective) for name, v in r.items()}

        return _Priced(
            self.block,
            self.totals,
            self.totals_full,
            _for_objective(self.point, objective),
            _for_objective(self.point_full, objective),
            each(self.results),
            each(self.results_full),
        )


def _price(
    lay: _Layout,
    steps: _PolicySteps,
    costs: CostDraws,
    rng: np.random.Generator,
    bootstrap: BootstrapSettings,
    *,
    with_mixed: bool,
) -> _Priced:
    """Aggregate the workload features, price them at the point costs, then resample and price
    every scheme (blocks of steps; whole requests when the evidence has rows) with the draws."""
    n_priced = steps.count
    block = bootstrap.block_steps or max(1, round(n_priced ** (1.0 / 3.0)))
    n_blocks = -(-n_priced // block) if n_priced else 0
    unit = steps.position // block
    # One resampling prices both policies: decode only (mixed steps native) and decode + mixed.
    x_decode = steps.features(lay, unit, n_blocks, mixed_cells=False)
    x_full = steps.features(lay, unit, n_blocks, mixed_cells=True) if with_mixed else x_decode
    width = lay.width
    totals = x_decode.sum(axis=0)
    totals_full = x_full.sum(axis=0)
    point_args = (
        costs.native_point,
        costs.compact_point,
        costs.overhead_point,
        costs.native_point,
        costs.compact_point,
    )
    point = _evaluate(lay, totals, *point_args)
    point_full = _evaluate(lay, totals_full, *point_args)
    schemes = {"blocks of steps": np.hstack([x_decode, x_full]) if with_mixed else x_decode}
    rows = steps.row_features(lay, both=with_mixed)
    if rows is not None:
        schemes["requests"] = rows
    results, results_full = {}, {}
    draw_args = (costs.native, costs.compact, costs.overhead, costs.gross_native, costs.gross_compact)
    for name, x in schemes.items():
        agg = _resample_sums(rng, x, bootstrap)
        results[name] = _evaluate(lay, agg[:, :width], *draw_args)
        results_full[name] = _evaluate(lay, agg[:, width:], *draw_args) if with_mixed else results[name]
    return _Priced(block, totals, totals_full, point, point_full, results, results_full)


def _interval(
    results: Mapping[str, Mapping[str, np.ndarray]], name: str, alpha: float
) -> tuple[float, float]:
    """The widest (low, high) quantile interval of ``name`` over the resampling schemes."""
    lo = min(_quantile(r[name], alpha) for r in results.values())
    hi = max(_quantile(r[name], 1 - alpha) for r in results.values())
    return lo, hi


def _decode_economics(
    lay: _Layout,
    priced: _Priced,
    costs: CostDraws,
    overhead: OverheadModel,
    *,
    alpha: float,
    policy_steps: int,
    compact_choices: int,
    safety_margin_ms: float | None,
) -> Economics:
    """The decode policy's receipt: the gross value's lower bound, the overhead's upper bound and
    the safety margin, through the runtime's admission rule."""
    results, point = priced.results, priced.point
    gross_low = min(_quantile(r["gross"], alpha) for r in results.values())
    marginal = gross_low
    if costs.model == LEGACY:
        # The pre-pairing bound: also no higher than the pessimistic point value.
        pess = _evaluate(
            lay,
            priced.totals,
            costs.native_point,
            costs.compact_point,
            costs.overhead_point,
            costs.gross_native[0],
            costs.gross_compact[0],
        )
        gross_low = min(gross_low, float(pess["gross"]))
    if overhead.measured:
        overhead_ub = max(_quantile(r["overhead"], 1 - alpha) for r in results.values())
        overhead_src = (
            f"{overhead.source}; upper {1 - alpha:.1%} bound of the per-step mean over the joint resampling"
        )
        if costs.model != LEGACY:
            gross_low = _joint_gross(results, "gross", alpha, policy_steps, overhead_ub)
    else:
        overhead_ub, overhead_src = float(point["overhead"]), overhead.source
    if safety_margin_ms is None:
        margin, margin_src = (
            DEFAULT_SAFETY_MARGIN_FRACTION * float(point["static_ms"]),
            f"default: {DEFAULT_SAFETY_MARGIN_FRACTION:.1%} of the static wall time",
        )
    else:
        margin, margin_src = float(safety_margin_ms), "user-supplied"
    return _receipt(
        policy_steps=policy_steps,
        compact_choices=compact_choices,
        gross_ms=float(point["gross"]),
        gross_lb=max(0.0, gross_low),
        overhead_ub=overhead_ub,
        overhead_source=overhead_src,
        margin=margin,
        margin_source=margin_src,
        marginal=max(0.0, marginal),
    )


def _joint_gross(
    results: Mapping[str, Mapping[str, np.ndarray]],
    gross: str,
    alpha: float,
    policy_steps: int,
    overhead_ub: float,
) -> float:
    """The receipt's gross lower bound when the overhead is drawn (DESIGN §9, never stacked).

    The net value ``gross_b − overhead_b`` of every replicate is one distribution; its lower
    ``alpha`` quantile is the bound the gate tests. The receipt states the overhead at its upper
    bound, so the gross amount is that net bound plus the overhead charge: the consumer's
    arithmetic ``gross − policy_steps · overhead − margin`` then equals the joint bound minus
    the margin, instead of the difference of two separate worst cases.
    """
    net = min(_quantile(r[gross] - r["overhead_total"], alpha) for r in results.values())
    return net + policy_steps * overhead_ub


def _receipt(
    *,
    policy_steps: int,
    compact_choices: int,
    gross_ms: float,
    gross_lb: float,
    overhead_ub: float,
    overhead_source: str,
    margin: float,
    margin_source: str,
    marginal: float | None = None,
) -> Economics:
    """The economics of one policy, admitted or not by :func:`admission_rule`. ``marginal`` is the
    gross value's own lower bound (reported beside the joint one; default: ``gross_lb``)."""
    admitted, net = admission_rule(
        policy_steps=policy_steps,
        compact_choices=compact_choices,
        gross_compact_value_ms_lower_bound=gross_lb,
        fixed_confidence_path_overhead_ms_upper_bound=overhead_ub,
        safety_margin_ms=margin,
    )
    return Economics(
        policy_steps=policy_steps,
        compact_choices=compact_choices,
        gross_compact_value_ms=gross_ms,
        gross_compact_value_ms_lower_bound=gross_lb,
        fixed_confidence_path_overhead_ms_upper_bound=overhead_ub,
        overhead_source=overhead_source,
        safety_margin_ms=margin,
        safety_margin_source=margin_source,
        net_value_ms=net,
        admitted=admitted,
        gross_compact_value_ms_marginal_lower_bound=gross_lb if marginal is None else marginal,
    )


def _per_bucket(
    ladder: Sequence[int], lay: _Layout, priced: _Priced, alpha: float
) -> tuple[dict[str, Any], ...]:
    """Per G with policy steps: its steps, gain with the block bootstrap's interval, compact share."""
    totals, point, blocks = priced.totals, priced.point, priced.results["blocks of steps"]
    per_bucket = []
    for i, g in enumerate(ladder):
        n_steps = int(totals[i])
        if n_steps == 0:
            continue
        per_bucket.append(
            {
                "graph_batch_size": int(g),
                "steps": n_steps,
                "predicted_gain": float(point["gain_g"][i]),
                "ci_low": _quantile(blocks["gain_g"][:, i], alpha),
                "ci_high": _quantile(blocks["gain_g"][:, i], 1 - alpha),
                "compact_share": float(1.0 - totals[lay.n_g + i] / totals[i]),
            }
        )
    return tuple(per_bucket)


def _per_cell(
    ladder: Sequence[int], lay: _Layout, cells: Sequence[tuple[int, int]], priced: _Priced, alpha: float
) -> tuple[dict[str, Any], ...]:
    """Per deployed cell (each G's native first): steps that chose it, value and its lower bound."""
    totals, point, blocks = priced.totals, priced.point, priced.results["blocks of steps"]
    per_cell = []
    for g in ladder:
        i = ladder.index(g)
        per_cell.append(
            {
                "graph_batch_size": int(g),
                "verifier_budget": NATIVE_BUDGET,
                "chosen_steps": int(totals[lay.n_g + i]),
                "value_ms": 0.0,
                "value_ms_lower_bound": 0.0,
            }
        )
        for j, cell in enumerate(cells):
            if cell[0] != g:
                continue
            chosen = int(totals[4 * lay.n_g + j])
            per_cell.append(
                {
                    "graph_batch_size": int(g),
                    "verifier_budget": int(cell[1]),
                    "chosen_steps": chosen,
                    "value_ms": float(point["value_c"][j]),
                    "value_ms_lower_bound": _quantile(blocks["value_c"][:, j], alpha) if chosen else 0.0,
                }
            )
    return tuple(per_cell)


def _reason_counts(reason: np.ndarray) -> dict[str, int]:
    """How many steps each selector reason code decided (codes that occur only)."""
    return {r.value: int(np.sum(reason == i)) for i, r in enumerate(REASON_CODES) if np.any(reason == i)}


@dataclass(frozen=True, eq=False)
class _PolicySteps:
    """Every priced policy step, decode and mixed, with what each policy does on it.

    Decode steps come first, then the mixed steps that have a measured native arm; ``position``
    is each entry's rank in step order (the block bootstrap's order).
    """

    g_index: np.ndarray
    c_decode: np.ndarray  # the decode policy: mixed steps native
    c_full: np.ndarray  # decode + mixed
    static: np.ndarray
    tokens_decode: np.ndarray
    tokens_full: np.ndarray
    position: np.ndarray
    unpriced: int
    evidence: StepEvidence
    choice: _Choice
    mixed: _MixedPricing | None

    @property
    def count(self) -> int:
        return int(self.g_index.shape[0])

    @classmethod
    def of(cls, ev: StepEvidence, ch: _Choice, mp: _MixedPricing | None, lay: _Layout) -> _PolicySteps:
        if mp is None:
            n = ev.steps
            static = ev.static_tokens.astype(np.float64)
            tokens = ch.tokens.astype(np.float64)
            return cls(
                ch.g_index, ch.c_index, ch.c_index, static, tokens, tokens, np.arange(n), 0, ev, ch, None
            )
        step_all = np.r_[ev.step_id, mp.step_id]
        order = np.argsort(step_all, kind="stable")
        position = np.empty_like(order)
        position[order] = np.arange(order.shape[0])
        static_m = mp.static_tokens.astype(np.float64)
        return cls(
            g_index=np.r_[ch.g_index, lay.n_dg + mp.group].astype(np.int64),
            c_decode=np.r_[ch.c_index, np.full(mp.steps, -1)].astype(np.int64),
            c_full=np.r_[ch.c_index, np.where(mp.cell >= 0, lay.n_dc + mp.cell, -1)].astype(np.int64),
            static=np.r_[ev.static_tokens.astype(np.float64), static_m],
            tokens_decode=np.r_[ch.tokens.astype(np.float64), static_m],
            tokens_full=np.r_[ch.tokens.astype(np.float64), mp.tokens.astype(np.float64)],
            position=position,
            unpriced=0,
            evidence=ev,
            choice=ch,
            mixed=mp,
        )

    def features(self, lay: _Layout, unit: np.ndarray, n_units: int, *, mixed_cells: bool) -> np.ndarray:
        c = self.c_full if mixed_cells else self.c_decode
        tokens = self.tokens_full if mixed_cells else self.tokens_decode
        return _features(lay, unit, n_units, self.g_index, c, np.ones(self.count), self.static, tokens)

    def row_features(self, lay: _Layout, *, both: bool) -> np.ndarray | None:
        """Per-request features, rows of decode and mixed steps resampled by whole requests; with
        ``both`` the two policies side by side (decode | decode + mixed cells)."""
        ev, ch, mx = self.evidence, self.choice, self.mixed
        if (
            ev.row_step is None
            or ev.row_tokens is None
            or ev.row_request is None
            or ev.row_static_tokens is None
        ):
            return None
        valid = ev.row_step >= 0
        rs = ev.row_step[valid]
        static = ev.row_static_tokens[valid].astype(np.float64)
        granted = (
            ev.row_tokens[valid][np.arange(rs.shape[0]), ch.column[rs]] if ev.row_tokens.shape[1] else static
        )
        dynamic = np.where(ch.compact[rs], granted, static).astype(np.float64)
        request = ev.row_request[valid]
        g, c_dec, c_full = ch.g_index[rs], ch.c_index[rs], ch.c_index[rs]
        weight = 1.0 / ev.rows[rs]
        dyn_dec, dyn_full = dynamic, dynamic
        if mx is not None:
            ms = mx.row_step
            # A mixed step without generation rows (only prefill) still counts once.
            counts = np.bincount(mx.row_step, minlength=mx.steps)
            empty = np.flatnonzero(counts == 0)
            per_step = np.maximum(counts, 1)
            m_rows = np.r_[ms, empty]
            m_static = np.r_[mx.row_static, np.zeros(empty.size)].astype(np.float64)
            m_tokens = np.r_[mx.row_tokens, np.zeros(empty.size)].astype(np.float64)
            m_req = np.r_[mx.row_request, -1 - empty]
            m_cell = mx.cell[m_rows]
            g = np.r_[g, lay.n_dg + mx.group[m_rows]]
            c_dec = np.r_[c_dec, np.full(m_rows.shape[0], -1)]
            c_full = np.r_[c_full, np.where(m_cell >= 0, lay.n_dc + m_cell, -1)]
            weight = np.r_[weight, 1.0 / per_step[m_rows]]
            dyn_dec = np.r_[dynamic, m_static]
            dyn_full = np.r_[dynamic, m_tokens]
            static = np.r_[static, m_static]
            request = np.r_[request, m_req]
        _, unit = np.unique(request, return_inverse=True)
        n_units = int(unit.max()) + 1 if unit.size else 0
        x_dec = _features(lay, unit, n_units, g, c_dec, weight, static, dyn_dec)
        if not both:
            return x_dec
        return np.hstack([x_dec, _features(lay, unit, n_units, g, c_full, weight, static, dyn_full)])
