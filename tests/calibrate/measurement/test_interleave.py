"""Interleaved visits (``sweep --interleave``): a G's cells timed in one alternating sequence, at
the clock of the G's mix, against a synthetic GPU whose clock lags the cells it runs."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from dspark_calibrate.calibrate.measurement.backends.synthetic import SyntheticBackend
from dspark_calibrate.calibrate.measurement.journal import read_journal
from dspark_calibrate.calibrate.measurement.ladder import CellKind, CellSpec
from dspark_calibrate.calibrate.measurement.order import interleaved_steps
from dspark_calibrate.calibrate.measurement.protocol import mix_arm, within_visit_drift
from dspark_calibrate.calibrate.measurement.stats import Thresholds
from dspark_calibrate.calibrate.measurement.sweep import (
    INTERLEAVE_DESIGN,
    MAX_SETTLE_S,
    SETTLE_S,
    SweepConfig,
    SweepResult,
    resummarize,
    run_sweep,
)
from dspark_calibrate.calibrate.measurement.timing import HostTimer
from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.errors import ConfigError, MeasurementError
from tests.calibrate.conftest import make_config

LADDER = (2, 4, 8)
DESIGN = {"recapture_every": 4, "epochs_required": 4, "samples_per_visit": 3}
HEAVY = {"per_tile_ms": 1.0, "tile": 4, "noise_rel": 0.002, "outlier_prob": 0.0}
#: At the power cap a light cell's clock settles 6%·(1 − its share of the full width) above its
#: native cell's, over about 20 steps: long enough that an interleaved G runs at its mix's clock,
#: short enough that a cell visited alone gains most of its own.
LAGGING_CLOCK: dict[str, Any] = {"power_capped": True, "power_cap_clock_rel": 0.06, "clock_tau_steps": 20.0}


def _config(seed: int, interleave: bool, **model: Any) -> tuple[SweepConfig, SyntheticBackend]:
    backend = SyntheticBackend(seed=seed, **{**HEAVY, **model})
    config, _ = make_config(
        backend, thresholds=Thresholds.quick(**DESIGN), ladder=LADDER, seed=seed, interleave=interleave
    )
    return config, backend


def _sweep(seed: int, interleave: bool = True, **model: Any) -> tuple[SweepResult, SyntheticBackend]:
    config, backend = _config(seed, interleave, **model)
    return run_sweep(config, backend, journal_path=None), backend


def _compact(result: SweepResult) -> list[Any]:
    return [c for c in result.cells if c.spec.kind is CellKind.COMPACT and c.summary is not None]


# --- the configuration ------------------------------------------------------------------------------


def test_a_sweep_of_one_cell_per_visit_keeps_its_digest() -> None:
    config, _ = _config(0, False)
    assert "interleave" not in config.to_dict()
    assert replace(config, interleave=True).digest() != config.digest()


def test_the_default_settle_keeps_an_interleaved_digest_and_another_changes_it() -> None:
    config, _ = _config(0, True)
    assert "settle_s" not in config.to_dict()
    assert config.settle_seconds == SETTLE_S
    longer = replace(config, settle_s=1.5)
    assert longer.to_dict()["settle_s"] == 1.5 and longer.settle_seconds == 1.5
    assert longer.digest() != config.digest()


@pytest.mark.parametrize(
    ("settle_s", "interleave", "match"),
    [
        (1.0, False, "add --interleave"),
        (-0.1, True, "0..60"),
        (math.nan, True, "0..60"),
        (math.inf, True, "0..60"),
        (MAX_SETTLE_S + 1.0, True, "0..60"),
    ],
    ids=["without-interleave", "negative", "nan", "inf", "above-the-cap"],
)
def test_a_bad_settle_is_refused(settle_s: float, interleave: bool, match: str) -> None:
    config, _ = _config(0, interleave)
    with pytest.raises(ConfigError, match=match):
        replace(config, settle_s=settle_s)


def test_a_mixed_sweep_cannot_interleave() -> None:
    config, _ = _config(0, False)
    with pytest.raises(ConfigError, match="--interleave"):
        replace(config, mixed={"groups": []}, interleave=True)


class _PlainTimer:
    """A timer that times samples of one step only (no sequences)."""

    def __init__(self, inner: HostTimer) -> None:
        self._inner = inner

    def now(self) -> float:
        return self._inner.now()

    def warm(self, step: Any, replays: int) -> None:
        self._inner.warm(step, replays)

    def measure(self, step: Any, *, replays: int, samples: int, on_sample: Any = None) -> list[float]:
        return self._inner.measure(step, replays=replays, samples=samples, on_sample=on_sample)


class _SpyTimer:
    """A sequence timer that records what it is asked to run."""

    def __init__(self, inner: HostTimer) -> None:
        self._inner = inner
        self.calls: list[tuple[str, int]] = []
        self.sequences: list[tuple[int, list[int]]] = []  # cells in a sequence, steps of each

    def now(self) -> float:
        return self._inner.now()

    def warm(self, step: Any, replays: int) -> None:
        self.calls.append(("warm", replays))
        self._inner.warm(step, replays)

    def measure(self, step: Any, *, replays: int, samples: int, on_sample: Any = None) -> list[float]:
        return self._inner.measure(step, replays=replays, samples=samples, on_sample=on_sample)

    def measure_sequence(self, steps: Any, order: Any, *, chunk: int, on_chunk: Any = None) -> list[float]:
        self.calls.append(("sequence", len(order)))
        self.sequences.append((len(steps), [list(order).count(i) for i in range(len(steps))]))
        return self._inner.measure_sequence(steps, order, chunk=chunk, on_chunk=on_chunk)


@pytest.mark.slow  # 0.5 s: over the fast tier's 0.3 s
def test_the_settle_is_queued_with_the_timed_steps_in_one_sequence(tmp_path: Path) -> None:
    """No wait between a visit's settle and its timed steps (an idle device's clock rises under a
    power cap): the only warm-ups are first captures', and each visit is one sequence holding the
    settle (every cell's re-warm) and then its samples' steps."""
    config, backend = _config(3, True)
    spy = _SpyTimer(backend.timer())
    journal = tmp_path / "j.jsonl"
    run_sweep(config, backend, journal_path=journal, timer=spy)
    th = config.thresholds
    assert {replays for kind, replays in spy.calls if kind == "warm"} <= {th.warmup_steps}
    visits = [r for r in read_journal(journal).records if r["type"] == "visit"]
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for v in visits:
        groups.setdefault((v["round"], v["g"]), []).append(v)
    sequences, captured, firsts = [], 0, []
    for kind, n in spy.calls:
        if kind == "warm":
            captured += 1  # a cell captured anew in this visit: its warm-up runs alone first
        else:
            sequences.append(n)
            firsts.append(captured)
            captured = 0
    expected, seen = [], []
    for vs, first, n in zip(groups.values(), firsts, sequences, strict=True):
        if vs[0].get("fill"):
            continue  # cells that stopped ran too (test_a_visit_keeps_its_gs_whole_mix)
        settle = sum(v["warmup"] for v in vs) - first * th.warmup_steps  # every cell's re-warm
        assert settle > 0
        expected.append(settle + sum(len(v["samples"]) for v in vs) * th.replays_per_sample)
        seen.append(n)
    assert len(seen) >= 6 and seen == expected


@pytest.mark.slow  # 0.5 s: over the fast tier's 0.3 s
def test_a_visit_keeps_its_gs_whole_mix(tmp_path: Path) -> None:
    """Once some of a G's cells have stopped, every visit to the G still runs all its cells, each
    as many timed-sequence steps as a cell that measures (the mix of the design, not a lighter one
    left by the cells that stopped). The journal names them (``fill``); their times are kept as
    their samples (own records, ``stopped``, after their stop round, charged no seconds), so every
    cell of a G ends with the samples of every round its G ran; the journal summarises again to the
    same cells."""
    backend = SyntheticBackend(seed=3, **{**HEAVY, "noise_rel": 0.01})
    staggered = Thresholds.quick(
        recapture_every=2, epochs_required=2, samples_per_visit=3, precision_rel=0.01, max_samples_per_cell=60
    )  # cells decide after 12 to 60 samples
    config, _ = make_config(backend, thresholds=staggered, ladder=(2, 4), seed=3, interleave=True)
    spy = _SpyTimer(backend.timer())
    journal = tmp_path / "j.jsonl"
    result = run_sweep(config, backend, journal_path=journal, timer=spy)
    records = read_journal(journal).records
    stopped_at = {(r["g"], r["v"]): r["round"] for r in records if r["type"] == "stop"}
    assert len(set(stopped_at.values())) >= 3, "cells decided at different rounds"
    per_g = {g: sum(1 for c in config.cells if c.key[0] == g) for g in (2, 4)}
    visits = [r for r in records if r["type"] == "visit"]
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for v in visits:
        groups.setdefault((v["round"], v["g"]), []).append(v)
    assert len(spy.sequences) == len(groups)
    filled = 0
    for ((rnd, g), vs), (cells, steps) in zip(groups.items(), spy.sequences, strict=True):
        assert cells == per_g[g] == len(vs) and len(set(steps)) == 1, (g, steps)
        assert len({len(v["samples"]) for v in vs}) == 1  # every cell timed alike
        measuring = [v for v in vs if not v.get("stopped")]
        stopped = [v for v in vs if v.get("stopped")]
        fill = measuring[0].get("fill") or []
        assert all(v.get("fill", []) == fill for v in measuring)
        assert sorted(tuple(k) for k in fill) == sorted((v["g"], v["v"]) for v in stopped)
        for v in stopped:  # a cell is fill only after its decision, and costs nothing
            assert rnd > stopped_at[(v["g"], v["v"])] and v["seconds"] == 0.0
        for v in measuring:
            assert (v["g"], v["v"]) not in stopped_at or rnd <= stopped_at[(v["g"], v["v"])]
        filled += bool(fill)
    assert filled >= 3, "some visits ran cells that had stopped"
    for g in (2, 4):  # every cell of a G holds the samples of every round its G ran
        cells = [c for c in result.cells if c.spec.key[0] == g]
        assert len({c.samples_taken for c in cells}) == 1
        assert cells[0].samples_taken == sum(len(vs[0]["samples"]) for (_, gg), vs in groups.items() if gg == g)
    reasons = {(r["g"], r["v"]): r["reason"] for r in records if r["type"] == "stop"}
    assert {c.spec.key: c.decision.reason for c in result.cells} == reasons  # the decisions stand
    assert resummarize(journal, passes=False).cells == result.cells


def test_a_timer_that_cannot_time_sequences_is_refused_before_anything_runs() -> None:
    config, backend = _config(0, True)
    timer = backend.timer()
    assert isinstance(timer, HostTimer)
    with pytest.raises(ConfigError, match="drop --interleave"):
        run_sweep(config, backend, journal_path=None, timer=_PlainTimer(timer))
    assert backend.clock() == 0.0  # nothing ran


# --- the visits -------------------------------------------------------------------------------------


def test_a_round_visits_each_gs_open_cells_together(tmp_path: Path) -> None:
    config, backend = _config(1, True)
    journal = tmp_path / "j.jsonl"
    result = run_sweep(config, backend, journal_path=journal)
    assert result.complete
    visits = [r for r in read_journal(journal).records if r["type"] == "visit"]
    by_round: dict[int, list[int]] = {}
    for v in visits:
        by_round.setdefault(v["round"], []).append(v["g"])
    for gs in by_round.values():
        # A G's cells are journalled together: G changes at most once per G in a round.
        changes = [g for i, g in enumerate(gs) if i == 0 or gs[i - 1] != g]
        assert len(changes) == len(set(gs))
    # Every sample of a group's visit follows the cell visited before the group.
    for v in visits:
        prev = {tuple(s["prev"]) if s["prev"] else None for s in v["samples"]}
        assert len(prev) == 1
        assert None not in prev or v["round"] == 0
    # Samples carry no first replay: every step of a sequence is queued behind another.
    assert all("first" not in s for v in visits for s in v["samples"])
    assert result.protocol_summary() == {"measured": False}
    mix = result.mix_summary()
    assert mix["measured"] and mix["stays"] == [0.0, 0.75]


def test_an_interleaved_sweep_resumes_its_journal(tmp_path: Path) -> None:
    config, backend = _config(2, True)
    journal = tmp_path / "j.jsonl"
    paused = run_sweep(config, backend, journal_path=journal, until_round=3)
    assert paused.paused
    config2, backend2 = _config(2, True)
    resumed = run_sweep(config2, backend2, journal_path=journal, resume=True)
    assert resumed.complete and resumed.resumed
    assert resumed.rounds > 3
    assert all(c.samples_taken > 0 for c in resumed.cells)


@pytest.mark.parametrize(
    ("options", "match"),
    [({"fail_at": 400}, "device lost"), ({"nan_at": 400}, "non-finite")],
    ids=["backend raises mid-sequence", "non-finite times"],
)
def test_a_failed_sequence_names_the_group_and_keeps_the_journal(
    tmp_path: Path, options: dict[str, int], match: str
) -> None:
    backend = SyntheticBackend(seed=0, **options)
    config, _ = make_config(backend, thresholds=Thresholds.quick(**DESIGN), ladder=LADDER, interleave=True)
    journal = tmp_path / "j.jsonl"
    with pytest.raises(MeasurementError, match=match) as err:
        run_sweep(config, backend, journal_path=journal)
    assert "cell G" in str(err.value)
    visits = [r for r in read_journal(journal).records if r["type"] == "visit"]
    assert visits, "samples measured before the failure stay in the journal"


def test_the_rewarm_settles_the_mix_for_a_fraction_of_a_second(tmp_path: Path) -> None:
    config, backend = _config(3, True)
    journal = tmp_path / "j.jsonl"
    run_sweep(config, backend, journal_path=journal)
    visits = [r for r in read_journal(journal).records if r["type"] == "visit"]
    later = [v for v in visits if v["round"] >= 1]
    # Steps of 2-10 ms: 0.2 s of the mix is far more than the quick preset's one re-warm replay.
    assert min(v["warmup"] for v in later) > config.thresholds.rewarm_steps
    # Each cell's share of the re-warm times the cells of its G runs about 0.2 s of steps.
    v = later[0]
    cells_in_visit = sum(1 for w in later if w["round"] == v["round"] and w["g"] == v["g"])
    step_ms = float(np.median([s["ms"] for s in v["samples"]]))
    assert 0.1 <= v["warmup"] * cells_in_visit * step_ms / 1000 <= 0.6


# --- against a known truth --------------------------------------------------------------------------


def _point_errors(seeds: range, interleave: bool) -> tuple[list[float], list[bool]]:
    errors, covered = [], []
    for seed in seeds:
        result, backend = _sweep(seed, interleave, **LAGGING_CLOCK)
        for c in _compact(result):
            truth = backend.model.true_saving(c.spec)
            errors.append(c.summary.saving - truth)
            covered.append(c.summary.saving_ci_low <= truth <= c.summary.saving_ci_high)
    return errors, covered


def test_interleaving_measures_the_saving_at_the_mixs_clock() -> None:
    """A cell visited alone runs at the clock its lighter load allows and its saving comes out
    high; interleaved with its G, it shares the mix's clock and the saving is the mix's."""
    alone, _ = _point_errors(range(2), interleave=False)
    mixed, covered = _point_errors(range(2), interleave=True)
    assert np.mean(alone) > 0.002  # biased high by the clock it gains alone (0.28 pp here)
    assert abs(np.mean(mixed)) < 0.001  # -0.03 pp here: noise
    assert np.mean(covered) >= 0.93


@pytest.mark.slow
def test_interleaved_intervals_cover_the_mix_truth_over_many_seeds() -> None:
    mixed, covered = _point_errors(range(2, 10), interleave=True)
    assert abs(np.mean(mixed)) < 0.001
    assert np.mean(covered) >= 0.93


def test_without_a_lagging_clock_both_visits_agree() -> None:
    for interleave in (False, True):
        errors, covered = _point_errors_plain(interleave)
        assert abs(np.mean(errors)) < 0.0015
        assert np.mean(covered) >= 0.93


def _point_errors_plain(interleave: bool) -> tuple[list[float], list[bool]]:
    result, backend = _sweep(5, interleave)
    errors = [c.summary.saving - backend.model.true_saving(c.spec) for c in _compact(result)]
    covered = [
        c.summary.saving_ci_low <= backend.model.true_saving(c.spec) <= c.summary.saving_ci_high
        for c in _compact(result)
    ]
    return errors, covered


def test_intervals_hold_both_layouts_of_the_mix() -> None:
    """With a clock that follows the last few steps, runs and every-step switching give different
    savings; each compact cell's interval holds both designs' estimates."""
    result, _ = _sweep(6, True, **{**LAGGING_CLOCK, "clock_tau_steps": 3.0})
    apart = 0
    for c in _compact(result):
        t = c.mix
        assert t is not None and t.saving_switching is not None and t.saving_runs is not None
        assert c.summary.saving_ci_low <= min(t.saving_switching, t.saving_runs)
        assert max(t.saving_switching, t.saving_runs) <= c.summary.saving_ci_high
        apart += abs(t.saving_runs - t.saving_switching) > 0.005
    assert apart >= 3  # the clock's lag moves savings by more than half a point between designs
    assert abs(result.mix_summary()["runs_minus_switching"]) > 0.005


def test_clocks_are_compared_within_the_same_visits() -> None:
    result, _ = _sweep(7, True, **LAGGING_CLOCK)
    clocks = [c.clock_rel for c in result.cells if c.clock_rel is not None]
    assert clocks and max(abs(x - 1.0) for x in clocks) < 0.01  # one mix, one clock
    # Alone, a light cell reports the clock it settles to.
    alone, _ = _sweep(7, False, **LAGGING_CLOCK)
    assert max(c.clock_rel or 1.0 for c in alone.cells) > 1.005


def test_the_rounds_alternate_the_designs() -> None:
    config, backend = _config(8, True)
    result = run_sweep(config, backend, journal_path=None)
    rounds = set(result.samples.column("round").to_pylist())
    assert {mix_arm(r) for r in rounds} == {0, 1}


# --- the command ------------------------------------------------------------------------------------


def test_the_cli_interleaves_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    args = ["sweep", "--k", "3", "--ladder", "2,4", "--out", str(out), "--preset", "quick", "--interleave"]
    args += ["--backend-opt", "power_capped=true", "--backend-opt", "clock_tau_steps=5", "--no-plot"]
    res = CliRunner().invoke(build_calibrate_app(), [*args, "--settle-s", "0.5", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    checks = report.get("checks", report)
    assert checks["visits"] == "interleaved"
    assert checks["mix_term"]["measured"] is True
    assert checks["settling"]["settle_s"] == 0.5
    res = CliRunner().invoke(build_calibrate_app(), [*args[:-1], "--out", str(tmp_path / "t.parquet")])
    assert res.exit_code == 0, res.output
    assert "interleaved" in res.output and "switching every step or in runs, by round, each visit balanced" in res.output
    assert "settling (after 0.2 s of untimed mix per visit): a native step moves" in res.output


@pytest.mark.parametrize(
    "extra",
    [["--settle-s", "1"], ["--interleave", "--settle-s", "nan"], ["--interleave", "--settle-s", "-1"]],
    ids=["without-interleave", "nan", "negative"],
)
def test_the_cli_refuses_a_bad_settle_before_measuring(tmp_path: Path, extra: list[str]) -> None:
    out = tmp_path / "s.parquet"
    res = CliRunner().invoke(
        build_calibrate_app(), ["sweep", "--k", "3", "--ladder", "2,4", "--out", str(out), *extra]
    )
    assert res.exit_code == 2, res.output
    assert "--settle-s" in res.output and not out.exists()


def _journal_config(out: Path) -> dict[str, Any]:
    head = read_journal(out.with_name(out.stem + ".journal.jsonl")).header
    return dict(head["config"])


@pytest.mark.slow  # 2 s: two small sweeps
def test_the_power_capped_preset_sets_the_held_out_design(tmp_path: Path) -> None:
    """``--preset power-capped`` interleaves, settles 0.75 s and takes six samples a visit and an
    epoch every six rounds; options given win over it, ``--no-interleave`` included."""
    base = ["sweep", "--k", "3", "--ladder", "2,4", "--preset", "power-capped", "--no-plot"]
    base += ["--backend-opt", "power_capped=true", "--max-samples", "24", "--precision", "0.05"]
    out = tmp_path / "p.parquet"
    res = CliRunner().invoke(build_calibrate_app(), [*base, "--out", str(out)])
    assert res.exit_code == 0, res.output
    config = _journal_config(out)
    assert config["interleave"] == INTERLEAVE_DESIGN == 5 and config["settle_s"] == 0.75
    th = config["thresholds"]
    assert (th["samples_per_visit"], th["recapture_every"]) == (6, 6)
    assert (th["max_samples_per_cell"], th["precision_rel"]) == (24, 0.05)  # given: they win
    out = tmp_path / "q.parquet"
    res = CliRunner().invoke(build_calibrate_app(), [*base, "--no-interleave", "--out", str(out)])
    assert res.exit_code == 0, res.output
    config = _journal_config(out)
    assert "interleave" not in config and "settle_s" not in config
    assert config["thresholds"]["samples_per_visit"] == 6


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--preset", "power-capped", "--mixed"], "--preset power-capped interleaves decode cells"),
        (["--preset", "power-capped", "--protocol", "fixed"], "an adaptive design; drop --protocol fixed"),
        (["--preset", "fast"], "use default, quick or power-capped"),
        (["--preset", "power-capped", "--no-interleave", "--settle-s", "1"], "add --interleave"),
    ],
)
def test_the_cli_refuses_a_preset_it_cannot_apply(tmp_path: Path, extra: list[str], match: str) -> None:
    out = tmp_path / "r.parquet"
    args = ["sweep", "--k", "3", "--ladder", "2,4", "--out", str(out), "--no-plot", *extra]
    res = CliRunner().invoke(build_calibrate_app(), args)
    assert res.exit_code == 2, res.output
    assert match in " ".join(res.output.split())
    assert not out.exists()


def test_the_cli_refuses_interleaving_a_mixed_sweep(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        build_calibrate_app(),
        ["sweep", "--k", "3", "--ladder", "2,4", "--out", str(tmp_path / "m.parquet"), "--mixed", "--interleave"],
    )
    assert res.exit_code == 2, res.output
    assert "--interleave" in res.output


def test_a_cell_spec_key_is_what_the_journal_keys_visits_by() -> None:
    assert CellSpec(8, 0, 3).key == (8, 0)


def test_the_synthetic_clock_lags_the_cells_it_runs() -> None:
    backend = SyntheticBackend(
        seed=0, noise_rel=0.0, drift_rel=0.0, cold_penalty_rel=0.0, outlier_prob=0.0, **LAGGING_CLOCK
    )
    native, light = CellSpec(8, 0, 3), CellSpec(8, 8, 3)
    steps = [backend.prepare(native), backend.prepare(light)]
    timer = backend.timer()
    assert isinstance(timer, HostTimer)
    settled = backend.model.clock_rel(light)
    assert settled == pytest.approx(1 + 0.06 * (1 - 8 / 32))
    ms = timer.measure_sequence(steps, [1] * 200, chunk=50)
    assert backend.clock_state() == pytest.approx(settled, rel=1e-4)  # 200 steps >> 20
    assert ms[-1] < ms[0]  # the light step sped up as the clock rose
    assert ms[0] / ms[-1] == pytest.approx(settled, rel=1e-3)
    ms = timer.measure_sequence(steps, [0] * 3, chunk=50)  # back to native: the clock falls slowly
    assert 1.0 < backend.clock_state() < settled


#: A power-capped clock that wanders by 1% (SD) with a correlation time of about one visit of
#: four cells' 24 steps (0.1 s here; on an H200 at its cap, 0.1-0.5 s windows move by ±1-2%).
WANDER: dict[str, Any] = {"wander_rel": 0.01, "wander_tau_s": 0.1}
QUIET: dict[str, Any] = {"noise_rel": 0.0, "drift_rel": 0.0, "cold_penalty_rel": 0.0, "outlier_prob": 0.0}


def test_the_synthetic_clock_wanders_with_its_sd_and_correlation_time() -> None:
    backend = SyntheticBackend(seed=1, **QUIET, **WANDER)
    timer = backend.timer()
    assert isinstance(timer, HostTimer)
    ms = np.array(timer.measure_sequence([backend.prepare(CellSpec(8, 0, 3))], [0] * 20000, chunk=100))
    logs = np.log(ms / np.median(ms))
    assert float(np.std(logs)) == pytest.approx(0.01, rel=0.15)
    lag = 20  # steps: about 0.09 s of 4.7 ms steps
    expected = math.exp(-lag * float(ms.mean()) / 1000.0 / 0.1)
    assert float(np.corrcoef(logs[:-lag], logs[lag:])[0, 1]) == pytest.approx(expected, abs=0.1)
    with pytest.raises(ConfigError, match="wander_tau_s"):
        SyntheticBackend(wander_tau_s=0.0)


def _identical_cells_apart(stay: float, balanced: bool, visits: int = 150) -> float:
    """The SD over visits of the log-ratio of a G's control cell (the native step again) to its
    native cell, each the mean of its 6 steps in one interleaved visit of four cells."""
    backend = SyntheticBackend(seed=3, per_tile_ms=1.0, tile=4, **QUIET, **WANDER)
    cells = [CellSpec(8, 0, 3), CellSpec(8, 8, 3), CellSpec(8, 16, 3), CellSpec(8, 32, 3)]
    steps = [backend.prepare(c) for c in cells]
    timer = backend.timer()
    assert isinstance(timer, HostTimer)
    rng = np.random.default_rng(0)
    apart = []
    for _ in range(visits):
        order = interleaved_steps([6] * 4, rng, stay=stay, balanced=balanced)
        ms, cell = np.array(timer.measure_sequence(steps, order, chunk=8)), np.array(order)
        apart.append(math.log(ms[cell == 3].mean() / ms[cell == 0].mean()))
    return float(np.std(apart))


@pytest.mark.parametrize(("stay", "at_most"), [(0.0, 0.65), (0.75, 0.8)])
def test_a_balanced_visit_keeps_a_wandering_clock_out_of_the_savings(stay: float, at_most: float) -> None:
    """Two identical cells differ within a visit only by the clock their steps met: a random
    order leaves a cell's steps bunched in some windows; balanced blocks run forward then back
    spread them (measured here: 0.40% -> 0.23% switching, 0.83% -> 0.55% in runs)."""
    random, balanced = _identical_cells_apart(stay, False), _identical_cells_apart(stay, True)
    assert balanced <= at_most * random


@pytest.mark.slow  # 2 s
def test_interleaved_intervals_cover_the_truth_under_a_wandering_clock() -> None:
    covered, errors = [], []
    for seed in range(6):
        result, backend = _sweep(40 + seed, True, power_capped=True, wander_rel=0.01, wander_tau_s=0.05)
        for c in _compact(result):
            truth = backend.model.true_saving(c.spec)
            errors.append(c.summary.saving - truth)
            covered.append(c.summary.saving_ci_low <= truth <= c.summary.saving_ci_high)
    assert abs(float(np.mean(errors))) < 0.002
    assert float(np.mean(covered)) >= 0.93


def test_a_host_timed_sequence_calls_telemetry_in_order() -> None:
    backend = SyntheticBackend(seed=0)
    steps = [backend.prepare(CellSpec(4, 0, 3)), backend.prepare(CellSpec(4, 4, 3))]
    seen: list[int] = []
    timer = backend.timer()
    assert isinstance(timer, HostTimer)
    ms = timer.measure_sequence(steps, [0, 1, 1, 0, 1], chunk=2, on_chunk=seen.append)
    assert len(ms) == 5 and all(m > 0 for m in ms)
    assert seen == [1, 3, 4]


# --- settling within a visit ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        ([(0, 0, 10.0), (0, 1, 10.1), (0, 2, 10.2), (1, 3, 10.0), (1, 4, 10.2)], math.log(1.02)),
        ([(0, 2, 10.2), (0, 0, 10.0), (0, 1, 10.1)], math.log(1.02)),  # by sample index, not row order
        ([(0, 0, 10.0), (1, 1, 10.0)], None),  # no visit of two samples
        ([], None),
        ([(0, 0, 10.0), (0, 1, 9.9), (1, 2, 10.0), (1, 3, 9.9), (2, 4, 10.0), (2, 5, 10.5)], math.log(0.99)),
    ],
    ids=["rising", "unsorted", "single samples", "empty", "median of visits"],
)
def test_within_visit_drift(samples: list[tuple[int, int, float]], expected: float | None) -> None:
    got = within_visit_drift(samples)
    assert got == (None if expected is None else pytest.approx(expected))


def test_a_visit_still_settling_shows_in_the_settling_check() -> None:
    """After a larger G the synthetic step runs 5% slower, decaying over ~60 steps, longer than the
    settle: an interleaved visit's native samples at the smallest G (every visit follows a larger
    one) speed up from first to last, which the check reports; without it they do not."""
    steady = {"cold_penalty_rel": 0.0, "drift_rel": 0.0}  # no switch penalty, no slow heat cycle
    slow, _ = _sweep(9, True, carryover_rel=0.05, carryover_decay_steps=60.0, **steady)
    settled, _ = _sweep(9, True, **steady)
    moving = slow.settling_summary()
    assert moving["measured"] and moving["largest_g"] == "2"
    assert moving["per_g"]["2"] < -0.004
    still = settled.settling_summary()
    assert max(abs(d) for d in still["per_g"].values() if d is not None) < 0.003

    alone, _ = _sweep(9, False)
    assert alone.settling_summary() == {"measured": False}


@pytest.mark.slow  # 0.5 s: over the fast tier's 0.3 s
def test_a_longer_settle_lets_the_visit_settle_before_it_is_timed() -> None:
    """The same slow carry-over as above (~60 steps, 0.3 s of the smallest G's mix): 0.2 s of
    settle leaves the visit moving, 1.5 s lets it settle before the first timed sample; the
    summary states the settle it used."""
    steady = {"cold_penalty_rel": 0.0, "drift_rel": 0.0}
    model = {**HEAVY, "carryover_rel": 0.05, "carryover_decay_steps": 60.0, **steady}
    config, backend = _config(9, True, **model)
    short = run_sweep(config, backend, journal_path=None).settling_summary()
    config, backend = _config(9, True, **model)
    long = run_sweep(replace(config, settle_s=1.5), backend, journal_path=None).settling_summary()
    assert short["settle_s"] == SETTLE_S and long["settle_s"] == 1.5
    assert short["per_g"]["2"] < -0.004
    assert abs(long["per_g"]["2"]) < 0.002


@pytest.mark.slow  # 0.5 s: over the fast tier's 0.3 s
def test_every_interleaved_cell_gets_its_settling_term(monkeypatch: pytest.MonkeyPatch) -> None:
    """finish_cells hands each cell its own within-visit drift and its native cell's (None for a
    native cell) to the settling term; a sweep of one cell per visit has none."""
    import dspark_calibrate.calibrate.measurement.sweep as sweep_module

    seen: list[tuple[float | None, float | None]] = []
    real = sweep_module.widen_for_settling

    def spy(summary: Any, drift: float | None, native_drift: float | None) -> Any:
        seen.append((drift, native_drift))
        return real(summary, drift, native_drift)

    monkeypatch.setattr(sweep_module, "widen_for_settling", spy)
    model = {"cold_penalty_rel": 0.0, "drift_rel": 0.0, "carryover_rel": 0.05, "carryover_decay_steps": 60.0}
    result, _ = _sweep(9, True, **model)
    measured = [c for c in result.cells if c.summary is not None]
    assert len(seen) == len(measured)
    natives = result.settling_summary()["per_g"]
    assert sorted(d for d, n in seen if n is None) == pytest.approx(sorted(natives.values()))
    assert all(n in natives.values() for _, n in seen if n is not None)
    seen.clear()
    _sweep(9, False, **model)
    assert seen == []


def test_a_compact_saving_that_moves_over_a_visit_shows_in_the_settling_check() -> None:
    """One compact cell's samples made 1% faster at each later sample of a visit (a saving that
    grows while the visit runs): the check reports that G's saving move, about (1 − s)·2% over
    three samples, at that cell; the other G's savings do not move."""
    steady = {"cold_penalty_rel": 0.0, "drift_rel": 0.0, "noise_rel": 0.0005}
    result, _ = _sweep(9, True, **steady)
    target = next(c for c in _compact(result) if c.spec.key[0] == 8)
    table = result.samples
    names = ("graph_batch_size", "verifier_budget", "round", "step_time_ms")
    g, v, rnd, ms = (table.column(n).to_pylist() for n in names)
    seen: dict[int, int] = {}
    for i in range(len(ms)):
        if (g[i], v[i]) == target.spec.key:
            k = seen.get(rnd[i], 0)
            seen[rnd[i]] = k + 1
            ms[i] *= 1.0 - 0.01 * k
    column = table.schema.get_field_index("step_time_ms")
    moved = replace(result, samples=table.set_column(column, "step_time_ms", [ms]))
    before, after = result.settling_summary(), moved.settling_summary()
    assert max(abs(m) for m in before["saving_move_per_g"].values()) < 0.002
    assert after["saving_move_cell"]["8"] == target.spec.label()
    want = (1.0 - target.summary.saving) * 0.02
    assert after["saving_move_per_g"]["8"] == pytest.approx(want, abs=0.002)
    assert abs(after["saving_move_per_g"]["2"]) < 0.002
