"""One selection rule: the host planner, the device planner and the fused planner agree where a
float's last bit, a NaN or an empty step could tell them apart (issue 26).

- **Ties between identical requests.** Identical rows have identical survivals, so the allocation
  breaks their tie by (position, request), whatever ulp a vectorised kernel adds to one copy.
- **Non-finite logits.** A NaN or infinite logit ranks its position and every later one of its
  row last, under every calibration map (an isotonic map's ``searchsorted`` included); the step's
  own decision is native. The host planner refuses such rows outright.
- **Steps without a graph.** The serving planners commit the newest decision, the one made
  beside the last step that had a graph; ``benchmarks.e2e.analysis.lag_report`` replays the same.

Runs the device code on the CPU (the ops a CUDA graph replays).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from benchmarks.e2e.analysis import lag_report

from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.device_planner import DevicePlanner, ServingPlanner, lagged_cell
from dspark_calibrate.runtime_plugin.fused_planner import FusedServingPlanner
from dspark_calibrate.runtime_plugin.planner import (
    Calibration,
    CostTable,
    PositionMap,
    SelectReason,
    StepRows,
    allocate,
    plan,
)
from tests.runtime_plugin.test_fused_planner import _Buffers
from tests.runtime_plugin.test_planner import CAL, K, staircase_table

# --- (a) ties between identical requests ---------------------------------------------------------


class UlpApart(DevicePlanner):
    """A device planner whose acceptance probabilities of the rows from ``tail`` on are one ulp
    off (``up``: towards 1): what a vectorised kernel does to the elements of a vector's tail."""

    def __init__(self, *args: Any, tail: int, up: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tail, self.up = tail, up

    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        p = super().probabilities(x).clone()
        toward = torch.ones_like(p) if self.up else torch.zeros_like(p)
        p[:, self.tail :] = torch.nextafter(p[:, self.tail :], toward[:, self.tail :])
        return p


#: The issue's case: K=3, temperatures [1, 1, 2], seven identical rows, one compact cell of G=8.
ISSUE_TABLE = CostTable.from_cells(3, {(8, 0): 10.0, (8, 16): 5.0})
ISSUE_CAL = Calibration.sts([1.0, 1.0, 2.0])

TIE_CASES = [
    # id, row (every request's logits), rows, tail (first nudged row, None: no nudge), up
    ("issue-26, tail rows an ulp up", [0.3, -1.2, 0.7], 7, 6, True),
    ("issue-26, tail rows an ulp down", [0.3, -1.2, 0.7], 7, 6, False),
    ("all but the first an ulp up", [1.4, -2.4, -1.3], 7, 1, True),
    ("torch's own float32 sigmoid (no nudge)", [0.322, -1.171, -2.682], 7, None, True),
    ("torch's own float32 sigmoid, other row", [2.058, -3.87, -0.48], 7, None, True),
    ("fewer rows", [0.3, -1.2, 0.7], 5, 4, True),
]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(
    ("row", "n", "tail", "up"), [c[1:] for c in TIE_CASES], ids=[c[0] for c in TIE_CASES]
)
def test_identical_requests_tie_by_position_then_request(
    row: list[float], n: int, tail: int | None, up: bool, dtype: str
) -> None:
    rows = StepRows.single_rank(np.tile(np.asarray(row, dtype=np.float32).astype(np.float64), (n, 1)))
    want = allocate(ISSUE_TABLE, ISSUE_CAL, rows, graph_batch_size=8, verifier_budget=16).windows.tolist()
    # The documented order: among equal survivals the lower position, then the earlier request,
    # so an earlier one of identical requests never verifies less than a later one.
    assert want == sorted(want, reverse=True) and len(set(want)) == 2
    if n == 7:
        assert want == [2, 1, 1, 1, 1, 1, 1]  # the issue's host answer
    if tail is None:
        dp = DevicePlanner(ISSUE_TABLE, ISSUE_CAL, dtype=dtype)
    else:
        dp = UlpApart(ISSUE_TABLE, ISSUE_CAL, dtype=dtype, tail=tail, up=up)
    assert dp.allocate(rows, 8, 16).windows.tolist() == want
    same = dp.plan(rows)
    ref = plan(ISSUE_TABLE, ISSUE_CAL, rows)
    assert (same.verifier_budget, same.windows.tolist()) == (ref.verifier_budget, ref.windows.tolist())


def test_identical_requests_among_others_keep_the_order() -> None:
    # Pairs of identical rows among distinct ones, several ranks' worth of slots: each pair's
    # survivals are one value, whichever copy a kernel computes.
    table = staircase_table()
    rng = np.random.default_rng(5)
    base = rng.normal(0.0, 2.0, (6, K)).astype(np.float32)
    x = np.concatenate([base, base[[0, 2, 4]], base[[2]]]).astype(np.float64)
    rows = StepRows.single_rank(x)
    dp = UlpApart(table, CAL, dtype="float32", tail=7, up=True)
    for v in table.compact_budgets(16):
        want = allocate(table, CAL, rows, graph_batch_size=16, verifier_budget=v).windows.tolist()
        assert dp.allocate(rows, 16, v).windows.tolist() == want, v


# --- (b) non-finite logits rank last ---------------------------------------------------------------

#: Maps under which a logit of -1e300 gives an acceptance probability of exactly 0: the host
#: reference of a bad candidate (ranked below every real survival, above absent rows).
BAD_MAPS = {
    "sts": CAL,
    "identity": Calibration.identity(K),
    "platt": Calibration(tuple(PositionMap("platt", (0.8 + 0.1 * j, -0.2)) for j in range(K))),
    "isotonic": Calibration(
        tuple(PositionMap("isotonic", (-40.0, -3.0, 0.5, 2.0, 0.0, 0.3, 0.6, 0.95)) for _ in range(K))
    ),
    "isotonic, one knot above the logits": Calibration(
        tuple(PositionMap("isotonic", (-40.0, 9.0, 0.0, 0.9)) for _ in range(K))
    ),
}

BAD_CASES = [
    # id, map, bad value, (row, position) of the bad logit
    ("isotonic-nan", "isotonic", math.nan, (2, 1)),
    ("isotonic-nan-first-position", "isotonic", math.nan, (0, 0)),
    ("isotonic-one-knot-nan", "isotonic, one knot above the logits", math.nan, (5, 2)),
    ("isotonic-plus-inf", "isotonic", math.inf, (3, 3)),
    ("sts-nan", "sts", math.nan, (2, 1)),
    ("sts-plus-inf", "sts", math.inf, (1, 2)),
    ("sts-minus-inf", "sts", -math.inf, (4, 1)),
    ("identity-plus-inf", "identity", math.inf, (0, 4)),
    ("platt-nan", "platt", math.nan, (6, 2)),
]


def _host_windows(table: CostTable, cal: Calibration, x: np.ndarray, g: int, v: int) -> list[int]:
    """The host allocation with every non-finite logit's candidates ranked last (survival 0)."""
    x64 = x.astype(np.float64)
    clean = np.where(np.isfinite(x64), x64, -1e300)
    return allocate(
        table, cal, StepRows.single_rank(clean), graph_batch_size=g, verifier_budget=v
    ).windows.tolist()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(("cal", "bad", "where"), [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_non_finite_candidates_rank_last_under_every_map(
    cal: str, bad: float, where: tuple[int, int], dtype: str
) -> None:
    table = staircase_table()
    calibration = BAD_MAPS[cal]
    rng = np.random.default_rng(2)
    x = rng.uniform(-4.0, 4.0, (8, K)).astype(np.float32)
    x[where] = bad
    step = DevicePlanner(table, calibration, dtype=dtype).step(8)
    step.logits[0] = torch.from_numpy(x)
    for column, v in enumerate(table.compact_budgets(8)):
        step.ints[:] = torch.tensor([8, column, 0])
        step.run()
        assert step.windows[0].tolist() == _host_windows(table, calibration, x, 8, v), v
        d = step.read()
        assert (d.verifier_budget, d.reason, d.non_finite) == (0, SelectReason.NON_FINITE, True)
    # The host planner refuses such rows before deciding anything.
    with pytest.raises(ConfigError, match="finite"):
        StepRows.single_rank(x.astype(np.float64))


def test_isotonic_map_gives_nan_for_nan_like_the_reference() -> None:
    cal = BAD_MAPS["isotonic"]
    x = np.array([[math.nan, -50.0, 0.0, 1.0, 50.0]])
    want = cal.probabilities(x)
    got = DevicePlanner(staircase_table(), cal).probabilities(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=1e-15)


@pytest.mark.parametrize("cal", ["isotonic", "sts"])
def test_fused_planner_ranks_a_nan_row_last(cal: str) -> None:
    table = staircase_table()
    calibration = BAD_MAPS[cal]
    fused, bufs = _fused(table, calibration)
    doubtful = np.full((6, K), -3.0, dtype=np.float32)  # (8, 16): two tokens above the floor
    for _ in range(3):
        _fused_step(fused, bufs, doubtful)
    broken = doubtful.copy()
    broken[0, 1] = math.nan  # the first request: granted first on the tie unless ranked last
    g, v = _fused_step(fused, bufs, broken)
    assert (g, v) == (8, 16)  # the cell committed from the step before
    want = _host_windows(table, calibration, broken, g, v)
    assert want == [1, 2, 2, 1, 1, 1]
    assert bufs[g].windows[:6].tolist() == want
    assert _fused_step(fused, bufs, doubtful)[1] == 0  # decided beside the broken step: native


# --- (c) a step without a graph ------------------------------------------------------------------


def _fused(table: CostTable, calibration: Calibration) -> tuple[FusedServingPlanner, dict[int, _Buffers]]:
    fused = FusedServingPlanner(DevicePlanner(table, calibration))
    bufs = {g: _Buffers(g, fused.decision_size(g)) for g in table.graph_batch_sizes}
    for g, b in bufs.items():
        fused.bind(
            g, logits=b.logits, ints=b.ints, ints_host=b.ints_host, windows=b.windows, decision=b.decision
        )
    return fused, bufs


def _fused_step(fused: FusedServingPlanner, bufs: dict[int, _Buffers], x: np.ndarray) -> tuple[int, int]:
    """One engine step: commit; with a graph, the logits in, the cell's hooks, observe."""
    g, v = fused.commit([x.shape[0]])
    if g == 0:
        return g, v  # the static fallback: no graph, so no planner work and no decision
    b = bufs[g]
    b.logits_host[: x.shape[0]] = x
    critical, beside = fused.hooks(g)
    critical()
    beside()
    fused.observe(b.decision.numpy().copy())
    return g, v


DOUBT = -3.0  # rows the table verifies compactly (a compact same-step decision)

GAP_CASES = [
    # id, rows per step (0: no rows; 17: above the ladder), V committed per step
    ("no rows between", [8, 0, 8], [0, 0, 16]),
    ("above the ladder between", [8, 17, 8], [0, 0, 16]),
    ("two steps without rows", [8, 0, 0, 8], [0, 0, 0, 16]),
    ("no rows, then another G", [8, 0, 16], [0, 0, 0]),
    ("no rows first", [0, 8, 8], [0, 0, 16]),
    ("no rows, then fewer rows of the same G", [8, 0, 6], [0, 0, 16]),
]


@pytest.mark.parametrize(("counts", "want"), [c[1:] for c in GAP_CASES], ids=[c[0] for c in GAP_CASES])
def test_after_a_step_without_a_graph_the_newest_decision_is_committed(
    counts: list[int], want: list[int]
) -> None:
    table = staircase_table()
    steps = [np.full((n, K), DOUBT, dtype=np.float32) for n in counts]
    # The rule: the newest decision is the one made beside the last step that had a graph.
    newest: tuple[int, int] | None = None
    rule = []
    for x in steps:
        rule.append(lagged_cell(table, newest, [x.shape[0]]))
        p = plan(table, CAL, StepRows.single_rank(x.astype(np.float64)))
        if p.graph_batch_size:
            newest = (p.graph_batch_size, p.verifier_budget)
    assert [v for _, v in rule] == want
    lagged = ServingPlanner(DevicePlanner(table, CAL))
    fused, bufs = _fused(table, CAL)
    assert [lagged.launch(x, [x.shape[0]]) for x in steps] == rule
    assert [_fused_step(fused, bufs, x) for x in steps] == rule
    a, b = lagged.finish(), fused.finish()
    for key in ("steps", "no_graph_steps", "committed_compact_steps", "lag_disagreements", "snapshot_late"):
        assert a[key] == b[key], key
    assert a["snapshot_late"] == 0 and a["no_graph_steps"] == sum(1 for n in counts if n in (0, 17))
    # The offline replay of the lag commits the same cells.
    report = lag_report(table, CAL, steps)
    assert report["lagged_compact_rate"] * len(steps) == pytest.approx(sum(1 for v in want if v))
    assert report["disagreements"] == a["lag_disagreements"]
    assert report["no_graph_steps"] == a["no_graph_steps"]


def test_doubtful_rows_decide_compact_on_every_g() -> None:
    # The premise of the gap cases: a compact same-step decision for every G they use.
    table = staircase_table()
    for n in (6, 8, 16):
        assert plan(table, CAL, StepRows.single_rank(np.full((n, K), DOUBT))).verifier_budget != 0, n
