"""Statistics: summaries, interval coverage on known distributions, stopping decisions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_calibrate.calibrate.measurement.ladder import CellKind, CellSpec
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
        min_samples=8,
        min_rounds=4,
        max_samples_per_cell=100,
        max_seconds_per_cell=5,
        budget_s=60,
        n_boot=200,
        recapture_every=0,
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


def test_between_run_term_adds_in_quadrature_on_the_log_scale() -> None:
    rng = np.random.default_rng(7)
    rounds = [rng.normal(10.0, 0.01, 6) for _ in range(8)]
    plain = median_interval(rounds, seed=1, reproduction=True, between_run_rel=0.0)
    wide = median_interval(rounds, seed=1, reproduction=True, between_run_rel=0.003)
    floor = 1.959964 * 0.003
    assert wide.median == plain.median
    up = math.log(plain.high / plain.median)
    down = math.log(plain.median / plain.low)
    assert math.log(wide.high / wide.median) == pytest.approx(math.hypot(up, floor), rel=1e-6)
    assert math.log(wide.median / wide.low) == pytest.approx(math.hypot(down, floor), rel=1e-6)
    assert wide.method.endswith("+between_run")
    # Without reproduction the term is not applied: it describes sweep-to-sweep differences only.
    cond = median_interval(rounds, seed=1, reproduction=False, between_run_rel=0.003)
    assert "between_run" not in cond.method


# ---------------------------------------------------------------------------------------------
# Capture epochs, between-run components and paired savings, on simulated sweeps with a known truth
# ---------------------------------------------------------------------------------------------

from dspark_calibrate.calibrate.measurement.stats import (  # noqa: E402
    BetweenRun,
    estimate_between_run,
    paired_saving_interval,
)

K = 3
#: The simulated ladder: each G has its native cell and three compact cells with known savings.
TRUE_SAVINGS = {0: 0.0, 6: 0.06, 9: 0.03, 11: 0.01}


def _simulate_sweep(
    rng: np.random.Generator,
    *,
    process: tuple[float, dict[CellSpec, float]],
    epochs: int = 3,
    rounds_per_epoch: int = 3,
    samples: int = 2,
    sd: dict[str, float],
) -> dict[CellSpec, CellSamples]:
    """One sweep of G = 4 and 8: a process level (common and per cell), per-epoch common and per-cell
    shifts, a common per-round drift and per-sample noise, all multiplicative (log scale)."""
    common_p, cell_p = process
    out: dict[CellSpec, list[tuple[float, int, int]]] = {}
    for e in range(epochs):
        f_e = rng.normal(0, sd["epoch_common"])
        u = {c: rng.normal(0, sd["epoch_cell"]) for c in cell_p}
        for r_local in range(rounds_per_epoch):
            r = e * rounds_per_epoch + r_local
            drift = rng.normal(0, sd["round_common"])
            for c in cell_p:
                base = (
                    10.0
                    * c.graph_batch_size
                    / 4
                    * (
                        1
                        - TRUE_SAVINGS[
                            c.verifier_budget % 12 if c.graph_batch_size == 4 else c.verifier_budget // 2 % 12
                        ]
                    )
                )
                level = common_p + cell_p[c] + f_e + u[c] + drift
                for _ in range(samples):
                    out.setdefault(c, []).append((base * math.exp(level + rng.normal(0, sd["sample"])), r, e))
    return {
        c: CellSamples(
            c, tuple(v for v, _, _ in rows), tuple(r for _, r, _ in rows), tuple(e for _, _, e in rows)
        )
        for c, rows in out.items()
    }


def _cells() -> list[CellSpec]:
    return [CellSpec(4, v, K) for v in TRUE_SAVINGS] + [
        CellSpec(8, 2 * v, K) if v else CellSpec(8, 0, K) for v in TRUE_SAVINGS
    ]


def _process(rng: np.random.Generator, sd: dict[str, float]) -> tuple[float, dict[CellSpec, float]]:
    return rng.normal(0, sd["process_common"]), {c: rng.normal(0, sd["process_cell"]) for c in _cells()}


#: Process-level variation equal to the epoch-level one: the assumption the sweep's estimate rests on.
SD = {
    "process_common": 0.006,
    "process_cell": 0.002,
    "epoch_common": 0.006,
    "epoch_cell": 0.002,
    "round_common": 0.004,
    "sample": 0.002,
}


def _true_saving(cell: CellSpec, proc: tuple[float, dict[CellSpec, float]]) -> float:
    """The saving a process with offsets ``proc`` sees over a long run (epochs average out)."""
    s = TRUE_SAVINGS[cell.verifier_budget if cell.graph_batch_size == 4 else cell.verifier_budget // 2]
    return 1 - (1 - s) * math.exp(proc[1][cell] - proc[1][cell.native])


@pytest.mark.slow
def test_between_run_components_are_recovered() -> None:
    rng = np.random.default_rng(11)
    sd = {**SD, "epoch_common": 0.01, "epoch_cell": 0.004}
    est = [
        estimate_between_run(_simulate_sweep(rng, process=_process(rng, sd), epochs=8, sd=sd))
        for _ in range(20)
    ]
    assert all(e.epochs == 8 and e.cells == 8 for e in est)
    common = np.median([e.common_mode_rel for e in est])
    level = np.median([e.level_rel for e in est])
    paired = np.median([e.paired_rel for e in est])
    assert 0.007 <= common <= 0.013
    assert 0.0025 <= level <= 0.0055
    # The paired log-ratio's epoch variation is the difference of two cells' own shifts: sqrt(2)·σ_u.
    assert 0.0035 <= paired <= 0.008


def test_one_epoch_estimates_nothing_and_summary_says_so() -> None:
    rng = np.random.default_rng(2)
    cells = _simulate_sweep(rng, process=_process(rng, SD), epochs=1, rounds_per_epoch=6, sd=SD)
    between = estimate_between_run(cells)
    assert not between.estimated
    s = summarize(cells[CellSpec(4, 0, K)], between=between, n_boot=200)
    assert "no_between_run_estimate" in s.warnings and "+between_run" in s.ci_method


@pytest.mark.slow
def test_reproduction_interval_covers_an_independent_sweep() -> None:
    """Between-epoch terms estimated per sweep: another process's median is covered at ~95%."""
    rng = np.random.default_rng(5)
    trials, hits, without = 60, 0, 0
    for t in range(trials):
        a = _simulate_sweep(rng, process=_process(rng, SD), sd=SD)
        b = _simulate_sweep(rng, process=_process(rng, SD), sd=SD)
        between = estimate_between_run(a)
        for c in _cells():
            other = float(np.median(b[c].raw_ms))
            s = summarize(a[c], between=between, n_boot=300, seed=t)
            hits += s.ci_low_ms <= other <= s.ci_high_ms
            iv = median_interval(list(a[c].round_groups().values()), n_boot=300, seed=t, between_run_rel=0.0)
            without += iv.low <= other <= iv.high
    n = trials * len(_cells())
    assert hits / n >= 0.9, hits / n
    assert without / n < 0.8  # rounds alone cannot see what separates two processes


