"""The step protocol's term: first replays timed apart, savings under a waiting and a queued step,
intervals that hold both, against a synthetic launch gap of known size."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dspark_calibrate.calibrate.measurement.backends.synthetic import SyntheticBackend
from dspark_calibrate.calibrate.measurement.journal import read_journal
from dspark_calibrate.calibrate.measurement.ladder import CellKind, CellSpec
from dspark_calibrate.calibrate.measurement.protocol import (
    MIX_STAYS,
    MixTerm,
    ProtocolTerm,
    SplitSample,
    mix_arm,
    mix_term,
    protocol_term,
    saving_at_native_clock,
    widen_for_clock,
    widen_for_mix,
    widen_for_order,
    widen_for_protocol,
    widen_for_settling,
)
from dspark_calibrate.calibrate.measurement.stats import CellSamples, CellSummary, Thresholds
from dspark_calibrate.calibrate.measurement.sweep import SampleRow, SweepResult, run_sweep
from dspark_calibrate.calibrate.measurement.timing import HostTimer, SplitTimer
from dspark_calibrate.cli import build_calibrate_app
from tests.calibrate.conftest import make_config

LADDER = (2, 4, 8)
DESIGN = {"recapture_every": 4, "epochs_required": 4, "samples_per_visit": 3}
#: Tokens dominate the step, so compact savings are large (20-40%) and a launch gap moves them by
#: whole points: a term the intervals must carry.
HEAVY = {"per_tile_ms": 1.0, "tile": 4, "noise_rel": 0.002, "outlier_prob": 0.0}
GAP_MS = 1.0


def _sweep(seed: int, replays: int = 2, **model: Any) -> tuple[SweepResult, SyntheticBackend]:
    backend = SyntheticBackend(seed=seed, **{**HEAVY, **model})
    th = Thresholds.quick(**DESIGN, replays_per_sample=replays)
    config, _ = make_config(backend, thresholds=th, ladder=LADDER, seed=seed)
    return run_sweep(config, backend, journal_path=None), backend


# --- the timer --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("replays", "gap"), [(2, 0.5), (4, 0.5), (3, 0.0)])
def test_the_host_timer_times_the_first_replay_apart(replays: int, gap: float) -> None:
    backend = SyntheticBackend(seed=0, noise_rel=0.0, drift_rel=0.0, cold_penalty_rel=0.0, launch_gap_ms=gap)
    cell = CellSpec(4, 0, 3)
    timer = backend.timer()
    assert isinstance(timer, SplitTimer)
    step = backend.prepare(cell)
    timer.warm(step, 3)
    split = timer.measure_split(step, replays=replays, samples=4)
    expected = backend.model.expected_ms(cell)
    for mean, first in split:
        assert first == pytest.approx(expected + gap, rel=1e-9)
        assert mean == pytest.approx(expected + gap / replays, rel=1e-9)
    # measure() is the same samples' means.
    timer.warm(step, 3)
    assert timer.measure(step, replays=replays, samples=2) == pytest.approx([m for m, _ in split[:2]])


def test_a_host_timer_without_a_device_wait_still_splits() -> None:
    ticks = iter(np.arange(0.0, 10.0, 0.001))
    timer = HostTimer(clock=lambda: float(next(ticks)))
    out = timer.measure_split(lambda: None, replays=2, samples=2)
    assert [len(x) for x in out] == [2, 2] and all(f > 0 for _, f in out)


# --- the pure parts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ms", "first", "replays", "pipelined"),
    [(5.0, 6.0, 2, 4.0), (5.0, 5.0, 4, 5.0), (2.5, 4.0, 4, 2.0)],
)
def test_a_split_sample_knows_its_queued_replays(
    ms: float, first: float, replays: int, pipelined: float
) -> None:
    assert SplitSample(ms, first, replays, 0, 0).pipelined_ms == pytest.approx(pipelined)


def _rows(ms: float, first: float, rounds: int = 6, replays: int = 2) -> list[SplitSample]:
    rng = np.random.default_rng(int(ms * 1000))
    out = []
    for r in range(rounds):
        for _ in range(3):
            noise = math.exp(float(rng.normal(0.0, 0.001)))
            out.append(SplitSample(ms * noise, first * noise, replays, r, r // 3))
    return out


def test_protocol_term_recovers_both_savings() -> None:
    native, compact = CellSpec(8, 0, 3), CellSpec(8, 9, 3)
    # Native 8 ms queued, 9 ms waiting; compact 6 ms and 7 ms: savings 25% and 22.2%.
    term = protocol_term(compact, _rows(6.5, 7.0), native, _rows(8.5, 9.0))
    assert term is not None and term.saving_pipelined is not None and term.saving_synchronous is not None
    assert term.pipelined_ms == pytest.approx(6.0, rel=0.005)
    assert term.synchronous_ms == pytest.approx(7.0, rel=0.005)
    assert term.launch_ms == pytest.approx(1.0, abs=0.02)
    assert term.saving_pipelined == pytest.approx(0.25, abs=0.003)
    assert term.saving_synchronous == pytest.approx(1 - 7 / 9, abs=0.003)


@pytest.mark.parametrize(
    ("case", "rows", "native_rows", "what"),
    [
        ("single-replay samples", _rows(6.0, 6.0, replays=1), _rows(8.0, 8.0), None),
        ("a non-finite first replay", [SplitSample(6.0, math.nan, 2, 0, 0)], _rows(8.0, 8.0), None),
        ("a first replay longer than the whole sample", [SplitSample(6.0, 13.0, 2, 0, 0)], _rows(8, 8), None),
        ("no samples", [], _rows(8.0, 8.0), None),
        ("a native cell without first replays", _rows(6.5, 7.0), _rows(8, 8, replays=1), "no savings"),
    ],
)
def test_protocol_term_refuses_what_it_cannot_split(
    case: str, rows: list[SplitSample], native_rows: list[SplitSample], what: str | None
) -> None:
    term = protocol_term(CellSpec(8, 9, 3), rows, CellSpec(8, 0, 3), native_rows)
    if what is None:
        assert term is None, case
    else:
        assert term is not None and term.saving_pipelined is None and term.saving_synchronous is None, case


def _summary(**kw: Any) -> CellSummary:
    base: dict[str, Any] = {
        "spec": CellSpec(8, 9, 3),
        "median_ms": 6.5,
        "ci_low_ms": 6.4,
        "ci_high_ms": 6.6,
        "p10_ms": 6.4,
        "p90_ms": 6.6,
        "iqr_ms": 0.1,
        "samples": 18,
        "rounds": 6,
        "ci_method": "test",
        "saving": 0.235,
        "saving_ci_low": 0.232,
        "saving_ci_high": 0.238,
    }
    return CellSummary(**{**base, **kw})


@pytest.mark.parametrize(
    ("term", "abs_bounds", "saving_bounds"),
    [
        (ProtocolTerm(6.0, 7.0, 0.25, 0.222), (6.4 * 6 / 6.5, 6.6 * 7 / 6.5), (0.219, 0.253)),
        (ProtocolTerm(6.5, 6.5, 0.235, 0.235), (6.4, 6.6), (0.232, 0.238)),
        (ProtocolTerm(6.0, 7.0), (6.4 * 6 / 6.5, 6.6 * 7 / 6.5), (0.232, 0.238)),
    ],
    ids=["both shifts", "no shift", "no savings (absolute only)"],
)
def test_widening_holds_both_protocols_and_keeps_the_point(
    term: ProtocolTerm, abs_bounds: tuple[float, float], saving_bounds: tuple[float, float]
) -> None:
    s = widen_for_protocol(_summary(), term)
    assert (s.median_ms, s.saving) == (6.5, 0.235)
    assert (s.ci_low_ms, s.ci_high_ms) == pytest.approx(abs_bounds)
    assert (s.saving_ci_low, s.saving_ci_high) == pytest.approx(saving_bounds)


@pytest.mark.parametrize(
    ("term", "abs_bounds", "saving_bounds"),
    [
        (MixTerm(6.3, 6.7, 0.25, 0.22), (6.4 * 6.3 / 6.5, 6.6 * 6.7 / 6.5), (0.217, 0.253)),
        (MixTerm(6.5, 6.5, 0.235, 0.235), (6.4, 6.6), (0.232, 0.238)),
        (MixTerm(6.3, 6.7), (6.4 * 6.3 / 6.5, 6.6 * 6.7 / 6.5), (0.232, 0.238)),
    ],
    ids=["both designs apart", "designs agree", "native (absolute only)"],
)
def test_the_mix_term_holds_both_designs_and_keeps_the_point(
    term: MixTerm, abs_bounds: tuple[float, float], saving_bounds: tuple[float, float]
) -> None:
    s = widen_for_mix(_summary(), term)
    assert (s.median_ms, s.saving) == (6.5, 0.235)
    assert (s.ci_low_ms, s.ci_high_ms) == pytest.approx(abs_bounds)
    assert (s.saving_ci_low, s.saving_ci_high) == pytest.approx(saving_bounds)


_END = 1 - (1 - 0.235) * math.exp(-0.02 - 0.01)  # the saving where a visit ends: 0.2576


@pytest.mark.parametrize(
    ("drift", "native_drift", "abs_bounds", "saving_bounds"),
    [
        (-0.02, 0.01, (6.4 * math.exp(-0.02), 6.6), (0.232, 0.238 + _END - 0.235)),
        (0.02, -0.01, (6.4, 6.6 * math.exp(0.02)), (0.232 + (1 - (1 - 0.235) * math.exp(0.03)) - 0.235, 0.238)),
        (0.0, 0.0, (6.4, 6.6), (0.232, 0.238)),
        (0.01, None, (6.4, 6.6 * math.exp(0.01)), (0.232, 0.238)),
        (None, 0.01, (6.4, 6.6), (0.232, 0.238)),
        (math.nan, 0.01, (6.4, 6.6), (0.232, 0.238)),
        (0.01, math.inf, (6.4, 6.6 * math.exp(0.01)), (0.232, 0.238)),
    ],
    ids=[
        "saving-grows-over-the-visit",
        "saving-shrinks-over-the-visit",
        "settled",
        "native-cell-absolute-only",
        "no-drift",
        "nan-drift",
        "infinite-native-drift",
    ],
)
def test_the_settling_term_holds_where_a_visit_ends_and_keeps_the_point(
    drift: float | None,
    native_drift: float | None,
    abs_bounds: tuple[float, float],
    saving_bounds: tuple[float, float],
) -> None:
    s = widen_for_settling(_summary(), drift, native_drift)
    assert (s.median_ms, s.saving) == (6.5, 0.235)
    assert (s.ci_low_ms, s.ci_high_ms) == pytest.approx(abs_bounds)
    assert (s.saving_ci_low, s.saving_ci_high) == pytest.approx(saving_bounds)


def test_rounds_alternate_the_two_designs() -> None:
    assert [MIX_STAYS[mix_arm(r)] for r in range(4)] == [0.0, 0.75, 0.0, 0.75]


def test_the_mix_term_splits_samples_by_design() -> None:
    # The cell runs 8 ms in the rounds of every step drawn at random, 7.6 in those of runs; its
    # native cell 10 ms in both: savings 20% and 24%.
    rounds = tuple(r for r in range(8) for _ in range(3))
    cell, native = CellSpec(8, 9, 3), CellSpec(8, 0, 3)
    mine = CellSamples(cell, tuple(8.0 if mix_arm(r) == 0 else 7.6 for r in rounds), rounds)
    theirs = CellSamples(native, (10.0,) * len(rounds), rounds)
    term = mix_term(mine, theirs)
    assert term is not None
    assert (term.switching_ms, term.runs_ms) == pytest.approx((8.0, 7.6))
    assert (term.saving_switching, term.saving_runs) == pytest.approx((0.20, 0.24))
    assert mix_term(theirs) == MixTerm(10.0, 10.0)
    only_even = CellSamples(cell, (8.0, 8.0), (0, 2))
    assert mix_term(only_even, theirs) is None  # one design has no sample


@pytest.mark.parametrize(
    ("clock_rel", "saving_bounds", "abs_bounds"),
    [
        # Compact ran 10% above its native's clock: at that clock it takes 10% longer.
        (1.10, (0.232 - 0.0765, 0.238), (6.4, 6.6 * 1.10)),
        # Compact ran below its native's clock: at that clock it would save more.
        (0.95, (0.232, 0.238 + 0.03825), (6.4 * 0.95, 6.6)),
        (1.0, (0.232, 0.238), (6.4, 6.6)),
        (None, (0.232, 0.238), (6.4, 6.6)),
        (math.nan, (0.232, 0.238), (6.4, 6.6)),
        (0.0, (0.232, 0.238), (6.4, 6.6)),
    ],
    ids=["faster clock", "slower clock", "same clock", "no telemetry", "nan", "zero"],
)
def test_the_clock_term(
    clock_rel: float | None, saving_bounds: tuple[float, float], abs_bounds: tuple[float, float]
) -> None:
    s = widen_for_clock(_summary(), clock_rel)
    assert (s.median_ms, s.saving) == (6.5, 0.235)
    assert (s.saving_ci_low, s.saving_ci_high) == pytest.approx(saving_bounds)
    assert (s.ci_low_ms, s.ci_high_ms) == pytest.approx(abs_bounds)


def test_a_saving_at_the_native_clock() -> None:
    # 8.5 ms against 16.9 ms at a 12% higher clock: 9.52 ms at the native's.
    assert saving_at_native_clock(1 - 8.5 / 16.9, 1.12) == pytest.approx(1 - 8.5 * 1.12 / 16.9)
    assert saving_at_native_clock(0.3, 1.0) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("carry", "abs_bounds"),
    [
        (0.005, (6.4 / 1.005, 6.6)),
        (-0.004, (6.4, 6.6 / 0.996)),
        (0.0, (6.4, 6.6)),
        (None, (6.4, 6.6)),
        (-1.0, (6.4, 6.6)),
    ],
    ids=["slowed by larger G", "sped up", "none", "not estimated", "impossible"],
)
def test_the_order_term_moves_only_the_absolute_interval(
    carry: float | None, abs_bounds: tuple[float, float]
) -> None:
    s = widen_for_order(_summary(), carry)
    assert (s.ci_low_ms, s.ci_high_ms) == pytest.approx(abs_bounds)
    assert (s.saving_ci_low, s.saving_ci_high, s.median_ms) == (0.232, 0.238, 6.5)


def test_a_power_capped_sweep_carries_the_clock_of_its_cells() -> None:
    """Synthetic power cap: a compact cell reports a clock 4%·(1 − its share) higher than native."""
    result, _ = _sweep(4, power_capped=True, power_cap_clock_rel=0.04)
    checked = 0
    for c in result.cells:
        if c.spec.kind is not CellKind.COMPACT or c.summary is None:
            continue
        assert c.clock_rel is not None and c.clock_rel > 1.0
        at_clock = saving_at_native_clock(c.summary.saving, c.clock_rel)
        assert c.summary.saving_ci_low <= at_clock + 1e-12 and c.summary.saving_ci_low < c.summary.saving
        checked += 1
    assert checked
    term = result.clock_summary()
    assert term["cell"] and term["largest_saving_shift"] > 0.0
    column = result.summary_table().column("saving_at_native_clock").to_pylist()
    assert any(v is not None for v in column)


def test_without_a_clock_difference_there_is_no_clock_term() -> None:
    result, _ = _sweep(4)
    assert result.clock_summary() == {"largest_saving_shift": 0.0, "cell": None}


# --- the sweep against a known launch gap -----------------------------------------------------------


def _coverage(seeds: range, gap: float) -> dict[str, float]:
    hits_pipe, hits_sync, bias, est = [], [], [], []
    for seed in seeds:
        result, backend = _sweep(seed, launch_gap_ms=gap)
        m = backend.model
        for c in result.cells:
            if c.spec.kind is not CellKind.COMPACT or c.summary is None:
                continue
            assert c.protocol is not None and c.protocol.saving_pipelined is not None
            s, spec = c.summary, c.spec
            assert isinstance(spec, CellSpec)
            pipe, sync = m.true_saving(spec), m.true_saving_synchronous(spec)
            hits_pipe.append(s.saving_ci_low <= pipe <= s.saving_ci_high)
            hits_sync.append(s.saving_ci_low <= sync <= s.saving_ci_high)
            bias.append(abs(s.saving - pipe))
            est.append(abs(c.protocol.saving_pipelined - pipe))
    return {
        "pipelined": float(np.mean(hits_pipe)),
        "synchronous": float(np.mean(hits_sync)),
        "point_off_pp": 100 * float(np.median(bias)),
        "estimate_off_pp": 100 * float(np.median(est)),
    }


def test_intervals_hold_both_protocols_of_a_known_launch_gap() -> None:
    got = _coverage(range(3), GAP_MS)
    # The sample mean pays half the gap: its saving is off the queued truth ...
    assert got["point_off_pp"] > 0.4 and got["point_off_pp"] > 5 * got["estimate_off_pp"], got
    # ... the split recovers it, and the intervals hold the truth of either kind of engine.
    assert got["estimate_off_pp"] < 0.2, got
    assert got["pipelined"] >= 0.93 and got["synchronous"] >= 0.93, got


@pytest.mark.slow
def test_without_the_term_the_intervals_miss_the_queued_truth(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same sweeps with the widening left out: the sweep's own intervals miss most cells."""
    import dspark_calibrate.calibrate.measurement.sweep as sweep_module

    monkeypatch.setattr(sweep_module, "widen_for_protocol", lambda summary, term: summary)
    got = _coverage(range(3), GAP_MS)
    assert got["pipelined"] < 0.6 and got["synchronous"] < 0.6, got


