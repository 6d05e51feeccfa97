"""The paired sweep: capture epochs, native pairing, serving-condition sampling, the forced-K arm."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from dspark_calibrate.calibrate.deployment.cells import CellGrid
from dspark_calibrate.calibrate.deployment.uncertainty import measured_overhead
from dspark_calibrate.calibrate.measurement.backends.synthetic import SyntheticBackend
from dspark_calibrate.calibrate.measurement.ladder import FORCED_K_BUDGET, CellKind, CellSpec
from dspark_calibrate.calibrate.measurement.stats import (
    CellSamples,
    Thresholds,
    median_interval,
    paired_saving_interval,
    round_level_half_width,
)
from dspark_calibrate.calibrate.measurement.sweep import run_sweep
from dspark_calibrate.calibrate.measurement.timing import Step
from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.errors import MeasurementError
from tests.calibrate.conftest import make_config


class CountingBackend(SyntheticBackend):
    """Counts ``prepare`` and ``release`` calls per cell (re-capture at every epoch)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.prepared: Counter[CellSpec] = Counter()
        self.released: Counter[CellSpec] = Counter()

    def prepare(self, cell: CellSpec) -> Step:
        self.prepared[cell] += 1
        return super().prepare(cell)

    def release(self, cell: CellSpec) -> None:
        self.released[cell] += 1


