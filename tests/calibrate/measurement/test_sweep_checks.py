"""The sweep against synthetic truths: the between-run estimate, saving-interval coverage, the
control bias check, measured carry-over with its re-warm, clock scaling and the serving order."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dspark_calibrate.calibrate.measurement.backends.synthetic import SyntheticBackend
from dspark_calibrate.calibrate.measurement.journal import read_journal
from dspark_calibrate.calibrate.measurement.ladder import CellKind, CellSpec
from dspark_calibrate.calibrate.measurement.stats import BetweenRun, Thresholds
from dspark_calibrate.calibrate.measurement.sweep import SweepResult, resummarize, run_sweep
from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.errors import ConfigError
from tests.calibrate.conftest import make_config

LADDER = (2, 4, 8)
#: Four epochs of four rounds; three samples a visit, so one wild sample cannot move a round's median.
DESIGN = {"recapture_every": 4, "epochs_required": 4, "samples_per_visit": 3}
#: The coverage the saving intervals must reach over repeated seeds.
COVERAGE = 0.93


def _sweep(seed: int, journal: Path | None = None, **model: Any) -> tuple[SweepResult, SyntheticBackend]:
    backend = SyntheticBackend(seed=seed, **model)
    config, _ = make_config(backend, thresholds=Thresholds.quick(**DESIGN), ladder=LADDER, seed=seed)
    return run_sweep(config, backend, journal_path=journal), backend


def _hits(
    result: SweepResult,
    backend: SyntheticBackend,
    kinds: tuple[CellKind, ...] = (CellKind.COMPACT, CellKind.CONTROL),
) -> list[bool]:
    """Whether each compact (and control) cell's saving interval covers the simulated truth."""
    out = []
    for c in result.cells:
        if c.spec.kind in kinds and c.summary is not None:
            truth = backend.model.true_saving(c.spec)  # type: ignore[arg-type]
            out.append(c.summary.saving_ci_low <= truth <= c.summary.saving_ci_high)
    return out


def _cli(*args: str) -> Any:
    return CliRunner().invoke(build_calibrate_app(), ["sweep", *args])


def _synthetic_args(out: Path, *opts: str) -> list[str]:
    args = ["--backend", "synthetic", "--k", "3", "--ladder", ",".join(map(str, LADDER)), "--out", str(out)]
    args += [
        "--preset",
        "quick",
        "--recapture-every",
        "4",
        "--epochs-required",
        "4",
        "--samples-per-visit",
        "3",
    ]
    for opt in opts:
        args += ["--backend-opt", opt]
    return [*args, "--no-plot"]


