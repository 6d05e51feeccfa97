"""The prediction model of DESIGN §9: regime and objective, the planner's measured overhead drawn in
the replicates, saving shifts, mixed steps priced without mixed evidence, the joint receipt."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from dspark_calibrate.calibrate.deployment.build import BuildOptions, load_overhead_evidence
from dspark_calibrate.calibrate.deployment.regime import (
    SATURATED_STEP_SHARE,
    Objective,
    Regime,
    infer_regime,
)
from dspark_calibrate.calibrate.deployment.replay import (
    BootstrapSettings,
    CellGrid,
    estimate_drain_guard,
    prepare_evidence,
    replay,
)
from dspark_calibrate.calibrate.deployment.uncertainty import (
    COMMON_SHIFT_FLOOR,
    OVERHEAD_PROCESS_REL,
    PAIRED_SHIFT_FLOOR,
    PER_G_SHIFT_FLOOR,
    OverheadEvidence,
    ShiftModel,
    draw_costs,
    overhead_from_runs,
    shift_model,
)
from dspark_calibrate.calibrate.deployment.workload import (
    synthesize_mixed_workload,
    synthesize_workload,
    with_step_values,
)
from dspark_calibrate.errors import ConfigError, InvalidValueError
from dspark_calibrate.runtime_plugin.planner import Calibration
from tests.calibrate.build_factories import TEMPERATURES, build_options, staircase_ms

K = 5
CAL = Calibration.sts(TEMPERATURES)
BOOT = BootstrapSettings(resamples=200, seed=11)
NAN = math.nan


def paired_rows(ladder: tuple[int, ...] = (8, 16), half: float = 0.002) -> list[dict[str, Any]]:
    rows = []
    for g in ladder:
        t0 = staircase_ms(g, g * (K + 1), native=True, base=4.0, per_tile=0.5)
        for v in (0, 2 * g, 3 * g, 4 * g):
            t = t0 if v == 0 else staircase_ms(g, v, base=4.0, per_tile=0.5)
            s = 1 - t / t0
            w = half if v else 0.0
            rows.append(
                {
                    "graph_batch_size": g,
                    "verifier_budget": v,
                    "step_time_ms": t,
                    "ci_low_ms": 0.995 * t,
                    "ci_high_ms": 1.005 * t,
                    "saving": s,
                    "saving_ci_low": s - w,
                    "saving_ci_high": s + w,
                    "paired_rounds": 12,
                    "common_mode_rel": 0.002,
                    "level_rel": 0.001,
                }
            )
    return rows


GRID = CellGrid.from_rows(K, paired_rows())
RUNS = OverheadEvidence("fused", (0.10, 0.11, 0.09, 0.10, 0.105, 0.095), "six forced-K runs")


# ---------------------------------------------------------------------------------------------
# Regime and objective
# ---------------------------------------------------------------------------------------------


def test_a_closed_batch_drains_saturated() -> None:
    """No request is still to arrive after the last one is admitted: a lost token lengthens the run."""
    waiting = np.array([3, 2, 1, 0, 0, 0, 0])
    finding = infer_regime(waiting, drain=np.array([0, 0, 0, 1, 1, 1, 1], dtype=bool))
    assert finding.regime is Regime.SATURATED and finding.saturated_share == 1.0
    assert "none was still to arrive" in finding.source
    assert infer_regime(waiting).regime is Regime.ARRIVAL_BOUND


def test_the_drain_is_read_from_when_requests_first_appear() -> None:
    w = synthesize_workload(k=K, steps=200, ranks=1, max_rows=8, seed=3, temperatures=TEMPERATURES)
    v = w.step_values()
    a = w.arrays()
    last = max(int(a.step[a.request == r].min()) for r in np.unique(a.request))
    assert np.array_equal(v.drain, v.step > last)
    assert v.drain.any() and not v.drain.all()


@pytest.mark.parametrize(
    ("waiting", "declared", "objective", "regime", "goal", "assumed", "says"),
    [
        pytest.param(
            [3, 2, 1, 4], None, None, Regime.SATURATED, Objective.THROUGHPUT, False, "recorded", id="queue"
        ),
        pytest.param(
            [0, 0, 0, 0], None, None, Regime.ARRIVAL_BOUND, Objective.LATENCY, False, "recorded", id="free"
        ),
        pytest.param(
            [1, 0, 0, 0], None, None, Regime.ARRIVAL_BOUND, Objective.LATENCY, False, "25%", id="mostly-free"
        ),
        pytest.param(
            [1, 1, 0, 0], None, None, Regime.SATURATED, Objective.THROUGHPUT, False, "50%", id="half"
        ),
        pytest.param(
            [NAN, NAN], None, None, Regime.SATURATED, Objective.THROUGHPUT, True, "assumed", id="unrecorded"
        ),
        pytest.param([], None, None, Regime.SATURATED, Objective.THROUGHPUT, True, "--regime", id="empty"),
        pytest.param(
            [NAN],
            "arrival-bound",
            None,
            Regime.ARRIVAL_BOUND,
            Objective.LATENCY,
            False,
            "declared",
            id="declared",
        ),
        pytest.param(
            [0, 0],
            "saturated",
            None,
            Regime.SATURATED,
            Objective.THROUGHPUT,
            False,
            "which says arrival-bound",
            id="override",
        ),
        pytest.param(
            [0, 0],
            None,
            "throughput",
            Regime.ARRIVAL_BOUND,
            Objective.THROUGHPUT,
            False,
            "--objective",
            id="objective",
        ),
    ],
)
def test_regime_is_recorded_declared_or_assumed_and_says_which(
    waiting: list[float],
    declared: str | None,
    objective: str | None,
    regime: Regime,
    goal: Objective,
    assumed: bool,
    says: str,
) -> None:
    finding = infer_regime(np.array(waiting, dtype=float), declared=declared, objective=objective)
    assert (finding.regime, finding.objective, finding.assumed) == (regime, goal, assumed)
    assert says in finding.source
    assert SATURATED_STEP_SHARE == 0.5


@pytest.mark.parametrize(("declared", "objective"), [("busy", None), (None, "tokens"), ("", None)])
def test_unknown_regime_or_objective_names_are_refused(declared: str | None, objective: str | None) -> None:
    with pytest.raises(ConfigError, match="is not one of"):
        infer_regime(np.zeros(3), declared=declared, objective=objective)


# ---------------------------------------------------------------------------------------------
# Overhead evidence
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        pytest.param([1, 2], "expected an object", id="not-object"),
        pytest.param({"planner": "fused", "per_step_ms": [0.1, 0.2]}, "keys", id="missing-key"),
        pytest.param(
            {"planner": "fused", "per_step_ms": [0.1, 0.2], "source": "", "x": 1}, "keys", id="extra-key"
        ),
        pytest.param({"planner": "fused", "per_step_ms": [0.1], "source": ""}, "at least 2", id="one-run"),
        pytest.param(
            {"planner": "fused", "per_step_ms": "0.1", "source": ""}, "list of numbers", id="not-list"
        ),
        pytest.param(
            {"planner": "fused", "per_step_ms": [True, 0.1], "source": ""}, "list of numbers", id="bool"
        ),
        pytest.param({"planner": "", "per_step_ms": [0.1, 0.2], "source": ""}, "planner", id="empty-planner"),
        pytest.param({"planner": 3, "per_step_ms": [0.1, 0.2], "source": ""}, "strings", id="planner-type"),
    ],
)
def test_overhead_evidence_rejects_every_malformed_document(doc: Any, match: str) -> None:
    with pytest.raises(InvalidValueError, match=match):
        OverheadEvidence.from_dict(doc)


def test_overhead_evidence_file_round_trip_and_errors(tmp_path: Any) -> None:
    import json

    good = tmp_path / "overhead.json"
    good.write_text(json.dumps(RUNS.to_dict()))
    assert load_overhead_evidence(good) == RUNS
    for name, text, match in [
        ("dup.json", '{"planner": "a", "planner": "b", "per_step_ms": [1, 2], "source": ""}', "duplicate"),
        ("nan.json", '{"planner": "a", "per_step_ms": [NaN, 2], "source": ""}', "NaN|not"),
        ("big.json", " " * (1 << 17), "larger than"),
    ]:
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(ConfigError, match=match) as err:
            load_overhead_evidence(path)
        assert str(path) in str(err.value)
    with pytest.raises(ConfigError, match="cannot read"):
        load_overhead_evidence(tmp_path / "absent.json")


def test_an_overhead_measured_for_another_planner_is_refused_before_any_work() -> None:
    with pytest.raises(ConfigError, match="measure the planner you deploy"):
        build_options(planner="host", overhead_evidence=RUNS)
    with pytest.raises(ConfigError, match="once"):
        build_options(overhead_ms=0.1, overhead_evidence=RUNS)
    assert build_options(overhead_evidence=RUNS).deployed_planner == "fused"
    assert build_options(planner="trtllm").deployed_planner == "trtllm"
    with pytest.raises(ConfigError, match="--saving-shift-sd"):
        build_options(saving_shift_sd=0.7)
    with pytest.raises(ConfigError, match="is not one of"):
        build_options(objective="speed")


def test_measured_runs_are_drawn_with_their_spread_never_at_a_bound() -> None:
    model = overhead_from_runs(RUNS, len(GRID.ladder))
    assert model.measured and model.planner == "fused"
    assert model.per_g_ms == pytest.approx((RUNS.mean_ms,) * len(GRID.ladder))
    costs = draw_costs(GRID, GRID.compact_keys(), model, draws=20_000, rng=np.random.default_rng(0))
    draws = costs.overhead[:, 0]
    assert np.all(costs.overhead == costs.overhead[:, :1])  # one cost per step at every G
    assert draws.mean() == pytest.approx(RUNS.mean_ms, rel=0.01)
    # The spread: the mean's Student-t error and the between-process term, nothing stacked.
    expected = math.sqrt(RUNS.standard_error_ms**2 * 5 / 3 + (OVERHEAD_PROCESS_REL * RUNS.mean_ms) ** 2)
    assert draws.std() == pytest.approx(expected, rel=0.05)


# ---------------------------------------------------------------------------------------------
# Saving shifts
# ---------------------------------------------------------------------------------------------


def test_shift_model_floors_and_a_larger_measured_common_shift() -> None:
    floors = shift_model(GRID)
    assert floors.common_sd == COMMON_SHIFT_FLOOR and floors.paired_sd == PAIRED_SHIFT_FLOOR
    assert dict(floors.per_g) == {g: PER_G_SHIFT_FLOOR for g in GRID.ladder}
    assert "floor" in floors.source
    measured = shift_model(GRID, common_sd=0.009, common_source="independent harness")
    assert measured.common_sd == 0.009 and "independent harness" in measured.source
    assert shift_model(GRID, common_sd=0.001).common_sd == COMMON_SHIFT_FLOOR
    with pytest.raises(InvalidValueError):
        ShiftModel(0.6, (), 0.0, "")


def test_saving_draws_carry_the_common_per_g_and_own_shifts() -> None:
    keys = GRID.compact_keys()
    model = overhead_from_runs(RUNS, len(GRID.ladder))
    shifts = ShiftModel(0.01, tuple((g, 0.005) for g in GRID.ladder), 0.004, "test")
    base = draw_costs(GRID, keys, model, draws=40_000, rng=np.random.default_rng(1))
    shifted = draw_costs(GRID, keys, model, draws=40_000, rng=np.random.default_rng(1), shifts=shifts)
    saving = 1 - shifted.compact / shifted.native[:, [GRID.ladder.index(g) for g, _ in keys]]
    saving0 = 1 - base.compact / base.native[:, [GRID.ladder.index(g) for g, _ in keys]]
    extra = np.sqrt(np.maximum(saving.var(axis=0) - saving0.var(axis=0), 0))
    assert extra == pytest.approx(np.full(len(keys), math.sqrt(0.01**2 + 0.005**2 + 0.004**2)), rel=0.08)
    # Two cells of one G share the common and the G shift; cells of two Gs share the common only.
    c = np.corrcoef((saving - saving0).T)
    same_g = c[0, 1]
    other_g = c[0, len(keys) - 1]
    assert same_g == pytest.approx((0.01**2 + 0.005**2) / (0.01**2 + 0.005**2 + 0.004**2), abs=0.03)
    assert other_g == pytest.approx(0.01**2 / (0.01**2 + 0.005**2 + 0.004**2), abs=0.03)


def test_a_common_saving_bias_of_one_pp_sits_inside_the_interval() -> None:
    """The gain's interval widens by the shift terms; a 1 pp bias moves the point by less than
    the distance to the lower bound added by the common floor."""
    w = synthesize_workload(k=K, steps=600, ranks=1, max_rows=16, seed=2, temperatures=TEMPERATURES)
    ev = prepare_evidence(w, GRID, CAL, per_row=True)
    guard, _ = estimate_drain_guard(ev, minimum_predicted_gain=0.01)
    none = ShiftModel(0.0, (), 0.0, "none")
    exact = replay(ev, drain_guard=guard, overhead_evidence=RUNS, shifts=none, bootstrap=BOOT)
    honest = replay(ev, drain_guard=guard, overhead_evidence=RUNS, bootstrap=BOOT)
    assert honest.predicted_gain == pytest.approx(exact.predicted_gain)
    lower_by = exact.predicted_gain_ci_low - honest.predicted_gain_ci_low
    # A common shift of the savings moves the gain by about the compact steps' share of the time
    # times the shift, so the common floor alone lowers the bound by about that share times
    # 1.96 floors (the other terms add in quadrature; the workload's own spread dilutes it).
    compact_share = (
        sum(c["chosen_steps"] for c in honest.per_cell if c["verifier_budget"]) / honest.policy_steps
    )
    assert lower_by > 0.5 * compact_share * 1.96 * COMMON_SHIFT_FLOOR
    assert honest.predicted_gain_ci_high - exact.predicted_gain_ci_high > 0
    assert honest.shifts is not None and honest.shifts["common_sd"] == COMMON_SHIFT_FLOOR


# ---------------------------------------------------------------------------------------------
# Objectives
# ---------------------------------------------------------------------------------------------


def test_the_latency_objective_prices_no_lost_token() -> None:
    w = synthesize_workload(k=K, steps=600, ranks=1, max_rows=16, seed=4, temperatures=TEMPERATURES)
    ev = prepare_evidence(w, GRID, CAL, per_row=True)
    guard, _ = estimate_drain_guard(ev, minimum_predicted_gain=0.01)
    tput = replay(ev, drain_guard=guard, overhead_evidence=RUNS, bootstrap=BOOT)
    lat = replay(ev, drain_guard=guard, overhead_evidence=RUNS, objective="latency", bootstrap=BOOT)
    assert tput.objective == "throughput" and lat.objective == "latency"
    assert tput.economics.compact_choices > 0
    # Same decisions, same prices: only the token-loss price differs.
    assert lat.selector_replay_sha256 == tput.selector_replay_sha256
    assert lat.predicted_gain > tput.predicted_gain
    assert lat.economics.gross_compact_value_ms > tput.economics.gross_compact_value_ms
    # Each report carries both objectives' gains, and they agree with each other.
    assert lat.predictions == tput.predictions
    assert tput.predictions["latency"]["gain"] == pytest.approx(lat.predicted_gain)
    static_ms = tput.static_goodput_tok_per_ms
    assert static_ms > 0
    # By hand at the point: latency gain = static time / dynamic time - 1.
    ratio = tput.dynamic_goodput_tok_per_ms / tput.static_goodput_tok_per_ms
    assert tput.predicted_gain == pytest.approx(ratio - 1)


# ---------------------------------------------------------------------------------------------
# Mixed steps without mixed evidence
# ---------------------------------------------------------------------------------------------


def _mixed_workload(seed: int = 1) -> Any:
    return synthesize_mixed_workload(
        k=K,
        steps=800,
        ranks=1,
        levels=(6, 12),
        prefill_share=0.5,
        chunk_sizes=(32, 64),
        positions=(128,),
        seed=seed,
        temperatures=TEMPERATURES,
    )


def test_mixed_steps_are_priced_without_mixed_evidence() -> None:
    mixed = _mixed_workload()
    ev = prepare_evidence(mixed, GRID, CAL, per_row=True)
    assert ev.mixed_native is not None and ev.mixed_native.steps == len(mixed.mixed_step_rows())
    guard, _ = estimate_drain_guard(ev, minimum_predicted_gain=0.01)
    estimated = replay(ev, drain_guard=guard, overhead_evidence=RUNS, bootstrap=BOOT)
    m = estimated.mixed_steps
    assert m["steps"] == ev.mixed_native.steps and m["estimated"] == m["steps"] and m["recorded"] == 0
    assert 0.4 < m["share"] < 0.6
    # Every step, mixed included, pays the confidence path.
    assert estimated.policy_steps == ev.steps + m["steps"]
    # The same rows with no step marked mixed (its generation rows replayed as decode steps)
    # predict more: marked mixed steps run native and still pay the confidence path.
    decode_only = replay(
        prepare_evidence(mixed.__class__(**{**_fields(mixed), "mixed": None}), GRID, CAL, per_row=True),
        drain_guard=guard,
        overhead_evidence=RUNS,
        bootstrap=BOOT,
    )
    assert decode_only.mixed_steps["steps"] == 0
    assert estimated.predicted_gain < decode_only.predicted_gain
    # Recorded step times replace the estimate; longer mixed steps dilute the gain further.
    values = mixed.step_values()
    ids = mixed.mixed_step_ids()
    for scale, expect in ((1.0, None), (3.0, "lower")):
        times = np.full(values.step.size, NAN)
        times[np.searchsorted(values.step, ids)] = scale * ev.mixed_native.time_ms
        rec = with_step_values(mixed, step=values.step, step_time_ms=times)
        ev_rec = prepare_evidence(rec, GRID, CAL, per_row=True)
        r = replay(ev_rec, drain_guard=guard, overhead_evidence=RUNS, bootstrap=BOOT)
        assert r.mixed_steps["recorded"] == r.mixed_steps["steps"]
        if expect is None:
            assert r.predicted_gain == pytest.approx(estimated.predicted_gain, abs=1e-9)
        else:
            assert abs(r.predicted_gain) < abs(estimated.predicted_gain)


def _fields(w: Any) -> dict[str, Any]:
    return {
        f: getattr(w, f)
        for f in ("table", "k", "num_ranks", "approximate", "synthetic", "notes", "source", "fingerprint")
    }


# ---------------------------------------------------------------------------------------------
# The receipt
# ---------------------------------------------------------------------------------------------


def test_the_receipt_reproduces_the_joint_net_bound_not_stacked_worst_cases() -> None:
    w = synthesize_workload(k=K, steps=800, ranks=1, max_rows=16, seed=9, temperatures=TEMPERATURES)
    ev = prepare_evidence(w, GRID, CAL, per_row=True)
    guard, _ = estimate_drain_guard(ev, minimum_predicted_gain=0.01)
    r = replay(ev, drain_guard=guard, overhead_evidence=RUNS, bootstrap=BOOT)
    e = r.economics
    # The consumer's arithmetic holds on the stated amounts.
    assert e.net_value_ms == pytest.approx(
        e.gross_compact_value_ms_lower_bound
        - e.policy_steps * e.fixed_confidence_path_overhead_ms_upper_bound
        - e.safety_margin_ms
    )
    # Stacking the gross value's own lower bound against the overhead's upper bound is lower.
    stacked = (
        e.gross_compact_value_ms_marginal_lower_bound
        - e.policy_steps * e.fixed_confidence_path_overhead_ms_upper_bound
        - e.safety_margin_ms
    )
    assert e.net_value_ms > stacked
    # A constant (user-given) overhead is exact: then the two bounds coincide.
    c = replay(ev, drain_guard=guard, overhead_ms=RUNS.mean_ms, bootstrap=BOOT).economics
    assert c.gross_compact_value_ms_lower_bound == pytest.approx(
        c.gross_compact_value_ms_marginal_lower_bound
    )


def test_build_options_record_what_the_prediction_assumes() -> None:
    options = build_options(objective="latency", regime="arrival-bound", overhead_evidence=RUNS)
    d = options.to_dict()
    assert d["objective"] == "latency" and d["regime"] == "arrival-bound" and d["planner"] == "fused"
    assert d["overhead_evidence"] == RUNS.to_dict()
    assert isinstance(replace(options, planner=None), BuildOptions)


@pytest.mark.parametrize(
    ("bias", "widened", "upper", "per_g", "own"),
    [
        pytest.param(None, False, None, PER_G_SHIFT_FLOOR, PAIRED_SHIFT_FLOOR, id="no-checks"),
        pytest.param(0.009, False, None, math.hypot(PER_G_SHIFT_FLOOR, 0.009), PAIRED_SHIFT_FLOOR, id="control-bias"),
        pytest.param(0.009, True, None, PER_G_SHIFT_FLOOR, PAIRED_SHIFT_FLOOR, id="already-widened"),
        pytest.param(None, False, 0.003, PER_G_SHIFT_FLOOR, math.sqrt(0.004**2 - 0.003**2), id="carried-part"),
        pytest.param(None, False, 0.006, PER_G_SHIFT_FLOOR, 0.0, id="carried-all"),
    ],
)
def test_the_sweeps_bias_checks_size_the_shifts(
    bias: float | None, widened: bool, upper: float | None, per_g: float, own: float
) -> None:
    rows = paired_rows()
    for r in rows:
        if r["graph_batch_size"] == 16:
            r.update(control_bias=bias, control_widened=widened)
            if bias is not None:
                r.update(control_bias_ci_low=bias - 0.002, control_bias_ci_high=bias + 0.002)
        r.update(paired_rel=upper, paired_rel_upper=upper)
    model = shift_model(CellGrid.from_rows(K, rows))
    assert dict(model.per_g)[16] == pytest.approx(per_g)
    assert dict(model.per_g)[8] == pytest.approx(PER_G_SHIFT_FLOOR)
    assert model.own_sd((16, 32)) == pytest.approx(own)
    if bias is not None and not widened:
        assert "control bias" in model.source