def test_every_epoch_captures_again_and_warms_up_fully() -> None:
    th = Thresholds.quick(recapture_every=2, warmup_steps=5, rewarm_steps=1)
    backend = CountingBackend(seed=1)
    config, _ = make_config(backend, thresholds=th)
    result = run_sweep(config, backend, journal_path=None)
    for c in result.cells:
        assert c.summary is not None
        epochs = math.ceil(c.summary.rounds / 2) if c.spec.kind is not CellKind.NATIVE else None
        assert backend.prepared[c.spec] == c.summary.epochs
        assert backend.released[c.spec] == c.summary.epochs - 1
        assert c.warmup_steps == 5 * c.summary.epochs + 1 * (c.summary.rounds - c.summary.epochs)
        if epochs is not None:
            assert c.summary.epochs == epochs
    assert result.between.estimated and result.between.epochs >= 2
    samples = result.samples.to_pydict()
    assert set(samples["epoch"]) == set(range(result.between.epochs))
    assert all(e == r // 2 for r, e in zip(samples["round"], samples["epoch"], strict=True))


def test_without_recapture_one_epoch_and_the_fallback_is_said() -> None:
    th = Thresholds.quick(recapture_every=0)
    config, backend = make_config(thresholds=th)
    result = run_sweep(config, backend, journal_path=None)
    assert not result.between.estimated
    assert all(
        c.summary is not None and "no_between_run_estimate" in c.summary.warnings for c in result.cells
    )


def test_a_native_cell_measures_every_round_its_siblings_do() -> None:
    config, backend = make_config(thresholds=Thresholds.quick(precision_rel=0.004), seed=3)
    result = run_sweep(config, backend, journal_path=None)
    rounds = result.samples.to_pydict()
    seen: dict[CellSpec, set[int]] = {}
    for g, v, r in zip(rounds["graph_batch_size"], rounds["verifier_budget"], rounds["round"], strict=True):
        seen.setdefault(CellSpec(g, v, 3), set()).add(r)
    for cell, rs in seen.items():
        if cell.kind is not CellKind.NATIVE:
            assert rs <= seen[cell.native], cell.label()
            summary = next(c.summary for c in result.cells if c.spec == cell)
            assert summary is not None and summary.paired_rounds == len(rs)


@pytest.mark.parametrize(
    ("policy", "model", "outcome"),
    [
        ("serving", {"power_capped": True}, "all kept"),
        ("keep-all", {"power_capped": True, "throttle_prob": 0.9}, "all kept"),
        ("strict", {"power_capped": True}, "sw_power_cap"),
        ("serving", {"throttle_prob": 0.9}, "sw_thermal"),
        ("strict", {"throttle_prob": 0.9}, "sw_thermal"),
    ],
    ids=["serving-at-cap", "keep-all", "strict-at-cap", "serving-thermal", "strict-thermal"],
)
def test_throttle_policies(policy: str, model: dict[str, Any], outcome: str) -> None:
    backend = SyntheticBackend(seed=2, **model)
    config, _ = make_config(backend, thresholds=Thresholds.quick(throttle_policy=policy))
    if outcome == "all kept":
        result = run_sweep(config, backend, journal_path=None)
        throttle = result.throttle_summary()
        assert throttle["samples_kept"] == throttle["samples_taken"] > 0
        if model.get("power_capped"):
            assert throttle["power_capped_share"] == 1.0 and "sw_power_cap" in throttle["reasons_seen"]
            assert all(c.power_capped == c.summary.samples for c in result.cells if c.summary)
        return
    with pytest.raises(MeasurementError) as info:
        run_sweep(config, backend, journal_path=None)
    message = str(info.value)
    # Stopped after the first round, naming the reason bits and the option to use.
    assert "after round 0" in message and outcome in message and "--throttle-policy" in message
    if outcome == "sw_power_cap":
        assert "serving" in message


def test_all_dropped_exits_1_within_the_first_round_from_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    res = CliRunner().invoke(
        build_calibrate_app(),
        [
            "sweep",
            "--backend",
            "synthetic",
            "--backend-opt",
            "power_capped=true",
            "--k",
            "3",
            "--ladder",
            "2,4",
            "--out",
            str(out),
            "--preset",
            "quick",
            "--throttle-policy",
            "strict",
            "--no-plot",
        ],
    )
    assert res.exit_code == 1
    assert "sw_power_cap" in res.stderr and "--throttle-policy serving" in res.stderr
    assert not out.exists()


def test_the_forced_k_arm_prices_the_confidence_path() -> None:
    """The synthetic arm costs native + 0.2 ms: the measured overhead recovers it."""
    config, backend = make_config(
        SyntheticBackend(seed=4, noise_rel=0.001, drift_rel=0.0, confidence_path_ms=0.2),
        thresholds=Thresholds.quick(),
        forced_k=True,
    )
    result = run_sweep(config, backend, journal_path=None)
    arms = [c for c in result.cells if c.spec.verifier_budget == FORCED_K_BUDGET]
    assert len(arms) == 2
    grid = CellGrid.from_rows(3, [_row(c) for c in result.cells if c.summary is not None])
    overhead = measured_overhead(grid)
    assert overhead is not None and overhead.measured
    for g, ms in zip(grid.ladder, overhead.per_g_ms, strict=True):
        arm = grid.forced_k(g)
        assert arm is not None and arm.saving_ci_low <= arm.saving <= arm.saving_ci_high < 0
        assert ms == pytest.approx(0.2, rel=0.15)


def _row(c: Any) -> dict[str, Any]:
    s = c.summary
    return {
        "graph_batch_size": c.spec.graph_batch_size,
        "verifier_budget": c.spec.verifier_budget,
        "step_time_ms": s.median_ms,
        "ci_low_ms": s.ci_low_ms,
        "ci_high_ms": s.ci_high_ms,
        "saving": s.saving,
        "saving_ci_low": s.saving_ci_low,
        "saving_ci_high": s.saving_ci_high,
        "paired_rounds": s.paired_rounds,
        "common_mode_rel": s.common_mode_rel,
        "level_rel": s.level_rel,
    }


def test_pairing_cancels_a_process_level_shift() -> None:
    """Two sweeps of processes whose levels differ: medians follow the shift, savings do not."""
    results, factors = [], []
    for seed in (10, 12):
        backend = SyntheticBackend(seed=seed, process_rel=0.03, capture_rel=0.0005, drift_rel=0.002)
        factors.append(backend.process_factor)
        config, _ = make_config(backend, thresholds=Thresholds.quick(precision_rel=0.003), seed=seed)
        results.append({c.spec: c.summary for c in run_sweep(config, backend, journal_path=None).cells})
    shift = math.log(factors[0] / factors[1])
    assert abs(shift) > 0.01  # the two processes really differ
    a, b = results
    level = [math.log(a[c].median_ms / b[c].median_ms) for c in a if a[c] and b[c]]
    saving = [abs(a[c].saving - b[c].saving) for c in a if a[c] and b[c] and c.kind is CellKind.COMPACT]
    assert np.median(level) == pytest.approx(shift, abs=0.004)
    assert np.median(saving) < 0.1 * abs(shift)


def test_the_closed_form_half_width_matches_the_bootstrap() -> None:
    """The stopping rule's closed form agrees with the stored interval's bootstrap (absolute)."""
    rng = np.random.default_rng(4)
    cell = CellSpec(8, 20, 5)
    ratios = []
    for _ in range(30):
        rounds = np.repeat(np.arange(12), 3)
        drift = rng.normal(0, 0.01, 12)[rounds]
        a = CellSamples(
            cell, tuple(9 * np.exp(drift + rng.normal(0, 0.004, 36))), tuple(rounds), tuple(rounds // 4)
        )
        alone = round_level_half_width(a)
        iv = median_interval(
            list(a.round_groups().values()),
            epochs=[r // 4 for r in range(12)],
            n_boot=2000,
            reproduction=False,
        )
        assert alone is not None
        ratios.append(alone / math.log(iv.high / iv.median))
    assert 0.75 < float(np.median(ratios)) < 1.35


def test_the_paired_interval_covers_the_true_saving_under_round_drift() -> None:
    """Round drift 2.5x the sample noise: the paired interval still covers at ~95%."""
    rng = np.random.default_rng(9)
    cell, nat = CellSpec(8, 20, 5), CellSpec(8, 0, 5)
    hits, trials = 0, 400
    for _ in range(trials):
        rounds = np.repeat(np.arange(8), 2)
        drift = rng.normal(0, 0.01, 8)[rounds]
        a = CellSamples(cell, tuple(9 * np.exp(drift + rng.normal(0, 0.004, 16))), tuple(rounds))
        b = CellSamples(nat, tuple(10 * np.exp(drift + rng.normal(0, 0.004, 16))), tuple(rounds))
        iv = paired_saving_interval(a, b)
        assert iv is not None
        hits += iv.low <= 0.1 <= iv.high
    assert 0.92 <= hits / trials <= 0.98
