"""Statistics: summaries, interval coverage on known distributions, stopping decisions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_calibrate.calibrate.measurement.ladder import CellSpec
from dspark_calibrate.calibrate.measurement.stats import (
    CellProgress,
    CellSamples,
    FixedProtocolRule,
    PrecisionRule,
    Status,
    StopReason,
    Thresholds,
    median_interval,
    sample_interval,
    summarize,
)
from dspark_calibrate.errors import ConfigError

CELL = CellSpec(8, 20, 5)


def _sweep_rounds(
    rng: np.random.Generator, rounds: int, n: int, between: float, within: float
) -> list[list[float]]:
    """One simulated sweep of a 10 ms cell: a shared round effect plus per-sample noise."""
    return [list(10.0 * (1 + rng.normal(0, between) + rng.normal(0, within, n))) for _ in range(rounds)]


def test_summary_of_known_values() -> None:
    values = tuple(float(v) for v in range(1, 11))
    s = summarize(CellSamples(CELL, values, (0,) * 5 + (1,) * 5), n_boot=200)
    assert s.median_ms == 5.5 and s.samples == 10 and s.rounds == 2
    assert s.p10_ms == pytest.approx(1.9) and s.p90_ms == pytest.approx(9.1)
    assert s.iqr_ms == pytest.approx(4.5)
    assert s.ci_low_ms <= s.median_ms <= s.ci_high_ms
    assert "few_rounds" in s.warnings and "wide_iqr" in s.warnings


def test_single_round_uses_sample_bootstrap_and_says_so() -> None:
    s = summarize(CellSamples(CELL, (10.0, 10.1, 9.9, 10.05)), n_boot=200)
    assert s.ci_method == "sample_bootstrap" and "single_round" in s.warnings


def test_summary_is_deterministic() -> None:
    rng = np.random.default_rng(3)
    rounds = _sweep_rounds(rng, 5, 3, 0.003, 0.002)
    samples = CellSamples(CELL, tuple(np.concatenate(rounds)), tuple(np.repeat(range(5), 3)))
    assert summarize(samples, seed=7) == summarize(samples, seed=7)


def test_hierarchical_interval_covers_a_resweep_where_the_naive_one_does_not() -> None:
    """The H200 finding in miniature: round effects dominate, so within-run intervals under-cover."""
    rng = np.random.default_rng(0)
    trials, hits, naive_hits, cond_hits = 150, 0, 0, 0
    for t in range(trials):
        a, b = _sweep_rounds(rng, 6, 4, 0.004, 0.002), _sweep_rounds(rng, 6, 4, 0.004, 0.002)
        other = float(np.median(np.concatenate(b)))
        rep = median_interval(a, n_boot=300, seed=t)
        cond = median_interval(a, n_boot=300, seed=t, reproduction=False)
        naive = sample_interval(np.concatenate(a), n_boot=300, seed=t)
        hits += rep.low <= other <= rep.high
        cond_hits += cond.low <= 10.0 <= cond.high
        naive_hits += naive.low <= other <= naive.high
    assert hits / trials >= 0.88
    assert cond_hits / trials >= 0.88
    assert naive_hits / trials <= 0.7


def test_sample_interval_covers_iid_median() -> None:
    rng = np.random.default_rng(1)
    hits = sum(
        (iv := sample_interval(rng.normal(10, 0.1, 40), n_boot=300, seed=i)).low <= 10 <= iv.high
        for i in range(150)
    )
    assert 0.85 <= hits / 150 <= 1.0


@settings(max_examples=30, deadline=None)
@given(
    values=st.lists(st.floats(0.5, 50, allow_nan=False), min_size=4, max_size=24),
    scale=st.floats(0.1, 10),
)
def test_interval_brackets_median_and_scales(values: list[float], scale: float) -> None:
    rounds = [values[i::2] for i in range(2)]
    iv = median_interval(rounds, n_boot=100, seed=1)
    assert iv.low <= iv.median <= iv.high
    scaled = median_interval([[v * scale for v in r] for r in rounds], n_boot=100, seed=1)
    assert scaled.median == pytest.approx(iv.median * scale)
    assert scaled.high - scaled.low == pytest.approx((iv.high - iv.low) * scale, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize(
    ("case", "values"),
    [
        ("empty", []),
        ("nan", [1.0, math.nan, 2.0]),
        ("inf", [1.0, math.inf]),
        ("negative", [1.0, -1.0]),
        ("zero", [0.0, 1.0]),
    ],
)
def test_unusable_values_raise(case: str, values: list[float]) -> None:
    with pytest.raises(ValueError):
        sample_interval(values)
    with pytest.raises(ValueError):
        median_interval([values, [1.0, 2.0]])


def test_one_round_is_not_hierarchical() -> None:
    with pytest.raises(ValueError, match="two"):
        median_interval([[1.0, 2.0]])


def _progress(values: list[float], rounds: list[int], **kw: float) -> CellProgress:
    base = {"cell_seconds": 1.0, "sweep_seconds": 1.0, "taken": len(values), "visits": len(set(rounds))}
    base.update(kw)
    return CellProgress(CellSamples(CELL, tuple(values), tuple(rounds)), seed=0, **base)  # type: ignore[arg-type]


TIGHT = [10.0 + 0.001 * (i % 3) for i in range(12)]
TIGHT_ROUNDS = [i // 2 for i in range(12)]
NOISY = [10.0 * (1 + 0.05 * math.sin(i * 1.7)) for i in range(12)]
RULE = PrecisionRule(
    Thresholds(
        min_samples=8, min_rounds=4, max_samples_per_cell=100, max_seconds_per_cell=5, budget_s=60, n_boot=200
    )
)


@pytest.mark.parametrize(
    ("case", "progress", "status", "reason"),
    [
        ("too_few_samples", _progress(TIGHT[:4], TIGHT_ROUNDS[:4]), Status.UNKNOWN, "too_few_samples"),
        ("too_few_rounds", _progress(TIGHT, [0] * 6 + [1] * 6), Status.UNKNOWN, "too_few_samples"),
        ("precise", _progress(TIGHT, TIGHT_ROUNDS), Status.ACCEPT, StopReason.PRECISION.value),
        ("noisy", _progress(NOISY, TIGHT_ROUNDS), Status.UNDECIDED, "precision_not_reached"),
        (
            "sample_cap",
            _progress(NOISY, TIGHT_ROUNDS, taken=100),
            Status.REJECT,
            StopReason.CELL_CAP_SAMPLES.value,
        ),
        (
            "time_cap",
            _progress(NOISY, TIGHT_ROUNDS, cell_seconds=5.0),
            Status.REJECT,
            StopReason.CELL_CAP_TIME.value,
        ),
        (
            "budget",
            _progress(NOISY, TIGHT_ROUNDS, sweep_seconds=61.0),
            Status.REJECT,
            StopReason.BUDGET.value,
        ),
        (
            "budget_beats_caps",
            _progress(NOISY, TIGHT_ROUNDS, sweep_seconds=61.0, taken=100),
            Status.REJECT,
            "budget",
        ),
        ("precise_at_budget", _progress(TIGHT, TIGHT_ROUNDS, sweep_seconds=61.0), Status.ACCEPT, "precision"),
        ("cap_before_minimum", _progress(TIGHT[:2], [0, 1], taken=100), Status.REJECT, "cell_cap_samples"),
        ("non_finite", _progress([1.0, math.nan], [0, 1]), Status.UNKNOWN, "non_finite"),
    ],
)
def test_precision_rule(case: str, progress: CellProgress, status: Status, reason: str) -> None:
    decision = RULE(progress)
    assert (decision.status, decision.reason) == (status, reason)
    assert decision.stops == (status in (Status.ACCEPT, Status.REJECT))


def test_fixed_rule() -> None:
    rule = FixedProtocolRule(Thresholds.fixed_protocol())
    assert rule(_progress([10.0] * 64, [0] * 64)).reason == StopReason.FIXED_PROTOCOL.value
    assert rule(_progress([10.0] * 10, [0] * 10)).status is Status.UNKNOWN
    assert rule(_progress([10.0] * 10, [0] * 10, sweep_seconds=1e9)).reason == "budget"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("precision_rel", 0.0),
        ("precision_rel", 1.5),
        ("precision_rel", math.nan),
        ("confidence", 1.0),
        ("min_samples", 0),
        ("min_rounds", 0),
        ("max_samples_per_cell", 2),
        ("max_seconds_per_cell", 0.0),
        ("budget_s", -1.0),
        ("replays_per_sample", 0),
        ("samples_per_visit", 0),
        ("n_boot", 10),
        ("warmup_steps", -1),
    ],
)
def test_threshold_ranges(name: str, value: float) -> None:
    with pytest.raises(ConfigError, match=name):
        Thresholds(**{name: value})


def test_threshold_presets_and_round_trip() -> None:
    fixed = Thresholds.fixed_protocol()
    assert (fixed.warmup_steps, fixed.samples_per_visit, fixed.replays_per_sample) == (128, 64, 1)
    assert Thresholds.from_dict(Thresholds.quick().to_dict()) == Thresholds.quick()
    with pytest.raises(ConfigError, match="unknown"):
        Thresholds.from_dict({"precision": 0.1})


def test_between_run_term_adds_in_quadrature() -> None:
    rng = np.random.default_rng(7)
    rounds = [rng.normal(10.0, 0.01, 6) for _ in range(8)]
    plain = median_interval(rounds, seed=1, reproduction=True, between_run_rel=0.0)
    wide = median_interval(rounds, seed=1, reproduction=True, between_run_rel=0.003)
    floor = 1.959964 * 0.003 * plain.median
    assert wide.median == plain.median
    assert wide.high - wide.median == pytest.approx(math.hypot(plain.high - plain.median, floor), rel=1e-6)
    assert wide.median - wide.low == pytest.approx(math.hypot(plain.median - plain.low, floor), rel=1e-6)
    assert wide.method.endswith("+between_run")
    # Without reproduction the term is not applied: it describes sweep-to-sweep differences only.
    cond = median_interval(rounds, seed=1, reproduction=False, between_run_rel=0.003)
    assert "between_run" not in cond.method
