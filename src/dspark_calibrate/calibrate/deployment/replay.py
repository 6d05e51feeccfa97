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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dspark_calibrate.artifacts import canonical_json
from dspark_calibrate.calibrate.deployment.workload import Workload
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
    CostTable,
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
    "ReplayReport",
    "StepEvidence",
    "admission_rule",
    "choose_steps",
    "estimate_drain_guard",
    "gain_decision",
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
# Cells
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class CellTime:
    """One measured cell: median whole-step time and its interval (ms)."""

    graph_batch_size: int
    verifier_budget: int
    step_time_ms: float
    ci_low_ms: float
    ci_high_ms: float
    source_result_sha256: str = ""

    def __post_init__(self) -> None:
        t, lo, hi = self.step_time_ms, self.ci_low_ms, self.ci_high_ms
        if not all(math.isfinite(x) and x > 0 for x in (t, lo, hi)) or not lo <= t <= hi:
            raise ConfigError(
                f"cell (G={self.graph_batch_size}, V={self.verifier_budget}): need finite 0 < ci_low <= "
                f"median <= ci_high, got {lo}, {t}, {hi}"
            )


@dataclass(frozen=True, eq=False)
class CellGrid:
    """Measured cells for draft length K: a native cell per G and candidate compact cells.

    Only deployable compact cells are kept (G < V < G*(K+1)): V = G cannot carry a real row and
    V = G*(K+1) is the full-width control. ``dropped`` lists what was left out.
    """

    k: int
    cells: tuple[CellTime, ...]
    dropped: tuple[tuple[int, int], ...] = ()
    _native: dict[int, CellTime] = field(init=False, repr=False)
    _compact: dict[int, tuple[CellTime, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        native: dict[int, CellTime] = {}
        compact: dict[int, list[CellTime]] = {}
        seen: set[tuple[int, int]] = set()
        for c in sorted(self.cells):
            key = (c.graph_batch_size, c.verifier_budget)
            if key in seen:
                raise ConfigError(
                    f"cell (G={key[0]}, V={key[1]}) is given twice; merge sweeps without overlap"
                )
            seen.add(key)
            if c.verifier_budget == NATIVE_BUDGET:
                native[c.graph_batch_size] = c
            else:
                compact.setdefault(c.graph_batch_size, []).append(c)
        missing = sorted(set(compact) - set(native))
        if missing or not native:
            raise ConfigError(
                f"graph batch sizes {missing or 'all'} have no native cell (V=0); re-run the sweep"
            )
        object.__setattr__(self, "cells", tuple(sorted(self.cells)))
        object.__setattr__(self, "_native", native)
        object.__setattr__(self, "_compact", {g: tuple(v) for g, v in compact.items()})

    @classmethod
    def from_rows(cls, k: int, rows: Iterable[Mapping[str, Any]]) -> CellGrid:
        """From ``sweep`` or ``cost-table`` rows (undeployable budgets are dropped, not refused)."""
        kept, dropped = [], []
        for r in rows:
            g, v = int(r["graph_batch_size"]), int(r["verifier_budget"])
            if v != NATIVE_BUDGET and not g < v < g * (k + 1):
                dropped.append((g, v))
                continue
            kept.append(
                CellTime(
                    g,
                    v,
                    float(r["step_time_ms"]),
                    float(r["ci_low_ms"]),
                    float(r["ci_high_ms"]),
                    str(r.get("source_result_sha256") or ""),
                )
            )
        return cls(k=k, cells=tuple(kept), dropped=tuple(sorted(dropped)))

    @property
    def ladder(self) -> tuple[int, ...]:
        """The graph batch sizes with a native cell."""
        return tuple(sorted(self._native))

    def native(self, graph_batch_size: int) -> CellTime:
        """The native cell of G."""
        return self._native[graph_batch_size]

    def compact(self, graph_batch_size: int) -> tuple[CellTime, ...]:
        """The compact cells of G, by V."""
        return self._compact.get(graph_batch_size, ())

    def compact_keys(self) -> tuple[tuple[int, int], ...]:
        """Every compact (G, V)."""
        return tuple((c.graph_batch_size, c.verifier_budget) for g in self.ladder for c in self.compact(g))

    def restrict(self, keep: Iterable[tuple[int, int]]) -> CellGrid:
        """Native cells plus the given compact cells (which must be in the grid)."""
        keep = set(keep)
        unknown = sorted(keep - set(self.compact_keys()))
        if unknown:
            raise ConfigError(
                f"cells {unknown} are not measured compact cells; no cell outside the sweep is used"
            )
        cells = [
            c
            for c in self.cells
            if c.verifier_budget == NATIVE_BUDGET or (c.graph_batch_size, c.verifier_budget) in keep
        ]
        return CellGrid(k=self.k, cells=tuple(cells))

    def cost_table(
        self,
        *,
        minimum_predicted_gain: float = DEFAULT_MINIMUM_PREDICTED_GAIN,
        drain_guard: DrainGuard | None = None,
    ) -> CostTable:
        """The runtime's view of these cells (medians).

        Raises:
            ConfigError: more compact cells than the engine accepts.
        """
        return CostTable.from_cells(
            self.k,
            {(c.graph_batch_size, c.verifier_budget): c.step_time_ms for c in self.cells},
            minimum_predicted_gain=minimum_predicted_gain,
            drain_guard=drain_guard,
        )


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


def _chunks(index: np.ndarray, size: int) -> Iterable[np.ndarray]:
    for i in range(0, index.shape[0], size):
        yield index[i : i + size]


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
    cols = k - floor
    a = workload.arrays()
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
    g_g = s_g[step_of_group]
    budgets = {int(g): [c.verifier_budget for c in grid.compact(int(g))] for g in ladder}
    j_max = max((len(v) for v in budgets.values()), default=0)
    g_base = np.zeros(n_groups)
    g_full = np.zeros(n_groups)
    g_base_tokens = np.zeros(n_groups, dtype=np.int64)
    g_static = np.zeros(n_groups, dtype=np.int64)
    g_yield = np.zeros((n_groups, j_max))
    g_tokens = np.zeros((n_groups, j_max), dtype=np.int64)
    g_feas = np.zeros((n_groups, j_max), dtype=bool)
    row_tokens = np.zeros((n, j_max), dtype=np.int16) if per_row else None
    positions = np.arange(floor + 1, k + 1)
    for c in np.unique(g_count):
        c = int(c)
        members = np.flatnonzero((g_count == c) & (g_g > 0))
        for chunk in _chunks(members, max(1, chunk_rows // c)):
            m = chunk.shape[0]
            idx = g_start[chunk][:, None] + np.arange(c)[None, :]  # (m, c) rows, canonical order
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
            ind = (acc[:, None, :] >= positions[None, :, None]).reshape(m, cols * c)
            aprefix = np.zeros((m, cols * c + 1), dtype=np.int64)
            np.cumsum(np.take_along_axis(ind, order, axis=1), axis=1, out=aprefix[:, 1:])
            base_tok = c + np.minimum(acc, floor).sum(axis=1)
            g_base[chunk] = base
            g_full[chunk] = base + prefix[:, cols * c]
            g_base_tokens[chunk] = base_tok
            g_static[chunk] = c + acc.sum(axis=1)
            gg = g_g[chunk]
            for g in np.unique(gg):
                sel = np.flatnonzero(gg == g)
                for j, v in enumerate(budgets[int(g)]):
                    geo = cell_geometry(c, int(g), v, min_verify_len=floor, max_draft_len=k)
                    if geo is None:
                        continue
                    e = geo.extra
                    rows_sel = chunk[sel]
                    g_yield[rows_sel, j] = base[sel] + prefix[sel, e]
                    g_tokens[rows_sel, j] = base_tok[sel] + aprefix[sel, e]
                    g_feas[rows_sel, j] = True
                    if row_tokens is not None:
                        granted = np.zeros((sel.shape[0], c), dtype=np.int64)
                        if e > 0:
                            picked = order[sel, :e] % c
                            flat = (np.arange(sel.shape[0])[:, None] * c + picked).reshape(-1)
                            granted = np.bincount(flat, minlength=sel.shape[0] * c).reshape(sel.shape[0], c)
                        w = floor + granted
                        row_tokens[idx[sel].reshape(-1), j] = (1 + np.minimum(acc[sel], w)).reshape(-1)
    # Aggregate groups (ranks) into steps, summing sequentially in rank order like the runtime.
    n_steps_all = s_first.shape[0]
    r_max = int(s_groups.max())
    local = np.arange(n_groups) - s_first[step_of_group]

    def seq_sum(values: np.ndarray) -> np.ndarray:
        if r_max == 1:
            return values.copy()
        mat = np.zeros((n_steps_all, r_max, *values.shape[1:]))
        mat[step_of_group, local] = values
        out: np.ndarray = np.cumsum(mat, axis=1)[:, -1]
        return out

    native_yield = seq_sum(g_full)
    compact_yield = seq_sum(g_yield)
    if j_max:
        feasible = np.logical_and.reduceat(g_feas, s_first, axis=0)
        with np.errstate(invalid="ignore"):
            loss = (g_full[:, None] - g_yield) / g_count[:, None]
        max_loss = np.maximum.reduceat(loss, s_first, axis=0)
        tokens = np.add.reduceat(g_tokens, s_first, axis=0)
    else:
        feasible = np.zeros((n_steps_all, 0), dtype=bool)
        max_loss = np.zeros((n_steps_all, 0))
        tokens = np.zeros((n_steps_all, 0), dtype=np.int64)
    static_tokens = np.add.reduceat(g_static, s_first)
    rows = np.add.reduceat(g_count, s_first)
    columns = np.full((n_steps_all, j_max), -1, dtype=np.int64)
    idle = s_groups < workload.num_ranks
    for g, vs in budgets.items():
        in_g = s_g == g
        for j, v in enumerate(vs):
            columns[in_g, j] = v
            idle_ok = cell_geometry(0, g, v, min_verify_len=floor, max_draft_len=k) is not None
            if not idle_ok:
                feasible[in_g & idle, j] = False
    feasible &= columns >= 0
    max_loss = np.where(feasible, max_loss, 0.0)
    compact_yield = np.where(feasible, compact_yield, 0.0)
    # Drain tail: final-step G of requests that finished before the trace ended.
    last_step = int(a.step.max())
    order_r = np.lexsort((a.step, a.request))
    req_sorted = a.request[order_r]
    is_last = np.r_[req_sorted[1:] != req_sorted[:-1], True]
    last_rows = order_r[is_last]
    finished = a.step[last_rows] < last_step
    step_index = np.searchsorted(g_step[s_first], a.step[last_rows[finished]])
    finished_g = s_g[step_index]
    finished_g = finished_g[finished_g > 0]
    keep = ~over
    row_step = row_request = row_static = None
    if per_row:
        step_of_row = np.repeat(step_of_group, g_count)
        policy_index = np.cumsum(keep) - 1
        row_step = np.where(keep[step_of_row], policy_index[step_of_row], -1)
        row_request = a.request
        row_static = a.accepted + 1
    return StepEvidence(
        grid=grid,
        min_verify_len=floor,
        num_ranks=workload.num_ranks,
        step_id=g_step[s_first][keep],
        graph_batch_size=s_g[keep],
        rows=rows[keep],
        static_tokens=static_tokens[keep],
        native_yield=native_yield[keep],
        columns=columns[keep],
        compact_yield=compact_yield[keep],
        max_loss=max_loss[keep],
        feasible=feasible[keep],
        tokens=tokens[keep],
        skipped_steps=int(over.sum()),
        finished_graph_batch_size=finished_g,
        row_step=row_step,
        row_request=row_request,
        row_static_tokens=row_static,
        row_tokens=row_tokens,
    )


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
    """The consumer's admission rule: (admitted, net value in ms).

    ``net = gross - policy_steps * overhead - margin``; admitted when compact_choices > 0 and
    net > 0. Every policy step pays the overhead, native ones included.

    Raises:
        ConfigError: counts or amounts out of range (the consumer refuses them too).
    """
    if isinstance(policy_steps, bool) or not isinstance(policy_steps, int) or policy_steps < 1:
        raise ConfigError(f"policy_steps must be an integer >= 1, got {policy_steps!r}")
    if (
        isinstance(compact_choices, bool)
        or not isinstance(compact_choices, int)
        or not 0 <= compact_choices <= policy_steps
    ):
        raise ConfigError(f"compact_choices must be an integer in [0, policy_steps], got {compact_choices!r}")
    for name, x in (
        ("gross_compact_value_ms_lower_bound", gross_compact_value_ms_lower_bound),
        ("fixed_confidence_path_overhead_ms_upper_bound", fixed_confidence_path_overhead_ms_upper_bound),
        ("safety_margin_ms", safety_margin_ms),
    ):
        if not math.isfinite(x) or x < 0:
            raise ConfigError(f"{name} must be finite and >= 0, got {x!r}")
    net = (
        gross_compact_value_ms_lower_bound
        - policy_steps * fixed_confidence_path_overhead_ms_upper_bound
        - safety_margin_ms
    )
    return compact_choices > 0 and net > 0, net


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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (without the per-step arrays)."""
        e = self.economics
        return {
            "policy_steps": self.policy_steps,
            "skipped_steps": self.skipped_steps,
            "static_goodput_tok_per_ms": self.static_goodput_tok_per_ms,
            "dynamic_goodput_tok_per_ms": self.dynamic_goodput_tok_per_ms,
            "predicted_gain": self.predicted_gain,
            "predicted_gain_ci_low": self.predicted_gain_ci_low,
            "predicted_gain_ci_high": self.predicted_gain_ci_high,
            "pessimistic_gain": self.pessimistic_gain,
            "compact_step_share": self.compact_step_share,
            "economics": {
                "policy_steps": e.policy_steps,
                "compact_choices": e.compact_choices,
                "gross_compact_value_ms": e.gross_compact_value_ms,
                "gross_compact_value_ms_lower_bound": e.gross_compact_value_ms_lower_bound,
                "fixed_confidence_path_overhead_ms_upper_bound": (
                    e.fixed_confidence_path_overhead_ms_upper_bound
                ),
                "overhead_source": e.overhead_source,
                "safety_margin_ms": e.safety_margin_ms,
                "safety_margin_source": e.safety_margin_source,
                "net_value_ms": e.net_value_ms,
                "admitted": e.admitted,
            },
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


def _gain(q: np.ndarray) -> np.ndarray:
    # q[..., 0:4] = static tokens, static ms, dynamic tokens, dynamic ms
    with np.errstate(divide="ignore", invalid="ignore"):
        out: np.ndarray = (q[..., 2] / q[..., 3]) / (q[..., 0] / q[..., 1]) - 1.0
    return out


def _value(q: np.ndarray) -> np.ndarray:
    # q[..., 4] = pessimistic saving on compact steps, q[..., 5] = lost tokens on compact steps
    with np.errstate(divide="ignore", invalid="ignore"):
        out: np.ndarray = q[..., 4] - q[..., 5] * (q[..., 1] / q[..., 0])
    return out


def replay(
    evidence: StepEvidence,
    *,
    minimum_predicted_gain: float = DEFAULT_MINIMUM_PREDICTED_GAIN,
    drain_guard: DrainGuard,
    drain_guard_estimate: Mapping[str, Any] | None = None,
    allowed: np.ndarray | None = None,
    overhead_ms: float | None = None,
    safety_margin_ms: float | None = None,
    bootstrap: BootstrapSettings = BootstrapSettings(),
    header: Mapping[str, Any] | None = None,
) -> ReplayReport:
    """Replay both policies over the evidence and compute goodput, gain, CI and economics.

    Args:
        evidence: from :func:`prepare_evidence` (``per_row=True`` adds the request bootstrap).
        minimum_predicted_gain: the table's margin.
        drain_guard: the table's drain guard.
        drain_guard_estimate: how the guard was estimated (reported as is).
        allowed: columns deployed (default all of the evidence's grid).
        overhead_ms: fixed confidence-path overhead per policy step (default: 1% of the mean
            native step time).
        safety_margin_ms: the receipt's safety margin (default: 0.5% of the static wall time).
        bootstrap: resampling settings.
        header: extra fields of the selector-replay digest header (calibration, cells, ...).
    """
    ev = evidence
    s_count = ev.steps
    choice = choose_steps(
        ev, minimum_predicted_gain=minimum_predicted_gain, drain_guard=drain_guard, allowed=allowed
    )
    col = choice.column
    compact = col >= 0
    ar = np.arange(s_count)
    safe_col = np.where(compact, col, 0)
    native_ms, compact_ms = ev.times("median")
    native_lo, _ = ev.times("low")
    _, compact_hi = ev.times("high")
    j = ev.columns.shape[1]
    if j:
        v_chosen = np.where(compact, ev.columns[ar, safe_col], NATIVE_BUDGET)
        dyn_tokens = np.where(compact, ev.tokens[ar, safe_col], ev.static_tokens)
        dyn_ms = np.where(compact, compact_ms[ar, safe_col], native_ms)
        saving_pess = np.where(compact, native_lo - compact_hi[ar, safe_col], 0.0)
    else:
        v_chosen = np.zeros(s_count, dtype=np.int64)
        dyn_tokens = ev.static_tokens.copy()
        dyn_ms = native_ms.copy()
        saving_pess = np.zeros(s_count)
    lost = np.where(compact, ev.static_tokens - dyn_tokens, 0)
    static_tokens = ev.static_tokens.astype(np.float64)
    mean_native = float(native_ms.mean()) if s_count else 0.0
    if overhead_ms is None:
        overhead, overhead_src = (
            DEFAULT_OVERHEAD_FRACTION * mean_native,
            f"default: {DEFAULT_OVERHEAD_FRACTION:.0%} of the mean native step ({mean_native:.4g} ms)",
        )
    else:
        overhead, overhead_src = float(overhead_ms), "user-supplied"
    # Every dynamic step pays the confidence path (selector, allocator, bookkeeping) on top of its
    # cell's time; static K does not. Goodput and gain are net of it: on an H200 the host-side
    # selector cost 4% of a step and a prediction without it overstated the realised gain by 5 pp.
    dyn_paid_ms = dyn_ms + overhead
    q = np.stack(
        [
            static_tokens,
            native_ms,
            dyn_tokens.astype(np.float64),
            dyn_paid_ms,
            saving_pess,
            lost.astype(np.float64),
        ],
        axis=1,
    )
    totals = q.sum(axis=0)
    static_gp = totals[0] / totals[1]
    dynamic_gp = totals[2] / totals[3]
    gain = float(_gain(totals))
    # Pessimistic dynamic time: every compact saving shrunk to ci_low(G,0) - ci_high(G,V).
    pess_dyn_ms = totals[1] - totals[4] + s_count * overhead
    pessimistic_gain = float((totals[2] / pess_dyn_ms) / static_gp - 1.0)
    ms_per_token = totals[1] / totals[0]
    gross_point = float(np.where(compact, native_ms - dyn_ms, 0.0).sum() - totals[5] * ms_per_token)
    gross_pess = float(_value(totals))

    rng = np.random.default_rng(bootstrap.seed)
    alpha = (1.0 - bootstrap.confidence) / 2.0
    block = bootstrap.block_steps or max(1, round(s_count ** (1.0 / 3.0)))
    starts = np.arange(0, s_count, block)
    block_sums = np.add.reduceat(q, starts, axis=0)
    ladder = np.array(ev.grid.ladder)
    bucket_index = np.searchsorted(ladder, ev.graph_batch_size)
    n_b = ladder.shape[0]
    # Per bucket: static tokens, static ms, dyn tokens, dyn ms, steps, compact steps
    per_bucket_q = np.zeros((s_count, n_b, 6))
    per_bucket_q[ar, bucket_index] = np.stack(
        [
            static_tokens,
            native_ms,
            dyn_tokens.astype(np.float64),
            dyn_paid_ms,
            np.ones(s_count),
            compact.astype(np.float64),
        ],
        axis=1,
    )
    bucket_block = np.add.reduceat(per_bucket_q.reshape(s_count, n_b * 6), starts, axis=0)
    cells = [
        (int(g), int(v))
        for g in ladder
        for v in ([NATIVE_BUDGET] + [c.verifier_budget for c in ev.grid.compact(int(g))])
    ]
    cell_pos = {c: i for i, c in enumerate(cells)}
    cell_of_step = (
        np.array([cell_pos[(int(g), int(v))] for g, v in zip(ev.graph_batch_size, v_chosen, strict=True)])
        if s_count
        else np.zeros(0, np.int64)
    )
    value_point = np.where(compact, native_ms - dyn_ms, 0.0) - lost * ms_per_token
    per_cell_q = np.zeros((s_count, len(cells), 2))
    per_cell_q[ar, cell_of_step, 0] = saving_pess
    per_cell_q[ar, cell_of_step, 1] = lost
    cell_block = np.add.reduceat(per_cell_q.reshape(s_count, len(cells) * 2), starts, axis=0)
    stacked = np.concatenate([block_sums, bucket_block, cell_block], axis=1)
    boot = _resample_sums(rng, stacked, bootstrap)
    boot_main = boot[:, :6]
    boot_bucket = boot[:, 6 : 6 + n_b * 6].reshape(-1, n_b, 6)
    boot_cell = boot[:, 6 + n_b * 6 :].reshape(-1, len(cells), 2)
    gains_block = _gain(boot_main)
    values_block = _value(boot_main)
    ci_low = float(np.nanquantile(gains_block, alpha))
    ci_high = float(np.nanquantile(gains_block, 1 - alpha))
    value_low = float(np.nanquantile(values_block, alpha))
    methods = ["blocks of steps"]
    if (
        ev.row_step is not None
        and ev.row_tokens is not None
        and ev.row_request is not None
        and ev.row_static_tokens is not None
    ):
        # Whole requests resampled; each row carries its step's times split evenly over the
        # step's rows.
        valid = ev.row_step >= 0
        rs = ev.row_step[valid]
        share = 1.0 / ev.rows[rs]
        rcol = safe_col[rs]
        row_dyn = np.where(
            compact[rs], ev.row_tokens[valid][np.arange(rs.shape[0]), rcol], ev.row_static_tokens[valid]
        )
        row_q = np.stack(
            [
                ev.row_static_tokens[valid].astype(np.float64),
                native_ms[rs] * share,
                row_dyn.astype(np.float64),
                dyn_paid_ms[rs] * share,
                saving_pess[rs] * share,
                np.where(compact[rs], ev.row_static_tokens[valid] - row_dyn, 0).astype(np.float64),
            ],
            axis=1,
        )
        req = ev.row_request[valid]
        uniq, inv = np.unique(req, return_inverse=True)
        per_req = np.zeros((uniq.shape[0], 6))
        for c in range(6):
            per_req[:, c] = np.bincount(inv, weights=row_q[:, c], minlength=uniq.shape[0])
        boot_req = _resample_sums(rng, per_req, bootstrap)
        g_req = _gain(boot_req)
        ci_low = min(ci_low, float(np.nanquantile(g_req, alpha)))
        ci_high = max(ci_high, float(np.nanquantile(g_req, 1 - alpha)))
        value_low = min(value_low, float(np.nanquantile(_value(boot_req), alpha)))
        methods.append("requests")
    gross_lb = max(0.0, min(value_low, gross_pess))
    compact_choices = int(compact.sum())
    if safety_margin_ms is None:
        margin, margin_src = (
            DEFAULT_SAFETY_MARGIN_FRACTION * float(totals[1]),
            f"default: {DEFAULT_SAFETY_MARGIN_FRACTION:.1%} of the static wall time",
        )
    else:
        margin, margin_src = float(safety_margin_ms), "user-supplied"
    admitted, net = admission_rule(
        policy_steps=max(1, s_count),
        compact_choices=compact_choices,
        gross_compact_value_ms_lower_bound=gross_lb,
        fixed_confidence_path_overhead_ms_upper_bound=overhead,
        safety_margin_ms=margin,
    )
    economics = Economics(
        policy_steps=s_count,
        compact_choices=compact_choices,
        gross_compact_value_ms=gross_point,
        gross_compact_value_ms_lower_bound=gross_lb,
        fixed_confidence_path_overhead_ms_upper_bound=overhead,
        overhead_source=overhead_src,
        safety_margin_ms=margin,
        safety_margin_source=margin_src,
        net_value_ms=net,
        admitted=admitted,
    )
    per_bucket = []
    bucket_totals = per_bucket_q.sum(axis=0)
    for i, g in enumerate(ladder):
        steps = int(bucket_totals[i, 4])
        if steps == 0:
            continue
        gb = _gain(boot_bucket[:, i, :])
        per_bucket.append(
            {
                "graph_batch_size": int(g),
                "steps": steps,
                "predicted_gain": float(_gain(bucket_totals[i])),
                "ci_low": float(np.nanquantile(gb, alpha)),
                "ci_high": float(np.nanquantile(gb, 1 - alpha)),
                "compact_share": float(bucket_totals[i, 5] / steps),
            }
        )
    per_cell = []
    for i, (g, v) in enumerate(cells):
        chosen = int(np.sum(cell_of_step == i))
        lb_samples = boot_cell[:, i, 0] - boot_cell[:, i, 1] * (boot_main[:, 1] / boot_main[:, 0])
        per_cell.append(
            {
                "graph_batch_size": g,
                "verifier_budget": v,
                "chosen_steps": chosen,
                "value_ms": float(value_point[cell_of_step == i].sum()) if v else 0.0,
                "value_ms_lower_bound": float(np.nanquantile(lb_samples, alpha)) if v and chosen else 0.0,
            }
        )
    reasons = {
        r.value: int(np.sum(choice.reason == i))
        for i, r in enumerate(REASON_CODES)
        if np.any(choice.reason == i)
    }
    digest = selector_replay_sha256(
        step_id=ev.step_id,
        graph_batch_size=ev.graph_batch_size,
        verifier_budget=v_chosen,
        header={
            "k": ev.grid.k,
            "min_verify_len": ev.min_verify_len,
            "minimum_predicted_gain": minimum_predicted_gain,
            "drain_guard": drain_guard.to_dict(),
            **dict(header or {}),
        },
    )
    return ReplayReport(
        policy_steps=s_count,
        skipped_steps=ev.skipped_steps,
        static_goodput_tok_per_ms=float(static_gp),
        dynamic_goodput_tok_per_ms=float(dynamic_gp),
        predicted_gain=gain,
        predicted_gain_ci_low=ci_low,
        predicted_gain_ci_high=ci_high,
        pessimistic_gain=pessimistic_gain,
        compact_step_share=compact_choices / s_count if s_count else 0.0,
        economics=economics,
        drain_guard=drain_guard,
        drain_guard_estimate=dict(drain_guard_estimate or {}),
        minimum_predicted_gain=float(minimum_predicted_gain),
        per_bucket=tuple(per_bucket),
        per_cell=tuple(per_cell),
        reasons=reasons,
        selector_replay_sha256=digest,
        bootstrap={**bootstrap.to_dict(), "block_steps": block, "methods": methods},
        decision=gain_decision(gain, ci_low, ci_high, admitted=admitted),
        step_id=ev.step_id,
        graph_batch_size=ev.graph_batch_size,
        verifier_budget=v_chosen,
    )
