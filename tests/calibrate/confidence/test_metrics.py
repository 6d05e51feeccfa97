"""Held-out metrics: hand-computed values, censoring, binning, and request-level intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import expit

from dspark_calibrate.calibrate.confidence.metrics import (
    binned_ece,
    equal_mass_bins,
    evaluate_predictions,
    observe,
    paired_nll_difference,
    round_log_likelihood,
)

P = np.array([[0.8, 0.5]])

# (accepted, verified, probability of what was observed) for p = (0.8, 0.5), K = 2.
OUTCOMES = [
    ("all_accepted", 2, 2, 0.8 * 0.5),
    ("rejected_at_2", 1, 2, 0.8 * 0.5),
    ("rejected_at_1", 0, 2, 0.2),
    ("censored_after_1", 1, 1, 0.8),  # only P(A >= 1) is known
    ("rejected_at_1_censored_block", 0, 1, 0.2),
    ("nothing_verified", 0, 0, 1.0),
]


@pytest.mark.parametrize(("name", "a", "v", "prob"), OUTCOMES, ids=[o[0] for o in OUTCOMES])
def test_accepted_length_likelihood_by_hand(name: str, a: int, v: int, prob: float) -> None:
    ll = round_log_likelihood(P, np.array([a]), np.array([v]))
    assert ll[0] == pytest.approx(math.log(prob), abs=1e-12)


def naive_log_likelihood(p: np.ndarray, a: np.ndarray, v: np.ndarray) -> np.ndarray:
    out = np.zeros(len(a))
    for i in range(len(a)):
        for j in range(1, p.shape[1] + 1):
            if a[i] >= j - 1 and v[i] >= j:
                out[i] += math.log(p[i, j - 1]) if a[i] >= j else math.log(1 - p[i, j - 1])
    return out


def test_likelihood_is_the_sum_of_risk_set_terms() -> None:
    rng = np.random.default_rng(3)
    p = rng.uniform(0.05, 0.95, size=(400, 4))
    v = rng.integers(0, 5, 400)
    a = np.minimum(rng.integers(0, 5, 400), v)
    np.testing.assert_allclose(round_log_likelihood(p, a, v), naive_log_likelihood(p, a, v), atol=1e-12)


def test_report_by_hand() -> None:
    p = np.array([[0.8, 0.5], [0.8, 0.5], [0.6, 0.5]])
    a = np.array([2, 1, 1])
    v = np.array([2, 2, 1])
    rep = evaluate_predictions(p, a, v, np.array([0, 1, 2]), bootstrap=0)
    ll = math.log(0.4) + math.log(0.4) + math.log(0.6)
    assert rep.nll.value == pytest.approx(-ll / 3)
    assert rep.nll.low is None and rep.bootstrap == 0
    s = np.cumprod(p, axis=1)
    brier = (
        (s[0, 0] - 1) ** 2 + (s[0, 1] - 1) ** 2 + (s[1, 0] - 1) ** 2 + s[1, 1] ** 2 + (s[2, 0] - 1) ** 2
    ) / 3
    assert rep.brier.value == pytest.approx(brier)
    # E[min(A, v)] predicted: rounds 1-2 sum S_1 + S_2, round 3 (v = 1) only S_1.
    assert rep.ea_predicted == pytest.approx((2 * (0.8 + 0.4) + 0.6) / 3)
    assert rep.ea_measured == pytest.approx(4 / 3)
    assert rep.ea_error.value == pytest.approx(rep.ea_predicted - rep.ea_measured)
    pos1, pos2 = rep.positions
    assert (pos1.risk_set_size, pos1.labelled) == (3, 3)
    assert (pos2.risk_set_size, pos2.labelled) == (2, 2)  # round 3 never verified position 2
    assert pos2.nll == pytest.approx(-(math.log(0.5) + math.log(0.5)) / 2)
    assert pos2.observed_survival == pytest.approx(0.5)
    assert pos2.mean_survival == pytest.approx(0.4)
    # Position 2: both labelled rounds have S = 0.4 (bin 6 of 15), labels 1 and 0: ECE |0.8 - 1|/2.
    assert pos2.ece.value == pytest.approx(abs(0.8 - 1.0) / 2)
    assert pos2.width.counts[6] == 2 and pos2.width.empty_bins == 14


def test_binned_ece_by_hand() -> None:
    conf = np.array([0.05, 0.05, 0.95, 0.95])
    label = np.array([0, 1, 1, 1])
    # Bin 0: mean conf 0.05 vs rate 0.5; last bin: 0.95 vs 1.0; weights 1/2 each.
    assert binned_ece(conf, label, 15) == pytest.approx(0.5 * 0.45 + 0.5 * 0.05)
    assert binned_ece(np.zeros(0), np.zeros(0)) == 0.0
    assert binned_ece(np.array([1.0]), np.array([1])) == 0.0  # conf = 1 falls in the last bin


def test_equal_mass_bins_split_distinct_values_evenly() -> None:
    n, bins = 997, 15
    conf = (np.arange(n) + 0.5) / n
    edges, b = equal_mass_bins(np.random.default_rng(0).permutation(conf), bins)
    counts = np.bincount(b, minlength=bins)
    assert set(counts.tolist()) <= {n // bins, n // bins + 1}
    assert edges[0] == 0.0 and edges[-1] == 1.0 and np.all(np.diff(edges) >= 0)


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=200), st.integers(2, 20))
def test_equal_mass_bins_are_monotone_and_in_range(values: list[float], bins: int) -> None:
    conf = np.asarray(values)
    edges, b = equal_mass_bins(conf, bins)
    assert len(edges) == bins + 1
    assert b.min() >= 0 and b.max() < bins
    order = np.argsort(conf, kind="stable")
    assert np.all(np.diff(b[order]) >= 0)  # a larger confidence never lands in an earlier bin
    assert np.all(np.diff(edges) >= 0)


def calibrated_rounds(n: int, k: int = 3, requests: int = 300, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    p = expit(rng.normal(1.0, 1.5, size=(n, k)))
    ok = rng.random((n, k)) < p
    a = np.cumprod(ok, axis=1).sum(axis=1)
    v = np.full(n, k)
    return p, a, v, rng.integers(0, requests, n)


def test_true_probabilities_score_well_and_intervals_cover() -> None:
    p, a, v, req = calibrated_rounds(60_000)
    rep = evaluate_predictions(p, a, v, req, bootstrap=100, seed=1)
    assert rep.max_ece is not None and rep.max_ece < 0.015
    lo, hi = rep.ea_error.low, rep.ea_error.high
    assert lo is not None and hi is not None and lo < 0 < hi
    for est in (rep.nll, rep.brier, rep.ea_error, *(x.ece for x in rep.positions)):
        assert est.low is not None and est.high is not None and est.low <= est.value <= est.high
    # A miscalibrated copy (too confident) is worse on every proper score.
    worse = evaluate_predictions(expit(2.0 * np.log(p / (1 - p))), a, v, req, bootstrap=0)
    assert worse.nll.value is not None and worse.nll.value > rep.nll.value
    assert worse.max_ece is not None and worse.max_ece > 0.05


def test_bootstrap_is_by_request_and_deterministic() -> None:
    p, a, v, _ = calibrated_rounds(6_000, requests=1)
    # One request: no interval can be formed (rounds are not the resampling unit).
    single = evaluate_predictions(p, a, v, np.zeros(len(a), np.int64), bootstrap=50)
    assert single.bootstrap == 0 and single.nll.low is None
    req = np.arange(len(a)) // 600  # 10 requests
    one = evaluate_predictions(p, a, v, req, bootstrap=50, seed=4)
    two = evaluate_predictions(p, a, v, req, bootstrap=50, seed=4)
    assert one.nll == two.nll and one.positions[0].ece == two.positions[0].ece
    # Clustered rounds: with a per-request shift, intervals by request are wider than by round.
    shift = np.repeat(np.random.default_rng(2).normal(0, 1.5, 10), 600)
    p2 = expit(np.log(p / (1 - p)) + shift[:, None])
    by_request = evaluate_predictions(p2, a, v, req, bootstrap=100, seed=0).nll
    by_round = evaluate_predictions(p2, a, v, np.arange(len(a)), bootstrap=100, seed=0).nll
    assert by_request.high - by_request.low > by_round.high - by_round.low


def test_outcomes_are_shared_and_checked() -> None:
    p, a, v, req = calibrated_rounds(1000)
    obs = observe(a, v, req, 3)
    assert (
        evaluate_predictions(p, a, v, req, bootstrap=0, outcomes=obs).nll
        == evaluate_predictions(p, a, v, req, bootstrap=0).nll
    )
    with pytest.raises(ValueError, match="outcomes describe"):
        evaluate_predictions(p[:10], a[:10], v[:10], req[:10], outcomes=obs)


def test_paired_difference() -> None:
    p, a, v, req = calibrated_rounds(5000)
    same = paired_nll_difference(p, p, a, v, req, bootstrap=50)
    assert same.value == 0.0 and same.low == 0.0 and same.high == 0.0
    flat = np.full_like(p, 0.5)
    diff = paired_nll_difference(flat, p, a, v, req, bootstrap=50)
    assert diff.value is not None and diff.low is not None and diff.value > diff.low > 0


def test_empty_and_unlabelled_positions_are_none() -> None:
    p = np.array([[0.9, 0.9]])
    rep = evaluate_predictions(p, np.array([1]), np.array([1]), np.array([0]), bootstrap=10)
    assert rep.positions[1].labelled == 0
    assert rep.positions[1].ece.value is None and rep.positions[1].nll is None
    empty = evaluate_predictions(np.zeros((0, 2)), np.zeros(0), np.zeros(0), np.zeros(0))
    assert empty.rounds == 0 and empty.nll.value is None and empty.max_ece is None
