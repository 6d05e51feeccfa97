"""The device selector/allocator agrees with the reference planner decision for decision (DESIGN §6).

Runs the device code on the CPU (the same torch ops a CUDA graph replays):

- the reference's own case tables (selection rule, plan invariants, tie-break, drain guard,
  empty steps and rows above the ladder) and its property test, in float64: with the reference's
  survivals every yield, score and decision is bit-identical; with the device's own calibration
  maps (torch's ``exp``/``log``) the decisions are identical and the numbers within 1e-12;
- float32: every disagreement with the float64 reference is classified as a near-threshold or
  near-tie decision, and one constructed near-tie shows that such a difference really happens;
- bad input (NaN/Inf logits), the lag rule, the serving helper's lagged and sync modes, and the
  fallback to the host planner.
"""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_calibrate.artifacts import Reason
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.device_planner import DevicePlanner, ServingPlanner, lagged_cell
from dspark_calibrate.runtime_plugin.engine import DynamicVerifier, choose_planner
from dspark_calibrate.runtime_plugin.planner import (
    REASON_CODES,
    Calibration,
    CostTable,
    DrainGuard,
    Plan,
    PositionMap,
    SelectReason,
    StepRows,
    _choose_one,
    allocate,
    cell_geometry,
    plan,
)
from tests.runtime_plugin.test_planner import (
    CAL,
    RULE_CASES,
    RULE_INPUTS,
    STEP_ROWS,
    K,
    _rows,
    staircase_table,
)

CALIBRATIONS = {
    "sts": CAL,
    "identity": Calibration.identity(K),
    "platt": Calibration(tuple(PositionMap("platt", (0.8 + 0.1 * j, -0.2)) for j in range(K))),
    "beta": Calibration(tuple(PositionMap("beta", (1.1, 0.9 - 0.05 * j, 0.1)) for j in range(K))),
    "isotonic": Calibration(
        tuple(PositionMap("isotonic", (-3.0, -1.0, 0.5, 2.0, 0.05, 0.3, 0.6, 0.95)) for _ in range(K))
    ),
    "mixed": Calibration(
        (
            PositionMap("sts", (1.3,)),
            PositionMap("platt", (0.9, 0.1)),
            PositionMap("identity"),
            PositionMap("beta", (1.0, 1.2, -0.1)),
            PositionMap("isotonic", (-1.0, 1.0, 0.2, 0.8)),
        )
    ),
}


class ReferenceSurvivals(DevicePlanner):
    """The device planner fed the reference's own acceptance probabilities (numpy's exp)."""

    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.detach().cpu().numpy().reshape(-1, self.max_draft_len)
        p = self.calibration.probabilities(flat)
        return torch.from_numpy(p.reshape(x.shape)).to(x.dtype)


def _decision(p: Plan) -> tuple[Any, ...]:
    s = p.selection
    return (s.graph_batch_size, s.verifier_budget, s.reason, p.windows.tolist(), [tuple(r) for r in p.ranks])


def _assert_numbers_close(a: Plan, b: Plan, rel: float) -> None:
    sa, sb = a.selection, b.selection
    assert sb.native_yield == pytest.approx(sa.native_yield, rel=rel, abs=1e-300)
    assert sb.native_score == pytest.approx(sa.native_score, rel=rel, abs=1e-300)
    assert len(sa.cells) == len(sb.cells)
    for x, y in zip(sa.cells, sb.cells, strict=True):
        assert (x.verifier_budget, x.feasible, x.passes_margin, x.passes_drain_guard) == (
            y.verifier_budget,
            y.feasible,
            y.passes_margin,
            y.passes_drain_guard,
        )
        for u, v in (
            (x.expected_yield, y.expected_yield),
            (x.score, y.score),
            (x.max_yield_loss_per_request, y.max_yield_loss_per_request),
        ):
            assert v == pytest.approx(u, rel=rel, abs=1e-12) or (math.isinf(u) and u == v)
        assert (x.group_value_ms is None) == (y.group_value_ms is None)
        if x.group_value_ms is not None and y.group_value_ms is not None:
            assert y.group_value_ms == pytest.approx(x.group_value_ms, rel=rel, abs=1e-12)


