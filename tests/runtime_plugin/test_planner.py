"""Reference selector and allocator: geometry, selection rule, allocation, determinism (DESIGN §6)."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.planner import (
    REASON_CODES,
    Calibration,
    CostTable,
    DrainGuard,
    Geometry,
    PositionMap,
    SelectReason,
    StepRows,
    _choose_one,
    allocate,
    cell_geometry,
    choose_cells,
    plan,
    select,
    sorted_prefix_sums,
    top_candidates,
)

K = 5
GUARD = DrainGuard(1.0, 3.0, 0.0, 8)


def staircase_table(*, guard: DrainGuard | None = GUARD, gain: float = 0.01) -> CostTable:
    cells: dict[tuple[int, int], float] = {}
    for g in (4, 8, 16):
        cells[(g, 0)] = 4.0 + 0.25 * math.ceil(g * (K + 1) / 8)
        for v in (2 * g, 3 * g, 4 * g, 5 * g):
            cells[(g, v)] = 4.05 + 0.25 * math.ceil(v / 8)
    return CostTable.from_cells(K, cells, minimum_predicted_gain=gain, drain_guard=guard)


CAL = Calibration.sts([1.0, 1.1, 1.2, 1.3, 1.4])


# --- geometry ---------------------------------------------------------------------------------

GEOMETRY_CASES = [
    # id, (n, G, V), floor, expected
    ("full rank at the floor", (4, 4, 8), 1, Geometry(0, 0, 8, 0)),
    ("full rank, extra tokens", (4, 4, 13), 1, Geometry(0, 0, 13, 5)),
    ("full rank below the floor", (4, 4, 7), 1, None),
    ("full rank above capacity", (4, 4, 25), 1, None),
    ("V=G never carries a real row", (1, 4, 4), 1, None),
    ("V=G on an idle rank", (0, 4, 4), 1, Geometry(1, 0, 0, 0)),
    ("idle rank splits q and q+1", (0, 4, 10), 1, Geometry(2, 2, 0, 0)),
    ("idle rank above two dummy lengths", (0, 4, 25), 1, None),
    ("idle rank at full width", (0, 4, 24), 1, Geometry(6, 0, 0, 0)),
    ("pads take the smallest length", (2, 4, 10), 1, Geometry(1, 0, 8, 4)),
    ("pads forced longer by capacity", (1, 4, 12), 1, Geometry(2, 0, 6, 4)),
    ("pads cannot shrink below 1", (3, 4, 6), 1, None),
    ("higher floor", (2, 4, 10), 2, Geometry(1, 0, 8, 2)),
    ("more rows than G", (5, 4, 20), 1, None),
]


@pytest.mark.parametrize(
    ("args", "floor", "expected"), [c[1:] for c in GEOMETRY_CASES], ids=[c[0] for c in GEOMETRY_CASES]
)
def test_cell_geometry(args: tuple[int, int, int], floor: int, expected: Geometry | None) -> None:
    n, g, v = args
    assert cell_geometry(n, g, v, min_verify_len=floor, max_draft_len=K) == expected


@given(
    n=st.integers(0, 16),
    g=st.sampled_from([4, 8, 16]),
    v=st.integers(1, 16 * (K + 1)),
    floor=st.integers(1, K),
)
@settings(max_examples=300, deadline=None)
def test_geometry_always_sums_to_v(n: int, g: int, v: int, floor: int) -> None:
    geo = cell_geometry(n, g, v, min_verify_len=floor, max_draft_len=K)
    if geo is None:
        return
    if n == 0:
        assert g * geo.pad_len + geo.pad_high_rows == v and 1 <= geo.pad_len <= K + 1
        assert geo.pad_len + (geo.pad_high_rows > 0) <= K + 1
    else:
        assert geo.real_tokens + (g - n) * geo.pad_len == v
        assert n * (floor + 1) <= geo.real_tokens <= n * (K + 1)
        assert geo.extra == geo.real_tokens - n * (floor + 1) >= 0
        assert (g == n and geo.pad_len == 0) or 1 <= geo.pad_len <= K + 1


# --- the selection rule -----------------------------------------------------------------------

RULE_CASES: list[tuple[str, dict[str, Any], int, SelectReason]] = [
    ("native wins an exact tie", {"cy": [8.0], "ct": [8.0]}, -1, SelectReason.BELOW_MARGIN),
    ("below the margin", {"cy": [8.0], "ct": [7.95]}, -1, SelectReason.BELOW_MARGIN),
    ("at the margin", {"cy": [8.08], "ct": [8.0]}, 0, SelectReason.COMPACT),
    ("no drain guard", {"cy": [9.0], "ct": [8.0], "guard": None}, -1, SelectReason.NO_DRAIN_GUARD),
    ("drain guard blocks", {"cy": [9.0], "ct": [8.0], "loss": [50.0]}, -1, SelectReason.DRAIN_GUARD),
    (
        "guard value must exceed its minimum",
        {"cy": [9.0], "ct": [8.0], "loss": [0.0], "min_value": 2.0},
        -1,
        SelectReason.DRAIN_GUARD,
    ),
    (
        "infeasible cells are skipped",
        {"cy": [9.0], "ct": [8.0], "feas": [False]},
        -1,
        SelectReason.NO_FEASIBLE_CELL,
    ),
    (
        "no compact cells",
        {"cy": [], "ct": [], "feas": [], "v": [], "loss": []},
        -1,
        SelectReason.NO_COMPACT_CELLS,
    ),
    (
        "highest group value wins",
        {"cy": [9.0, 8.5], "ct": [8.0, 7.0], "v": [20, 30]},
        1,
        SelectReason.COMPACT,
    ),
    (
        "group value tie: higher score",
        {"cy": [9.0, 9.5], "ct": [8.0, 8.0], "v": [20, 30], "loss": [0.0, 0.0]},
        1,
        SelectReason.COMPACT,
    ),
    (
        "full tie: larger V",
        {"cy": [9.0, 9.0], "ct": [8.0, 8.0], "v": [30, 20], "loss": [0.0, 0.0]},
        0,
        SelectReason.COMPACT,
    ),
]


def _rule_inputs(case: dict[str, Any]) -> dict[str, Any]:
    cy = case["cy"]
    n = len(cy)
    guard = case.get("guard", DrainGuard(1.0, 3.0, case.get("min_value", 0.0), 8))
    return {
        "native_yield": 10.0,
        "native_ms": 10.0,
        "compact_yield": cy,
        "compact_ms": case["ct"],
        "max_loss": case.get("loss", [0.1] * n),
        "feasible": case.get("feas", [True] * n),
        "budgets": case.get("v", [16 + i for i in range(n)]),
        "guard": guard,
    }


@pytest.mark.parametrize(
    ("case", "column", "reason"), [c[1:] for c in RULE_CASES], ids=[c[0] for c in RULE_CASES]
)
def test_selection_rule(case: dict[str, Any], column: int, reason: SelectReason) -> None:
    x = _rule_inputs(case)
    vec = choose_cells(
        native_yield=np.array([x["native_yield"]]),
        native_ms=np.array([x["native_ms"]]),
        compact_yield=np.array([x["compact_yield"]], dtype=float).reshape(1, -1),
        compact_ms=np.array([x["compact_ms"]], dtype=float).reshape(1, -1),
        max_loss=np.array([x["max_loss"]], dtype=float).reshape(1, -1),
        feasible=np.array([x["feasible"]], dtype=bool).reshape(1, -1),
        budgets=np.array([x["budgets"]], dtype=np.int64).reshape(1, -1),
        minimum_predicted_gain=0.01,
        drain_guard=x["guard"],
        tail_native_ms=6.0,
    )
    assert int(vec.column[0]) == column
    assert REASON_CODES[int(vec.reason[0])] is reason
    cells = list(
        zip(x["budgets"], x["compact_ms"], x["feasible"], x["compact_yield"], x["max_loss"], strict=True)
    )
    col, why, _ = _choose_one(
        native_yield=10.0,
        native_ms=10.0,
        cells=cells,
        minimum_predicted_gain=0.01,
        drain_guard=x["guard"],
        tail_native_ms=6.0,
    )
    assert (col, why) == (column, reason)


#: One step's rule inputs: per compact cell (yield, time, feasible, loss), the native yield and
#: time, the gain threshold and whether a drain guard applies (also used by the device rule's test).
RULE_INPUTS = {
    "data": st.lists(
        st.tuples(st.floats(0.5, 12), st.floats(5, 12), st.booleans(), st.floats(0, 3)),
        min_size=0,
        max_size=4,
    ),
    "ny": st.floats(1, 12),
    "nt": st.floats(5, 12),
    "gain": st.sampled_from([0.0, 0.01, 0.05]),
    "guarded": st.booleans(),
}


@given(**RULE_INPUTS)
@settings(max_examples=200, deadline=None)
def test_scalar_and_vectorised_rules_agree(
    data: list[tuple[float, float, bool, float]], ny: float, nt: float, gain: float, guarded: bool
) -> None:
    guard = DrainGuard(1.3, 2.5, 0.05, 8) if guarded else None
    c = len(data)
    cells = [(10 + i, t, f, y, loss) for i, (y, t, f, loss) in enumerate(data)]
    col, why, evals = _choose_one(
        native_yield=ny,
        native_ms=nt,
        cells=cells,
        minimum_predicted_gain=gain,
        drain_guard=guard,
        tail_native_ms=6.0,
    )
    vec = choose_cells(
        native_yield=np.array([ny]),
        native_ms=np.array([nt]),
        compact_yield=np.array([[d[0] for d in data]]).reshape(1, c),
        compact_ms=np.array([[d[1] for d in data]]).reshape(1, c),
        max_loss=np.array([[d[3] for d in data]]).reshape(1, c),
        feasible=np.array([[d[2] for d in data]], dtype=bool).reshape(1, c),
        budgets=np.array([[10 + i for i in range(c)]]).reshape(1, c),
        minimum_predicted_gain=gain,
        drain_guard=guard,
        tail_native_ms=6.0,
    )
    assert int(vec.column[0]) == col
    assert REASON_CODES[int(vec.reason[0])] is why
    for i, (score, passes, gv, ok) in enumerate(evals):
        assert vec.score[0, i] == score and bool(vec.passes_margin[0, i]) == passes
        assert bool(vec.passes_guard[0, i]) == ok
        assert (math.isnan(gv) and math.isnan(vec.group_value_ms[0, i])) or vec.group_value_ms[0, i] == gv


# --- one step: select, allocate, plan ---------------------------------------------------------


def _rows(n: int, *, ranks: int = 1, seed: int = 0, scale: float = 2.0) -> StepRows:
    rng = np.random.default_rng(seed)
    rank = np.sort(rng.integers(0, ranks, n)) if ranks > 1 else np.zeros(n, dtype=np.int64)
    return StepRows(rng.normal(1.5, scale, (n, K)), rank, rng.permutation(10 * n)[:n], ranks)


@pytest.mark.parametrize(("n", "ranks"), [(3, 1), (8, 1), (13, 1), (16, 1), (20, 4), (7, 3), (2, 4)])
def test_plan_invariants(n: int, ranks: int) -> None:
    table = staircase_table()
    for seed in range(12):
        rows = _rows(n, ranks=ranks, seed=seed)
        p = plan(table, CAL, rows)
        g, v = p.graph_batch_size, p.verifier_budget
        assert g == table.graph_batch_size_for(max(np.bincount(rows.rank, minlength=ranks)))
        assert len(p.ranks) == ranks and np.all((p.windows >= 1) & (p.windows <= K))
        for lay in p.ranks:
            assert lay.real_rows + lay.pad_rows == g
            assert lay.tokens == (v if v else g * (K + 1)), lay
            mine = p.windows[rows.rank == lay.rank]
            if v and lay.real_rows:
                assert int(np.sum(mine + 1)) + lay.pad_rows * lay.pad_len == v
            if v and not lay.real_rows:
                assert g * lay.pad_len + lay.pad_high_rows == v
        if not v:
            assert np.all(p.windows == K)


# --- the optimised planner against a straightforward reference ---------------------------------


def _seq(values: list[float]) -> float:
    total = 0.0
    for x in values:
        total += x
    return total


def _reference_plan(
    table: CostTable,
    calibration: Calibration,
    logits: np.ndarray,
    rank: list[int],
    request: list[int],
    num_ranks: int,
    floor: int,
) -> tuple[int, int, SelectReason, float, list[tuple[float, float, bool]], list[int], list[tuple[int, ...]]]:
    """DESIGN §6 written out literally: per-rank Python lists, an explicit sort, no memo, no views.

    Returns (G, V, reason, native yield, per cell (yield, max loss, feasible), windows in input
    order, per-rank layouts as tuples).
    """
    k = table.max_draft_len
    surv = calibration.survival(logits)  # (n, K), the documented left-to-right products
    by_rank: dict[int, list[int]] = {}
    for i in sorted(range(len(rank)), key=lambda i: (rank[i], request[i])):
        by_rank.setdefault(rank[i], []).append(i)
    base: dict[int, float] = {}
    ranking: dict[int, list[tuple[float, int, int]]] = {}  # (survival, position, row index)
    for r, members in by_rank.items():
        terms = [float(surv[i, j]) for j in range(floor) for i in members]  # position-major
        base[r] = len(members) + _seq(terms)
        cand = [(float(surv[i, j]), j, local) for j in range(floor, k) for local, i in enumerate(members)]
        ranking[r] = sorted(cand, key=lambda t: (-t[0], t[1], t[2]))
    full = {r: base[r] + _seq([c[0] for c in ranking[r]]) for r in by_rank}
    native_yield = _seq([full[r] for r in sorted(by_rank)])
    windows = [k] * len(rank)
    if not by_rank:
        return 0, 0, SelectReason.NO_ROWS, 0.0, [], windows, []
    g = table.graph_batch_size_for(max(len(m) for m in by_rank.values()))
    if g is None:
        return 0, 0, SelectReason.NO_GRAPH, native_yield, [], windows, []
    budgets = table.compact_budgets(g)
    idle = num_ranks > len(by_rank)
    cells: list[tuple[float, float, bool]] = []
    geos: list[dict[int, Geometry]] = []
    for v in budgets:
        geo = {
            r: cell_geometry(len(m), g, v, min_verify_len=floor, max_draft_len=k) for r, m in by_rank.items()
        }
        idle_geo = cell_geometry(0, g, v, min_verify_len=floor, max_draft_len=k)
        if any(x is None for x in geo.values()) or (idle and idle_geo is None):
            cells.append((0.0, 0.0, False))
            geos.append({})
            continue
        fits = {r: x for r, x in geo.items() if x is not None}
        per_rank = {r: base[r] + _seq([c[0] for c in ranking[r][: x.extra]]) for r, x in fits.items()}
        loss = max((full[r] - per_rank[r]) / len(by_rank[r]) for r in by_rank)
        cells.append((_seq([per_rank[r] for r in sorted(by_rank)]), loss, True))
        geos.append(fits)
    choice = choose_cells(
        native_yield=np.array([native_yield]),
        native_ms=np.array([table.time(g, 0)]),
        compact_yield=np.array([[c[0] for c in cells]]).reshape(1, -1),
        compact_ms=np.array([[table.time(g, v) for v in budgets]]).reshape(1, -1),
        max_loss=np.array([[c[1] for c in cells]]).reshape(1, -1),
        feasible=np.array([[c[2] for c in cells]], dtype=bool).reshape(1, -1),
        budgets=np.array([list(budgets)]).reshape(1, -1),
        minimum_predicted_gain=table.minimum_predicted_gain,
        drain_guard=table.drain_guard,
        tail_native_ms=(
            None if table.drain_guard is None else table.time(table.drain_guard.tail_graph_batch_size, 0)
        ),
    )
    col = int(choice.column[0])
    reason = REASON_CODES[int(choice.reason[0])]
    layouts: list[tuple[int, ...]] = []
    if col < 0:
        for r in range(num_ranks):
            c = len(by_rank.get(r, []))
            layouts.append((r, c, g - c, k + 1 if c < g else 0, 0, g * (k + 1)))
        return g, 0, reason, native_yield, cells, windows, layouts
    v = budgets[col]
    for r, members in by_rank.items():
        granted = [floor] * len(members)
        for _, _, local in ranking[r][: geos[col][r].extra]:
            granted[local] += 1
        for local, i in enumerate(members):
            windows[i] = granted[local]
    idle_geo = cell_geometry(0, g, v, min_verify_len=floor, max_draft_len=k)
    for r in range(num_ranks):
        if r in by_rank:
            c, x = len(by_rank[r]), geos[col][r]
            tokens = sum(windows[i] + 1 for i in by_rank[r]) + (g - c) * x.pad_len
            layouts.append((r, c, g - c, x.pad_len, 0, tokens))
        else:
            assert idle_geo is not None
            layouts.append(
                (
                    r,
                    0,
                    g,
                    idle_geo.pad_len,
                    idle_geo.pad_high_rows,
                    g * idle_geo.pad_len + idle_geo.pad_high_rows,
                )
            )
    return g, v, reason, native_yield, cells, windows, layouts


#: One step's rows: (rank, K logits) each; a few repeated values make exact survival ties (the
#: tie-break path) common (also used by the device planner's tests).
STEP_ROWS = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.lists(
            st.one_of(st.sampled_from([-3.0, 0.0, 2.0, 40.0]), st.floats(-6, 8)), min_size=K, max_size=K
        ),
    ),
    max_size=40,
)


@pytest.mark.slow
@given(
    num_ranks=st.integers(1, 4),
    rows=STEP_ROWS,
    shuffle=st.randoms(use_true_random=False),
    floor=st.integers(1, K),
    gain=st.sampled_from([0.0, 0.01]),
    cal_kind=st.sampled_from(["sts", "identity", "platt"]),
)
@settings(max_examples=300, deadline=None)
def test_plan_matches_a_straightforward_reference(
    num_ranks: int, rows: list[tuple[int, list[float]]], shuffle: Any, floor: int, gain: float, cal_kind: str
) -> None:
    """Bit-identical yields, scores, windows and layouts, whatever the fast paths take."""
    table = staircase_table(gain=gain)
    calibration = {
        "sts": CAL,
        "identity": Calibration.identity(K),
        "platt": Calibration(tuple(PositionMap("platt", (0.8 + 0.1 * j, -0.2)) for j in range(K))),
    }[cal_kind]
    rank = [r % num_ranks for r, _ in rows]
    request = list(range(len(rows)))
    shuffle.shuffle(request)
    logits = np.array([lg for _, lg in rows], dtype=np.float64).reshape(len(rows), K)
    step = StepRows(logits, np.array(rank, dtype=np.int64), np.array(request, dtype=np.int64), num_ranks)
    got = plan(table, calibration, step, min_verify_len=floor)
    g, v, reason, native_yield, cells, windows, layouts = _reference_plan(
        table, calibration, logits, rank, request, num_ranks, floor
    )
    sel = got.selection
    assert (sel.graph_batch_size, sel.verifier_budget, sel.reason) == (g, v, reason)
    assert sel.native_yield == native_yield
    assert [(c.expected_yield, c.max_yield_loss_per_request, c.feasible) for c in sel.cells] == cells
    assert got.windows.tolist() == windows
    assert [tuple(lay) for lay in got.ranks] == layouts
    assert select(table, calibration, step, min_verify_len=floor) == sel
    if g:
        alloc = allocate(
            table, calibration, step, graph_batch_size=g, verifier_budget=v, min_verify_len=floor
        )
        assert alloc.windows.tolist() == windows and [tuple(lay) for lay in alloc.ranks] == layouts
    # Rows passed in canonical order plan identically (the fast canonical path).
    order = sorted(range(len(rows)), key=lambda i: (rank[i], request[i]))
    again = plan(
        table,
        calibration,
        StepRows(logits[order], np.array(rank)[order], np.array(request)[order], num_ranks),
        min_verify_len=floor,
    )
    assert again.selection == sel and again.windows.tolist() == [windows[i] for i in order]


def test_rows_with_a_rank_revisited_are_not_taken_as_canonical() -> None:
    # Ranks [0, 1, 0] with increasing keys are not sorted by rank: rank 0 holds two rows.
    logits = np.random.default_rng(1).normal(0, 2, (3, K))
    a = plan(staircase_table(), CAL, StepRows(logits, np.array([0, 1, 0]), np.array([0, 1, 2]), 2))
    b = plan(staircase_table(), CAL, StepRows(logits[[0, 2, 1]], np.array([0, 0, 1]), np.array([0, 2, 1]), 2))
    assert [(lay.rank, lay.real_rows) for lay in a.ranks] == [(0, 2), (1, 1)]
    assert a.ranks == b.ranks and a.selection == b.selection
    assert a.windows.tolist() == b.windows[[0, 2, 1]].tolist()


def test_confident_rows_keep_native_doubtful_rows_go_compact() -> None:
    table = staircase_table()
    sure = plan(table, CAL, StepRows.single_rank(np.full((8, K), 12.0)))
    assert sure.verifier_budget == 0 and sure.selection.reason is SelectReason.BELOW_MARGIN
    doubtful = plan(table, CAL, StepRows.single_rank(np.full((8, K), -3.0)))
    assert doubtful.verifier_budget == 16 and doubtful.selection.reason is SelectReason.COMPACT
    assert np.all(doubtful.windows == 1)


def test_without_drain_guard_never_compact() -> None:
    sel = select(staircase_table(guard=None), CAL, StepRows.single_rank(np.full((8, K), -3.0)))
    assert sel.verifier_budget == 0 and sel.reason is SelectReason.NO_DRAIN_GUARD
    assert any(c.passes_margin for c in sel.cells)


def test_drain_guard_blocks_a_lossy_cell() -> None:
    strict = DrainGuard(
        loss_multiplier=1000.0,
        mean_output_tokens_per_request_iteration=1.0,
        minimum_group_value_ms=0.0,
        tail_graph_batch_size=16,
    )
    rows = StepRows.single_rank(np.full((8, K), 0.0))
    assert select(staircase_table(), CAL, rows).verifier_budget != 0
    sel = select(staircase_table(guard=strict), CAL, rows)
    assert sel.verifier_budget == 0 and sel.reason is SelectReason.DRAIN_GUARD


def test_empty_step_and_rows_above_the_ladder() -> None:
    table = staircase_table()
    assert select(table, CAL, StepRows.single_rank(np.zeros((0, K)))).reason is SelectReason.NO_ROWS
    big = plan(table, CAL, StepRows.single_rank(np.zeros((17, K))))
    assert big.selection.reason is SelectReason.NO_GRAPH and big.ranks == () and np.all(big.windows == K)


def test_tie_break_is_position_then_request() -> None:
    # Identical rows: at a given position every request ties; the earlier position, then the
    # lower request key, wins. 4 rows on G=4, V=14: floor tokens 8, extra 6 = all four second
    # positions (position 2) plus the first two third positions.
    table = CostTable.from_cells(K, {(4, 0): 10.0, (4, 14): 5.0}, drain_guard=DrainGuard(1.0, 3.0, 0.0, 4))
    logits = np.zeros((4, K))
    p = allocate(
        table, CAL, StepRows.single_rank(logits, request=[7, 3, 9, 5]), graph_batch_size=4, verifier_budget=14
    )
    # requests in key order 3, 5, 7, 9 -> windows 3, 3, 2, 2
    assert dict(zip([7, 3, 9, 5], p.windows.tolist(), strict=True)) == {3: 3, 5: 3, 7: 2, 9: 2}


@pytest.mark.parametrize("ranks", [1, 3])
def test_plan_is_invariant_under_input_order(ranks: int) -> None:
    table = staircase_table()
    for seed in range(10):
        rows = _rows(12, ranks=ranks, seed=seed)
        perm = np.random.default_rng(seed + 100).permutation(len(rows))
        shuffled = StepRows(rows.logits[perm], rows.rank[perm], rows.request[perm], ranks)
        a, b = plan(table, CAL, rows), plan(table, CAL, shuffled)
        assert a.selection == b.selection and a.ranks == b.ranks
        assert np.array_equal(a.windows[perm], b.windows)


def test_every_request_gets_a_prefix_ranked_by_survival() -> None:
    table = staircase_table()
    rows = _rows(16, seed=5, scale=3.0)
    p = allocate(table, CAL, rows, graph_batch_size=16, verifier_budget=48)
    surv = CAL.survival(rows.logits)
    # Brute force: rank every (request, position>1) by survival, ties by (position, request key).
    cands = sorted(
        ((-surv[i, j], j, rows.request[i], i) for i in range(len(rows)) for j in range(1, K)),
    )
    extra = 48 - 2 * 16
    want = np.ones(len(rows), dtype=int)
    for _, _, _, i in cands[:extra]:
        want[i] += 1
    assert p.windows.tolist() == want.tolist()


def test_allocate_refuses_unmeasured_or_infeasible_cells() -> None:
    table = staircase_table()
    rows = StepRows.single_rank(np.zeros((8, K)))
    with pytest.raises(ConfigError, match="no measurement"):
        allocate(table, CAL, rows, graph_batch_size=8, verifier_budget=17)
    narrow = CostTable.from_cells(K, {(4, 0): 5.0, (4, 6): 4.0})
    with pytest.raises(ConfigError, match="cannot carry"):  # 4 rows need at least 8 tokens
        allocate(narrow, CAL, StepRows.single_rank(np.zeros((4, K))), graph_batch_size=4, verifier_budget=6)
    with pytest.raises(ConfigError, match="cannot hold"):
        allocate(table, CAL, StepRows.single_rank(np.zeros((9, K))), graph_batch_size=8, verifier_budget=16)
    native = allocate(table, CAL, rows, graph_batch_size=8, verifier_budget=0)
    assert np.all(native.windows == K)


def test_k_mismatch_is_refused() -> None:
    with pytest.raises(ConfigError, match="K mismatch"):
        select(staircase_table(), Calibration.identity(4), StepRows.single_rank(np.zeros((2, 4))))


# --- top-k helpers ----------------------------------------------------------------------------


@given(
    values=st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9, 1.0]), min_size=1, max_size=40),
    data=st.data(),
)
@settings(max_examples=200, deadline=None)
def test_top_candidates_matches_a_stable_sort(values: list[float], data: st.DataObject) -> None:
    c = np.array([values])
    e = data.draw(st.integers(0, len(values)))
    mask = top_candidates(c, np.array([e]))
    order = np.argsort(-c[0], kind="stable")[:e]
    want = np.zeros(len(values), dtype=bool)
    want[order] = True
    assert mask[0].tolist() == want.tolist()
    prefix = sorted_prefix_sums(c)[0]
    assert prefix[e] == np.cumsum(c[0][np.argsort(-c[0], kind="stable")])[e - 1] if e else prefix[0] == 0.0


# --- tables and calibrations -----------------------------------------------------------------

TABLE_ERRORS = [
    ("no native cell", {(4, 8): 5.0}, "no native cell"),
    ("budget above full width", {(4, 0): 5.0, (4, 25): 4.0}, "outside"),
    ("budget below G", {(4, 0): 5.0, (4, 3): 4.0}, "outside"),
    ("five compact cells for one G", {(4, 0): 5.0, **{(4, v): 4.0 for v in (8, 9, 10, 11, 12)}}, "limit"),
    ("non-positive time", {(4, 0): 5.0, (4, 8): 0.0}, "finite and > 0"),
]


@pytest.mark.parametrize(("cells", "match"), [c[1:] for c in TABLE_ERRORS], ids=[c[0] for c in TABLE_ERRORS])
def test_cost_table_rules(cells: dict[tuple[int, int], float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        CostTable.from_cells(K, cells)


def test_cost_table_total_limit_and_guard_tail() -> None:
    cells = {(g, 0): 5.0 for g in range(2, 20)}
    cells.update({(g, v): 4.0 for g in range(2, 20) for v in (2 * g, 3 * g)})
    with pytest.raises(ConfigError, match="limit is 32"):
        CostTable.from_cells(K, cells)
    with pytest.raises(ConfigError, match="tail_graph_batch_size"):
        CostTable.from_cells(K, {(4, 0): 5.0}, drain_guard=DrainGuard(1.0, 1.0, 0.0, 8))
    full = CostTable.from_cells(K, {(4, 0): 5.0, (4, 24): 5.1, (4, 8): 4.0})
    assert full.compact_budgets(4) == (8,)  # the full-width control is not a production cell


def test_calibration_maps() -> None:
    x = np.linspace(-6, 6, 13)
    sig = 1 / (1 + np.exp(-x))
    assert np.allclose(PositionMap("sts", (2.0,)).apply(x), 1 / (1 + np.exp(-x / 2)))
    assert np.allclose(PositionMap("platt", (0.5, 1.0)).apply(x), 1 / (1 + np.exp(-(0.5 * x + 1))))
    assert np.allclose(PositionMap("beta", (1.0, 1.0, 0.0)).apply(x), sig)  # a=b=1, c=0 is the identity
    assert np.allclose(PositionMap("identity").apply(x), sig)
    iso = PositionMap("isotonic", (-1.0, 1.0, 0.2, 0.8)).apply(np.array([-5.0, 0.0, 5.0]))
    assert iso.tolist() == pytest.approx([0.2, 0.5, 0.8])
    for bad in (("sts", (0.0,)), ("platt", (1.0,)), ("isotonic", (1.0, 0.0, 0.5, 0.4)), ("magic", ())):
        with pytest.raises(ConfigError):
            PositionMap(*bad)
    rows = [{"position": j, "method": "platt", "temperature": 1.5, "params": [0.7, 0.1]} for j in (1, 2)]
    assert Calibration.from_rows(rows, use="sts").sts_temperatures() == (1.5, 1.5)
    native = Calibration.from_rows(rows, use="native")
    assert native.sts_temperatures() is None and native.maps[0].method == "platt"
    surv = native.survival(np.random.default_rng(0).normal(size=(50, 2)))
    assert np.all(np.diff(surv, axis=1) <= 0)
    with pytest.raises(ConfigError, match="no STS temperature"):
        Calibration.from_rows(
            [{"position": 1, "method": "platt", "temperature": None, "params": [1, 0]}], use="sts"
        )


def test_step_rows_validation() -> None:
    with pytest.raises(ConfigError, match="twice"):
        StepRows(np.zeros((2, K)), [0, 0], [1, 1], 1)
    with pytest.raises(ConfigError, match="ranks must lie"):
        StepRows(np.zeros((1, K)), [2], [1], 2)
    with pytest.raises(ConfigError, match="finite"):
        StepRows.single_rank(np.full((1, K), np.nan))
    src = np.zeros((2, K))
    rows = StepRows.single_rank(src)
    src[0, 0] = 5.0  # the rows hold their own copy
    assert rows.logits[0, 0] == 0.0 and not rows.logits.flags.writeable


def test_planner_imports_neither_torch_nor_calibrate() -> None:
    code = textwrap.dedent(
        """
        import sys
        import dspark_calibrate.runtime_plugin.planner
        heavy = ("torch", "dspark_calibrate.calibrate", "scipy", "pyarrow")
        print(",".join(m for m in heavy if m in sys.modules))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "torch" not in proc.stdout and "dspark_calibrate.calibrate" not in proc.stdout