@pytest.mark.slow
def test_paired_saving_predicts_the_serving_process_and_is_narrower_than_unpaired() -> None:
    rng = np.random.default_rng(8)
    trials, hits, widths, unpaired_widths = 60, 0, [], []
    for t in range(trials):
        a = _simulate_sweep(rng, process=_process(rng, SD), sd=SD)
        serving = _process(rng, SD)
        between = estimate_between_run(a)
        for c in _cells():
            if c.kind is CellKind.NATIVE:
                continue
            s = summarize(a[c], reference=a[c.native], between=between, n_boot=300, seed=t)
            truth = _true_saving(c, serving)
            hits += s.saving_ci_low <= truth <= s.saving_ci_high
            widths.append(s.saving_ci_high - s.saving_ci_low)
            nat = summarize(a[c.native], between=between, n_boot=300, seed=t)
            unpaired_widths.append(s.ci_high_ms / nat.ci_low_ms - s.ci_low_ms / nat.ci_high_ms)
    n = len(widths)
    assert hits / n >= 0.9, hits / n
    assert np.median(widths) < 0.5 * np.median(unpaired_widths)


def test_paired_saving_needs_two_common_rounds() -> None:
    cell, nat = CellSpec(4, 6, K), CellSpec(4, 0, K)
    a = CellSamples(cell, (9.0, 9.1, 9.2), (0, 1, 2))
    b = CellSamples(nat, (10.0, 10.1), (2, 3))
    assert paired_saving_interval(a, b) is None
    s = summarize(a, reference=b, n_boot=200)
    assert "unpaired" in s.warnings and s.paired_rounds == 0
    assert s.saving_ci_low <= s.saving <= s.saving_ci_high


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.floats(1e-3, 1e4, allow_nan=False), min_size=4, max_size=20),
    spread=st.floats(0.0, 0.4),
)
def test_bounds_are_never_negative(values: list[float], spread: float) -> None:
    """A wild cell (orders of magnitude apart) still gets 0 < low <= median <= high."""
    rounds = [values[i::2] for i in range(2)]
    big = BetweenRun(3, 5, spread, 2, spread, spread, 4)
    iv = median_interval(rounds, epochs=[0, 1], n_boot=100, seed=1, between=big)
    assert 0 < iv.low <= iv.median <= iv.high and math.isfinite(iv.high)


def test_thresholds_validate_new_fields_and_read_the_old_drop_flag() -> None:
    for name, value in (
        ("recapture_every", -1),
        ("throttle_policy", "lenient"),
        ("min_kept_share", 1.5),
        ("between_run_rel", 0.7),
    ):
        with pytest.raises(ConfigError, match=name):
            Thresholds(**{name: value})
    legacy = {k: v for k, v in Thresholds().to_dict().items() if k != "throttle_policy"}
    assert Thresholds.from_dict({**legacy, "drop_throttled": True}).throttle_policy == "strict"
    assert Thresholds.from_dict({**legacy, "drop_throttled": False}).throttle_policy == "keep-all"
    assert Thresholds().min_epochs == 2 and Thresholds(recapture_every=0).min_epochs == 1