# --- the selection rule: the reference's case table --------------------------------------------


def _rule_step(case: dict[str, Any]) -> tuple[Any, list[int]]:
    """A DeviceStep whose G carries the case's cells (native 10 ms, a 6 ms tail G for the guard).

    Returns the step and, per case column, its column in the table's V order.
    """
    cy = case["cy"]
    budgets = case.get("v", [16 + i for i in range(len(cy))])
    cells = {(16, 0): 10.0, (8, 0): 6.0}
    for v, t in zip(budgets, case["ct"], strict=True):
        cells[(16, v)] = t
    guard = case.get("guard", DrainGuard(1.0, 3.0, case.get("min_value", 0.0), 8))
    table = CostTable.from_cells(K, cells, minimum_predicted_gain=0.01, drain_guard=guard)
    step = DevicePlanner(table, CAL).step(16, input_dtype=torch.float64)
    order = table.compact_budgets(16)
    return step, [order.index(v) for v in budgets]


@pytest.mark.parametrize(
    ("case", "column", "reason"), [c[1:] for c in RULE_CASES], ids=[c[0] for c in RULE_CASES]
)
def test_selection_rule_cases(case: dict[str, Any], column: int, reason: SelectReason) -> None:
    step, to_table = _rule_step(case)
    n = len(case["cy"])
    if n == 0:  # a G without compact cells: the step itself says so
        step.ints[0], step.ints[2] = 1, 1
        step.run()
        assert (step.read().column, step.read().reason) == (column, reason)
        return
    inv = {t: i for i, t in enumerate(to_table)}

    def in_table_order(values: list[Any], dtype: torch.dtype) -> torch.Tensor:
        out = [values[inv[t]] for t in range(n)]
        return torch.tensor(out, dtype=dtype).reshape(n)

    f64 = torch.float64
    col, why, *_ = step._choose(
        torch.tensor(10.0, dtype=f64),
        torch.tensor(1.0, dtype=f64),
        in_table_order(case["cy"], f64),
        in_table_order(case.get("loss", [0.1] * n), f64),
        in_table_order(case.get("feas", [True] * n), torch.bool),
    )
    got_col = int(col)
    assert (to_table.index(got_col) if got_col >= 0 else -1) == column
    assert REASON_CODES[int(why)] is reason


@given(**(RULE_INPUTS | {"data": RULE_INPUTS["data"].filter(bool)}))  # a step's G has >= 1 cell here
@settings(max_examples=200, deadline=None)
def test_device_rule_equals_the_scalar_rule(
    data: list[tuple[float, float, bool, float]], ny: float, nt: float, gain: float, guarded: bool
) -> None:
    guard = DrainGuard(1.3, 2.5, 0.05, 8) if guarded else None
    cells = {(16, 0): nt, (8, 0): 6.0} | {(16, 17 + i): t for i, (_, t, _, _) in enumerate(data)}
    table = CostTable.from_cells(K, cells, minimum_predicted_gain=gain, drain_guard=guard)
    step = DevicePlanner(table, CAL).step(16, input_dtype=torch.float64)
    f64 = torch.float64
    col, why, score, passes, gv, ok = step._choose(
        torch.tensor(ny, dtype=f64),
        torch.tensor(ny, dtype=f64) / nt,
        torch.tensor([d[0] for d in data], dtype=f64),
        torch.tensor([d[3] for d in data], dtype=f64),
        torch.tensor([d[2] for d in data]),
    )
    ref_cells = [(17 + i, t, f, y, loss) for i, (y, t, f, loss) in enumerate(data)]
    want_col, want_reason, evals = _choose_one(
        native_yield=ny,
        native_ms=nt,
        cells=ref_cells,
        minimum_predicted_gain=gain,
        drain_guard=guard,
        tail_native_ms=6.0 if guarded else None,
    )
    assert int(col) == want_col
    assert REASON_CODES[int(why)] is want_reason
    for i, (s, p, g, o) in enumerate(evals):
        assert float(score[i]) == s and bool(passes[i]) == p and bool(ok[i]) == o
        assert (math.isnan(g) and math.isnan(float(gv[i]))) or float(gv[i]) == g