@pytest.mark.slow
def test_intervals_hold_both_protocols_over_many_seeds() -> None:
    got = _coverage(range(3, 15), GAP_MS)
    assert got["pipelined"] >= 0.93 and got["synchronous"] >= 0.93, got
    assert got["estimate_off_pp"] < 0.2, got


def test_the_sweep_states_the_launch_it_measured() -> None:
    result, _ = _sweep(1, launch_gap_ms=0.4)
    summary = result.protocol_summary()
    assert summary["measured"] and set(summary["launch_ms_per_g"]) == {"2", "4", "8"}
    for ms in summary["launch_ms_per_g"].values():
        assert ms == pytest.approx(0.4, abs=0.05)
    assert summary["largest_saving_shift"] > 0.002 and summary["cell"]
    table = result.summary_table()
    for name in ("pipelined_ms", "synchronous_ms"):
        assert all(v is not None for v in table.column(name).to_pylist())
    native = [r for r in table.to_pylist() if r["verifier_budget"] == 0]
    assert all(r["saving_pipelined"] is None for r in native)


def test_without_a_gap_the_protocols_agree() -> None:
    result, _ = _sweep(2, launch_gap_ms=0.0)
    summary = result.protocol_summary()
    assert all(abs(ms) < 0.05 for ms in summary["launch_ms_per_g"].values()), summary
    assert summary["largest_saving_shift"] < 0.004, summary


