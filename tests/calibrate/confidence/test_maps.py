"""Calibrators: STS semantics, risk-set fits, censoring, fallbacks, model selection, sts.json."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar
from scipy.special import expit, log_expit

from dspark_calibrate.artifacts import canonical_json
from dspark_calibrate.calibrate.confidence.maps import (
    ISOTONIC_MIN_RISK_SET,
    PARAMETRIC_MIN_RISK_SET,
    STS_GRID,
    T_MAX,
    T_MIN,
    FittedCalibration,
    FittedPositionMap,
    Method,
    build_risk_sets,
    compress_risk_set,
    fit_calibration,
    fit_position,
    fit_sts_grid,
    parse_sts_document,
    select_method,
    sts_document,
)
from dspark_calibrate.calibrate.confidence.synth_traces import SynthSpec, synth_traces
from dspark_calibrate.calibrate.confidence.traces import TraceSet
from dspark_calibrate.errors import ConfigError

FIXTURES = Path(__file__).parent.parent / "fixtures"
TRUTH = (0.7, 0.9, 1.1, 1.4, 1.8)


@pytest.fixture(scope="module")
def censored_pair() -> tuple[TraceSet, TraceSet]:
    """The same 200k rounds, once fully verified and once with half the blocks trimmed."""
    full = synth_traces(SynthSpec(rounds=200_000, seed=11))
    cut = synth_traces(SynthSpec(rounds=200_000, seed=11, censor_fraction=0.5))
    return full, cut


def temps(ts: TraceSet, method: Method = Method.STS) -> np.ndarray:
    rs = build_risk_sets(ts.logits, ts.accepted, ts.verified)
    return np.asarray(fit_calibration(rs, method).sts_temperatures())


def rel_err(a: np.ndarray, b: np.ndarray | tuple[float, ...]) -> np.ndarray:
    return np.abs(np.asarray(a) - np.asarray(b)) / np.asarray(b)


# ---------------------------------------------------------------------------------------------
# STS semantics and the maximum-likelihood solve


def test_sts_is_tensorrt_llm_semantics() -> None:
    x = np.array([[-3.0, 0.5, 2.0], [1.0, -1.0, 0.0]], dtype=np.float32)
    cal = FittedCalibration.from_temperatures([0.5, 2.0, 1.5])
    p = expit(x.astype(np.float64) / np.array([0.5, 2.0, 1.5]))
    np.testing.assert_allclose(cal.conditional(x), p, rtol=0, atol=0)
    np.testing.assert_allclose(cal.survival(x), np.cumprod(p, axis=1), rtol=1e-15)


def test_compressed_mle_matches_exact_mle() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(0.5, 2.0, 50_000).astype(np.float32)
    y = rng.random(50_000) < expit(x / 1.3)

    def nll(t: float) -> float:
        z = x.astype(np.float64) / t
        return float(-(np.where(y, log_expit(z), log_expit(-z))).sum())

    exact = minimize_scalar(nll, bounds=(0.1, 10), method="bounded", options={"xatol": 1e-10}).x
    rs = compress_risk_set(1, x, y.astype(np.int64))
    assert rs.size == 50_000 and rs.x.size < 50_000
    fitted = fit_position(rs, Method.STS).params[0]
    assert fitted == pytest.approx(exact, rel=1e-4)


def test_censored_fit_matches_uncensored_but_naive_fit_does_not(
    censored_pair: tuple[TraceSet, TraceSet],
) -> None:
    full, cut = censored_pair
    assert cut.censored_rounds > 90_000
    t_full, t_cut = temps(full), temps(cut)
    assert np.all(rel_err(t_full, TRUTH) < 0.05)
    assert np.all(rel_err(t_cut, t_full) < 0.03), (t_cut, t_full)
    # Treating the unverified positions as rejections (verified := K) biases deeper positions.
    naive = temps(cut.with_verified(np.full(cut.rounds, cut.k)))
    assert rel_err(naive, t_full).max() > 0.15, naive
    assert naive[0] == pytest.approx(t_full[0])  # position 1 is never censored


def test_randomly_censored_data_gives_the_same_answer() -> None:
    full = synth_traces(SynthSpec(rounds=120_000, seed=4))
    cut = synth_traces(SynthSpec(rounds=120_000, seed=4, censor_fraction=0.6, censor_mode="random"))
    assert np.all(rel_err(temps(cut), temps(full)) < 0.04)


# ---------------------------------------------------------------------------------------------
# Survival is non-increasing for every method


@pytest.fixture(scope="module")
def small_rounds() -> TraceSet:
    return synth_traces(SynthSpec(rounds=40_000, seed=2, k=4, temperatures=(0.8, 1.0, 1.3, 2.0)))


FITTED = [(m, False) for m in Method if m is not Method.IDENTITY] + [(Method.PLATT, True)]


@pytest.mark.parametrize(
    ("method", "shared"), FITTED, ids=[f"{m.value}{'-shared' if s else ''}" for m, s in FITTED]
)
def test_survival_non_increasing_for_fitted_methods(
    small_rounds: TraceSet, method: Method, shared: bool
) -> None:
    ts = small_rounds
    cal = fit_calibration(build_risk_sets(ts.logits, ts.accepted, ts.verified), method, shared_slope=shared)
    grid = np.linspace(-30, 30, 241, dtype=np.float32)
    probe = np.concatenate([ts.logits[:2000], np.repeat(grid[:, None], ts.k, axis=1)])
    s = cal.survival(probe)
    assert np.all((s >= 0) & (s <= 1))
    assert np.all(np.diff(s, axis=1) <= 0)


param_sets = st.one_of(
    st.floats(0.05, 20).map(lambda t: (Method.STS, (t,))),
    st.tuples(st.floats(-5, 5), st.floats(-5, 5)).map(lambda ab: (Method.PLATT, ab)),
    st.tuples(st.floats(0, 5), st.floats(0, 5), st.floats(-5, 5)).map(lambda abc: (Method.BETA, abc)),
    st.lists(st.floats(0, 1), min_size=1, max_size=6).map(
        lambda ps: (Method.ISOTONIC, (*np.arange(len(ps), dtype=float).tolist(), *sorted(ps)))
    ),
    st.just((Method.IDENTITY, ())),
)


@settings(max_examples=60)
@given(st.lists(param_sets, min_size=1, max_size=5), st.lists(st.floats(-50, 50), min_size=1, max_size=40))
def test_survival_non_increasing_for_any_parameters(
    maps: list[tuple[Method, tuple[float, ...]]], xs: list[float]
) -> None:
    cal = FittedCalibration(
        "mixed", tuple(FittedPositionMap(j, m, p, None, 0) for j, (m, p) in enumerate(maps, start=1))
    )
    logits = np.repeat(np.asarray(xs, dtype=np.float32)[:, None], cal.k, axis=1)
    s = cal.survival(logits)
    assert np.all(np.diff(s, axis=1) <= 0) and np.all((s >= 0) & (s <= 1))


# ---------------------------------------------------------------------------------------------
# Fallbacks where a risk set cannot carry a map


def risk_set(n: int, *, positives: str = "mixed", position: int = 1) -> Any:
    rng = np.random.default_rng(n)
    x = rng.normal(size=n).astype(np.float32)
    y = {"mixed": rng.random(n) < expit(x), "all": np.ones(n, bool), "none": np.zeros(n, bool)}[positives]
    return compress_risk_set(position, x, y.astype(np.int64))


FALLBACKS = [
    ("empty_any_method", Method.BETA, 0, "mixed", Method.IDENTITY, "empty risk set"),
    (
        "isotonic_small",
        Method.ISOTONIC,
        ISOTONIC_MIN_RISK_SET - 1,
        "mixed",
        Method.PLATT,
        "too small for isotonic",
    ),
    ("platt_small", Method.PLATT, PARAMETRIC_MIN_RISK_SET - 1, "mixed", Method.STS, "below 200"),
    ("beta_small", Method.BETA, 50, "mixed", Method.STS, "STS .* instead of beta"),
    ("isotonic_tiny", Method.ISOTONIC, 50, "mixed", Method.STS, "too small for isotonic.*below 200"),
    # With one label and logits of both signs, the STS likelihood is maximal at the largest T.
    (
        "all_accepted",
        Method.PLATT,
        5000,
        "all",
        Method.STS,
        f"all rounds have one label.*upper bound T={T_MAX:g}",
    ),
    ("none_accepted", Method.BETA, 5000, "none", Method.STS, "one label.*upper bound"),
    ("sts_all_accepted", Method.STS, 5000, "all", Method.STS, f"upper bound T={T_MAX:g}"),
]


@pytest.mark.parametrize(
    ("name", "method", "n", "labels", "used", "note"), FALLBACKS, ids=[f[0] for f in FALLBACKS]
)
def test_fallbacks_are_recorded(
    name: str, method: Method, n: int, labels: str, used: Method, note: str
) -> None:
    if n == 0:
        rs = compress_risk_set(3, np.zeros(0, np.float32), np.zeros(0, np.int64))
    else:
        rs = risk_set(n, positives=labels)
    pm = fit_position(rs, method)
    assert pm.method is used
    assert pm.risk_set_size == n
    assert pm.note and re.search(note, pm.note), pm.note


def test_separable_labels_hit_the_lower_bound_and_zero_logits_give_identity() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=20_000).astype(np.float32)
    y = (x > 0).astype(np.int64)  # the sign of the logit decides: T -> 0
    pm = fit_position(compress_risk_set(1, x, y), Method.STS)
    assert pm.params == (T_MIN,) and f"lower bound T={T_MIN:g}" in pm.note
    zero = fit_position(compress_risk_set(1, np.zeros(100, np.float32), y[:100]), Method.STS)
    assert zero.params == (1.0,) and "all zero" in zero.note


def test_empty_position_after_a_never_accepted_one() -> None:
    n = 3000
    ts = TraceSet.from_arrays(
        request_ids=[f"r{i % 30}" for i in range(n)],
        rounds=[i // 30 for i in range(n)],
        logits=np.random.default_rng(1).normal(size=(n, 3)).astype(np.float32),
        accepted=[i % 2 for i in range(n)],  # never two accepted: position 3 has an empty risk set
        verified=[3] * n,
    )
    cal = fit_calibration(build_risk_sets(ts.logits, ts.accepted, ts.verified), Method.STS)
    assert [p.method for p in cal.positions] == [Method.STS, Method.STS, Method.IDENTITY]
    assert cal.is_sts and cal.sts_temperatures()[2] == 1.0


# ---------------------------------------------------------------------------------------------
# Methods beyond STS, model selection, grid baseline


def non_sts_rounds(n: int, seed: int = 0) -> TraceSet:
    """Truth with an offset STS cannot express: p_j = sigmoid(x_j / T + 1)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(-0.5, 2.0, size=(n, 2)).astype(np.float32)
    ok = rng.random((n, 2)) < expit(x / 1.5 + 1.0)
    return TraceSet.from_arrays(
        request_ids=[f"r{i % 400}" for i in range(n)],
        rounds=[i // 400 for i in range(n)],
        logits=x,
        accepted=np.cumprod(ok, axis=1).sum(axis=1),
        verified=[2] * n,
    )


def test_auto_selection_prefers_a_richer_map_when_sts_cannot_fit() -> None:
    ts = non_sts_rounds(60_000)
    folds = (np.arange(ts.rounds) % 400 % 5).astype(np.int8)  # by request
    rs = build_risk_sets(ts.logits, ts.accepted, ts.verified, folds=folds, n_folds=5)
    method, scores = select_method(rs, 5, ts.rounds)
    assert method is not Method.STS
    assert scores["sts"] > scores[method.value] + 0.005
    platt = fit_calibration(rs, Method.PLATT)
    a, b = platt.positions[0].params
    assert a == pytest.approx(1 / 1.5, rel=0.05) and b == pytest.approx(1.0, abs=0.06)


def test_auto_selection_keeps_sts_competitive_on_sts_truth(small_rounds: TraceSet) -> None:
    ts = small_rounds
    folds = (ts.request % 5).astype(np.int8)
    rs = build_risk_sets(ts.logits, ts.accepted, ts.verified, folds=folds, n_folds=5)
    _, scores = select_method(rs, 5, ts.rounds)
    assert scores["sts"] <= min(scores.values()) + 1e-3
    assert scores["isotonic"] > scores["sts"]  # flexibility costs held-out likelihood here


def test_isotonic_and_beta_maps_are_valid_and_approximated_by_sts(small_rounds: TraceSet) -> None:
    ts = small_rounds
    rs = build_risk_sets(ts.logits, ts.accepted, ts.verified)
    iso = fit_calibration(rs, Method.ISOTONIC)
    beta = fit_calibration(rs, Method.BETA)
    for cal in (iso, beta):
        approx = np.asarray(cal.sts_temperatures())
        assert np.all(rel_err(approx, (0.8, 1.0, 1.3, 2.0)) < 0.12), approx
    assert iso.positions[0].method is Method.ISOTONIC
    assert all(pm.params[0] >= 0 and pm.params[1] >= 0 for pm in beta.positions if pm.method is Method.BETA)


def test_shared_slope_shares_the_slope(small_rounds: TraceSet) -> None:
    ts = small_rounds
    cal = fit_calibration(
        build_risk_sets(ts.logits, ts.accepted, ts.verified), Method.PLATT, shared_slope=True
    )
    slopes = {pm.params[0] for pm in cal.positions}
    assert len(slopes) == 1 and all(pm.note == "shared slope" for pm in cal.positions)


def test_grid_baseline_picks_grid_temperatures(small_rounds: TraceSet) -> None:
    ts = small_rounds
    grid = fit_sts_grid(ts.logits, ts.accepted, ts.verified)
    assert len(STS_GRID) == 41 and STS_GRID[0] == pytest.approx(0.1) and STS_GRID[-1] == pytest.approx(10.0)
    assert all(t in STS_GRID for t in grid.sts_temperatures())
    # Grid spacing is 12%, so the baseline lands within about one step of the truth.
    assert np.all(rel_err(np.asarray(grid.sts_temperatures()), (0.8, 1.0, 1.3, 2.0)) < 0.25)


# ---------------------------------------------------------------------------------------------
# Models: validation and round trips

BAD_MAPS = [
    ("position_zero", dict(position=0, method=Method.STS, params=(1.0,)), "position must be >= 1"),
    ("sts_two_params", dict(position=1, method=Method.STS, params=(1.0, 2.0)), "takes 1 params"),
    ("sts_negative_t", dict(position=1, method=Method.STS, params=(-1.0,)), "must be > 0"),
    ("nan_param", dict(position=1, method=Method.PLATT, params=(math.nan, 0.0)), "must be finite"),
    ("beta_negative", dict(position=1, method=Method.BETA, params=(-0.1, 1.0, 0.0)), "a, b >= 0"),
    (
        "isotonic_odd",
        dict(position=1, method=Method.ISOTONIC, params=(0.0, 1.0, 0.5)),
        "x_1..x_m then p_1..p_m",
    ),
    (
        "isotonic_decreasing",
        dict(position=1, method=Method.ISOTONIC, params=(0.0, 1.0, 0.6, 0.5)),
        "non-decreasing",
    ),
    (
        "isotonic_unsorted_x",
        dict(position=1, method=Method.ISOTONIC, params=(1.0, 0.0, 0.1, 0.5)),
        "increasing x",
    ),
    (
        "bad_temperature",
        dict(position=1, method=Method.PLATT, params=(1.0, 0.0), temperature=0.0),
        "temperature",
    ),
]


@pytest.mark.parametrize(("name", "kwargs", "message"), BAD_MAPS, ids=[b[0] for b in BAD_MAPS])
def test_position_map_rejects_impossible_values(name: str, kwargs: dict[str, Any], message: str) -> None:
    kwargs = {"temperature": None, "risk_set_size": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        FittedPositionMap(**kwargs)


def test_calibration_round_trips(small_rounds: TraceSet) -> None:
    rs = build_risk_sets(small_rounds.logits, small_rounds.accepted, small_rounds.verified)
    for method in (Method.STS, Method.PLATT, Method.BETA, Method.ISOTONIC):
        cal = fit_calibration(rs, method)
        again = FittedCalibration.from_dict(json.loads(json.dumps(cal.to_dict())))
        assert again == cal
        np.testing.assert_array_equal(
            again.survival(small_rounds.logits[:100]), cal.survival(small_rounds.logits[:100])
        )
    with pytest.raises(ValueError, match=r"1\.\.K in order"):
        FittedCalibration("sts", (FittedPositionMap(2, Method.STS, (1.0,), 1.0, 0),))


# ---------------------------------------------------------------------------------------------
# sts.json


def test_sts_json_golden(update_goldens: bool) -> None:
    doc = sts_document(
        [0.7, 0.9, 1.1, 1.4, 1.8], ece_before=0.031, ece_after=0.004, dataset="fit-golden.parquet",
        num_samples=200000, max_draft_len=5,
    )  # fmt: skip
    data = canonical_json(doc.to_dict())
    golden = FIXTURES / "fit_sts_golden.json"
    if update_goldens:
        golden.write_bytes(data)
    assert data == golden.read_bytes()
    assert parse_sts_document(golden.read_bytes(), k=5) == doc
    minimal = canonical_json(sts_document([1.0, 2.0]).to_dict())
    assert minimal == b'{"sts_temperatures":[1.0,2.0],"temperatures":[1.0,2.0]}'


def _doc(**changes: Any) -> bytes:
    obj: dict[str, Any] = {"sts_temperatures": [0.5, 1.5], "temperatures": [0.5, 1.5], "max_draft_len": 2}
    for key, value in changes.items():
        if value is ...:
            obj.pop(key)
        else:
            obj[key] = value
    return json.dumps(obj).encode()


BAD_STS = [
    ("not_json", b"{", "not valid UTF-8 JSON"),
    ("not_object", b"[1.0]", "expected a JSON object"),
    ("missing_temperatures", _doc(sts_temperatures=...), "missing 'sts_temperatures'"),
    ("unknown_key", _doc(confidence=1), r"unknown key\(s\) \['confidence'\]"),
    ("empty", _doc(sts_temperatures=[], temperatures=...), "non-empty list"),
    ("zero", _doc(sts_temperatures=[0, 1.5], temperatures=...), r"sts_temperatures\[1\] is 0"),
    ("negative", _doc(sts_temperatures=[0.5, -1], temperatures=...), r"\[2\] is -1"),
    ("string", _doc(sts_temperatures=["1", 1.5], temperatures=...), "finite number > 0"),
    ("bool", _doc(sts_temperatures=[True, 1.5], temperatures=...), "finite number > 0"),
    ("nan_literal", b'{"sts_temperatures":[NaN,1.0]}', "NaN"),
    (
        "wrong_k",
        _doc(sts_temperatures=[1.0, 1.0, 1.0], temperatures=...),
        "has 3 values, expected exactly K=2",
    ),
    ("temperatures_differ", _doc(temperatures=[0.5, 1.6]), "must equal 'sts_temperatures'"),
    ("null_temperatures", _doc(temperatures=None), "'temperatures' is null"),
    ("few_samples", _doc(num_samples=999), "num_samples must be an integer >= 1000"),
    ("float_samples", _doc(num_samples=1000.0), "num_samples must be an integer"),
    ("ece_out_of_range", _doc(ece_after=1.5), r"ece_after must be a number in \[0, 1\]"),
    ("null_ece", _doc(ece_before=None), "ece_before is null"),
    ("dataset_not_ascii", _doc(dataset="tr\u00e4ces"), "printable ASCII"),
    ("duplicate_key", b'{"sts_temperatures":[1.0],"sts_temperatures":[2.0]}', "duplicate JSON key"),
    ("bad_max_draft_len", _doc(max_draft_len=0), "max_draft_len must be an integer >= 1"),
]


@pytest.mark.parametrize(("name", "data", "message"), BAD_STS, ids=[b[0] for b in BAD_STS])
def test_bad_sts_documents(name: str, data: bytes, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_sts_document(data, where="deploy/sts.json")
    assert "deploy/sts.json" in str(info.value)


def test_sts_k_must_match_expectation() -> None:
    with pytest.raises(ConfigError, match="expected exactly K=3"):
        parse_sts_document(_doc(max_draft_len=...), k=3)


@given(
    st.lists(
        st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False),
        min_size=1,
        max_size=16,
    ),
    st.none() | st.integers(1000, 10**9),
    st.none() | st.floats(0, 1),
)
def test_sts_documents_round_trip(values: list[float], num: int | None, ece: float | None) -> None:
    doc = sts_document(values, num_samples=num, ece_after=ece, max_draft_len=len(values))
    data = canonical_json(doc.to_dict())
    assert parse_sts_document(data, k=len(values)) == doc
    assert json.loads(data)["sts_temperatures"] == [float(v) for v in values]
    assert set(json.loads(data)) <= {"sts_temperatures", "temperatures", "ece_before", "ece_after",
                                      "dataset", "num_samples", "max_draft_len"}  # fmt: skip


def test_temperature_bounds_are_sane() -> None:
    assert 0 < T_MIN < min(STS_GRID) and max(STS_GRID) < T_MAX