# --- one step: plan, select, allocate ---------------------------------------------------------


@pytest.mark.parametrize(("n", "ranks"), [(3, 1), (8, 1), (13, 1), (16, 1), (20, 4), (7, 3), (2, 4), (17, 1)])
@pytest.mark.parametrize("cal", sorted(CALIBRATIONS))
def test_plans_equal_the_reference(n: int, ranks: int, cal: str) -> None:
    table = staircase_table()
    calibration = CALIBRATIONS[cal]
    exact = ReferenceSurvivals(table, calibration, num_ranks=ranks)
    own = DevicePlanner(table, calibration, num_ranks=ranks)
    compact = 0
    for seed in range(12):
        rows = _rows(n, ranks=ranks, seed=seed)
        ref = plan(table, calibration, rows)
        got = exact.plan(rows)
        assert got.selection == ref.selection  # bit-identical yields, scores, group values
        assert _decision(got) == _decision(ref)
        mine = own.plan(rows)
        assert _decision(mine) == _decision(ref)
        _assert_numbers_close(ref, mine, 1e-12)
        compact += ref.verifier_budget != 0
        assert own.select(rows).verifier_budget == ref.verifier_budget
    if n <= 16 and cal in ("sts", "identity"):
        assert compact > 0, "no compact decision: the case table does not exercise the allocation"


def test_reference_scenarios() -> None:
    table = staircase_table()
    dp = DevicePlanner(table, CAL)
    sure = dp.plan(StepRows.single_rank(np.full((8, K), 12.0)))
    assert sure.verifier_budget == 0 and sure.selection.reason is SelectReason.BELOW_MARGIN
    doubtful = dp.plan(StepRows.single_rank(np.full((8, K), -3.0)))
    assert doubtful.verifier_budget == 16 and doubtful.selection.reason is SelectReason.COMPACT
    assert np.all(doubtful.windows == 1)
    sel = DevicePlanner(staircase_table(guard=None), CAL).select(StepRows.single_rank(np.full((8, K), -3.0)))
    assert sel.verifier_budget == 0 and sel.reason is SelectReason.NO_DRAIN_GUARD
    strict = DrainGuard(1000.0, 1.0, 0.0, 16)
    rows = StepRows.single_rank(np.zeros((8, K)))
    assert DevicePlanner(staircase_table(guard=strict), CAL).select(rows).reason is SelectReason.DRAIN_GUARD
    empty = dp.plan(StepRows.single_rank(np.zeros((0, K))))
    assert empty.selection.reason is SelectReason.NO_ROWS and empty.windows.shape == (0,)
    big_rows = StepRows.single_rank(np.random.default_rng(3).normal(0, 2, (17, K)))
    big, ref = dp.plan(big_rows), plan(table, CAL, big_rows)
    assert big.selection.reason is SelectReason.NO_GRAPH and big.ranks == () and np.all(big.windows == K)
    assert big.selection.native_yield == pytest.approx(ref.selection.native_yield, rel=1e-12)


def test_tie_break_is_position_then_request() -> None:
    table = CostTable.from_cells(K, {(4, 0): 10.0, (4, 14): 5.0}, drain_guard=DrainGuard(1.0, 3.0, 0.0, 4))
    rows = StepRows.single_rank(np.zeros((4, K)), request=[7, 3, 9, 5])
    p = DevicePlanner(table, CAL).allocate(rows, 4, 14)
    assert dict(zip([7, 3, 9, 5], p.windows.tolist(), strict=True)) == {3: 3, 5: 3, 7: 2, 9: 2}


