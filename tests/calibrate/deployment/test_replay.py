"""Replay: per-step decisions equal the reference planner's; tokens, goodput, CI and economics."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest

from dspark_calibrate.calibrate.deployment.replay import (
    BootstrapSettings,
    CellGrid,
    StepEvidence,
    admission_rule,
    choose_steps,
    deployed_evidence,
    estimate_drain_guard,
    gain_decision,
    prepare_evidence,
    replay,
    selector_replay_sha256,
)
from dspark_calibrate.calibrate.deployment.workload import (
    synthesize_mixed_workload,
    synthesize_workload,
    workload_from_arrays,
)
from dspark_calibrate.calibrate.measurement.stats import Status
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.planner import (
    REASON_CODES,
    Calibration,
    DrainGuard,
    SelectReason,
    StepRows,
    plan,
)
from tests.calibrate.build_factories import TEMPERATURES, staircase_ms

K = 5
CAL = Calibration.sts(TEMPERATURES)


def grid_rows(ladder: tuple[int, ...] = (4, 8, 16), per_g: int = 4) -> list[dict[str, Any]]:
    rows = []
    for g in ladder:
        budgets = [g + 1, 2 * g, 3 * g, 4 * g + 1][:per_g]
        for v in [0, *budgets]:
            t = staircase_ms(g, g * (K + 1) if v == 0 else v, tile=8, native=v == 0)
            rows.append(
                {
                    "graph_batch_size": g,
                    "verifier_budget": v,
                    "step_time_ms": t,
                    "ci_low_ms": 0.99 * t,
                    "ci_high_ms": 1.01 * t,
                }
            )
    return rows


GRID = CellGrid.from_rows(K, grid_rows())
BOOT = BootstrapSettings(resamples=100, seed=3)


@pytest.mark.parametrize(("ranks", "max_rows", "floor"), [(1, 16, 1), (3, 16, 1), (2, 8, 2)])
def test_replay_matches_the_reference_planner_step_by_step(ranks: int, max_rows: int, floor: int) -> None:
    w = synthesize_workload(
        k=K, steps=150, ranks=ranks, max_rows=max_rows, seed=ranks + floor, temperatures=TEMPERATURES
    )
    ev = prepare_evidence(w, GRID, CAL, min_verify_len=floor, per_row=True)
    guard, _ = estimate_drain_guard(ev, minimum_predicted_gain=0.01)
    rep = replay(ev, drain_guard=guard, bootstrap=BOOT)
    table = GRID.cost_table(minimum_predicted_gain=0.01, drain_guard=guard)
    a = w.arrays()
    compact = 0
    for i, sid in enumerate(ev.step_id):
        m = a.step == sid
        rows = StepRows(a.logits[m].astype(np.float64), a.rank[m], a.request[m], w.num_ranks)
        p = plan(table, CAL, rows, min_verify_len=floor)
        assert (p.graph_batch_size, p.verifier_budget) == (
            int(ev.graph_batch_size[i]),
            int(rep.verifier_budget[i]),
        )
        assert p.selection.native_yield == ev.native_yield[i]
        for j, cell in enumerate(p.selection.cells):
            assert cell.feasible == bool(ev.feasible[i, j])
            if cell.feasible:
                assert cell.expected_yield == ev.compact_yield[i, j]
                assert cell.max_yield_loss_per_request == ev.max_loss[i, j]
        realized = int(np.sum(1 + np.minimum(a.accepted[m], p.windows)))
        if p.verifier_budget:
            compact += 1
            j = list(ev.columns[i]).index(p.verifier_budget)
            assert realized == ev.tokens[i, j]
            assert ev.row_tokens is not None
            assert np.array_equal(
                ev.row_tokens[np.flatnonzero(m), j], 1 + np.minimum(a.accepted[m], p.windows)
            )
        else:
            assert realized == ev.static_tokens[i] == int(np.sum(a.accepted[m] + 1))
    assert compact > 0, "the case should exercise compact steps"


def test_tokens_and_goodput_by_hand() -> None:
    # One step, one rank, two rows that accept 0 and 5 tokens; every cell feasible.
    logits = np.array([[-4.0] * K, [4.0] * K], dtype=np.float32)
    w = workload_from_arrays(
        step=[0, 0], rank=[0, 0], request_id=["a", "b"], logits=logits, accepted=[0, 5], output_len=[0, 0]
    )
    grid = CellGrid.from_rows(K, [r for r in grid_rows((4,)) if r["verifier_budget"] in (0, 8)])
    ev = prepare_evidence(w, grid, CAL)
    assert ev.static_tokens.tolist() == [1 + 6]
    # V=8 on G=4 with 2 rows: 2 pad rows of 1 token, 6 real tokens = floor 4 + extra 2, both to
    # row b (w=3): row a emits min(0, 1) + 1, row b min(5, 3) + 1
    assert ev.tokens.tolist() == [[1 + 4]]
    guard = DrainGuard(1.0, 3.5, 0.0, 4)
    rep = replay(ev, drain_guard=guard, overhead_ms=0.0, bootstrap=BOOT)
    t0, t8 = grid.native(4).step_time_ms, grid.compact(4)[0].step_time_ms
    if rep.verifier_budget[0]:
        assert rep.predicted_gain == pytest.approx((5 / t8) / (7 / t0) - 1)
    else:
        assert rep.predicted_gain == 0.0
    # The confidence path's cost is paid on every dynamic step and lowers the gain by hand, too.
    paid = replay(ev, drain_guard=guard, overhead_ms=0.25, bootstrap=BOOT)
    if paid.verifier_budget[0]:
        assert paid.predicted_gain == pytest.approx((5 / (t8 + 0.25)) / (7 / t0) - 1)
    else:
        assert paid.predicted_gain == pytest.approx(t0 / (t0 + 0.25) - 1)


def test_rows_above_the_ladder_are_skipped() -> None:
    w = synthesize_workload(k=K, steps=100, max_rows=24, seed=1, temperatures=TEMPERATURES)
    ev = prepare_evidence(w, GRID, CAL)
    big = int(np.sum(np.bincount(w.arrays().step) > 16))
    assert ev.skipped_steps == big > 0 and ev.steps == 100 - big
    with pytest.raises(ConfigError, match="no workload step fits"):
        prepare_evidence(w, CellGrid.from_rows(K, grid_rows((2,))), CAL)


def test_k_mismatch_is_refused() -> None:
    w = synthesize_workload(k=4, steps=10, max_rows=4, seed=1)
    with pytest.raises(ConfigError, match="K mismatch"):
        prepare_evidence(w, GRID, CAL)


@pytest.fixture(scope="module")
def report() -> Any:
    w = synthesize_workload(k=K, steps=1200, ranks=1, max_rows=16, seed=11, temperatures=TEMPERATURES)
    ev = prepare_evidence(w, GRID, CAL, per_row=True)
    guard, est = estimate_drain_guard(ev, minimum_predicted_gain=0.01)
    return ev, guard, replay(ev, drain_guard=guard, drain_guard_estimate=est, bootstrap=BOOT)


def test_report_is_consistent(report: Any) -> None:
    ev, _guard, rep = report
    assert rep.policy_steps == ev.steps == sum(b["steps"] for b in rep.per_bucket)
    assert rep.predicted_gain_ci_low <= rep.predicted_gain <= rep.predicted_gain_ci_high
    assert rep.pessimistic_gain < rep.predicted_gain
    assert rep.bootstrap["methods"] == ["blocks of steps", "requests"]
    e = rep.economics
    assert e.compact_choices == int(np.sum(rep.verifier_budget > 0)) == rep.reasons["compact"]
    assert rep.compact_step_share == pytest.approx(e.compact_choices / e.policy_steps)
    admitted, net = admission_rule(
        policy_steps=e.policy_steps,
        compact_choices=e.compact_choices,
        gross_compact_value_ms_lower_bound=e.gross_compact_value_ms_lower_bound,
        fixed_confidence_path_overhead_ms_upper_bound=e.fixed_confidence_path_overhead_ms_upper_bound,
        safety_margin_ms=e.safety_margin_ms,
    )
    assert (admitted, net) == (e.admitted, e.net_value_ms)
    assert 0 <= e.gross_compact_value_ms_lower_bound <= e.gross_compact_value_ms
    chosen = sum(c["chosen_steps"] for c in rep.per_cell)
    assert chosen == rep.policy_steps
    assert rep.decision.status is Status.ACCEPT


def test_value_sums_to_the_wall_time_saving(report: Any) -> None:
    ev, _, rep = report
    native_ms, compact_ms = ev.times("median")
    static_ms = float(native_ms.sum())
    dyn_ms = sum(
        float(compact_ms[i, list(ev.columns[i]).index(v)]) if v else float(native_ms[i])
        for i, v in enumerate(rep.verifier_budget.tolist())
    )
    # Goodput is net of the confidence path, paid on every dynamic step.
    overhead = rep.economics.fixed_confidence_path_overhead_ms_upper_bound
    dyn_tokens = rep.dynamic_goodput_tok_per_ms * (dyn_ms + overhead * len(rep.verifier_budget))
    # sum of (T0 - TV - lost * static ms/token) = time static K needs for the dynamic tokens - dynamic time
    saving = static_ms * dyn_tokens / float(ev.static_tokens.sum()) - dyn_ms
    assert sum(c["value_ms"] for c in rep.per_cell) == pytest.approx(saving)
    assert rep.economics.gross_compact_value_ms == pytest.approx(saving)


def test_replay_is_deterministic_and_the_digest_binds_decisions(report: Any) -> None:
    ev, guard, rep = report
    again = replay(ev, drain_guard=guard, bootstrap=BOOT)
    assert again.selector_replay_sha256 == rep.selector_replay_sha256
    assert again.predicted_gain_ci_low == rep.predicted_gain_ci_low
    v = rep.verifier_budget.copy()
    v[0] = 7 if v[0] == 0 else 0
    other = selector_replay_sha256(
        step_id=ev.step_id, graph_batch_size=ev.graph_batch_size, verifier_budget=v, header={"k": K}
    )
    same = selector_replay_sha256(
        step_id=ev.step_id,
        graph_batch_size=ev.graph_batch_size,
        verifier_budget=rep.verifier_budget,
        header={"k": K},
    )
    assert other != same


def test_drain_guard_estimate(report: Any) -> None:
    ev, guard, _ = report
    assert guard.mean_output_tokens_per_request_iteration == pytest.approx(
        ev.static_tokens.sum() / ev.rows.sum()
    )
    assert guard.tail_graph_batch_size in GRID.ladder and guard.loss_multiplier >= 1.0
    fixed, est = estimate_drain_guard(
        ev, minimum_predicted_gain=0.01, loss_multiplier=2.5, minimum_group_value_ms=0.1
    )
    assert (
        fixed.loss_multiplier == 2.5
        and fixed.minimum_group_value_ms == 0.1
        and est["realized_to_predicted_loss_ratio"] is None
    )


def test_user_economics_and_deployed_subset(report: Any) -> None:
    ev, guard, _rep = report
    user = replay(ev, drain_guard=guard, overhead_ms=0.5, safety_margin_ms=10.0, bootstrap=BOOT)
    assert user.economics.overhead_source == "user-supplied"
    assert user.economics.net_value_ms == pytest.approx(
        user.economics.gross_compact_value_ms_lower_bound - user.policy_steps * 0.5 - 10.0
    )
    none = np.zeros_like(ev.feasible)
    native_only = replay(ev, drain_guard=guard, allowed=none, overhead_ms=0.0, bootstrap=BOOT)
    assert native_only.economics.compact_choices == 0 and not native_only.economics.admitted
    assert native_only.predicted_gain == 0.0
    # With a confidence-path cost, running a policy that never trims is a loss.
    assert replay(ev, drain_guard=guard, allowed=none, overhead_ms=0.5, bootstrap=BOOT).predicted_gain < 0
    choice = choose_steps(ev, minimum_predicted_gain=0.01, drain_guard=guard, allowed=none)
    assert {REASON_CODES[r] for r in choice.reason.tolist()} == {SelectReason.NO_COMPACT_CELLS}


ADMISSION_CASES = [
    # (policy_steps, compact_choices, gross, overhead, margin) -> (admitted, net)
    ("aggregate accounting admits", (100, 50, 156.0, 1.0, 0.0), (True, 56.0)),
    ("overhead on every policy step", (100, 10, 80.0, 1.0, 0.0), (False, -20.0)),
    ("needs a compact choice", (100, 0, 200.0, 1.0, 10.0), (False, 90.0)),
    ("zero net is not admitted", (100, 50, 110.0, 1.0, 10.0), (False, 0.0)),
    ("positive net is admitted", (100, 50, 160.0, 1.0, 10.0), (True, 50.0)),
]


@pytest.mark.parametrize(
    ("args", "expected"), [c[1:] for c in ADMISSION_CASES], ids=[c[0] for c in ADMISSION_CASES]
)
def test_admission_rule(args: tuple[int, int, float, float, float], expected: tuple[bool, float]) -> None:
    steps, choices, gross, overhead, margin = args
    admitted, net = admission_rule(
        policy_steps=steps,
        compact_choices=choices,
        gross_compact_value_ms_lower_bound=gross,
        fixed_confidence_path_overhead_ms_upper_bound=overhead,
        safety_margin_ms=margin,
    )
    assert admitted is expected[0] and net == pytest.approx(expected[1])


@pytest.mark.parametrize(
    "bad",
    [
        {"policy_steps": 0},
        {"policy_steps": True},
        {"compact_choices": 101},
        {"gross_compact_value_ms_lower_bound": math.nan},
        {"fixed_confidence_path_overhead_ms_upper_bound": math.inf},
        {"safety_margin_ms": -1.0},
    ],
)
def test_admission_rule_refuses_invalid_economics(bad: dict[str, Any]) -> None:
    args = {
        "policy_steps": 100,
        "compact_choices": 50,
        "gross_compact_value_ms_lower_bound": 160.0,
        "fixed_confidence_path_overhead_ms_upper_bound": 1.0,
        "safety_margin_ms": 10.0,
    } | bad
    with pytest.raises(ConfigError):
        admission_rule(**args)


@pytest.mark.parametrize(
    ("args", "status"),
    [
        ((0.05, 0.02, 0.08, True), Status.ACCEPT),
        ((0.05, -0.01, 0.08, True), Status.UNDECIDED),
        ((-0.02, -0.05, -0.01, False), Status.REJECT),
        ((0.05, 0.02, 0.08, False), Status.REJECT),
        ((math.nan, 0.0, 0.1, True), Status.UNKNOWN),
    ],
)
def test_gain_decision(args: tuple[float, float, float, bool], status: Status) -> None:
    gain, lo, hi, admitted = args
    assert gain_decision(gain, lo, hi, admitted=admitted).status is status


def test_grid_drops_undeployable_budgets() -> None:
    rows = grid_rows((4,))
    rows.append(
        {
            "graph_batch_size": 4,
            "verifier_budget": 4,
            "step_time_ms": 4.0,
            "ci_low_ms": 3.9,
            "ci_high_ms": 4.1,
        }
    )
    rows.append(
        {
            "graph_batch_size": 4,
            "verifier_budget": 24,
            "step_time_ms": 6.0,
            "ci_low_ms": 5.9,
            "ci_high_ms": 6.1,
        }
    )
    grid = CellGrid.from_rows(K, rows)
    assert grid.dropped == ((4, 4), (4, 24))
    with pytest.raises(ConfigError, match="not measured compact cells"):
        grid.restrict([(4, 6)])
    with pytest.raises(ConfigError, match="no native cell"):
        CellGrid.from_rows(K, [r for r in rows if r["verifier_budget"]])
    with pytest.raises(ConfigError, match="ci_low"):
        CellGrid.from_rows(
            K,
            [
                {
                    "graph_batch_size": 4,
                    "verifier_budget": 0,
                    "step_time_ms": 4.0,
                    "ci_low_ms": 4.1,
                    "ci_high_ms": 4.2,
                }
            ],
        )


def _paired_rows(half: float, common: float = 0.0) -> list[dict[str, Any]]:
    rows = grid_rows()
    native = {r["graph_batch_size"]: r["step_time_ms"] for r in rows if r["verifier_budget"] == 0}
    for r in rows:
        s = 1 - r["step_time_ms"] / native[r["graph_batch_size"]]
        w = half if r["verifier_budget"] else 0.0
        r.update(
            saving=s,
            saving_ci_low=s - w,
            saving_ci_high=s + w,
            paired_rounds=8,
            common_mode_rel=common,
            level_rel=0.0,
        )
    return rows


def test_the_cost_table_is_never_treated_as_exact() -> None:
    """Wider saving intervals widen the gain's interval and lower the gross value's bound."""
    w = synthesize_workload(k=K, steps=800, ranks=1, max_rows=16, seed=5, temperatures=TEMPERATURES)
    out = {}
    for half in (0.0, 0.02):
        grid = CellGrid.from_rows(K, _paired_rows(half))
        ev = prepare_evidence(w, grid, CAL, per_row=True)
        guard, _ = estimate_drain_guard(ev, minimum_predicted_gain=0.01)
        out[half] = replay(ev, drain_guard=guard, overhead_ms=0.0, bootstrap=BOOT)
    exact, uncertain = out[0.0], out[0.02]
    assert exact.uncertainty_model.startswith("joint") and uncertain.uncertainty_model.startswith("joint")
    assert exact.predicted_gain == pytest.approx(uncertain.predicted_gain)
    width = lambda r: r.predicted_gain_ci_high - r.predicted_gain_ci_low  # noqa: E731
    assert width(uncertain) > 1.2 * width(exact)
    assert (
        uncertain.economics.gross_compact_value_ms_lower_bound
        < exact.economics.gross_compact_value_ms_lower_bound
    )


def test_a_common_level_shift_barely_moves_the_gain() -> None:
    """The level every cell shares cancels in the gain (only the overhead's share moves)."""
    w = synthesize_workload(k=K, steps=800, ranks=1, max_rows=16, seed=5, temperatures=TEMPERATURES)
    widths = []
    for common in (0.0, 0.05):
        grid = CellGrid.from_rows(K, _paired_rows(0.002, common))
        ev = prepare_evidence(w, grid, CAL, per_row=True)
        guard, _ = estimate_drain_guard(ev, minimum_predicted_gain=0.01)
        r = replay(ev, drain_guard=guard, overhead_ms=0.0, bootstrap=BOOT)
        widths.append(r.predicted_gain_ci_high - r.predicted_gain_ci_low)
    assert widths[1] == pytest.approx(widths[0], rel=0.05)


# --- the deployed evidence, derived from the candidates' ----------------------------------------


def _assert_same_evidence(got: StepEvidence, want: StepEvidence) -> None:
    """Every field equal (arrays by value and dtype), the cell times included."""
    for f in dataclasses.fields(StepEvidence):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if f.name in ("grid", "source"):
            continue
        if f.name == "mixed_native":
            assert (a is None) == (b is None)
            if a is not None:
                for m in dataclasses.fields(a):
                    assert np.array_equal(getattr(a, m.name), getattr(b, m.name)), m.name
            continue
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, f.name
            assert np.array_equal(a, b), f.name
        else:
            assert a == b, f.name
    assert got.grid.cells == want.grid.cells
    for which in ("median", "low", "high"):
        for x, y in zip(got.times(which), want.times(which), strict=True):
            assert np.array_equal(x, y)


def _slower(rows: list[dict[str, Any]], factor: float) -> list[dict[str, Any]]:
    keys = ("step_time_ms", "ci_low_ms", "ci_high_ms")
    return [{**r, **{key: factor * r[key] for key in keys}} for r in rows]


DEPLOYED_CASES = {
    # G=8 has no deployed compact cell; the others keep later columns only.
    "a G without a cell": [(4, 12), (16, 32), (16, 65)],
    "no compact cell": [],
    "every candidate": list(GRID.compact_keys()),
}


@pytest.mark.parametrize(("ranks", "floor"), [(1, 1), (3, 2)])
@pytest.mark.parametrize("case", sorted(DEPLOYED_CASES))
def test_deployed_evidence_equals_a_fresh_evaluation(ranks: int, floor: int, case: str) -> None:
    w = synthesize_workload(k=K, steps=200, ranks=ranks, max_rows=20, seed=ranks, temperatures=TEMPERATURES)
    candidates = prepare_evidence(w, GRID, CAL, min_verify_len=floor)
    final = GRID.restrict(DEPLOYED_CASES[case])
    got = deployed_evidence(candidates, final)
    want = prepare_evidence(w, final, CAL, min_verify_len=floor, per_row=True)
    assert got.grid is final and got.row_tokens is not None
    _assert_same_evidence(got, want)
    if case == "a G without a cell":
        assert got.columns.shape[1] == 2 and np.all(got.columns[got.graph_batch_size == 8] == -1)


def test_deployed_evidence_takes_the_deployed_grid_times_and_prices_mixed_steps_with_them() -> None:
    w = synthesize_mixed_workload(
        k=K,
        steps=400,
        ranks=1,
        levels=(6, 12),
        chunk_sizes=(32,),
        positions=(128,),
        seed=2,
        temperatures=TEMPERATURES,
    )
    candidates = prepare_evidence(w, GRID, CAL)
    assert candidates.mixed_native is not None and candidates.mixed_native.estimated.any()
    keep = [(4, 8), (16, 48)]
    final = CellGrid.from_rows(
        K,
        [
            r
            for r in _slower(grid_rows(), 1.25)
            if r["verifier_budget"] == 0 or (r["graph_batch_size"], r["verifier_budget"]) in keep
        ],
    )
    got = deployed_evidence(candidates, final)
    _assert_same_evidence(got, prepare_evidence(w, final, CAL, per_row=True))
    assert got.mixed_native is not None
    assert not np.array_equal(got.mixed_native.time_ms, candidates.mixed_native.time_ms)


def test_deployed_evidence_refuses_cells_it_has_no_evidence_for() -> None:
    w = synthesize_workload(k=K, steps=50, ranks=1, max_rows=16, seed=1, temperatures=TEMPERATURES)
    candidates = prepare_evidence(w, CellGrid.from_rows(K, grid_rows(per_g=2)), CAL)
    with pytest.raises(ConfigError, match="not candidate cells"):
        deployed_evidence(candidates, GRID.restrict([(4, 12)]))
    with pytest.raises(ConfigError, match="ladder"):
        deployed_evidence(candidates, CellGrid.from_rows(K, grid_rows((4, 8))))