def test_single_replay_samples_state_the_term_unmeasured() -> None:
    result, _ = _sweep(0, replays=1, launch_gap_ms=0.4)
    assert result.protocol_summary() == {"measured": False}
    assert all(c.protocol is None for c in result.cells)
    assert set(result.summary_table().column("pipelined_ms").to_pylist()) == {None}


def test_a_journal_without_first_replays_reads_back() -> None:
    row = SampleRow(3, 0, 7, 5.0, 2, None, None, None, None, True, 1, (8, 0), 4)
    old = row.to_json()
    assert "first" not in old
    assert SampleRow.from_json(old) == row and row.split() is None
    new = SampleRow(3, 0, 7, 5.0, 2, None, None, None, None, True, 1, (8, 0), 4, 5.5)
    assert SampleRow.from_json(json.loads(json.dumps(new.to_json()))) == new
    assert new.split() == SplitSample(5.0, 5.5, 2, 3, 1)


# --- what the user sees -----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_cli_prints_and_stores_the_term(tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    args = ["sweep", "--backend", "synthetic", "--k", "3", "--ladder", "2,4", "--out", str(out), "--no-plot"]
    args += ["--preset", "quick", "--backend-opt", "launch_gap_ms=0.3", "--backend-opt", "per_tile_ms=2.0"]
    res = CliRunner().invoke(build_calibrate_app(), [*args, "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["step_protocol"]["measured"]
    cells = [c for c in report["cells"] if c["kind"] == "compact"]
    assert cells and all(c["saving_pipelined"] is not None for c in cells)
    # No power cap here: every cell at its native's clock, the clock term equal to the saving.
    assert all(c["saving_at_native_clock"] == pytest.approx(c["saving"]) for c in cells)
    samples = pq.read_table(out.with_name("s.samples.parquet"))
    first = samples.column("first_replay_ms").to_pylist()
    assert all(f is not None and f > 0 for f in first)
    journal = read_journal(out.with_name("s.journal.jsonl"))
    visits = [r for r in journal.records if r.get("type") == "visit"]
    assert visits and all("first" in s for v in visits for s in v["samples"])
    text = CliRunner().invoke(build_calibrate_app(), [*args[:-2], "--out", str(tmp_path / "t.parquet")])
    assert "step protocol: a step that waits for the one before pays" in text.stdout