def test_allocate_equals_the_reference_for_every_cell() -> None:
    table = staircase_table()
    dp = ReferenceSurvivals(table, CAL, num_ranks=3)
    for seed in range(6):
        rows = _rows(11, ranks=3, seed=seed, scale=3.0)
        g = table.graph_batch_size_for(int(np.bincount(rows.rank, minlength=3).max()))
        assert g is not None
        for gg in (g, 16):
            for v in (0, *table.compact_budgets(gg)):
                try:
                    ref = allocate(table, CAL, rows, graph_batch_size=gg, verifier_budget=v)
                except ConfigError as exc:
                    with pytest.raises(ConfigError, match=str(exc).split(" ")[0]):
                        dp.allocate(rows, gg, v)
                    continue
                got = dp.allocate(rows, gg, v)
                assert got.windows.tolist() == ref.windows.tolist(), (gg, v)
                assert got.ranks == ref.ranks


def test_allocate_refuses_what_the_reference_refuses() -> None:
    dp = DevicePlanner(staircase_table(), CAL)
    rows = StepRows.single_rank(np.zeros((8, K)))
    with pytest.raises(ConfigError, match="no measurement"):
        dp.allocate(rows, 8, 17)
    narrow = DevicePlanner(CostTable.from_cells(K, {(4, 0): 5.0, (4, 6): 4.0}), CAL)
    with pytest.raises(ConfigError, match="cannot carry"):
        narrow.allocate(StepRows.single_rank(np.zeros((4, K))), 4, 6)
    with pytest.raises(ConfigError, match="cannot hold"):
        dp.allocate(StepRows.single_rank(np.zeros((9, K))), 8, 16)
    with pytest.raises(ConfigError, match="K mismatch"):
        DevicePlanner(staircase_table(), Calibration.identity(4))
    with pytest.raises(ConfigError, match="dtype"):
        DevicePlanner(staircase_table(), CAL, dtype="float16")


# --- the reference's property test, on the device ------------------------------------------------

STEP = STEP_ROWS


def _step_rows(rows: list[tuple[int, list[float]]], num_ranks: int, shuffle: Any) -> StepRows:
    rank = [r % num_ranks for r, _ in rows]
    request = list(range(len(rows)))
    shuffle.shuffle(request)
    logits = np.array([lg for _, lg in rows], dtype=np.float64).reshape(len(rows), K)
    return StepRows(logits, np.array(rank, dtype=np.int64), np.array(request, dtype=np.int64), num_ranks)


@pytest.mark.slow
@given(
    num_ranks=st.integers(1, 4),
    rows=STEP,
    shuffle=st.randoms(use_true_random=False),
    floor=st.integers(1, K),
    gain=st.sampled_from([0.0, 0.01]),
    cal=st.sampled_from(sorted(CALIBRATIONS)),
)
@settings(max_examples=250, deadline=None)
def test_every_decision_agrees_in_float64(
    num_ranks: int, rows: list[tuple[int, list[float]]], shuffle: Any, floor: int, gain: float, cal: str
) -> None:
    table = staircase_table(gain=gain)
    calibration = CALIBRATIONS[cal]
    step = _step_rows(rows, num_ranks, shuffle)
    ref = plan(table, calibration, step, min_verify_len=floor)
    exact = ReferenceSurvivals(table, calibration, min_verify_len=floor, num_ranks=num_ranks).plan(step)
    assert exact.selection == ref.selection
    assert _decision(exact) == _decision(ref)
    mine = DevicePlanner(table, calibration, min_verify_len=floor, num_ranks=num_ranks).plan(step)
    assert _decision(mine) == _decision(ref)
    _assert_numbers_close(ref, mine, 1e-12)


# --- float32: only near-threshold and near-tie decisions may differ --------------------------------

#: Relative distance to a threshold or tie under which a float32 decision may differ.
F32_REL = 1e-4