@pytest.mark.slow
def test_the_json_report_states_the_paired_shift_it_was_given(tmp_path: Path) -> None:
    """epoch_shift_rel=0.004 per cell: a log-ratio to native shifts by √2·0.4% = 0.57% per epoch."""
    out = tmp_path / "s.parquet"
    res = _cli(*_synthetic_args(out, "epoch_shift_rel=0.004"), "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    between = report["between_run"]
    assert between["estimator"] == "reml" and between["paired_resolved"]
    assert 0.002 <= between["paired_rel"] <= 0.008
    assert between["paired_rel_low"] <= between["paired_rel"] <= between["paired_rel_upper"]
    assert 0.0 < between["resolvable_shift_rel"] < 0.004  # the design resolves 0.4%
    table = pq.read_table(out).to_pydict()
    # Each compact or control row states its G's own σ_d, carrying its upper value where it is
    # above the pooled one; a native row states the pooled σ_d.
    groups = {g["native"]: g for g in between["paired_groups"]}
    assert set(groups) == {f"G{g}/V0" for g in LADDER}
    columns = ("graph_batch_size", "verifier_budget", "paired_rel", "paired_rel_upper")
    rows = zip(*(table[name] for name in columns), strict=True)
    for g, v, rel, upper in rows:
        if v == 0:
            assert (rel, upper) == (between["paired_rel"], between["paired_rel_upper"])
        else:
            own = groups[f"G{g}/V0"]
            assert rel == own["estimate"] and own["low"] <= rel <= own["upper"]
            assert upper == max(own["upper"], between["paired_rel_upper"])
    assert report["order"] == "random" and report["carryover"]["rewarm_steps"] >= 1


@pytest.mark.slow
def test_without_a_shift_nothing_is_stated_as_measured(tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    res = _cli(*_synthetic_args(out))
    assert res.exit_code == 0, res.output
    assert "paired SD not resolved" in res.stdout and "intervals carry" in res.stdout
    assert "the design resolves shifts >=" in res.stdout


@pytest.mark.parametrize("shift", [0.004, 0.0])
def test_saving_intervals_cover_the_truth(shift: float) -> None:
    """The fast variant of the repeated-seed coverage test (the slow one runs twenty seeds)."""
    hits: list[bool] = []
    for seed in (1, 2):
        result, backend = _sweep(seed, epoch_shift_rel=shift)
        hits += _hits(result, backend)
    assert np.mean(hits) >= COVERAGE, np.mean(hits)


@pytest.mark.slow
@pytest.mark.parametrize("shift", [0.004, 0.0])
def test_saving_intervals_cover_the_truth_over_many_seeds(shift: float) -> None:
    hits: list[bool] = []
    estimates = []
    for seed in range(20):
        result, backend = _sweep(100 + seed, epoch_shift_rel=shift)
        hits += _hits(result, backend)
        estimates.append(result.between.paired_rel)
    assert np.mean(hits) >= COVERAGE, np.mean(hits)
    if shift:
        assert all(0.002 <= e <= 0.008 for e in estimates), estimates


def test_a_biased_control_widens_its_g_and_restores_coverage() -> None:
    """Cells captured apart from the native one run 1% faster in the sweep than in serving: the
    control shows it, the compact savings of every G are widened, and cover the serving truth."""
    result, backend = _sweep(3, capture_bias_rel=0.01)
    summary = result.control_summary()
    assert set(summary) == {str(g) for g in LADDER}
    for bias in summary.values():
        assert bias["widened"] and bias["ci_low"] > 0.0 and abs(bias["control_bias"] - 0.01) < 0.005
    compact = [c for c in result.cells if c.spec.kind is CellKind.COMPACT]
    assert all(c.control_widened and "control_widened" in c.summary.warnings for c in compact)  # type: ignore[union-attr]
    # The controls themselves keep their (biased) interval: it is the evidence of the bias.
    assert np.mean(_hits(result, backend, (CellKind.COMPACT,))) >= COVERAGE
    table = result.summary_table().to_pydict()
    widened = dict(
        zip(
            zip(table["graph_batch_size"], table["verifier_budget"], strict=True),
            table["control_widened"],
            strict=True,
        )
    )
    assert widened[(2, 0)] is False and widened[(2, 3)] is True


def test_an_unbiased_control_widens_nothing() -> None:
    result, _ = _sweep(4)
    assert not any(c.control_widened for c in result.cells)
    assert all(not b["widened"] for b in result.control_summary().values())


def test_carry_over_is_measured_and_the_rewarm_grows_until_it_is_small(tmp_path: Path) -> None:
    journal = tmp_path / "s.journal.jsonl"
    result, _ = _sweep(5, journal, carryover_rel=0.02)
    assert result.rewarm_steps is not None and result.rewarm_steps > Thresholds.quick().rewarm_steps
    records = read_journal(journal).records
    grown = [r for r in records if r["type"] == "rewarm"]
    assert grown and grown[-1]["steps"] == result.rewarm_steps and "carry-over" in grown[-1]["detail"]
    carry = result.carryover
    assert carry is not None
    # The slowdown after a larger G, measured at the last re-warm, is what the rule judged small.
    for g in (2, 4):
        effect = carry.per_g[g]
        assert effect.effect is not None and effect.effect < 0.02
    shifts = {c.spec: c.carryover_rel for c in result.cells}
    assert all(v is not None for v in shifts.values())
    assert all(v == 0.0 for c, v in shifts.items() if c.key[0] == 8)  # nothing is larger than G=8
    samples = result.samples.to_pydict()
    assert {"prev_graph_batch_size", "prev_verifier_budget", "warmup"} <= set(samples)
    assert max(samples["warmup"]) >= result.rewarm_steps


def test_without_carry_over_the_rewarm_stays() -> None:
    result, _ = _sweep(6)
    assert result.rewarm_steps == Thresholds.quick().rewarm_steps


def test_a_resumed_sweep_keeps_the_grown_rewarm(tmp_path: Path) -> None:
    journal = tmp_path / "s.journal.jsonl"
    th = Thresholds.quick(**DESIGN)
    backend = SyntheticBackend(seed=5, carryover_rel=0.02)
    config, _ = make_config(backend, thresholds=th, ladder=LADDER, seed=5)
    first = run_sweep(config, backend, journal_path=journal, until_round=8)
    assert first.paused and first.rewarm_steps is not None and first.rewarm_steps > th.rewarm_steps
    resumed = run_sweep(config, SyntheticBackend(seed=5, carryover_rel=0.02), journal_path=journal, resume=True)
    assert resumed.rewarm_steps is not None and resumed.rewarm_steps >= first.rewarm_steps
    # After the resume every visit re-warms at least as long, unless it is a capture's full warm-up.
    later = [r["warmup"] for r in read_journal(journal).records if r["type"] == "visit" and r["round"] >= 8]
    assert later and all(w >= first.rewarm_steps or w == th.warmup_steps for w in later)


def test_clock_scaling_is_stated_per_cell() -> None:
    result, _ = _sweep(7, power_capped=True, power_cap_clock_rel=0.04)
    for c in result.cells:
        assert c.clock_rel is not None and c.power_rel == pytest.approx(1.0)
        spec = c.spec
        share = spec.tokens / spec.full_width  # type: ignore[union-attr]
        if c.spec.kind is CellKind.NATIVE or c.spec.kind is CellKind.CONTROL:
            assert c.clock_rel == pytest.approx(1.0)
        else:
            assert c.clock_rel == pytest.approx(1.0 + 0.04 * (1.0 - share))


def _workload(path: Path) -> Path:
    from dspark_calibrate.calibrate.deployment.workload import synthesize_workload, write_workload

    write_workload(path, synthesize_workload(k=3, steps=400, max_rows=8, seed=2))
    return path


@pytest.mark.slow
def test_the_serving_order_follows_the_workload(tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    workload = _workload(tmp_path / "w.parquet")
    res = _cli(*_synthetic_args(out), "--order", "serving", "--workload", str(workload), "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["order"]["mode"] == "serving" and report["order"]["steps"] == 400
    samples = pq.read_table(out.with_name("s.samples.parquet")).to_pydict()
    # One G's cells are visited together: most visits follow a visit to their own G.
    same = [
        g == pg
        for g, pg in zip(samples["graph_batch_size"], samples["prev_graph_batch_size"], strict=True)
        if pg is not None
    ]
    assert np.mean(same) > 0.6
    header = read_journal(out.with_name("s.journal.jsonl")).header
    assert header["config"]["order"]["mode"] == "serving"


@pytest.mark.parametrize(
    ("case", "extra", "message"),
    [
        ("serving_without_workload", ["--order", "serving"], "--workload"),
        ("workload_without_serving", ["--workload", "w.parquet"], "--order serving"),
        ("unknown_order", ["--order", "sorted"], "unknown"),
        ("serving_with_mixed", ["--order", "serving", "--workload", "w.parquet", "--mixed"], "--mixed"),
    ],
)
def test_order_usage_errors_exit_2(tmp_path: Path, case: str, extra: list[str], message: str) -> None:
    res = _cli(*_synthetic_args(tmp_path / "s.parquet"), *extra)
    assert res.exit_code == 2, res.output
    assert message in res.stderr


@pytest.mark.slow
def test_schema_4_rows_and_the_summary_lines(tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    res = _cli(*_synthetic_args(out, "power_capped=true", "power_cap_clock_rel=0.03"))
    assert res.exit_code == 0, res.output
    for line in (
        "between-run (reml",
        "control bias (0 is the truth)",
        "carry-over after a larger G",
        "SM clock relative to native",
    ):
        assert line in res.stdout
    from dspark_calibrate.artifacts import read_artifact

    art = read_artifact(out)
    assert art.schema_version == 4
    rows = art.table.to_pylist()
    assert all(r["clock_rel"] is not None and r["carryover_rel"] is not None for r in rows)
    assert all(r["control_bias"] is not None for r in rows)
    assert all(math.isfinite(r["paired_rel_upper"]) for r in rows)
    extra = art.provenance_untrusted().extra
    assert {"carryover", "control_bias", "order", "between_run"} <= set(extra)
    assert extra["between_run"]["estimator"] == "reml"


@pytest.mark.slow
def test_a_design_that_cannot_resolve_the_shift_says_what_to_add(tmp_path: Path) -> None:
    """Rounds ten times noisier than the default: two rounds per epoch cannot see 0.4%."""
    out = tmp_path / "s.parquet"
    args = ["--backend", "synthetic", "--backend-opt", "noise_rel=0.03", "--k", "3", "--ladder", "2,4"]
    res = _cli(*args, "--preset", "quick", "--out", str(out), "--no-plot")
    assert res.exit_code == 0, res.output
    assert "not the 0.40%" in res.stdout and "--passes 4" in res.stdout


#: Only G=8 moves between captures, by 0.8% per cell: a log-ratio to its native moves by 1.1%.
HEAVY = {"heavy_shift_rel": 0.008, "heavy_from_g": 8.0}


def _heavy_hits(seeds: range) -> tuple[list[bool], list[bool], list[Any]]:
    """Over ``seeds``, whether each G=8 cell's saving interval holds the noise-free saving, and
    whether it holds a fresh serving process's (its own capture of the cell and of the native
    draws a log-ratio shift of SD √2·0.8%, what a saving interval predicts), with each sweep's
    components."""
    truth: list[bool] = []
    fresh: list[bool] = []
    between = []
    sd = math.sqrt(2.0) * HEAVY["heavy_shift_rel"]
    for seed in seeds:
        result, backend = _sweep(seed, **HEAVY)
        rng = np.random.default_rng(seed)
        for c in result.cells:
            if c.spec.kind is CellKind.NATIVE or c.spec.graph_batch_size != 8 or c.summary is None:
                continue
            s = c.summary
            true = backend.model.true_saving(c.spec)  # type: ignore[arg-type]
            served = 1.0 - (1.0 - true) * math.exp(float(rng.normal(0.0, sd)))
            truth.append(s.saving_ci_low <= true <= s.saving_ci_high)
            fresh.append(s.saving_ci_low <= served <= s.saving_ci_high)
        between.append(result.between)
    return truth, fresh, between


@pytest.mark.slow
def test_a_heavy_g_that_moves_between_captures_gets_its_own_paired_sd() -> None:
    truth, fresh, between = _heavy_hits(range(300, 303))
    for b in between:
        groups = {g.native: g for g in b.paired_groups}
        assert set(groups) == {"G2/V0", "G4/V0", "G8/V0"}
        heavy = groups["G8/V0"]
        assert heavy.estimate > b.paired_rel and heavy.upper > b.paired_rel_upper  # the pool is mostly G=2, 4
        assert 0.004 <= heavy.estimate <= 0.03, heavy
    assert np.mean(truth) >= COVERAGE and np.mean(fresh) >= COVERAGE, (np.mean(truth), np.mean(fresh))


@pytest.mark.slow
def test_the_pooled_paired_sd_alone_misses_a_heavy_g(monkeypatch: pytest.MonkeyPatch) -> None:
    """Twelve seeds: with each G's own σ_d, G=8's intervals hold a fresh serving process's
    saving; with the pooled σ_d alone (the cell's group ignored) they do not."""
    truth, fresh, _ = _heavy_hits(range(400, 412))
    assert np.mean(truth) >= COVERAGE and np.mean(fresh) >= COVERAGE, (np.mean(truth), np.mean(fresh))
    monkeypatch.setattr(BetweenRun, "for_cell", lambda self, cell: self)
    _, pooled, _ = _heavy_hits(range(400, 412))
    assert np.mean(pooled) < COVERAGE, np.mean(pooled)


def test_the_summary_names_the_g_whose_own_paired_sd_is_carried() -> None:
    from dspark_calibrate.calibrate.measurement.stats import GroupPaired
    from dspark_calibrate.cli.sweep import _between_line

    base = BetweenRun(
        6, 9, 0.0, 5, 0.001, 0.0012, 6, paired_df=12, paired_rel_upper=0.002, paired_rel_low=0.0005
    )
    light = GroupPaired("G8/V0", 0.0004, 0.0, 0.0015, 10, 2)
    heavy = GroupPaired("G256/V0", 0.005, 0.001, 0.012, 10, 2)
    line = _between_line(replace(base, paired_groups=(light, heavy)), 0.95)
    assert "per G above the pool: G256 0.50% (carries 1.20%)" in line and "G8 " not in line
    assert "per G" not in _between_line(replace(base, paired_groups=(light,)), 0.95)
    # The least-resolved G says how many times its epochs would resolve 0.4%.
    resolving = replace(base, resolvable_shift_rel=0.001)
    needs = replace(heavy, resolvable=0.0077, epochs_factor=4)
    line = _between_line(replace(resolving, paired_groups=(replace(light, resolvable=0.002), needs)), 0.95)
    assert "each G alone 0.20%-0.77%, G256 the least; 0.40% at G256 needs 4x its epochs (--resolve 0.004 measures" in line
    far = replace(needs, epochs_factor=None)
    assert "needs over 64x its epochs" in _between_line(replace(resolving, paired_groups=(far,)), 0.95)
    within = replace(needs, resolvable=0.003)
    assert "needs" not in _between_line(replace(resolving, paired_groups=(within,)), 0.95)
    # A cell takes its own group's estimate and the larger upper value; a native cell the pool's.
    between = replace(base, paired_groups=(light, heavy))
    compact = CellSpec(256, 512, 5)
    assert between.for_cell(compact).paired_rel_upper == 0.012
    assert between.for_cell(compact).paired_rel == 0.005 and between.for_cell(compact).paired_df == 10
    assert between.for_cell(CellSpec(8, 16, 5)).paired_rel_upper == 0.002
    assert between.for_cell(CellSpec(8, 16, 5)).paired_rel == 0.0004
    assert between.for_cell(CellSpec(256, 0, 5)) is between
    assert between.for_cell(CellSpec(64, 128, 5)) is between  # no group estimated for G=64


@pytest.mark.parametrize("interleave", [False, True])
def test_a_journal_summarised_again_gives_the_sweeps_own_table(tmp_path: Path, interleave: bool) -> None:
    """``resummarize`` rebuilds a finished sweep from its journal alone: the same rows, the same
    between-run components (what lets a change to the statistics be checked on past sweeps)."""
    journal = tmp_path / "s.journal.jsonl"
    backend = SyntheticBackend(seed=6, **HEAVY)
    config, _ = make_config(
        backend, thresholds=Thresholds.quick(**DESIGN), ladder=LADDER, seed=6, interleave=interleave
    )
    result = run_sweep(config, backend, journal_path=journal)
    again = resummarize(journal, passes=False)
    assert again.config.to_dict() == result.config.to_dict()
    assert again.summary_table().to_pylist() == result.summary_table().to_pylist()
    assert again.between == result.between and not again.paused and again.rounds == result.rounds


@pytest.mark.parametrize(
    ("header", "match"),
    [
        ({}, "no sweep configuration"),
        ({"config": {"mixed": {"groups": []}}}, "mixed sweep"),
        ({"config": {"k": 3}}, "incomplete"),
    ],
)
def test_a_journal_that_cannot_be_summarised_again_is_refused(
    tmp_path: Path, header: dict[str, Any], match: str
) -> None:
    journal = tmp_path / "bad.journal.jsonl"
    head = {"type": "header", "format": "dspark-calibrate/sweep-journal", "version": 1, **header}
    journal.write_text(json.dumps(head) + "\n")
    with pytest.raises(ConfigError, match=match):
        resummarize(journal, passes=False)
