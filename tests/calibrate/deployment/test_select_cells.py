"""Cell selection: limits, greedy value, refusals with numbers (STYLE rule 11)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from dspark_calibrate.calibrate.deployment.replay import (
    CellGrid,
    estimate_drain_guard,
    prepare_evidence,
    replay,
)
from dspark_calibrate.calibrate.deployment.select_cells import (
    SelectionRefused,
    flatness,
    require_cells,
    select_cells,
)
from dspark_calibrate.calibrate.deployment.workload import synthesize_workload
from dspark_calibrate.calibrate.measurement.stats import Status
from dspark_calibrate.runtime_plugin.planner import Calibration
from tests.calibrate.build_factories import TEMPERATURES, sweep_rows

K = 5
CAL = Calibration.sts(TEMPERATURES)
WORKLOAD = synthesize_workload(k=K, steps=800, ranks=1, max_rows=32, seed=21, temperatures=TEMPERATURES)


def evidence(rows: list[dict[str, Any]]) -> Any:
    grid = CellGrid.from_rows(K, rows)
    ev = prepare_evidence(WORKLOAD, grid, CAL)
    guard, _ = estimate_drain_guard(ev, minimum_predicted_gain=0.01)
    return ev, guard


def dense_rows() -> list[dict[str, Any]]:
    return sweep_rows(
        (8, 16, 32), K, budgets={g: list(range(g, g * (K + 1) + 1, max(1, g // 4))) for g in (8, 16, 32)}
    )


@pytest.fixture(scope="module")
def dense() -> Any:
    ev, guard = evidence(dense_rows())
    return ev, guard, select_cells(ev, minimum_predicted_gain=0.01, drain_guard=guard)


def test_limits_and_measured_set(dense: Any) -> None:
    ev, _, sel = dense
    assert sel.decision.status is Status.ACCEPT and sel.decision.reason == "cells_selected"
    per_g: dict[int, int] = {}
    for g, v in sel.cells:
        per_g[g] = per_g.get(g, 0) + 1
        assert g < v < g * (K + 1)  # never V=G, never the full-width control
    assert max(per_g.values()) <= 4 and len(sel.cells) <= 32 - len(ev.grid.ladder)
    assert set(sel.cells) <= set(ev.grid.compact_keys())
    assert require_cells(sel) == sel.cells


@pytest.mark.slow
def test_greedy_value_increases_and_matches_the_replay(dense: Any) -> None:
    ev, guard, sel = dense
    totals = [r["total_value_ms"] for r in sel.rounds]
    assert all(b > a for a, b in itertools.pairwise(totals))
    assert all(r["added_value_ms"] > 0 for r in sel.rounds)
    # The first round takes the best single cell: brute force over every candidate alone.
    singles = {}
    for key in ev.grid.compact_keys():
        allowed = ev.columns == key[1]
        allowed &= ev.graph_batch_size[:, None] == key[0]
        rep = replay(ev, drain_guard=guard, allowed=allowed)
        singles[key] = sum(c["value_ms"] for c in rep.per_cell)
    best = max(singles, key=lambda c: singles[c])
    first = (sel.rounds[0]["graph_batch_size"], sel.rounds[0]["verifier_budget"])
    assert first == best and sel.rounds[0]["added_value_ms"] == pytest.approx(singles[best])
    # The selection's value is what the replay of the chosen set reports.
    chosen = np.zeros_like(ev.feasible)
    for g, v in sel.cells:
        chosen |= (ev.columns == v) & (ev.graph_batch_size[:, None] == g)
    rep = replay(ev, drain_guard=guard, allowed=chosen)
    assert sum(c["value_ms"] for c in rep.per_cell) == pytest.approx(sel.value_ms)


def test_tighter_limits_are_respected(dense: Any) -> None:
    ev, guard, _ = dense
    sel = select_cells(ev, minimum_predicted_gain=0.01, drain_guard=guard, max_per_g=1, max_total=2)
    assert len(sel.cells) <= 2 and len({g for g, _ in sel.cells}) == len(sel.cells)


def test_flat_table_is_rejected_with_numbers() -> None:
    ev, guard = evidence(sweep_rows((8, 16, 32), K, flat=True))
    sel = select_cells(ev, minimum_predicted_gain=0.01, drain_guard=guard)
    assert sel.decision.status is Status.REJECT and sel.decision.reason == "flat" and sel.cells == ()
    with pytest.raises(
        SelectionRefused, match=r"no compact cell is faster than native: G=8: best V=\d+ saves"
    ) as exc:
        require_cells(sel)
    assert exc.value.decision.reason == "flat"


def test_drops_within_noise_are_undecided() -> None:
    rows = sweep_rows((8,), K)
    nat = next(r for r in rows if r["verifier_budget"] == 0)["step_time_ms"]
    for r in rows:
        if r["verifier_budget"]:
            t = nat * 0.999
            # The paired saving's interval reaches below 0: the drop may be noise.
            r.update(
                step_time_ms=t,
                ci_low_ms=t * 0.99,
                ci_high_ms=t * 1.01,
                saving=0.001,
                saving_ci_low=-0.004,
                saving_ci_high=0.006,
            )
    decision, numbers = flatness(CellGrid.from_rows(K, rows))
    assert decision.status is Status.UNDECIDED and decision.reason == "flat_within_noise"
    assert numbers[0]["saving_fraction"] == pytest.approx(0.001)


def test_cells_that_never_change_the_decision_are_rejected(dense: Any) -> None:
    ev, guard, _ = dense
    sel = select_cells(ev, minimum_predicted_gain=5.0, drain_guard=guard)
    assert sel.decision.status is Status.REJECT and sel.decision.reason == "never_changes_decision"
    assert "over 800 policy steps, 0 have a cell beating native" in sel.decision.detail
    with pytest.raises(SelectionRefused, match="never_changes_decision"):
        require_cells(sel)