def _near_threshold(sel: Any, table: CostTable) -> bool:
    """Some comparison that decides the cell lies within F32_REL of flipping: a score against
    native or the margin, a group value against its minimum, two cells' scores or group values."""
    ns = sel.native_score
    if not ns or not math.isfinite(ns):
        return False
    guard_min = table.drain_guard.minimum_group_value_ms if table.drain_guard else 0.0
    feasible = [c for c in sel.cells if c.feasible]
    gaps = []
    for c in feasible:
        gaps += [abs(c.score - ns) / ns, abs(c.score - ns * (1.0 + table.minimum_predicted_gain)) / ns]
        if c.group_value_ms is not None:
            gaps.append(abs(c.group_value_ms - guard_min) / c.step_time_ms)
    for i, a in enumerate(feasible):
        for b in feasible[i + 1 :]:
            gaps.append(abs(a.score - b.score) / ns)
            if a.group_value_ms is not None and b.group_value_ms is not None:
                gaps.append(abs(a.group_value_ms - b.group_value_ms) / a.step_time_ms)
    return bool(gaps) and min(gaps) < F32_REL


def _near_tie_at_cut(calibration: Calibration, rows: StepRows, ref: Plan, floor: int) -> bool:
    """Some rank's cut falls between two candidate survivals within F32_REL of each other."""
    surv = calibration.survival(rows.logits)
    v, g = ref.verifier_budget, ref.graph_batch_size
    for r in range(rows.num_ranks):
        mine = np.flatnonzero(rows.rank == r)
        if not mine.size:
            continue
        geo = cell_geometry(mine.size, g, v, min_verify_len=floor, max_draft_len=K)
        if geo is None or geo.extra == 0:
            continue
        cand = np.sort(surv[mine][:, floor:].reshape(-1))[::-1]
        e = geo.extra
        if e < cand.size and abs(cand[e - 1] - cand[e]) <= F32_REL * max(cand[e - 1], 1e-30):
            return True
    return False


def _classify(table: CostTable, calibration: Calibration, step: StepRows, floor: int) -> str:
    ref = plan(table, calibration, step, min_verify_len=floor)
    got = DevicePlanner(
        table, calibration, min_verify_len=floor, dtype="float32", num_ranks=step.num_ranks
    ).plan(step)
    if _decision(got) == _decision(ref):
        return "agree"
    if (got.graph_batch_size, got.verifier_budget) != (ref.graph_batch_size, ref.verifier_budget):
        near = _near_threshold(ref.selection, table) or _near_threshold(got.selection, table)
        return "near-threshold" if near else "UNEXPLAINED cell"
    if got.selection.reason != ref.selection.reason:
        return "near-threshold" if _near_threshold(ref.selection, table) else "UNEXPLAINED reason"
    return "near-tie" if _near_tie_at_cut(calibration, step, ref, floor) else "UNEXPLAINED windows"


@pytest.mark.slow
@given(
    num_ranks=st.integers(1, 4),
    rows=STEP,
    shuffle=st.randoms(use_true_random=False),
    floor=st.integers(1, K),
    cal=st.sampled_from(["sts", "identity", "platt"]),
)
@settings(max_examples=200, deadline=None)
def test_float32_differs_only_near_thresholds_and_ties(
    num_ranks: int, rows: list[tuple[int, list[float]]], shuffle: Any, floor: int, cal: str
) -> None:
    verdict = _classify(staircase_table(), CALIBRATIONS[cal], _step_rows(rows, num_ranks, shuffle), floor)
    assert not verdict.startswith("UNEXPLAINED"), verdict


@pytest.mark.slow
def test_float32_over_many_serving_steps_is_classified() -> None:
    table = staircase_table()
    verdicts: dict[str, int] = {}
    for seed in range(300):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(1, 17))
        rows = StepRows.single_rank(rng.normal(1.0, 2.5, (n, K)).astype(np.float32).astype(np.float64))
        v = _classify(table, CAL, rows, 1)
        verdicts[v] = verdicts.get(v, 0) + 1
    assert not any(k.startswith("UNEXPLAINED") for k in verdicts), verdicts
    assert verdicts.get("agree", 0) >= 290, verdicts


def test_float32_really_differs_at_a_near_tie() -> None:
    # Two rows whose position-2 survivals differ by ~1e-9: float64 grants the better one (the later
    # request), float32 sees a tie and grants the earlier request. The classifier explains it.
    table = CostTable.from_cells(K, {(2, 0): 10.0, (2, 5): 4.0}, drain_guard=DrainGuard(1.0, 3.0, 0.0, 2))
    logits = np.array([[3.0, 0.5, -9.0, -9.0, -9.0], [3.0, 0.5 + 2e-9, -9.0, -9.0, -9.0]])
    rows = StepRows.single_rank(logits)
    ref = allocate(table, CAL, rows, graph_batch_size=2, verifier_budget=5)
    got = DevicePlanner(table, CAL, dtype="float32").allocate(rows, 2, 5)
    assert ref.windows.tolist() == [1, 2] and got.windows.tolist() == [2, 1]
    assert _classify(table, CAL, rows, 1) == "near-tie"


# --- no host synchronisation -----------------------------------------------------------------------

#: Ops that read a device value on the host (a CUDA synchronisation) or give data-dependent shapes.
SYNCING_OPS = (
    "aten::item",
    "aten::_local_scalar_dense",
    "aten::nonzero",
    "aten::masked_select",
    "aten::unique",
)


@pytest.mark.parametrize(("ranks", "cal", "floor"), [(1, "sts", 1), (3, "mixed", 2), (1, "isotonic", 1)])
def test_a_step_runs_no_op_that_reads_the_device_on_the_host(ranks: int, cal: str, floor: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    dp = DevicePlanner(staircase_table(), CALIBRATIONS[cal], min_verify_len=floor, num_ranks=ranks)
    step = dp.step(16)
    step.logits.normal_(0.0, 2.0)
    step.ints[:ranks] = torch.tensor([16, 9, 0][:ranks])
    for use_selected in (0, 1):
        step.ints[ranks], step.ints[ranks + 1] = 1, use_selected
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step.run()
        names = {e.name for e in prof.events()}
        assert not names & set(SYNCING_OPS), sorted(names & set(SYNCING_OPS))


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_logits_make_the_step_native_and_still_fill_v(bad: float) -> None:
    table = staircase_table()
    dp = DevicePlanner(table, CAL)
    step = dp.step(8, input_dtype=torch.float32)
    logits = np.full((8, K), -3.0, dtype=np.float32)
    step.logits[0] = torch.from_numpy(logits)
    step.ints[0], step.ints[1], step.ints[2] = 8, -1, 1
    step.run()
    assert step.read().verifier_budget == 16  # doubtful rows: compact
    logits[3, 2] = bad
    step.logits[0] = torch.from_numpy(logits)
    step.run()
    d = step.read()
    assert d.reason is SelectReason.NON_FINITE and d.verifier_budget == 0 and d.non_finite
    assert step.windows.tolist() == [[K] * 8]
    # A committed compact cell (the lag) is still allocated exactly, the bad row ranked last.
    for column, v in enumerate(table.compact_budgets(8)):
        step.ints[1], step.ints[2] = column, 0
        step.run()
        w = step.windows[0].tolist()
        assert sum(x + 1 for x in w) == v and all(1 <= x <= K for x in w)
    # A bad value in a slot beyond the rows in use is ignored.
    logits[3, 2] = -3.0
    logits_padded = np.full((16, K), -3.0, dtype=np.float32)
    logits_padded[:8] = logits
    logits_padded[12, 0] = math.nan
    s16 = dp.step(16, input_dtype=torch.float32)
    s16.logits[0] = torch.from_numpy(logits_padded)
    s16.ints[0], s16.ints[1], s16.ints[2] = 9, -1, 1
    s16.run()
    assert not s16.read().non_finite


@pytest.mark.parametrize("mode", ["lagged", "sync"])
def test_serving_planner_counts_non_finite_steps_and_never_raises(mode: str) -> None:
    table = staircase_table()
    sp = ServingPlanner(DevicePlanner(table, CAL), mode=mode)
    doubtful = np.full((8, K), -3.0, dtype=np.float32)
    bad = doubtful.copy()
    bad[0, 0] = math.nan
    cells = [sp.launch(x, [8]) for x in (doubtful, doubtful, bad, doubtful, doubtful)]
    stats = sp.finish()
    assert stats["non_finite_steps"] == 1
    if mode == "sync":
        assert cells == [(8, 16), (8, 16), (8, 0), (8, 16), (8, 16)]  # that very step runs native
    else:
        # the lag: step 3 keeps the cell committed from step 2, step 4 (deciding on step 3's) is native
        assert cells == [(8, 0), (8, 16), (8, 16), (8, 0), (8, 16)]


# --- the lag ----------------------------------------------------------------------------------------

LAG_CASES = [
    # id, previous (G, V), counts per rank, floor, expected
    ("no earlier decision", None, [5], 1, (8, 0)),
    ("earlier native", (8, 0), [5], 1, (8, 0)),
    ("earlier decision on another G", (16, 32), [5], 1, (8, 0)),
    ("kept", (8, 16), [8], 1, (8, 16)),
    ("kept with pad rows", (8, 24), [5], 1, (8, 24)),
    ("kept with an idle rank", (8, 16), [8, 0], 1, (8, 16)),
    ("the floor tokens exceed V", (4, 8), [4], 2, (4, 0)),
    ("one rank of two cannot carry V", (4, 8), [2, 4], 2, (4, 0)),
    ("no rows", (8, 16), [0], 1, (0, 0)),
    ("above the ladder", (16, 32), [17], 1, (0, 0)),
]


@pytest.mark.parametrize(
    ("previous", "counts", "floor", "expected"), [c[1:] for c in LAG_CASES], ids=[c[0] for c in LAG_CASES]
)
def test_lagged_cell(
    previous: tuple[int, int] | None, counts: list[int], floor: int, expected: tuple[int, int]
) -> None:
    got = lagged_cell(staircase_table(), previous, counts, min_verify_len=floor)
    assert got == expected
    if got[1]:  # whatever is kept, every rank can carry it
        for c in counts:
            assert cell_geometry(c, got[0], got[1], min_verify_len=floor, max_draft_len=K) is not None


def _serve(sp: ServingPlanner, steps: list[np.ndarray]) -> list[tuple[int, int]]:
    return [sp.launch(x, [x.shape[0]]) for x in steps]


def _steps(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    n = 8
    for _ in range(count):
        n = int(np.clip(n + rng.integers(-2, 3), 1, 16))
        out.append(rng.normal(0.0, 2.5, (n, K)).astype(np.float32))
    return out


def test_lagged_mode_commits_the_previous_decision_and_allocates_it_exactly() -> None:
    table = staircase_table()
    dp = DevicePlanner(table, CAL)
    sp = ServingPlanner(dp)
    targets = {g: torch.zeros(g, dtype=torch.int64) for g in table.graph_batch_sizes}
    for g, t in targets.items():
        sp.bind(g, t)
    previous: tuple[int, int] | None = None
    disagreements = 0
    steps = _steps(80)
    for x in steps:
        rows = StepRows.single_rank(x.astype(np.float64))
        same = plan(table, CAL, rows)
        want = lagged_cell(table, previous, [x.shape[0]])
        got = sp.launch(x, [x.shape[0]])
        assert got == want
        if got[1]:
            ref = allocate(table, CAL, rows, graph_batch_size=got[0], verifier_budget=got[1])
            assert targets[got[0]][: x.shape[0]].tolist() == ref.windows.tolist()
        disagreements += want != (same.graph_batch_size, same.verifier_budget)
        previous = (same.graph_batch_size, same.verifier_budget)
    stats = sp.finish()
    assert stats["steps"] == len(steps) and stats["lag_disagreements"] == disagreements
    assert 0 < disagreements < len(steps)
    assert stats["snapshot_late"] == stats["snapshot_waits"] == 0


def test_sync_mode_is_the_same_step_plan_and_force_native_keeps_k() -> None:
    table = staircase_table()
    steps = _steps(40, seed=1)
    sync = ServingPlanner(DevicePlanner(table, CAL), mode="sync")
    want = [plan(table, CAL, StepRows.single_rank(x.astype(np.float64))) for x in steps]
    assert _serve(sync, steps) == [(p.graph_batch_size, p.verifier_budget) for p in want]
    stats = sync.finish()
    assert stats["lag_disagreements"] == 0
    assert stats["verified_tokens"] == sum(int(p.windows.sum()) + len(p.windows) for p in want)
    forced = ServingPlanner(DevicePlanner(table, CAL), force_native=True)
    assert all(v == 0 for _, v in _serve(forced, steps))
    stats = forced.finish()
    assert stats["committed_compact_steps"] == 0 and stats["selected_compact_steps"] > 0
    assert stats["verified_tokens"] == sum(x.shape[0] * (K + 1) for x in steps)


def test_serving_planner_multi_rank_grid() -> None:
    table = staircase_table()
    sp = ServingPlanner(DevicePlanner(table, CAL, num_ranks=2), mode="sync")
    rng = np.random.default_rng(4)
    grid = rng.normal(-1.0, 2.0, (2, 16, K)).astype(np.float32)
    g, v = sp.launch(grid, [6, 3])
    rows = StepRows(
        np.concatenate([grid[0, :6], grid[1, :3]]).astype(np.float64),
        np.array([0] * 6 + [1] * 3),
        np.arange(9),
        2,
    )
    ref = plan(table, CAL, rows)
    assert (g, v) == (ref.graph_batch_size, ref.verifier_budget)
    with pytest.raises(ConfigError, match="one entry per rank"):
        sp.launch(grid, [6])


# --- loading and fallback --------------------------------------------------------------------------


def _verifier() -> DynamicVerifier:
    return DynamicVerifier(staircase_table(), CAL, digest="0" * 64, min_verify_len=1)


def test_choose_planner_cpu_device_and_host() -> None:
    choice = choose_planner(_verifier(), device="cpu")
    assert choice.kind == "device" and choice.fallback is None
    assert not isinstance(choice.planner, DynamicVerifier)
    rows = _rows(12, seed=3)
    assert _decision(choice.planner.planner.plan(rows)) == _decision(plan(staircase_table(), CAL, rows))
    host = choose_planner(_verifier(), prefer="host")
    assert host.kind == "host" and host.fallback is None
    with pytest.raises(ConfigError, match="prefer"):
        choose_planner(_verifier(), prefer="gpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA")
def test_choose_planner_falls_back_without_cuda(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="dspark_calibrate.runtime_plugin.engine"):
        choice = choose_planner(_verifier())
    assert choice.kind == "host" and choice.fallback is not None
    assert choice.fallback.reason is Reason.PLANNER_FALLBACK and choice.fallback.field == "cuda"
    assert choice.reason_code == "PLANNER_FALLBACK:cuda"
    assert choice.planner.plan(_rows(4)).graph_batch_size == 4
    assert any(
        getattr(r, "dspark_planner", {}).get("reason_code") == "PLANNER_FALLBACK:cuda" for r in caplog.records
    )


def test_choose_planner_falls_back_without_torch() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any import of torch now raises ImportError
        from dspark_calibrate.runtime_plugin.engine import DynamicVerifier, choose_planner
        from dspark_calibrate.runtime_plugin.planner import Calibration, CostTable
        table = CostTable.from_cells(2, {(2, 0): 10.0, (2, 4): 6.0})
        choice = choose_planner(DynamicVerifier(table, Calibration.identity(2), digest="0", min_verify_len=1))
        print(choice.kind, choice.reason_code)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["host", "PLANNER_FALLBACK:torch"]
    assert "PLANNER_FALLBACK:torch" in proc.stderr  # the logged warning


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replay_equals_eager_and_never_syncs() -> None:
    table = staircase_table()
    steps = _steps(30, seed=2)
    eager = ServingPlanner(DevicePlanner(table, CAL, device="cpu"), mode="lagged")
    want = _serve(eager, steps)
    sp = ServingPlanner(DevicePlanner(table, CAL, device="cuda"), mode="lagged")
    sp.prepare()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = _serve(sp, steps)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert got == want
    assert sp.finish()["snapshot_late"] == 0
